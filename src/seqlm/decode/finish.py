"""The end of the utterances: the partial word scored as a word, </s>, beams of one transcript merged, the
n-best ranked, and their label sequences read back from the frames' back-pointers.

At the end a beam's partial word (if any) is scored as a finished word, then </s>. A beam whose partial word
is empty (its last frames put a space after its last word, or it read nothing) scores, as pyctcdecode does
(trailing_space "unk"), an empty word before </s>: kenlm reads it as <unk>, and it takes unk_offset. Beams of
one transcript merge, and the transcript's LM score is that of the last of them, the worst ranked at the last
frame (pyctcdecode's merge keeps the fields of the last beam it adds to a group), so a transcript whose worst
beam ended in a space pays that penalty. With trailing_space "ignore", </s> follows the last word, and a
transcript's LM score depends on its words alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from seqlm.decode.beams import Beams
from seqlm.decode.hashing import mix
from seqlm.decode.search import LN10, Moves, _best, _merge


@dataclass(frozen=True)
class Hypothesis:
    """One transcript: score = acoustic + lm (natural logs), lm the LM and hotword part alone."""

    text: str
    score: float
    acoustic: float
    lm: float
    labels: tuple[int, ...]  # the output labels (blanks and repeats removed)


def finish(t, b: Beams, lengths: Tensor, traces: list[tuple[Tensor, Tensor]], nbest: int) -> list[list[Hypothesis]]:
    """The n-best of each of the U utterances, best first; lengths (U,) their frame counts."""
    u, k = b.alive.nonzero(as_tuple=True)  # (E,) each, by utterance
    old = b.flat(u * t.cfg.beam_width + k)
    pending = (old.plen > 0) & t.word_level
    key = torch.where(pending, old.key, old.text) if t.word_level else old.key
    lm = old.lm + _final_lm(t, old, pending)  # (E,)
    group, first, merged = _merge(mix(key, u), old.logit)
    score = merged + lm[_last(group, len(first))]  # (G,)
    keep = _best(u[first], score, t.cfg.beam_prune_logp, t.cfg.beam_width, len(lengths))
    rep = first[keep]  # (R,) by utterance, best first
    labels = _trace_back(traces, lengths, u[rep], k[rep])
    out: list[list[Hypothesis]] = [[] for _ in range(len(lengths))]
    for i, (ui, s, a) in enumerate(zip(u[rep].tolist(), score[keep].tolist(), merged[keep].tolist(), strict=True)):
        if len(out[ui]) < nbest:
            out[ui].append(Hypothesis(t.labels.render(labels[i]), s, a, s - a, tuple(labels[i])))
    return out


def _last(group: Tensor, G: int) -> Tensor:
    """(G,) the last member of each group: pyctcdecode's merge keeps the fields of the last beam it adds to a
    group, so that beam's words are the ones the end scores."""
    last = torch.full((G,), -1, dtype=torch.long, device=group.device)
    return last.scatter_reduce_(0, group, torch.arange(len(group), device=group.device), "amax")


def _final_lm(t, old: Beams, pending: Tensor) -> Tensor:
    """(E,) what the end adds: the pending word (LM and hotword) and alpha * ln p(</s>)."""
    add = torch.zeros_like(old.lm)
    if t.hotwords is not None:
        add += torch.where(pending, t.hotwords.finished(old.hot), 0.0)
    if t.pool is None:
        return add
    row = old.row
    event, token, unknown = t.lm_events(old, old.last, Moves(pending, pending, pending))
    if t.word_level and t.cfg.trailing_space == "unk":  # the empty word: <unk>, outside the unigrams
        token, unknown = torch.where(event, token, t.unk), torch.where(event, unknown, 1.0)
        event = torch.ones_like(event)
    i = event.nonzero().squeeze(1)
    if len(i):
        lnp = t.pool.logp(row[i], token[i])
        add[i] += t.cfg.alpha * (lnp + unknown[i] * (t.cfg.unk_offset * LN10)) + t.cfg.beta
        row = row.clone()
        row[i] = t.pool.add_pairs(row[i], token[i])
    eos = torch.full_like(row, t.eos)
    return add + t.cfg.alpha * t.pool.logp(row, eos)


def _trace_back(traces: list[tuple[Tensor, Tensor]], lengths: Tensor, u: Tensor, k: Tensor) -> list[list[int]]:
    """The labels each beam (u[i], k[i]) appended, first to last, following the frames' back-pointers from
    its utterance's last frame (utterances are ordered longest first, so frame f runs the first A_f)."""
    T = len(traces)
    parents = [p.cpu().numpy() for p, _ in traces]
    added = [a.cpu().numpy() for _, a in traces]
    ends = lengths.cpu().numpy()[u.cpu().numpy()]  # (H,)
    slot, utt = k.cpu().numpy().copy(), u.cpu().numpy()
    seq = np.full((len(slot), T), -1, dtype=np.int64)
    for f in range(T - 1, -1, -1):
        on = np.nonzero(ends > f)[0]
        seq[on, f] = added[f][utt[on], slot[on]]
        slot[on] = parents[f][utt[on], slot[on]]
    return [row[row >= 0].tolist() for row in seq]
