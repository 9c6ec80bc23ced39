"""The autoencoding function c(s) of discrete-autoencoders.txt (Sec. 2.3): a sequence of vectors s (B, T, D)
shortened K = 2^k times, then discretised.

One step halves the length: 3 x [conv1d kernel 3 (zero "SAME" padding), LayerNorm, ReLU] with a residual
around them, then a conv1d of kernel 2 and stride 2. The local variant keeps only the strided convolutions,
so symbol j is computed from exactly its own K inputs s[jK : (j+1)K]. After k steps, s' goes through the
bottleneck: c(s) = bottleneck(s'). For the first `pretrain_steps` training steps c(s) = s' (the paper's side
path without discretisation: the convolutions learn with a clear gradient before the bottleneck cuts it).

Lengths: s is zero-padded to a multiple of K; padding of shorter rows in a batch is kept at zero after every
layer, so a sentence's code does not depend on what it is batched with. A sentence of T positions has
ceil(T / K) symbols.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class HalvingStep(nn.Module):
    def __init__(self, d_model: int, local: bool):
        super().__init__()
        self.convs = nn.ModuleList() if local else nn.ModuleList(nn.Conv1d(d_model, d_model, 3, padding=1)
                                                                 for _ in range(3))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in self.convs)
        self.down = nn.Conv1d(d_model, d_model, 2, stride=2)

    def forward(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, T, D) with T even, mask (B, T) -> (B, T/2, D), (B, T/2)."""
        keep = mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        h = x
        for conv, norm in zip(self.convs, self.norms, strict=True):
            h = F.relu(norm(conv(h.transpose(1, 2)).transpose(1, 2))) * keep  # (B, T, D)
        if len(self.convs):
            x = x + h
        half = mask.view(mask.shape[0], -1, 2).any(-1)  # (B, T/2) a symbol with any real input is real
        return self.down(x.transpose(1, 2)).transpose(1, 2) * half.unsqueeze(-1).to(x.dtype), half


class Compress(nn.Module):
    """s (B, T, D), mask (B, T) -> (c(s) dense (B, M, D), symbols (B, M), symbol mask (B, M)), M = ceil(T / K)."""

    def __init__(self, d_model: int, k: int, bottleneck: nn.Module, local: bool = False, pretrain_steps: int = 0):
        super().__init__()
        self.K, self.pretrain_steps = 2**k, pretrain_steps
        self.steps_ = nn.ModuleList(HalvingStep(d_model, local) for _ in range(k))
        self.bottleneck = bottleneck
        self.register_buffer("trained", torch.zeros((), dtype=torch.long))  # training steps seen (side path)

    def shorten(self, s: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """s' (B, M, D) and its mask (B, M): the k halving steps."""
        pad = -s.shape[1] % self.K
        x = F.pad(s, (0, 0, 0, pad)) * F.pad(mask, (0, pad)).unsqueeze(-1).to(s.dtype)  # (B, M*K, D)
        m = F.pad(mask, (0, pad))  # (B, M*K)
        for step in self.steps_:
            x, m = step(x, m)
        return x, m

    def forward(self, s: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        short, m = self.shorten(s, mask)  # (B, M, D)
        dense, symbols = self.bottleneck(short)
        if self.training:
            self.trained += 1
            if int(self.trained) <= self.pretrain_steps:
                dense = short + 0.0 * dense  # the side path: no discretisation yet (the bottleneck still gets
                # a zero gradient: data-parallel training wants every parameter in the graph)
        return dense * m.unsqueeze(-1).to(dense.dtype), symbols.masked_fill(~m, 0), m
