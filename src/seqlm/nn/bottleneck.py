"""Discretisation bottlenecks of discrete-autoencoders.txt (Kaiser & Bengio 2018, Sec. 2.1): a dense vector in,
a discrete symbol out (b bits, an integer in [0, 2^b)), and the dense vector the rest of the network reads.

Both modules map (..., d_model) -> (dense (..., d_model), symbols (...,) int64) and count their own training
steps in a buffer (saved and resumed with the weights), so annealing needs nothing from the training loop.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def saturating_sigmoid(x: Tensor) -> Tensor:
    """max(0, min(1, 1.2 sigmoid(x) - 0.1)) (Kaiser & Sutskever 2016): reaches 0 and 1 exactly."""
    return torch.clamp(1.2 * torch.sigmoid(x) - 0.1, 0.0, 1.0)


def bits_to_symbols(bits: Tensor) -> Tensor:
    """(..., b) of 0/1 -> (...,) int64, bit i worth 2^i."""
    weights = 2 ** torch.arange(bits.shape[-1], device=bits.device)  # (b,)
    return (bits.long() * weights).sum(-1)


def symbols_to_bits(symbols: Tensor, b: int) -> Tensor:
    """(...,) int64 -> (..., b) float 0/1, the inverse of bits_to_symbols."""
    return ((symbols.unsqueeze(-1) >> torch.arange(b, device=symbols.device)) & 1).float()


class Decompress(nn.Module):
    """The paper's way back from bits to a dense vector: relu(dense(v) + dense(1 - v)) -> relu(dense) -> dense.
    A large filter lets it "recover from the discretization bottleneck" (paper: 4096 for d_model 512)."""

    def __init__(self, bits: int, filter_size: int, d_model: int):
        super().__init__()
        self.h1a = nn.Linear(bits, filter_size)
        self.h1b = nn.Linear(bits, filter_size)
        self.h2 = nn.Linear(filter_size, filter_size)
        self.out = nn.Linear(filter_size, d_model)

    def forward(self, v: Tensor) -> Tensor:
        h = F.relu(self.h1a(v) + self.h1b(1.0 - v))  # (..., filter)
        return self.out(F.relu(self.h2(h)))  # (..., d_model)


class SemanticHashing(nn.Module):
    """Improved semantic hashing. v = dense(w, b); in training v_n = v + N(0, noise_std^2), at evaluation v_n = v.
    v1 = saturating_sigmoid(v_n) (soft), v2 = 1[v_n > 0] (the bits; the paper's text writes `< 0`, the sign
    convention is free). Training feeds v2 forward in `hard_fraction` of the cases and v1 in the others, the
    gradient always through v1 (straight-through: v2 + v1 - stop_gradient(v1)). Evaluation feeds v2.

    Where the paper is silent, chosen here: the soft/hard choice is drawn per sequence (a row of the batch, all
    its symbols alike), as the authors' public implementation drew it per example; the hard fraction is the
    paper's fixed 1/2 from the first step (that implementation ramped it up to 1/2 over the first steps);
    `hard_warmup` > 0 ramps it up linearly over that many steps instead.

    `balance` (not in the paper) normalises each bit's pre-activation over the batch (zero mean, unit
    variance, a learned per-bit scale; running statistics at evaluation), so no bit can sit at a constant
    value. Without it, small models on this CPU were measured to collapse the code: the training noise
    costs the decoder before the code is of any use to it, and saturating every bit to a constant removes
    the noise (issue 12: 4-5 distinct symbols over 57k on character-level PTB).
    """

    def __init__(self, d_model: int, bits: int, filter_size: int, noise_std: float = 1.0, hard_fraction: float = 0.5,
                 hard_warmup: int = 0, balance: bool = False):
        super().__init__()
        self.bits, self.noise_std, self.hard_fraction, self.hard_warmup = bits, noise_std, hard_fraction, hard_warmup
        self.proj = nn.Linear(d_model, bits)
        # per-bit batch statistics without a shift (a learned shift could make a bit constant again)
        self.norm = nn.BatchNorm1d(bits, affine=False) if balance else None
        self.scale = nn.Parameter(torch.ones(bits)) if balance else None
        self.decompress = Decompress(bits, filter_size, d_model)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def discretise(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """(the vector the decompression reads (B, M, b), the bits v2 (B, M, b)) for w (B, M, d_model)."""
        v = self.proj(w).float()  # (B, M, b)
        if self.norm is not None:
            v = self.norm(v.reshape(-1, self.bits)).view_as(v) * self.scale  # (B, M, b) balanced bits
        if self.training and self.noise_std > 0:
            v = v + self.noise_std * torch.randn_like(v)
        v1 = saturating_sigmoid(v)
        v2 = (v > 0).float()
        if not self.training:
            return v2, v2
        fraction = self.hard_fraction * min(1.0, int(self.steps) / self.hard_warmup) if self.hard_warmup else \
            self.hard_fraction
        self.steps += 1
        straight_through = v2 + (v1 - v1.detach())  # value exactly v2, gradient of v1
        hard = torch.rand(v.shape[0], *([1] * (v.dim() - 1)), device=v.device) < fraction  # (B, 1, 1)
        return torch.where(hard, straight_through, v1), v2

    def forward(self, w: Tensor) -> tuple[Tensor, Tensor]:
        vd, v2 = self.discretise(w)
        return self.decompress(vd.to(w.dtype)), bits_to_symbols(v2)

    def embed_symbols(self, symbols: Tensor) -> Tensor:
        """The dense vectors of given symbols (decoding from a c(s) given by hand)."""
        return self.decompress(symbols_to_bits(symbols, self.bits).to(self.proj.weight.dtype))


class GumbelBottleneck(nn.Module):
    """Gumbel-softmax over 2^b symbols (Jang et al. 2016): logits l = dense(w, 2^b); in training
    y = softmax((log_softmax(l) + g) / tau), g = -log(-log u), and the output is y times an embedding matrix;
    at evaluation the argmax symbol's embedding. tau is annealed per training step:
    tau = max(tau_min, tau_start * exp(-anneal_rate * step)).
    """

    def __init__(self, d_model: int, bits: int, tau_start: float = 1.0, tau_min: float = 0.1,
                 anneal_rate: float = 1e-3):
        super().__init__()
        self.bits, self.tau_start, self.tau_min, self.anneal_rate = bits, tau_start, tau_min, anneal_rate
        self.proj = nn.Linear(d_model, 2**bits)
        self.embed = nn.Embedding(2**bits, d_model)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    @property
    def temperature(self) -> float:
        return max(self.tau_min, self.tau_start * math.exp(-self.anneal_rate * int(self.steps)))

    def forward(self, w: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.proj(w).float()  # (B, M, 2^b)
        symbols = logits.argmax(-1)  # (B, M)
        if not self.training:
            return self.embed(symbols), symbols
        u = torch.rand_like(logits).clamp_(1e-9, 1.0 - 1e-9)
        y = torch.softmax((F.log_softmax(logits, -1) - torch.log(-torch.log(u))) / self.temperature, -1)
        self.steps += 1
        return (y.to(self.embed.weight.dtype) @ self.embed.weight).to(w.dtype), symbols  # (B, M, d_model)

    def embed_symbols(self, symbols: Tensor) -> Tensor:
        return self.embed(symbols)
