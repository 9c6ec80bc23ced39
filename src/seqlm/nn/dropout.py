"""Dropout with a mask from random bytes, for the CPU.

torch's CPU dropout draws a float per element (`bernoulli_`): 17 ms for the 2M elements of a (512, 20, 200)
batch on one core, 25 ms with the scaling, where the RNN's whole training step takes about 60 ms (bench/
rnn_speed.py; its two dropouts, forward and backward, nearly halved its words per second). Here an element
is kept where a random byte is below k = round((1 - p) 256) (compiled splitmix64 bytes, seeded from torch's
generator; torch's own random int64s without the compiled module): p is rounded to
a multiple of 1/256 (0.25 exactly; 0.3 becomes 77/256 = 0.3008), the kept elements scaled by 256 / k, so the
expectation is the input's, as torch's. In float32 the mask is applied in compiled code (nn/_gather_dot.cpp's
byte_mask_mul: one pass over the batch each way, the bytes kept for the backward pass); in other dtypes by
tensors. On other devices, and at p = 0 or in evaluation, torch's own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from seqlm.nn.kernels import compiled_for, numpy_view


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
        random = _random_bytes(x.numel()).view(x.shape)  # (...) a uniform byte an element
        if compiled_for(x) is not None:
            return _MaskBytes.apply(x, random, self.keep)
        return x * (random < self.keep).to(x.dtype).mul_(256.0 / self.keep)

    def extra_repr(self) -> str:
        return f"p={self.p}, kept below byte {self.keep}"


def _random_bytes(n: int) -> Tensor:
    """(n,) uint8 uniform bytes, decided by torch's default generator (so by the seed): one int64 from it seeds
    the compiled splitmix64 stream; without the module, torch's own 64 random bits at a time."""
    kernel = compiled_for()
    if kernel is None:
        words = torch.empty((n + 7) // 8, dtype=torch.int64).random_(-(2**63), 2**63 - 1)  # (W,) 64 random bits
        return words.view(torch.uint8)[:n]
    out = torch.empty(n, dtype=torch.uint8)  # (n,)
    kernel.random_bytes(int(torch.randint(0, 2**62, (1,))), numpy_view(out))
    return out


class _MaskBytes(torch.autograd.Function):
    """x * 256 / keep where the byte is below keep, else 0; the gradient masked the same way."""

    @staticmethod
    def forward(ctx, x: Tensor, random: Tensor, keep: int) -> Tensor:
        ctx.save_for_backward(random)
        ctx.keep = keep
        return _mask(x, random, keep)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        return _mask(grad, ctx.saved_tensors[0], ctx.keep), None, None


def _mask(x: Tensor, random: Tensor, keep: int) -> Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)  # (...) x's shape
    compiled_for(x).byte_mask_mul(numpy_view(x), numpy_view(random), keep, 256.0 / keep, numpy_view(out))
    return out
