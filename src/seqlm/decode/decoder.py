"""CTCDecoder: posteriors in, n-best transcripts out, utterances decoded side by side.

Utterances are sorted by length and decoded `batch_size` at a time, frame by frame: at frame f the batch's
utterances longer than f (the first A of it) take one step of seqlm.decode.search together, so one frame costs
a few dozen tensor operations whatever the number of beams and utterances, and the LM is asked once per frame
for all the words that ended in it (seqlm.decode.lmpool).
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from seqlm.data.vocab import BOS, EOS
from seqlm.decode.beams import ROW, Beams
from seqlm.decode.compiled import compiled_search
from seqlm.decode.finish import Hypothesis, finish
from seqlm.decode.hashing import Symbols
from seqlm.decode.labels import Labels, check_spelling, token_ids
from seqlm.decode.lexicon import Hotwords, Lexicon
from seqlm.decode.lmpool import LMPool
from seqlm.decode.search import Moves, Search
from seqlm.errors import SeqlmError
from seqlm.protocol import LanguageModel, context_order, require

MIN_P = 1e-15  # pyctcdecode's MIN_TOKEN_CLIP_P: log posteriors are clipped at ln 1e-15


@dataclass
class DecodeConfig:
    """The search's settings; the defaults are pyctcdecode's."""

    alpha: float = 0.5  # LM weight
    beta: float = 1.5  # bonus per word (token level: per token)
    beam_width: int = 100
    beam_prune_logp: float = -10.0  # beams this far below the best go
    token_min_logp: float = -5.0  # labels below this ln p in a frame are not tried (its best always is)
    unk_offset: float = -10.0  # log10 added for a word outside the unigrams; a partial word that starts none
    prune_history: bool = True  # keep only the best of beams alike in their last n - 1 words (pyctcdecode's decode)
    lm_unit: str = "auto"  # word | token | auto: token for a model of characters (or tokens), else word
    # unk: a beam ending in a space scores an empty last word, read as <unk> with unk_offset (pyctcdecode's
    # rule; see seqlm.decode.finish) | ignore: </s> follows its last word, as for any other beam
    trailing_space: str = "unk"
    batch_size: int = 64  # utterances decoded side by side
    nbest: int = 1

    def __post_init__(self) -> None:
        if self.lm_unit not in ("auto", "word", "token"):
            raise SeqlmError(f"--lm-unit {self.lm_unit}: choose auto, word or token")
        if self.trailing_space not in ("unk", "ignore"):
            raise SeqlmError(f"--trailing-space {self.trailing_space}: choose unk or ignore")
        for name in ("beam_width", "batch_size", "nbest"):
            if getattr(self, name) < 1:
                raise SeqlmError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("alpha", "beta", "beam_prune_logp", "token_min_logp", "unk_offset"):
            if not math.isfinite(getattr(self, name)):
                raise SeqlmError(f"--{name.replace('_', '-')} must be a finite number")


POOL_SLACK = 256  # rows an LM pool may hold past twice those its beams read before it is compacted


class Tables:
    """What the search reads: labels as tensors, hashes, tries, the LM pool (one per batch) and the settings."""

    def __init__(self, labels: Labels, lm: LanguageModel | None, cfg: DecodeConfig, unigrams, hotwords,
                 device: torch.device):
        self.labels, self.lm, self.cfg, self.device = labels, lm, cfg, device
        self.starts, self.text_len = labels.tensors(device)
        self.boundaries = (self.starts & (self.text_len == 0)).nonzero().squeeze(1)  # (S,) spaces, a lone ▁
        self.longest = max(map(len, labels.texts))  # characters of the longest label
        self.word_level = lm is None or _unit(lm, cfg) == "word"
        strings = Symbols.of_strings(list(labels.texts), device)
        self.part_hash = strings
        self.key_hash = strings if self.word_level else Symbols.of_labels(len(labels), device)
        self.hotwords = Hotwords(hotwords, labels, device) if hotwords else None
        self.lexicon, self.pool, self.tokens = None, None, None
        self.vocab_size, self.eos, self.unk = 0, -1, -1  # the LM's, where there is one
        if lm is not None:
            self._read_lm(lm, unigrams)
        # at word level with labels of one character and no ▁ pieces (which may follow a space or end a word), a
        # group's members read one parent prefix, a space's aside (seqlm.decode.search.Search.reach)
        pieces = any(starts and text for starts, text in zip(labels.starts, labels.texts, strict=True))
        self.bound_by_prefix = not self.word_level or (max(map(len, labels.texts)) <= 1 and not pieces)
        self.hot_max = max([0.0, *hotwords.values()]) if hotwords else 0.0
        order = context_order(lm) if lm is not None else 1
        self.prune_history = cfg.prune_history and order is not None
        self.history = max(1, (order or 1) - 1)  # H: the words of history the LM reads

    def _read_lm(self, lm: LanguageModel, unigrams) -> None:
        vocab, spec = lm.vocab, lm.text_spec()
        what = f"the LM ({lm.family}, {spec.describe()})"
        self.vocab_size, self.eos, self.unk = len(vocab), vocab.eos_id, vocab.unk_id
        if self.word_level:
            require(lm, words="seqlm decode --lm-unit word")
            words = {w: i for i, w in enumerate(vocab.itos) if w not in (BOS, EOS)}
            check_spelling(self.labels, list(words), what)
            chosen = set(words) if unigrams is None else set(unigrams)
            self.lexicon = Lexicon(words, chosen, self.labels, self.device)
        else:
            if spec.unit == "char" and any(len(n) != 1 for n in (self.labels.names[i] for i in self.labels.ordinary())):
                raise SeqlmError(f"{what} reads single characters, and some labels are longer; decode word by word "
                                 "with an LM of words (--lm-unit word), or with labels of single characters")
            self.tokens = torch.tensor(token_ids(self.labels, vocab.stoi, spec.unit, what), device=self.device)

    @property
    def bound(self) -> float | None:
        """The most a label can add to a beam's LM and hotword score, plus ln 2 (seqlm.decode.search.Search.reach);
        None when there is no such bound (a negative alpha or a positive unk_offset)."""
        cfg, lm = self.cfg, self.lm
        if lm is not None and (cfg.alpha < 0 or cfg.unk_offset > 0):
            return None
        return math.log(2) + (max(cfg.beta, 0.0) if lm is not None else 0.0) + 2 * self.hot_max

    def new_pool(self) -> None:
        if self.lm is not None:  # sparse: scored word by word by lookups (the word a beam ends, not a table row)
            self.pool = LMPool(self.lm, self.device, sparse=self.word_level and self.lm.capabilities().sparse_targets)

    def lm_events(self, old: Beams, c: Tensor, moves: Moves) -> tuple[Tensor, Tensor, Tensor]:
        """Which beams (E,) read an LM token with label c (E,), the token, and 1.0 where it is no unigram."""
        if not self.word_level:
            return moves.fresh, self.tokens.index_select(0, c), torch.zeros_like(old.lm)
        n = old.node.clamp(min=0)
        unknown = ~((old.node >= 0) & self.lexicon.unigram.index_select(0, n))
        return moves.ends, self.word_tokens(old.node), unknown.double()

    def word_tokens(self, node: Tensor) -> Tensor:
        """(E,) the LM's id of the word each partial word at `node` (E,) spells, <unk> for one it does not."""
        word = torch.where(node >= 0, self.lexicon.word.index_select(0, node.clamp(min=0)), -1)
        return torch.where(word >= 0, word, self.unk)


def _unit(lm: LanguageModel, cfg: DecodeConfig) -> str:
    if cfg.lm_unit != "auto":
        return cfg.lm_unit
    return "word" if lm.text_spec().unit == "word" else "token"


class CTCDecoder:
    """decoder = CTCDecoder(labels, lm=seqlm.load("runs/kn5")); decoder.decode([logits, ...]) -> n-best lists.

    `lm` None: the posteriors alone (and hotwords). `unigrams`: the words whose partial spellings go
    unpenalised and that take no unk_offset (default: every word of the LM). `hotwords`: {word: weight}."""

    def __init__(self, labels: Labels, lm: LanguageModel | None = None, cfg: DecodeConfig | None = None,
                 unigrams=None, hotwords: dict[str, float] | None = None, device: str | torch.device = "cpu"):
        self.cfg = cfg or DecodeConfig()
        self.device = torch.device(device)
        if isinstance(lm, torch.nn.Module):
            lm.to(self.device).eval()
        self.tables = Tables(labels, lm, self.cfg, unigrams, hotwords, self.device)
        self.search = compiled_search(self.tables) or Search(self.tables)  # compiled on the CPU
        self._frames = torch.empty(0, dtype=torch.float64, device=self.device)  # log_posteriors' buffer, reused
        self.ms_per_utterance: list[float] = []  # of the last decode: its batch's time over its size

    @torch.inference_mode()
    def decode(self, posteriors: list[np.ndarray], progress=None) -> list[list[Hypothesis]]:
        """The n-best of each (frames, labels) matrix of logits or log posteriors (or probabilities: rows in
        [0, 1] summing to 1), in order. `progress`: called with the number of utterances done after each batch."""
        order = sorted(range(len(posteriors)), key=lambda i: -len(posteriors[i]))
        out: list[list[Hypothesis]] = [[] for _ in posteriors]
        self.ms_per_utterance = [0.0] * len(posteriors)
        for lo in range(0, len(order), self.cfg.batch_size):
            batch = order[lo : lo + self.cfg.batch_size]
            start = time.perf_counter()
            hyps = self._decode_batch([posteriors[i] for i in batch])
            ms = 1000 * (time.perf_counter() - start) / len(batch)
            for i, h in zip(batch, hyps, strict=True):
                out[i], self.ms_per_utterance[i] = h, ms
            if progress is not None:
                progress(len(batch))
        return out

    def _decode_batch(self, mats: list[np.ndarray]) -> list[list[Hypothesis]]:
        """Utterances ordered longest first, decoded together (_gc_paused)."""
        with _gc_paused():
            return self._search_batch(mats)

    def _search_batch(self, mats: list[np.ndarray]) -> list[list[Hypothesis]]:
        t = self.tables
        self._frames, lp = log_posteriors(mats, self._frames)  # (T, U, L)
        lengths = torch.tensor([len(m) for m in mats], device=self.device)
        t.new_pool()
        beams = Beams.start(len(mats), self.cfg.beam_width, t.history, t.labels.blank, self.device)
        traces = []
        actives = (lengths.view(1, -1) > torch.arange(lp.shape[0], device=self.device).view(-1, 1)).sum(1).tolist()
        for f, active in enumerate(actives):  # utterances are longest first: the first `active` have frame f
            beams, parent, label = self.search.frame(beams, lp[f, :active], active)
            traces.append((parent, label))
            beams = self._compact(beams)
        return finish(t, beams, lengths, traces, self.cfg.nbest)

    def _compact(self, beams: Beams) -> Beams:
        """Drop the pool's rows that no beam reads any more, when they are most of it. Counted against the
        distinct rows the beams read (many beams share a history) and counted again only when the pool has
        outgrown the last count: a pool let grow to twice the beams' number holds many times the rows they read
        (each a distribution over the vocabulary), and copying it as it grows showed in the profile of a decode
        with hotwords, whose beams read more rows."""
        pool = self.tables.pool
        if pool is None or pool.size < 2 * pool.live + POOL_SLACK:
            return beams
        live = torch.unique(beams.row[beams.alive])
        pool.live = len(live)
        if pool.size < 2 * pool.live + POOL_SLACK:
            return beams
        beams.ints[..., ROW] = torch.where(beams.alive, pool.compact(live)[beams.row], 0)
        return beams


@contextlib.contextmanager
def _gc_paused():
    """Python's cycle collector off while a batch is searched (as it was before, after): every frame makes
    small tensors, which start collections that walk every object the process holds (a share of a beam-8
    decode's time that shows in a profile); the search makes no reference cycles for it to find."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def log_posteriors(mats: list[np.ndarray], buffer: Tensor) -> tuple[Tensor, Tensor]:
    """(T, U, L) float64 log posteriors, frame-major (a frame's active utterances are one contiguous block),
    in `buffer` grown if need be (a fresh array of that size costs its page faults every batch); the frames past
    an utterance's end are left as they were (never read). Each utterance is read by _normalised, in float32
    where it is float32 (as a model's logits are, and as users normalise them: a third of the float64 time) and
    in float64 otherwise. Returns (the buffer, the posteriors: a view of it)."""
    T, U, L = max(len(m) for m in mats), len(mats), mats[0].shape[1]
    if buffer.numel() < T * U * L:
        buffer = torch.empty(T * U * L, dtype=torch.float64, device=buffer.device)
    out = buffer[: T * U * L].view(T, U, L)
    single = [np.asarray(m).dtype == np.float32 for m in mats]
    for kind, dtype in ((True, np.float32), (False, np.float64)):
        group = [u for u in range(U) if single[u] == kind]
        if not group:
            continue
        lengths = torch.tensor([len(mats[u]) for u in group], device=buffer.device)  # (G,)
        x = torch.from_numpy(np.concatenate([np.asarray(mats[u], dtype=dtype) for u in group])).to(buffer.device)
        utt = torch.repeat_interleave(torch.tensor(group, device=buffer.device), lengths)  # (N,) each row's utterance
        frame = torch.arange(len(x), device=buffer.device) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths,
                                                                                    lengths)  # (N,)
        out.view(T * U, L).index_copy_(0, frame * U + utt, _normalised(x, lengths).double())
    return buffer, out


def _normalised(x: Tensor, lengths: Tensor) -> Tensor:
    """(N, L) log posteriors of utterances laid end to end (lengths (G,)): an utterance of probabilities (every
    value in [0, 1], rows summing to 1 within 1e-3) through log, any other (logits, log posteriors alike)
    through log_softmax; then clipped at ln 1e-15, as pyctcdecode does. An utterance whose first row fails the
    range test is not probabilities (logits and log posteriors fail it there): only the others are read whole."""
    G = len(lengths)
    if len(x) == 0:
        return x
    starts = (torch.cumsum(lengths, 0) - lengths).clamp(max=len(x) - 1)  # (G,) (an empty utterance's: any row)
    lo, hi = torch.aminmax(x[starts], dim=1)  # (G,)
    probs = (lo >= 0) & (hi <= 1)  # (G,) still possibly probabilities
    if bool(probs.any()):
        utt = torch.repeat_interleave(torch.arange(G, device=x.device), lengths)  # (N,)
        rows = torch.nonzero(probs[utt]).squeeze(1)  # (M,) the candidates' rows
        lo, hi = torch.aminmax(x[rows], dim=1)  # (M,)
        bad = (lo < 0) | (hi > 1) | ((x[rows].sum(1) - 1).abs() >= 1e-3)  # (M,)
        probs &= ~torch.zeros_like(probs).index_put_((utt[rows],), bad, accumulate=True)
        rows = probs[utt]  # (N,) the rows read as probabilities
    if not bool(probs.any()):
        logp = torch.log_softmax(x, dim=1)
    elif bool(probs.all()):
        logp = x.clamp(min=MIN_P).log()
    else:
        logp = torch.empty_like(x)
        logp[rows] = x[rows].clamp(min=MIN_P).log()
        logp[~rows] = torch.log_softmax(x[~rows], dim=1)
    return logp.clamp_(min=math.log(MIN_P))


def load_lm(path: str | Path | None) -> LanguageModel | None:
    import seqlm

    return None if path is None else seqlm.load(path)
