"""Prefix identities as 64-bit hashes, updated label by label as tensors.

A hash reads a string one symbol at a time: h -> mix(h ^ symbol), mix a multiply by an odd constant (mod 2^64)
and an xor-shift (FNV-1a's scheme with a stronger mixer). A label appends its text character by character, so
a prefix's hash is that of its text whichever labels spelled it (`Symbols.of_strings`); token-level prefixes
append one symbol per label (`Symbols.of_labels`: "th" and "t" + "h" differ). Beams are merged when their
hashes agree: two different prefixes agree with probability about 2^-64.
"""

from __future__ import annotations

import torch
from torch import Tensor

MUL = 0x5851F42D4C957F2D  # odd, below 2^63
LOW32 = 0xFFFFFFFF


def step(h: Tensor, symbol: Tensor) -> Tensor:
    """(E,) hashes h (E,) after reading symbols (E,) (non-negative int64)."""
    h = (h ^ symbol) * MUL  # wraps mod 2^64
    return h ^ ((h >> 29) & 0x7FFFFFFFF)  # a logical shift of the high bits down


class Symbols:
    """The symbols each label appends: codes (L, S), -1 past a label's last."""

    def __init__(self, codes: list[list[int]], device: torch.device):
        width = max(1, max(map(len, codes), default=1))
        self.codes = torch.tensor([c + [-1] * (width - len(c)) for c in codes], dtype=torch.long, device=device)

    @staticmethod
    def of_strings(texts: list[str], device: torch.device) -> Symbols:
        return Symbols([[ord(ch) + 1 for ch in t] for t in texts], device)

    @staticmethod
    def of_labels(count: int, device: torch.device) -> Symbols:
        return Symbols([[(1 << 40) + i] for i in range(count)], device)  # apart from every character's code

    def __call__(self, h: Tensor, label: Tensor) -> Tensor:
        """(E,) the hashes h (E,) after appending the symbols of label (E,)."""
        codes = self.codes.index_select(0, label)  # (E, S)
        for j in range(codes.shape[1]):
            c = codes[:, j]
            h = torch.where(c >= 0, step(h, c), h)  # a label with no text (a space) appends nothing
        return h


SPACE = ord(" ") + 1


def mix(*columns: Tensor) -> Tensor:
    """One int64 key from several int64 columns: equal columns give equal keys; different ones collide with
    probability about 2^-64 when a hash is among them."""
    key = torch.zeros_like(columns[0])
    for col in columns:
        key = step(key, col)
    return key
