"""A pre-norm Transformer decoder block (Vaswani et al. 2017, with the layer norm before each sub-layer as in
GPT-2), attention through `F.scaled_dot_product_attention`, and the key/value cache incremental decoding uses.

Every block returns the keys and values it computed, so a caller can keep them (generation) and feed them back
as `cache`: a query then attends to the cached positions followed by its own.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlm.nn.cross_entropy import upcast
from seqlm.nn.dropout import ByteDropout

KV = tuple[Tensor, Tensor]  # keys and values, each (B, heads, S, head_dim)


def sinusoidal_positions(n: int, dim: int) -> Tensor:
    """(n, dim) the fixed position code of Vaswani et al. (2017), Sec. 3.5: sin on even, cos on odd features."""
    pos = torch.arange(n, dtype=torch.float32).unsqueeze(1)  # (n, 1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))  # (dim/2,)
    out = torch.zeros(n, dim)
    out[:, 0::2] = torch.sin(pos * freq)
    out[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return out


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not a multiple of heads {heads}")
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.drop = ByteDropout(dropout)
        self.attn_drop = ByteDropout(dropout)  # on the attention weights, in training (see _attend_dropped)

    def forward(self, x: Tensor, mask: Tensor | None, cache: KV | None = None) -> tuple[Tensor, KV]:
        """x (B, T, D); mask (B, 1, T, S) True where a query may attend a key (S = cached + T), None = causal."""
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(D, dim=-1))  # each (B, H, T, Dh)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)  # (B, H, S, Dh)
        dropout = self.dropout if self.training else 0.0
        if dropout > 0 and x.device.type == "cpu":
            y = self._attend_dropped(q, k, v, mask)  # (B, H, T, Dh)
        else:  # (a GPU's fused kernels draw their own dropout); with a cache the new queries see every key
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                               is_causal=mask is None and cache is None)  # (B, H, T, Dh)
        y = y.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.drop(self.proj(y)), (k, v)

    def _attend_dropped(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Attention with dropout on its weights, written out, on the CPU: scaled_dot_product_attention's own dropout
        draws a float per weight with torch's bernoulli_ (there, with a mask, it runs these same products anyway),
        ByteDropout a byte (nn/dropout.py): 529 against 653 ms a bf16 step of the 4 x 256 recipe with the other
        dropouts (a throwaway timing). The softmax in float32 at least, as autocast's own would."""
        T, S = q.shape[2], k.shape[2]
        if mask is None:  # causal, the S - T keys before the queries seen by all
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)  # (T, S)
        scores = upcast(q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, T, S)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)  # (B, H, T, S)
        return self.attn_drop(weights).to(v.dtype) @ v  # (B, H, T, Dh)


class Block(nn.Module):
    """x + attention(norm(x)), then x + feed-forward(norm(x)); the feed-forward is d -> d_ff -> d with ReLU
    (the paper's "filter size" is d_ff)."""

    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model), ByteDropout(dropout))

    def forward(self, x: Tensor, mask: Tensor | None, cache: KV | None = None) -> tuple[Tensor, KV]:
        a, kv = self.attn(self.norm1(x), mask, cache)  # (B, T, D)
        x = x + a
        return x + self.ff(self.norm2(x)), kv


def segment_layout(resets: Tensor) -> tuple[Tensor, Tensor]:
    """Positions within each segment (B, L) and the attention mask (B, 1, L, L) of a row of segments.

    A segment starts at column 0 and wherever `resets` is True; a query attends to the keys at or before it
    in its own segment only, so sentences packed into one row never see each other.
    """
    B, L = resets.shape
    col = torch.arange(L, device=resets.device).expand(B, L)  # (B, L)
    starts = resets.clone()
    starts[:, 0] = True
    seg_start = torch.where(starts, col, torch.zeros_like(col)).cummax(dim=1).values  # (B, L)
    seg = starts.long().cumsum(dim=1)  # (B, L) segment number
    same = seg.unsqueeze(2) == seg.unsqueeze(1)  # (B, L, L)
    causal = torch.ones(L, L, dtype=torch.bool, device=resets.device).tril()  # (L, L)
    return col - seg_start, (same & causal).unsqueeze(1)
