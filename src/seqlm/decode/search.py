"""One frame of the CTC prefix beam search, for every beam of every active utterance at once.

The rules are pyctcdecode's (decoder.py, 0.5.0), so that its transcripts come out:
- candidates: the labels with ln p >= token_min_logp in the frame, and its best label;
- each beam takes each candidate: the blank, or the label of the last frame again, keeps the prefix; a space
  (or ▁ piece) ends the partial word, if there is one; any other label extends the partial word;
- beams with the same prefix and last label merge, their probabilities summed;
- word level: a word scores alpha * (ln p(word | history) + [not a unigram] * unk_offset * ln 10) + beta when it
  ends; the partial word scores unk_offset (times length / 6 past 6 characters) unless some unigram starts with
  it; token level: each token scores alpha * ln p(token | history) + beta when it is read. Hotwords, with or
  without an LM, as seqlm.decode.lexicon.Hotwords says;
- pruning: beams below the best's score + beam_prune_logp go, then all but the beam_width best; with
  prune_history, of beams that agree on their last n - 1 words (n: the LM's order; 1 without an LM), their
  partial word and last label, only the best stays (pyctcdecode's `decode` does so, `decode_beams` does not).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from seqlm.decode.beams import HOT, KEY, NODE, PART, PLEN, ROW, Beams
from seqlm.decode.hashing import SPACE, mix, step

LN10 = math.log(10.0)
AVG_WORD = 6  # pyctcdecode's AVG_TOKEN_LEN: partial words longer than this are penalised in proportion
SLACK = 1e-3  # candidate bounds are compared in float32 about nearby scores (rounding < 1e-5): this much leeway


class Moves(NamedTuple):
    """What a label did to each beam (E,) bool each."""

    fresh: Tensor  # neither the blank nor a repeat: a new label of the output
    moved: Tensor  # the prefix's text changed (a space after a space changes nothing at word level)
    ends: Tensor  # a word ended


class Groups(NamedTuple):
    """Candidates (E,) merged into groups (G,)."""

    u: Tensor  # (E,) utterance
    k: Tensor  # (E,) beam slot
    c: Tensor  # (E,) label
    old: Beams  # (E,) the beams they extend
    cols: list[Tensor]  # (E,) each: the new integer columns
    moves: Moves
    lm: Tensor  # (E,) new LM score
    partial: Tensor  # (E,) new partial word score
    first: Tensor  # (G,) a member of each group
    merged: Tensor  # (G,) summed acoustic score
    score: Tensor  # (G,) total score
    utt: Tensor  # (G,) utterance


class Search:
    """The frame step; `tables` (seqlm.decode.decoder.Tables) holds the labels, tries, LM pool and options."""

    def __init__(self, tables):
        self.t = tables

    def frame(self, b: Beams, lp: Tensor, active: int) -> tuple[Beams, Tensor, Tensor]:
        """The beams after one more frame, lp (A, L) its log posteriors (A = active, the utterances still
        running: the first A); with, for the traceback, each new slot's parent slot and the label it appended
        (-1: none), (A, K) each."""
        t, K = self.t, self.t.cfg.beam_width
        g = self.groups(b, lp, self.candidates(b, lp, active), active)
        keep = _best(g.utt, g.score, t.cfg.beam_prune_logp, K, active)  # (R,) by utterance, best first
        u, k, c, old, moves = g.u, g.k, g.c, g.old, g.moves
        rep = g.first.index_select(0, keep)  # (R,) one candidate of each kept group
        ints = torch.cat([torch.stack(g.cols, 1).index_select(0, rep), self.history(old, c, moves, rep)], 1)
        kept = Beams(torch.stack([g.merged.index_select(0, keep), *_take([g.lm, g.partial], rep)], 1), ints)
        if t.prune_history:
            rep, kept = _drop_same_history(rep, kept, c, u)
        kept.ints[:, ROW] = self.extend_lm(old, c, moves, rep)
        us, parent, label = _take([u, k, torch.where(moves.moved, c, -1)], rep)
        slot = torch.arange(len(rep), device=us.device) - torch.searchsorted(us, us)  # (R,) rank in its utterance
        return b.written(active, us, slot, kept), _grid(active, K, us, slot, parent), _grid(active, K, us, slot, label)

    def groups(self, b: Beams, lp: Tensor, ukc: tuple[Tensor, Tensor, Tensor], active: int) -> Groups:
        """Beams (u, k) (E,) after labels c (E,), merged into groups of equal prefix and last label, scored."""
        u, k, c = ukc
        old = b.flat(u * self.t.cfg.beam_width + k)
        cols, moves = self.expand(old, c)  # (E,) each
        lm = old.lm + self.word_scores(old, c, moves)  # (E,)
        partial = self.partial_scores(cols)  # (E,)
        group, first, merged = _merge(mix(cols[KEY], c, u), old.logit + lp[u, c])  # (E,), (G,), (G,)
        score = merged + (lm + partial).index_select(0, first)  # (G,)
        return Groups(u, k, c, old, cols, moves, lm, partial, first, merged, score, u.index_select(0, first))

    def candidates(self, b: Beams, lp: Tensor, active: int) -> tuple[Tensor, Tensor, Tensor]:
        """(u, k, c) (E,) each: the beams (u, k) and labels c to try. A label is tried if its ln p reaches
        token_min_logp or is the frame's best, and, when it changes the prefix, if the best score any group it
        joins could reach (`reach`) is not below a score that is sure to be pruned (`floor`): such a group
        would go anyway, so leaving it out changes nothing, and the search does not hash every label of every
        beam."""
        t = self.t
        cand = lp >= t.cfg.token_min_logp  # (A, L)
        cand.scatter_(1, lp.argmax(1, keepdim=True), True)
        alive, last = b.alive[:active], b.last[:active]  # (A, K)
        tried = alive[:, :, None] & cand[:, None, :]  # (A, K, L)
        if t.bound is None:
            return tried.nonzero(as_tuple=True)
        labels = torch.arange(lp.shape[1], device=lp.device)
        same = (labels == t.labels.blank) | (last[:, :, None] == labels)  # (A, K, L) the prefix stays
        partial = self.next_partial(b, active)  # (A, K, L)
        floor = self.floor(b, lp, tried & ~same, cand, partial, active)  # (A,)
        return (tried & (same | self.reach(b, lp, floor, partial, active))).nonzero(as_tuple=True)

    def floor(self, b: Beams, lp: Tensor, fresh: Tensor, cand: Tensor, partial: Tensor | None,
              active: int) -> Tensor:
        """(A,) a score below which every group is pruned. Beam k keeps a group of its own by reading its last
        label again (or the blank, if that was it), scoring at least its own score + ln p of that label: the
        lowest of these K bounds the K-th best group. A label that continues the partial word keeps the LM
        score, and (word level, from `outside`) its penalty is known: the best of these, less the prune
        margin, bounds what beam_prune_logp keeps."""
        t, alive, last = self.t, b.alive[:active], b.last[:active]
        base = b.logit[:active] + b.lm[:active]  # (A, K)
        stays = torch.where(alive & cand.gather(1, last), base + lp.gather(1, last) + b.partial[:active], -torch.inf)
        best = stays.max(1).values
        if partial is not None:  # in float32 about the best beam: small numbers; SLACK covers the rounding
            ref = torch.where(alive, base, -torch.inf).max(1, keepdim=True).values  # (A, 1)
            near = (base - ref).float()[:, :, None] + lp.float()[:, None, :] + partial  # (A, K, L)
            grows = fresh & ~t.starts  # (A, K, L) the LM score stays
            top = torch.where(grows, near, -torch.inf).flatten(1).max(1).values  # (A,)
            best = torch.maximum(best, ref.squeeze(1) + top.double() - SLACK)
        return torch.maximum(stays.min(1).values, best + t.cfg.beam_prune_logp)

    def reach(self, b: Beams, lp: Tensor, floor: Tensor, partial: Tensor | None, active: int) -> Tensor:
        """(A, K, L) whether beam k + label c may join a group scoring `floor` (A,) or more. A group's summed
        alignment probability is at most that of all beams with the parent prefix plus the one beam that
        repeats c (together at most ln 2 above the larger), times p(c); its LM score at most the parent's plus
        `t.bound` (beta, hotword boosts); its partial word's penalty is `partial`, where known."""
        t, alive = self.t, b.alive[:active]
        logit = torch.where(alive, b.logit[:active], -1e300)  # (A, K)
        lm = torch.where(alive, b.lm[:active], -1e300)
        parents = _prefix_totals(b, logit, active) if t.bound_by_prefix else logit.logsumexp(1, keepdim=True)
        X = parents + lm + t.bound  # (A, K)
        repeat = torch.full_like(lp, -1e300).scatter_reduce_(1, b.last[:active], logit, "amax")  # (A, L)
        Z = repeat + lm.max(1, keepdim=True).values + t.bound  # (A, L)
        # in float32 about the floor: small numbers; SLACK covers the rounding, so no group that can be kept goes
        X, Z = (X - floor[:, None]).float(), (Z - floor[:, None] + lp).float()  # (A, K), (A, L)
        top = torch.maximum(X[:, :, None] + lp.float()[:, None, :], Z[:, None, :])  # (A, K, L)
        if t.word_level and len(t.boundaries):
            # a space after a word joins the beams that already read a space there: any prefix may be the parent
            s = t.boundaries  # (S,)
            anyone = (logit.logsumexp(1, keepdim=True) + lm + t.bound - floor[:, None]).float()[:, :, None]
            top[:, :, s] = torch.maximum(anyone + lp.float()[:, None, s], Z[:, None, s])
        return (top if partial is None else top + partial) >= -SLACK

    def next_partial(self, b: Beams, active: int) -> Tensor | None:
        """(A, K, L) float32 the unknown-word penalty of each beam's partial word after each label, at word
        level with an LM whose words are a table (seqlm.decode.lexicon.Lexicon.outside) and no hotwords (whose
        share would replace it); else None."""
        t = self.t
        if t.lexicon is None or t.lexicon.outside is None or t.hotwords is not None:
            return None
        node, plen = b.node[:active], b.plen[:active]  # (A, K)
        row = torch.where(node >= 0, node, len(t.lexicon.outside) - 1)  # (A, K) row N: a word that starts none
        table = t.lexicon.penalty(t.cfg.unk_offset)
        penalty = table.index_select(0, row.flatten()).view(*row.shape, -1)  # (A, K, L) no word longer than 6
        long = ((plen + t.longest > AVG_WORD) | (t.longest > AVG_WORD)).flatten().nonzero().squeeze(1)  # (N,)
        if len(long):  # beams whose partial word may pass 6 characters: scaled by its length
            flat, rows, lens = penalty.view(-1, penalty.shape[2]), row.flatten()[long], plen.flatten()[long]
            length = torch.where(t.starts, 0, lens[:, None]) + t.text_len  # (N, L)
            scale = torch.where(length > AVG_WORD, length / AVG_WORD, 1.0)
            flat[long] = torch.where(t.lexicon.outside[rows] & (length > 0), t.cfg.unk_offset * scale, 0.0)
        return penalty

    def expand(self, old: Beams, c: Tensor) -> tuple[list[Tensor], Moves]:
        """The integer columns (seqlm.decode.beams.COLUMNS) of each beam of `old` (E,) after label c (E,)."""
        t = self.t
        fresh = (c != t.labels.blank) & (c != old.last)
        starting, text_len = t.starts.index_select(0, c), t.text_len.index_select(0, c)  # (E,)
        starts = starting & fresh  # a space or ▁ piece
        grows = fresh & ~starting
        had = old.plen > 0
        ends = starts & had
        if t.word_level:
            moved = grows | (starts & (had | (text_len > 0)))  # a space after a space: nothing
            key = torch.where(ends, step(old.key, torch.full_like(c, SPACE)), old.key)
            key = torch.where(moved, t.key_hash(key, c), key)
            text = torch.where(ends, old.key, old.text)
        else:
            moved = fresh
            key, text = torch.where(moved, t.key_hash(old.key, c), old.key), old.text
        part = t.part_hash(torch.where(starts, 0, old.part), c)
        part = torch.where(fresh, part, old.part)
        plen = torch.where(starts, 0, old.plen) + torch.where(fresh, text_len, 0)
        node = torch.where(fresh, t.lexicon.trie.follow(old.node, c, starts), old.node) if t.lexicon else old.node
        hot = torch.where(fresh, t.hotwords.trie.follow(old.hot, c, starts), old.hot) if t.hotwords else old.hot
        return [key, text, part, plen, c, node, hot, old.row], Moves(fresh, moved, ends)

    def word_scores(self, old: Beams, c: Tensor, moves: Moves) -> Tensor:
        """(E,) what the LM and the hotwords add for the word (token) this label finishes, if any."""
        t, add = self.t, torch.zeros_like(old.lm)
        if t.hotwords is not None:
            add += torch.where(moves.ends, t.hotwords.finished(old.hot), 0.0)
        if t.pool is None:
            return add
        event, token, unknown = t.lm_events(old, c, moves)
        i = event.nonzero().squeeze(1)
        if len(i):
            lnp = t.pool.logp(old.row[i], token[i])  # (N,)
            add[i] += t.cfg.alpha * (lnp + unknown[i] * (t.cfg.unk_offset * LN10)) + t.cfg.beta
        return add

    def partial_scores(self, cols: list[Tensor]) -> Tensor:
        """(E,) the partial word's score: a hotword's share, else the unknown-word penalty (word level)."""
        t, node, hot, plen = self.t, cols[NODE], cols[HOT], cols[PLEN]
        score = torch.zeros(plen.shape, dtype=torch.float64, device=plen.device)
        if t.lexicon is not None:
            off = ~((node >= 0) & t.lexicon.prefix.index_select(0, node.clamp(min=0))) & (plen > 0)
            scale = torch.where(plen > AVG_WORD, plen.double() / AVG_WORD, 1.0)
            score = torch.where(off, t.cfg.unk_offset * scale, 0.0)
        if t.hotwords is not None:
            score = torch.where((hot >= 0) & (plen > 0), t.hotwords.partial(hot, plen), score)
        return score

    def history(self, old: Beams, c: Tensor, moves: Moves, rep: Tensor) -> Tensor:
        """(R, H) the last H words (tokens) of the kept beams rep (R,), for prune_history."""
        hist = old.hist.index_select(0, rep)  # (R, H)
        push, unit = _take([moves.ends, old.part] if self.t.word_level else [moves.fresh, c], rep)
        shifted = torch.cat([hist[:, 1:], unit[:, None]], dim=1)  # (R, H)
        return torch.where(push[:, None], shifted, hist)

    def extend_lm(self, old: Beams, c: Tensor, moves: Moves, rep: Tensor) -> Tensor:
        """(R,) the LM pool rows of the kept beams: new rows, made together, where they read a word (token)."""
        t = self.t
        row = old.row.index_select(0, rep)
        if t.pool is None:
            return row
        event, token, _ = t.lm_events(old.rows(rep), c.index_select(0, rep), Moves(*_take(moves, rep)))
        i = event.nonzero().squeeze(1)
        if len(i) == 0:
            return row
        row[i] = t.pool.add_pairs(row[i], token[i])
        return row


def _prefix_totals(b: Beams, logit: Tensor, active: int) -> Tensor:
    """(A, K) ln of the summed probabilities of the beams that share each beam's prefix (any last label)."""
    u = torch.arange(active, device=logit.device)[:, None].expand_as(logit)
    _, group = torch.unique(mix(b.key[:active], u).flatten(), return_inverse=True)  # (A * K,)
    flat = logit.flatten()
    top = torch.full((int(group.max()) + 1,), -1e300, dtype=flat.dtype, device=flat.device)
    top.scatter_reduce_(0, group, flat, "amax")
    total = torch.zeros_like(top).scatter_add_(0, group, (flat - top.index_select(0, group)).exp())
    return (top + total.log()).index_select(0, group).view_as(logit)


def _merge(key: Tensor, logit: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Groups of equal keys (E,): each one's group (E,), first member (G,), ln of summed probability (G,)."""
    _, group = torch.unique(key, return_inverse=True)  # (E,)
    G, E = int(group.max()) + 1, len(key)
    first = torch.full((G,), E, dtype=torch.long, device=key.device)
    first.scatter_reduce_(0, group, torch.arange(E, device=key.device), "amin")
    top = torch.full((G,), -torch.inf, dtype=logit.dtype, device=key.device)
    top.scatter_reduce_(0, group, logit, "amax")
    total = torch.zeros_like(top).scatter_add_(0, group, (logit - top.index_select(0, group)).exp())
    return group, first, top + total.log()


def _best(utt: Tensor, score: Tensor, prune: float, width: int, active: int) -> Tensor:
    """Indices of the kept scores (within `prune` of their utterance's best, and its `width` best), ordered by
    utterance, then by score from the best down."""
    order = torch.argsort(utt, stable=True)  # (G,) by utterance
    us = utt.index_select(0, order)
    counts = torch.bincount(us, minlength=active)  # (A,)
    start = counts.cumsum(0) - counts
    table = torch.full((active, int(counts.max())), -torch.inf, dtype=score.dtype, device=score.device)
    table[us, torch.arange(len(us), device=us.device) - start.index_select(0, us)] = score.index_select(0, order)
    top, at = table.topk(min(width, table.shape[1]), dim=1)  # (A, W) best first
    keep = (top > -torch.inf) & (top >= top[:, :1] + prune)
    return order[(start[:, None] + at)[keep]]


def _drop_same_history(rep: Tensor, kept: Beams, c: Tensor, u: Tensor) -> tuple[Tensor, Beams]:
    """pyctcdecode's prune_history: of kept beams (best first within each utterance) that agree on their last
    words, partial word and last label, the first."""
    key = mix(*kept.hist.unbind(1), kept.ints[:, PART], *_take([c, u], rep))
    _, group = torch.unique(key, return_inverse=True)
    n = len(rep)
    order = torch.arange(n, device=rep.device)
    first = torch.full((n,), n, dtype=torch.long, device=rep.device).scatter_reduce_(0, group, order, "amin")
    keep = (first.index_select(0, group) == order).nonzero().squeeze(1)
    return rep.index_select(0, keep), kept.rows(keep)


def _take(tensors, index: Tensor) -> list[Tensor]:
    """Rows `index` of each tensor."""
    return [x.index_select(0, index) for x in tensors]


def _grid(active: int, width: int, us: Tensor, slot: Tensor, values: Tensor) -> Tensor:
    """(A, K) `values` at (us, slot), -1 elsewhere."""
    out = torch.full((active, width), -1, dtype=torch.long, device=us.device)
    out[us, slot] = values
    return out
