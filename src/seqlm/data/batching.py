"""Turning a TokenStream into Batches (see `seqlm.protocol.Batch`).

Three shapes, one Batch type:
- `sentence_batches`: one sentence per row, padded, sorted by length: evaluation and scoring.
  Sentences longer than `max_len` are cut into pieces; each piece after the first carries the
  `context` tokens before it as masked, non-reset positions: the same history a whole-sentence pass
  gives a model whose predictions depend on at most `context` + 1 inputs (an n-gram window).
- `continued_rows`: long sentences side by side, `max_len` positions at a time, each call continuing
  the last: a model that carries its state from call to call (`score_stream`) reads every sentence
  with its whole history, in memory bounded by `max_len`, however long the sentence.
- `packed_batches`: shuffled whole sentences laid end to end and cut into rows of `batch_tokens`
  (FOFE paper, Sec. 4: "each mini-batch is composed of several sentences up to 200 words").
- `stream_batches`: the text as B parallel streams cut into chunks of `bptt` steps (Mikolov's rnnlm
  and TBPTT); sentence starts are resets only when `reset_at_sentences`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from seqlm.data.corpus import TokenStream
from seqlm.protocol import Batch

# how a family cuts its training text: (text, rng, (rank, world size)) -> this rank's batches of one epoch
Batches = Callable[[TokenStream, np.random.Generator, tuple[int, int]], Iterator[Batch]]


def history(batch: Batch, size: int) -> Tensor:
    """(B, T, size) the last `size` inputs at each position, oldest first; -1 before the sentence start.

    Column size-1 is inputs[:, t] itself, column size-1-k is inputs[:, t-k].
    """
    B, T = batch.inputs.shape
    pos = torch.arange(T, device=batch.inputs.device).expand(B, T)  # (B, T)
    seg_start = torch.where(batch.resets, pos, torch.zeros_like(pos)).cummax(dim=1).values  # (B, T)
    padded = torch.cat([batch.inputs.new_full((B, size - 1), -1), batch.inputs], dim=1)  # (B, T+size-1)
    windows = padded.unfold(1, size, 1)  # (B, T, size)
    offsets = torch.arange(size - 1, -1, -1, device=pos.device)  # (size,) how far back each column is
    valid = (pos.unsqueeze(-1) - offsets) >= seg_start.unsqueeze(-1)  # (B, T, size)
    return torch.where(valid, windows, torch.full_like(windows, -1))


class Planned(Iterable[Batch]):
    """An epoch's batches with their number known before the first is built (progress bars, per-step
    schedules such as warmup-cosine); each batch is still built only when its turn comes."""

    def __init__(self, count: int, batches: Iterable[Batch]):
        self.count, self.batches = count, batches

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.batches)


@dataclass
class Rows:
    """A batch plus where its rows come from: row b scores sentence `sentence[b]` from token `offset[b]`."""

    batch: Batch
    sentence: np.ndarray  # (B,)
    offset: np.ndarray  # (B,)


def _pieces(lengths: np.ndarray, max_len: int, sentences: np.ndarray | None = None) -> list[tuple[int, int, int]]:
    """(sentence, first target, number of targets) for every piece of every sentence (of `sentences` only)."""
    out = []
    for s in range(len(lengths)) if sentences is None else sentences.tolist():
        n = int(lengths[s])
        for o in range(0, n, max_len):
            out.append((s, o, min(max_len, n - o)))
    return out


CONTEXT = 64  # tokens of context carried into each piece of a sentence cut at max_len
MAX_LEN = 512  # targets per row when scoring sentence by sentence; longer sentences come in pieces


def sentence_groups(
    stream: TokenStream, max_tokens: int = 8192, max_len: int = MAX_LEN, context: int = CONTEXT,
    sentences: np.ndarray | None = None,
) -> list[list[tuple[int, int, int]]]:
    """The pieces (sentence, first target, targets) of each batch of `sentence_batches`, cheap to hold:
    batches are built from them one at a time, in any order (`sentence_rows`). `sentences`: only these."""
    pieces = _pieces(np.diff(np.asarray(stream.starts)), max_len, sentences)
    pieces.sort(key=lambda p: (p[2] + (min(p[1], context)), p[0]))  # rows grouped by length: little padding
    groups, i = [], 0
    while i < len(pieces):
        width = pieces[i][2] + min(pieces[i][1], context)
        j = i
        while j < len(pieces):  # the widest piece is last in sort order; grow while the budget allows
            w = pieces[j][2] + min(pieces[j][1], context)
            if (j - i + 1) * max(width, w) > max_tokens and j > i:
                break
            width = max(width, w)
            j += 1
        groups.append(pieces[i:j])
        i = j
    return groups


def sentence_rows(stream: TokenStream, bos_id: int, group: list[tuple[int, int, int]], context: int = CONTEXT
                  ) -> Rows:
    """One batch of sentence pieces, each row scored from a fresh start after up to `context` tokens."""
    ids, starts = stream.ids, np.asarray(stream.starts)
    B = len(group)
    width = max(n + min(o, context) for _, o, n in group)
    inputs = np.zeros((B, width), dtype=np.int64)
    targets = np.zeros((B, width), dtype=np.int64)
    mask = np.zeros((B, width), dtype=bool)
    resets = np.zeros((B, width), dtype=bool)
    for b, (s, o, n) in enumerate(group):
        c = min(o, context)
        base = starts[s]
        tgt = ids[base + o - c : base + o + n]  # c context targets (masked) then n scored targets
        inp = np.empty(c + n, dtype=np.int64)
        inp[1:] = tgt[:-1]
        if o - c == 0:
            inp[0], resets[b, 0] = bos_id, True
        else:
            inp[0] = ids[base + o - c - 1]
        inputs[b, : c + n], targets[b, : c + n] = inp, tgt
        mask[b, c : c + n] = True
    batch = Batch(*(torch.from_numpy(a) for a in (inputs, targets, mask, resets)))
    return Rows(batch, np.array([g[0] for g in group]), np.array([g[1] for g in group]))


def sentence_batches(
    stream: TokenStream, bos_id: int, max_tokens: int = 8192, max_len: int = MAX_LEN, context: int = CONTEXT,
    sentences: np.ndarray | None = None,
) -> Iterator[Rows]:
    """Every sentence (of `sentences`) scored from a fresh start; rows grouped by length to keep padding small."""
    for group in sentence_groups(stream, max_tokens, max_len, context, sentences):
        yield sentence_rows(stream, bos_id, group, context)


def long_sentences(stream: TokenStream, max_len: int = MAX_LEN) -> np.ndarray:
    """(S,) ids of the sentences of more than `max_len` targets: those `sentence_batches` would cut."""
    return np.flatnonzero(np.diff(np.asarray(stream.starts)) > max_len)


def continued_groups(stream: TokenStream, sentences: np.ndarray, max_tokens: int = 8192,
                     max_len: int = MAX_LEN) -> list[np.ndarray]:
    """`sentences` in groups read side by side by `continued_rows`, about `max_tokens` a call; similar
    lengths share a group so that rows run out at about the same piece."""
    lengths = np.diff(np.asarray(stream.starts))[sentences]  # (S,)
    by_length = np.asarray(sentences)[np.argsort(lengths, kind="stable")]
    rows = max(1, max_tokens // max_len)
    return [by_length[i : i + rows] for i in range(0, len(by_length), rows)]


def continued_rows(stream: TokenStream, bos_id: int, group: np.ndarray, max_len: int = MAX_LEN) -> Iterator[Rows]:
    """The sentences of `group`, one a row, in consecutive pieces of `max_len` targets. Only the first piece
    resets: each later one continues the row where the last stopped, for a model that carries its state
    between calls (`score_stream`). A row whose sentence has ended is padding (mask False)."""
    ids, starts = stream.ids, np.asarray(stream.starts)
    group = np.asarray(group)
    first, n = starts[group], starts[group + 1] - starts[group]  # (B,) text offset and length of each sentence
    for o in range(0, int(n.max()), max_len):
        pos = o + np.arange(min(max_len, int(n.max()) - o))  # (T,) positions inside the sentences
        mask = pos[None, :] < n[:, None]  # (B, T)
        at = np.where(mask, first[:, None] + pos, 0)  # (B, T) text index of each target
        targets = np.where(mask, np.asarray(ids[at], dtype=np.int64), 0)
        inputs = np.where(mask & (pos > 0), np.asarray(ids[np.maximum(at - 1, 0)], dtype=np.int64), 0)
        inputs[:, pos == 0] = bos_id  # the sentence start, in the first piece only
        resets = np.zeros(mask.shape, dtype=bool)
        resets[:, pos == 0] = True
        arrs = (inputs, targets, mask, resets)
        batch = Batch(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrs))
        yield Rows(batch, group, np.full(len(group), o))


def _gather_sentences(stream: TokenStream, order: np.ndarray, bos_id: int) -> tuple[np.ndarray, ...]:
    """Inputs, targets and resets of the sentences in `order`, laid end to end (vectorised)."""
    starts = np.asarray(stream.starts)
    lengths = np.diff(starts)[order]  # (S,)
    first = starts[:-1][order]  # (S,)
    total = int(lengths.sum())
    seg_begin = np.repeat(np.cumsum(lengths) - lengths, lengths)  # (N,) where each target's sentence begins
    within = np.arange(total) - seg_begin  # (N,) position inside its sentence
    tgt_index = np.repeat(first, lengths) + within  # (N,)
    targets = np.asarray(stream.ids[tgt_index], dtype=np.int64)
    resets = within == 0
    inputs = np.where(resets, bos_id, np.asarray(stream.ids[np.maximum(tgt_index - 1, 0)], dtype=np.int64))
    return inputs, targets, resets


GATHER_TOKENS = 1 << 20  # positions gathered at a time: the epoch's text is never laid out whole


def packed_batches(
    stream: TokenStream,
    bos_id: int,
    batch_tokens: int = 200,
    rows: int = 1,
    rng: np.random.Generator | None = None,
    shard: tuple[int, int] = (0, 1),
) -> Planned:
    """Shuffled sentences end to end, cut into (rows, batch_tokens) batches; the last one may be short.

    `shard=(rank, world)` keeps every world-th batch for data-parallel training. The packed text is
    gathered from the (memory-mapped) ids a slice of about GATHER_TOKENS positions at a time, so
    memory stays bounded however large the corpus: only the sentence order (8 bytes a sentence) is
    held whole.
    """
    order = rng.permutation(stream.num_sentences) if rng is not None else np.arange(stream.num_sentences)
    lengths = np.diff(np.asarray(stream.starts))[order]  # (S,) in packed order
    ends = np.cumsum(lengths)  # (S,) where each sentence ends in the packed text
    total = int(ends[-1]) if len(ends) else 0
    step = batch_tokens * rows
    rank, world = shard
    n_batches = (total + step - 1) // step
    n_batches -= n_batches % world if n_batches >= world else 0  # equal batch counts across ranks
    return Planned(len(range(rank, n_batches, world)), _packed(stream, bos_id, batch_tokens, rows, order, ends,
                                                                n_batches, shard))


def _packed(stream: TokenStream, bos_id: int, batch_tokens: int, rows: int, order: np.ndarray, ends: np.ndarray,
            n_batches: int, shard: tuple[int, int]) -> Iterator[Batch]:
    step = batch_tokens * rows
    total = int(ends[-1]) if len(ends) else 0
    rank, world = shard
    per_gather = max(1, GATHER_TOKENS // step) * step  # whole batches per slice
    for lo in range(0, n_batches * step, per_gather):
        hi = min(lo + per_gather, n_batches * step, total)
        first = int(np.searchsorted(ends, lo, side="right"))  # sentences overlapping [lo, hi)
        last = int(np.searchsorted(ends, hi, side="left")) + 1
        inputs, targets, resets = _gather_sentences(stream, order[first:last], bos_id)
        off = lo - (int(ends[first - 1]) if first else 0)  # [lo, hi) inside the gathered sentences
        for k in range(lo // step, (hi + step - 1) // step):
            if k % world == rank:
                sl = slice(off + k * step - lo, off + min((k + 1) * step, hi) - lo)
                yield _as_batch(inputs[sl], targets[sl], resets[sl], rows, batch_tokens)


def _as_batch(inp: np.ndarray, tgt: np.ndarray, rst: np.ndarray, rows: int, width: int) -> Batch:
    """Lay a flat run of positions out as (rows, width), padding the tail."""
    n = len(tgt)
    width = min(width, -(-n // rows))
    full = rows * width
    pad = full - n
    mask = np.concatenate([np.ones(n, dtype=bool), np.zeros(pad, dtype=bool)])
    inp, tgt, rst = (np.concatenate([a, np.zeros(pad, dtype=a.dtype)]) for a in (inp, tgt, rst))
    shape = (rows, width)
    return Batch(*(torch.from_numpy(np.ascontiguousarray(a.reshape(shape))) for a in (inp, tgt, mask, rst)))


def stream_batches(
    stream: TokenStream,
    bos_id: int,
    batch_size: int,
    bptt: int,
    reset_at_sentences: bool = False,
    shard: tuple[int, int] = (0, 1),
) -> Planned:
    """The text in order as `batch_size` parallel streams, in chunks of `bptt` steps (for TBPTT).

    Row r of chunk k continues row r of chunk k-1, so a model may carry its state between calls.
    Each chunk is read straight from the (memory-mapped) ids: memory is one chunk, not the text.
    """
    n = len(stream.ids)
    rank, world = shard
    per_row = n // (batch_size * world)
    if per_row == 0:
        batch_size, per_row = 1, n // world
    row_start = rank * batch_size * per_row + np.arange(batch_size) * per_row  # (B,) text offset of each row
    return Planned(len(range(0, per_row, bptt)), _stream(stream, bos_id, bptt, reset_at_sentences, row_start, per_row))


def _stream(stream: TokenStream, bos_id: int, bptt: int, reset_at_sentences: bool, row_start: np.ndarray,
            per_row: int) -> Iterator[Batch]:
    ids, starts = stream.ids, np.asarray(stream.starts)
    for t0 in range(0, per_row, bptt):
        pos = row_start[:, None] + np.arange(t0, min(t0 + bptt, per_row))  # (B, T) text positions
        tgt = np.asarray(ids[pos], dtype=np.int64)
        prev = np.asarray(ids[np.maximum(pos - 1, 0)], dtype=np.int64)
        if reset_at_sentences:
            rst = starts[np.searchsorted(starts, pos)] == pos  # a sentence starts here
            inp = np.where(rst, bos_id, prev)
        else:  # the stream reads </s> as the next context
            rst = np.zeros(pos.shape, dtype=bool)
            inp = np.where(pos == 0, bos_id, prev)
        if t0 == 0:
            rst[:, 0] = True  # every row begins from a fresh state
        arrs = (inp, tgt, np.ones(pos.shape, dtype=bool), rst)
        yield Batch(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrs))
