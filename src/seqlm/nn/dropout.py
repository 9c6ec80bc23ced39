"""Dropout with a mask from random bytes, for the CPU.

torch's CPU dropout draws a float per element (`bernoulli_`): 17 ms for the 2M elements of a (512, 20, 200)
batch on one core, 25 ms with the scaling, where the RNN's whole training step takes about 60 ms (bench/
rnn_speed.py; its two dropouts, forward and backward, nearly halved its words per second). Here an element
is kept where a random byte is below k = round((1 - p) 256), 64 random bits drawn per int64: p is rounded to
a multiple of 1/256 (0.25 exactly; 0.3 becomes 77/256 = 0.3008), the kept elements scaled by 256 / k, so the
expectation is the input's, as torch's. On other devices, and at p = 0 or in evaluation, torch's own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ByteDropout(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.keep = round((1.0 - p) * 256)  # a byte below this keeps its element: 0..256

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        if x.device.type != "cpu" or self.keep in (0, 256):
            return F.dropout(x, self.p, True)
        n = x.numel()
        words = torch.empty((n + 7) // 8, dtype=torch.int64).random_(-(2**63), 2**63 - 1)  # (W,) 64 random bits
        random = words.view(torch.uint8)[:n].view(x.shape)  # (...) a uniform byte an element
        return x * (random < self.keep).to(x.dtype).mul_(256.0 / self.keep)

    def extra_repr(self) -> str:
        return f"p={self.p}, kept below byte {self.keep}"
