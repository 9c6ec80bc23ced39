"""The frame step compiled (_search.cpp), for decoding on the CPU: the twin of seqlm.decode.search.Search, with
the same `frame`. Tensor operations over every candidate cost a few microseconds each whatever their size, and
a frame needs a few hundred of them; the compiled step expands and merges each utterance's candidates in one
loop instead. The LM is still read through the pool (seqlm.decode.lmpool), by any model's batched `advance`:
before the step, the rows of the beams that may read a token in it; after it, the rows the kept beams made.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from seqlm.data.native import compiled
from seqlm.decode.beams import ROW, Beams
from seqlm.protocol import model_device


def extension():
    """The compiled module, or None where it cannot be built or SEQLM_NATIVE=0."""
    return compiled("_seqlm_decode", [Path(__file__).with_name("_search.cpp")])


def compiled_search(tables) -> CompiledSearch | None:
    """The compiled step for these tables, where they and the LM are on the CPU (the step reads the LM pool's
    rows in place) and the module is built; else None."""
    on_cpu = tables.device.type == "cpu" and (tables.lm is None or model_device(tables.lm).type == "cpu")
    ext = extension() if on_cpu else None
    return None if ext is None else CompiledSearch(tables, ext)


def _ints(x: Tensor | None) -> np.ndarray:
    return np.zeros(0, np.int64) if x is None else np.ascontiguousarray(x.cpu().numpy().astype(np.int64))


def _floats(x: Tensor | None) -> np.ndarray:
    return np.zeros(0, np.float64) if x is None else np.ascontiguousarray(x.cpu().numpy().astype(np.float64))


def _trie(trie, bit: Tensor | None = None) -> tuple:
    """(dense children or None, keys, children, start) of a seqlm.decode.lexicon.Trie (or an empty one); `bit`
    (N,) bool: the dense table holds child * 2 + bit[child] (_search.cpp's Tables.lex_next)."""
    if trie is None:
        return None, _ints(None), _ints(None), _ints(None)
    dense = None
    if trie.dense is not None:
        child = trie.dense.cpu().numpy().astype(np.int64)
        if bit is not None:
            child = np.where(child >= 0, 2 * child + bit.cpu().numpy()[np.maximum(child, 0)], -1)
        dense = np.ascontiguousarray(child.astype(np.int32))
    return dense, _ints(trie.keys), _ints(trie.child), _ints(trie.start)


class CompiledSearch:
    def __init__(self, tables, ext):
        self.t, self.ext = tables, ext
        t, lex, hot = tables, tables.lexicon, tables.hotwords
        self.want = np.empty(0, dtype=np.int64)  # _wanted's outputs, reused
        self.out: tuple[np.ndarray, ...] | None = None  # _outputs' buffers, reused
        self.arrays = (_ints(t.starts), _ints(t.text_len), _ints(t.part_hash.codes), _ints(t.key_hash.codes),
                       _ints(t.tokens), _ints(lex.word if lex else None), _ints(lex.unigram if lex else None),
                       _ints(lex.prefix if lex else None), _floats(hot.weight if hot else None),
                       _floats(hot.min_len if hot else None), _floats(hot.min_weight if hot else None),
                       _trie(lex.trie if lex else None, lex.prefix if lex else None),
                       _trie(hot.trie if hot else None))

    def frame(self, b: Beams, lp: Tensor, active: int) -> tuple[Beams, Tensor, Tensor]:
        """As seqlm.decode.search.Search.frame, on numpy views of the beams and of output buffers reused every
        frame (the compiled step runs on the CPU only)."""
        t, K, lp = self.t, self.t.cfg.beam_width, lp.contiguous().numpy()
        ints, floats = self._ints(), self._floats()
        pool = t.pool
        scores, beam_ints = b.scores.numpy(), b.ints.numpy()  # (U, K, 3), (U, K, W): views
        dist, slot, word_lnp = self._read_lm(b, lp, active, ints, floats) if pool is not None else (None, None, None)
        out_scores, out_ints, pend = self._outputs(scores, beam_ints, active)
        parent, label = np.empty((active, K), dtype=np.int64), np.empty((active, K), dtype=np.int64)
        self.ext.frame(ints, floats, self.arrays, scores, beam_ints, lp, dist, slot, word_lnp, out_scores, out_ints,
                       parent, label, pend)
        if pool is not None:
            pend = pend.reshape(-1, 2)  # (A * K, 2): the (LM row, token) a kept beam reads; -1: none
            i = np.flatnonzero(pend[:, 0] >= 0)
            if len(i):  # new rows, made together (search.py's extend_lm)
                rows = pool.add_pairs(torch.from_numpy(pend[i, 0]), torch.from_numpy(pend[i, 1]))
                out_ints.reshape(-1, out_ints.shape[-1])[i, ROW] = rows.numpy()
        scores[:active], beam_ints[:active] = out_scores, out_ints
        return b, torch.from_numpy(parent), torch.from_numpy(label)

    def _outputs(self, scores: np.ndarray, beam_ints: np.ndarray, active: int) -> tuple[np.ndarray, ...]:
        """The step's outputs for `active` utterances: scores (A, K, 3), ints (A, K, W), pend (A, K, 2), views of
        buffers made once for the batch's beams and reused every frame."""
        if self.out is None or self.out[0].shape != scores.shape or self.out[1].shape != beam_ints.shape:
            U, K = scores.shape[:2]
            self.out = (np.empty_like(scores), np.empty_like(beam_ints), np.empty((U, K, 2), dtype=np.int64))
        return tuple(x[:active] for x in self.out)

    def _read_lm(self, b: Beams, lp: np.ndarray, active: int, ints: tuple, floats: tuple) -> tuple:
        """What the step reads of the LM, read first: the pool's rows and their slots (dist, slot), or from a sparse
        pool the score of each beam's partial word if it ends, (A * K,) 0 where it may not (word_lnp)."""
        t, pool = self.t, self.t.pool
        if not t.word_level:  # token level: the rows of every live beam
            pool.read_rows(b.row[:active][b.alive[:active]])
        else:  # the pairs the frame may score (a word ends)
            rows, tokens, index, pair = self._wanted(b, lp, active, ints, floats)
            if pool.sparse:
                word_lnp = np.zeros(active * t.cfg.beam_width)
                if len(index):
                    word_lnp[index] = pool.logp(rows, tokens).numpy()[pair]
                return None, None, word_lnp
            pool.read_rows(rows)
        return pool.dist.numpy(), pool.slot.numpy(), None

    def _wanted(self, b: Beams, lp: np.ndarray, active: int, ints: tuple,
                floats: tuple) -> tuple[Tensor, Tensor, np.ndarray, np.ndarray]:
        """The (LM row, word) pairs the frame may score, rows (N,) and words (N,), and the beams that read them,
        u * K + k (M,), each reading pair[i] (M,): the live beams with a partial word in utterances where a label
        that ends a word is tried (_search.cpp's wanted); in most frames of most utterances there is none."""
        size = active * self.t.cfg.beam_width
        if len(self.want) < 4 * size:
            self.want = np.empty(4 * size, dtype=np.int64)
        rows, tokens, index, pair = (self.want[i * size : (i + 1) * size] for i in range(4))
        n, m = self.ext.wanted(ints, floats, self.arrays, b.scores.numpy(), b.ints.numpy(), lp, rows, tokens, index,
                               pair)
        return torch.from_numpy(rows[:n]), torch.from_numpy(tokens[:n]), index[:m], pair[:m]

    def _ints(self) -> tuple:
        t = self.t
        return (len(t.labels), t.cfg.beam_width, t.history, t.labels.blank, t.unk, t.vocab_size, t.word_level,
                t.lexicon is not None, t.hotwords is not None, t.pool is not None, t.prune_history,
                t.bound_by_prefix)

    def _floats(self) -> tuple:
        c, bound = self.t.cfg, self.t.bound
        return (float(c.alpha), float(c.beta), float(c.unk_offset), float(c.token_min_logp), float(c.beam_prune_logp),
                math.inf if bound is None else float(bound), float(self.t.hot_max))
