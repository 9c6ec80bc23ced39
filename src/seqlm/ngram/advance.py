"""Whole-vocabulary next-word distributions of a back-off n-gram model as torch tensors, on CPU or CUDA:
what `NGramModel.advance` computes for a decoder's B prefixes at once.

The model's tables become tensors on one device. Keys are sorted by (prefix id, word), so the n-grams of
order k + 1 that continue a context c of order k are one contiguous run, `first[k][c] : first[k][c + 1]`
(a CSR row: one gather instead of two binary searches). For the B rows, with ctx[:, k - 1] the id of the
last k words at order k (-1 where they are not listed, back-off 0):

    ln p(w | h) = ln p(the longest listed n-gram h' w) + the back-offs of the contexts of h longer than h'

which is the ARPA rule unrolled. So one dense pass writes every row's unigram term plus all its back-offs;
then, order by order from the lowest, the n-grams continuing each row's context overwrite their words
with their own probability plus the back-offs of the longer contexts. The loop is over orders only; rows
and words are tensor indices.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from seqlm.ngram.native import extension

LN10 = math.log(10.0)


class NGramTensors:
    """An NGramModel's tables on `device`, natural logs in `dtype` (float32: what KenLM sums in)."""

    def __init__(self, model, device: torch.device, dtype: torch.dtype = torch.float32):
        V, self.order, self.device = len(model.vocab), model.order, device
        self.V, self.bos = V, model.vocab.bos_id
        self.keys = [_tensor(k, device) for k in model.keys]  # (M_k,) int64, sorted
        self.words = [_tensor(k % V, device) for k in model.keys]  # (M_k,) each n-gram's last word
        self.logp = [_tensor(p.astype(np.float64) * LN10, device, dtype) for p in model.log10_prob]
        self.backoff = [_tensor(b.astype(np.float64) * LN10, device, dtype) for b in model.log10_backoff]
        # first[k - 1][c]: where the order-(k+1) n-grams continuing the order-k context c begin, c = 0..M_k
        self.first = [_tensor(np.searchsorted(model.keys[k], np.arange(len(model.keys[k - 1]) + 1) * V), device)
                      for k in range(1, self.order)]
        self._compiled = extension() if device.type == "cpu" else None
        self._orders = tuple((self.words[k].numpy(), self.logp[k].numpy(), _nth(self.backoff, k, dtype).numpy(),
                              _nth(self.first, k, torch.long).numpy())
                             for k in range(self.order)) if self._compiled is not None else ()

    def find(self, k: int, context: Tensor, words: Tensor) -> Tensor:
        """Id at order k of the n-gram (context, word), context an id at order k - 1; -1 where absent."""
        keys = self.keys[k - 1]
        ok = (context >= 0) & (words >= 0)
        if len(keys) == 0:
            return torch.full_like(context, -1)
        query = context * self.V + words
        at = torch.searchsorted(keys, query).clamp_(max=len(keys) - 1)
        return torch.where(ok & (keys[at] == query), at, -1)

    def context_ids(self, window: Tensor) -> Tensor:
        """(B, N-1) ids at orders 1..N-1 of each row's last 1..N-1 words, from the window of its last N-1
        words (oldest first, -1 = none). The k-gram ending at a position extends the (k-1)-gram ending just
        before it, so each order is one lookup over the positions that still have room for it."""
        if window.shape[1] == 0:
            return window  # a unigram model reads no context
        ids = window  # (B, L) at order 1 a word is its own id
        last = [ids[:, -1]]
        for k in range(2, window.shape[1] + 1):
            ids = self.find(k, ids[:, :-1], window[:, k - 1 :])  # (B, L - k + 1) k-grams ending there
            last.append(ids[:, -1])
        return torch.stack(last, dim=1)  # (B, L)

    def distribution(self, ctx: Tensor) -> Tensor:
        """(B, V) ln p(w | context) for every word w (<s>: -inf); ctx (B, K) as in the module
        docstring, K <= N - 1 (a shorter context: the columns it lacks are -1)."""
        B, K = ctx.shape
        bo = torch.stack([_take(self.backoff[k], ctx[:, k]) for k in range(K)], 1) if K else ctx.new_zeros(B, 0)
        tail = torch.zeros(B, K + 1, dtype=self.logp[0].dtype, device=ctx.device)  # (B, K + 1)
        tail[:, :K] = bo.flip(1).cumsum(1).flip(1)  # tail[:, k]: back-offs of the contexts of order > k
        logp = tail[:, :1] + self.logp[0]  # (B, V) every word backed off to its unigram
        flat, rows = logp.view(-1), torch.arange(B, device=ctx.device) * self.V  # (B,) where each row begins
        for k in range(1, K + 1):  # the n-grams of order k + 1 continuing each row's order-k context
            c = ctx[:, k - 1].clamp(min=0)  # (B,)
            lo = self.first[k - 1][c]  # (B,)
            n = torch.where(ctx[:, k - 1] >= 0, self.first[k - 1][c + 1] - lo, 0)  # (B,)
            total = int(n.sum())
            if total == 0:
                continue
            row = torch.repeat_interleave(n, output_size=total)  # (E,) the row of each continuation
            start = lo - n.cumsum(0) + n  # (B,) its id at order k + 1 less its place among the E
            entry = torch.arange(total, device=ctx.device).add_(start.index_select(0, row))  # (E,)
            at = rows.index_select(0, row).add_(self.words[k].index_select(0, entry))  # (E,) into (B * V,)
            flat.index_copy_(0, at, self.logp[k].index_select(0, entry).add_(tail[:, k].index_select(0, row)))
        logp[:, self.bos] = -torch.inf  # <s> is context only
        return logp

    def advance(self, window: Tensor) -> Tensor:
        """(B, V) ln p of the next word after each window of the last N-1 words read: on the CPU by one
        compiled call where it is built (ngram/_dense.cpp, the same rule and sums), else as tensors."""
        window = window.to(self.device)
        if self._compiled is None:
            return self.distribution(self.context_ids(window))
        out = torch.empty((len(window), self.V), dtype=self.logp[0].dtype)  # (B, V)
        self._compiled.dense_rows(window.to(torch.long).contiguous().numpy(), out.numpy(), self._orders, self.bos)
        return out

    def targets(self, window: Tensor, words: Tensor) -> Tensor:
        """(B,) advance(window)[b, words[b]]: on the CPU one compiled lookup a row (the longest listed n-gram,
        not the whole row), else gathered from the tensor rows."""
        window, words = window.to(self.device, torch.long), words.to(self.device, torch.long)
        if self._compiled is None:
            return self.distribution(self.context_ids(window)).gather(1, words.view(-1, 1)).squeeze(1)
        out = torch.empty(len(window), dtype=self.logp[0].dtype)  # (B,)
        self._compiled.dense_pairs(window.contiguous().numpy(), words.contiguous().numpy(), out.numpy(),
                                   self._orders, self.bos)
        return out


def shift_windows(window: Tensor, rows: Tensor, tokens: Tensor) -> Tensor:
    """The windows of rows `rows` (R,) after reading tokens (R,): the oldest word drops out."""
    window = window.index_select(0, rows.to(window.device))  # (R, N-1)
    if window.shape[1] == 0:
        return window
    return torch.cat([window[:, 1:], tokens.to(window.device, torch.long).view(-1, 1)], dim=1)  # (R, N-1)


def _nth(tables: list[Tensor], k: int, dtype: torch.dtype) -> Tensor:
    """tables[k], or an empty table where the list is shorter (the top order has no back-offs, no runs)."""
    return tables[k] if k < len(tables) else torch.zeros(0, dtype=dtype)


def _take(values: Tensor, ids: Tensor) -> Tensor:
    """values[ids] where ids >= 0, else 0 (also when the order has no entries)."""
    if len(values) == 0:
        return torch.zeros(ids.shape, dtype=values.dtype, device=ids.device)
    return torch.where(ids >= 0, values[ids.clamp(min=0)], 0.0)


def _tensor(a: np.ndarray, device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
    """A copy on `device` (the model's arrays may be read-only memory maps)."""
    return torch.tensor(np.ascontiguousarray(a), dtype=dtype, device=device)
