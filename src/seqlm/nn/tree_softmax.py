"""Hierarchical softmax over a Huffman tree of the training counts (Morin & Bengio 2005; Mikolov et al. 2013;
faster-rnnlm's -hs, the output its speed comes from): the words are the leaves of a binary tree, each inner node
n has a vector v_n and a bias c_n, and

    log P(w | h) = sum over the inner nodes n on w's path of log sigmoid(+-(v_n . h + c_n)),

+ where the path turns to the node's second child, - to its first. The two turns at a node sum to one, so the
leaves' probabilities do: the distribution is exact and normalised, and one word costs its path (about log2 of
its inverse frequency: ~10 dot products on PTB) instead of V. Training gathers the paths' rows (nn/nce.py's
GatherDot, compiled), so a step costs O(N log V H); a decoder reads a word from a state at the same price
(nn/readout.py). The interface is nn/softmax.py's.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlm.nn.cross_entropy import upcast
from seqlm.nn.kernels import compiled_for, numpy_view
from seqlm.nn.nce import GatherDot


def huffman_paths(counts: Sequence[int] | Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each word's path from its leaf up to the root of the Huffman tree of `counts` (zero counts as one): inner
    nodes (V, D) (numbered 0..V-2 in the order they are made; 0 past the path), turns (V, D) float (+1: the
    word lies under the node's second child, -1: its first; 0 past the path) and lengths (V,). Ties are broken
    by node number, so the same counts always give the same tree."""
    c = [max(int(x), 1) for x in (counts.tolist() if isinstance(counts, Tensor) else counts)]
    V = len(c)
    parent, turn = np.zeros(max(2 * V - 1, 1), dtype=np.int64), np.zeros(max(2 * V - 1, 1), dtype=np.float32)
    heap = [(x, i) for i, x in enumerate(c)]  # (count, node): leaves 0..V-1, inner node k is V + k
    heapq.heapify(heap)
    made = V
    while len(heap) > 1:
        (ca, a), (cb, b) = heapq.heappop(heap), heapq.heappop(heap)
        parent[a], turn[a], parent[b], turn[b] = made, -1.0, made, 1.0
        heapq.heappush(heap, (ca + cb, made))
        made += 1
    root = made - 1
    node, paths, turns = np.arange(V), [], []
    while (node != root).any():  # one level a pass, every word at once
        up = node != root
        paths.append(np.where(up, parent[node] - V, 0))
        turns.append(np.where(up, turn[node], 0.0))
        node = np.where(up, parent[node], root)
    path = np.stack(paths, 1) if paths else np.zeros((V, 0), dtype=np.int64)  # (V, D)
    sign = np.stack(turns, 1).astype(np.float32) if turns else np.zeros((V, 0), dtype=np.float32)
    return (torch.from_numpy(path).to("cpu"), torch.from_numpy(sign).to("cpu"),
            torch.from_numpy((sign != 0).sum(1)).to("cpu", torch.long))


class TreeSoftmax(nn.Module):
    def __init__(self, hidden: int, counts: Sequence[int] | Tensor) -> None:
        super().__init__()
        path, sign, length = huffman_paths(counts)  # (V, D), (V, D), (V,)
        self.hidden, self.vocab_size = hidden, len(length)
        # zeros: every turn 1/2 at first, so the model starts as the code's unigram model (2^-length)
        self.weight = nn.Parameter(torch.zeros(max(self.vocab_size - 1, 1), hidden))  # (V - 1, H) inner nodes
        self.bias = nn.Parameter(torch.zeros(max(self.vocab_size - 1, 1)))  # (V - 1,)
        self.register_buffer("path", path)
        self.register_buffer("sign", sign)
        self.register_buffer("length", length)

    def target_log_probs(self, h: Tensor, targets: Tensor) -> Tensor:
        """(N,) log P(targets | h): each target's path, its rows gathered (GatherDot)."""
        fused = self._fused(h, None, targets)
        return self._gathered(h, targets) if fused is None else fused

    def _gathered(self, h: Tensor, targets: Tensor) -> Tensor:
        """target_log_probs through GatherDot: autograd, and every dtype and device."""
        s = GatherDot.apply(h, self.weight, self.bias, self.path[targets], self.length[targets])  # (N, D)
        sign = self.sign[targets].to(s.dtype)  # (N, D) 0 past the path
        return (F.logsigmoid(sign * s) * (sign != 0)).sum(1)  # (N,)

    def loss(self, h: Tensor, targets: Tensor) -> Tensor:
        return -self.target_log_probs(h, targets)  # (N,)

    def log_probs(self, h: Tensor) -> Tensor:
        """(N, V) every word's log P, from all inner nodes' scores (N, V - 1) once, a tree level at a time."""
        s = upcast(F.linear(h, self.weight, self.bias))  # (N, V - 1)
        out = s.new_zeros(h.shape[0], self.vocab_size)  # (N, V)
        for d in range(self.path.shape[1]):
            sign = self.sign[:, d].to(s.dtype)  # (V,)
            out += F.logsigmoid(sign * s[:, self.path[:, d]]) * (sign != 0)  # (N, V)
        return out

    def pair_log_probs(self, h: Tensor, rows: Tensor, targets: Tensor, memo: dict | None = None) -> Tensor:
        """(N,) log P(targets[i] | h[rows[i]]), h (B, H): a path each (`memo` unused: ClassSoftmax's interface)."""
        fused = self._fused(h, rows, targets)
        return self._gathered(h[rows], targets) if fused is None else fused

    def _fused(self, h: Tensor, rows: Tensor | None, targets: Tensor) -> Tensor | None:
        """At inference in float32 on the CPU, the word scores in one compiled pass (a decoder asks for ~20 at a
        time, where the tensors between GatherDot and the sum cost more than the dot products); else None."""
        if torch.is_grad_enabled() and (h.requires_grad or self.weight.requires_grad):
            return None
        kernel = compiled_for(h, self.weight, self.bias, self.sign)
        if kernel is None or self.path.shape[1] == 0:
            return None
        out = torch.empty(targets.shape[0], dtype=torch.float32)  # (N,)
        rows = None if rows is None else rows.long()
        buffers = map(numpy_view, (h, self.weight, self.bias, self.path, self.sign, rows, targets.long(), out))
        kernel.tree_pairs(*buffers, self.hidden, self.path.shape[1])
        return out
