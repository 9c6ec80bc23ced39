"""Training cross-entropy of a linear output layer, fused for vocabulary-sized outputs.

With V = 61k words and 640 tokens a batch the logits are 156 MB in fp32. Autograd's path (linear, the
upcast autocast needs, log_softmax, nll_loss) writes and reads that matrix about eight times a step: the
upcast copy, log-softmax, its backward, the zero-filled gradient of nll_loss. Once the matmuls run in
bf16 (a CPU with AVX512-BF16, or a GPU) those passes cost more than the matmuls themselves. Here the
logits stay in the matmul's dtype, are reduced to log Z one block of rows at a time (a block stays in
cache), and are overwritten in place by their own gradient, softmax - onehot, in the backward pass.
Losses and gradients equal autograd's to rounding (tests/test_cross_entropy.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

BLOCK = 32  # rows reduced at a time: 32 x 61k fp32 = 7.8 MB, inside a server CPU's L3 cache


class LinearCrossEntropy(torch.autograd.Function):
    """-log softmax(h W^T + b)[target] per row; the (N, V) logits are never upcast as a whole."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor) -> Tensor:
        logits = F.linear(h, weight, bias)  # (N, V): bf16 under autocast, else the parameters' dtype
        acc = torch.promote_types(logits.dtype, torch.float32)  # reductions in fp32 at least (fp64 stays)
        log_z = torch.empty(h.shape[0], dtype=acc, device=h.device)  # (N,)
        for i in range(0, h.shape[0], BLOCK):
            log_z[i:i + BLOCK] = torch.logsumexp(logits[i:i + BLOCK].to(acc), dim=1)
        target_logit = logits.gather(1, targets[:, None]).squeeze(1).to(acc)  # (N,)
        ctx.has_bias = bias is not None
        ctx.save_for_backward(h, weight, targets, logits, log_z)
        return log_z - target_logit  # (N,)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        # the logits are overwritten below: a second backward (retain_graph) fails autograd's version check
        h, weight, targets, logits, log_z = ctx.saved_tensors
        grad = grad.to(log_z.dtype)
        grad_bias = torch.zeros(logits.shape[1], dtype=log_z.dtype, device=h.device) if ctx.has_bias else None
        for i in range(0, h.shape[0], BLOCK):
            rows = slice(i, i + BLOCK)
            p = logits[rows].to(log_z.dtype).sub_(log_z[rows, None]).exp_()  # (c, V) softmax
            p[torch.arange(p.shape[0], device=p.device), targets[rows]] -= 1.0
            p.mul_(grad[rows, None])  # (c, V) dloss/dlogits
            if grad_bias is not None:
                grad_bias += p.sum(0)
            logits[rows] = p
        dz = logits  # (N, V), in the matmul's dtype
        grad_h = dz @ weight.to(dz.dtype)  # (N, H)
        grad_w = dz.t() @ h.to(dz.dtype)  # (V, H)
        return (grad_h.to(h.dtype), grad_w.to(weight.dtype),
                grad_bias.to(weight.dtype) if grad_bias is not None else None, None)


def linear_cross_entropy(h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor) -> Tensor:
    """(N,) training losses of the linear layer (weight (V, H), bias (V,)) on h (N, H) for targets (N,)."""
    return LinearCrossEntropy.apply(h, weight, bias, targets)
