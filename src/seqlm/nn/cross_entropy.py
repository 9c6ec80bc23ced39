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


class ClassCrossEntropy(torch.autograd.Function):
    """-log P(c(w)|h) - log P(w|c(w),h) per row for nn/softmax.py's ClassSoftmax, its gradient prepared
    in the forward pass.

    Autograd's path builds a log-softmax, a loss and a split node per class (about 100 a step), each
    with its own zero-filled gradient and upcast copies, and assembles the (V, H) weight gradient from
    the pieces: at H = 200 those passes cost as much as the matmuls. Here each class's (n_c, |c|)
    softmax - onehot is kept from the forward pass and the backward pass only scales it by the incoming
    gradient and runs the two matmuls per class. Under autocast (bf16) every product runs in its dtype,
    and each class's group of tokens is padded to a multiple of PAD rows: oneDNN builds a bf16 kernel
    for every new matrix shape (milliseconds each), and with unpadded groups every batch brings new
    ones. Padded rows get a zero gradient. Equal to autograd's to rounding (tests/test_cross_entropy.py).
    """

    PAD = 64

    @staticmethod
    def group_pad(mm: torch.dtype, acc: torch.dtype) -> int:
        """Rows a class's group is padded to a multiple of: PAD for low-precision products, else 1."""
        return 1 if mm == acc else ClassCrossEntropy.PAD

    @staticmethod
    def forward(ctx, h: Tensor, class_w: Tensor, class_b: Tensor, word_w: Tensor, word_b: Tensor,
                targets: Tensor, layout: tuple) -> Tensor:
        dev = h.device.type
        mm = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype  # matmul dtype
        with torch.autocast(dev, enabled=False):  # the dtypes are chosen here, explicitly
            return ClassCrossEntropy._forward(ctx, h, class_w, class_b, word_w, word_b, targets, layout, mm)

    @staticmethod
    def _forward(ctx, h: Tensor, class_w: Tensor, class_b: Tensor, word_w: Tensor, word_b: Tensor,
                 targets: Tensor, layout: tuple, mm: torch.dtype) -> Tensor:
        word_class, word_to_row, class_start, class_sizes = layout  # class_sizes: a python list
        acc = torch.promote_types(mm, torch.float32)  # softmaxes in fp32 at least (fp64 stays)
        tgt_class = word_class[targets]  # (N,)
        rows = torch.arange(h.shape[0], device=h.device)  # (N,)
        h_mm, ww, wb = h.to(mm), word_w.to(mm), word_b.to(mm)
        d_class = torch.addmm(class_b.to(mm), h_mm, class_w.to(mm).t()).to(acc).log_softmax(1)  # (N, C)
        loss = -d_class[rows, tgt_class]  # (N,) -log P(c|h)
        d_class.exp_()[rows, tgt_class] -= 1.0  # (N, C) softmax - onehot

        # tokens grouped by target class (one matmul per class against its contiguous weight slice),
        # each group starting at a multiple of `pad` rows of hs
        sorted_class, order = torch.sort(tgt_class, stable=True)  # (N,), (N,)
        counts = torch.bincount(sorted_class, minlength=len(class_sizes))  # (C,)
        pad = ClassCrossEntropy.group_pad(mm, acc)
        padded = (counts + pad - 1) // pad * pad  # (C,)
        shift = torch.cumsum(padded - counts, 0) - (padded - counts)  # (C,) rows of padding before each group
        pos = rows + shift[sorted_class]  # (N,) row of each grouped token in hs
        total = int(padded.sum())
        hs = h_mm.new_zeros(total, h.shape[1]).index_copy_(0, pos, h_mm[order])  # (P, H)
        local = torch.zeros(total, dtype=torch.long, device=h.device)  # (P,) target's row within its class
        local[pos] = word_to_row[targets[order]] - class_start[sorted_class]
        word_loss = torch.zeros(total, dtype=acc, device=h.device)  # (P,) 0 for one-word classes
        ar_all = torch.arange(total, device=h.device)  # (P,) a group may be longer than the batch
        groups, start, first = [], 0, 0
        for n, size in zip(padded.tolist(), class_sizes):
            if n and size > 1:
                tok, wrow = slice(start, start + n), slice(first, first + size)
                d = torch.addmm(wb[wrow], hs[tok], ww[wrow].t()).to(acc).log_softmax(1)  # (n, |c|)
                ar = ar_all[:n]
                word_loss[tok] = -d[ar, local[tok]]
                d.exp_()[ar, local[tok]] -= 1.0  # (n, |c|) softmax - onehot
                groups.append((tok, wrow, d))
            start, first = start + n, first + size
        loss.index_add_(0, order, word_loss[pos])
        ctx.groups = groups
        ctx.save_for_backward(h_mm, hs, order, pos, d_class, class_w, ww)
        ctx.dtypes = (h.dtype, class_w.dtype, word_w.dtype)
        return loss  # (N,)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        h_mm, hs, order, pos, d_class, class_w, ww = ctx.saved_tensors
        h_dt, cw_dt, ww_dt = ctx.dtypes
        mm, grad = h_mm.dtype, grad.to(d_class.dtype)
        d_class.mul_(grad[:, None])  # (N, C)
        dc = d_class.to(mm)
        grad_h = (dc @ class_w.to(mm)).to(d_class.dtype)  # (N, H)
        grad_cw, grad_cb = dc.t() @ h_mm, d_class.sum(0)  # (C, H), (C,)
        grad_grouped = grad.new_zeros(hs.shape[0]).index_copy_(0, pos, grad[order])  # (P,) 0 on padding
        grad_hs = torch.zeros(hs.shape, dtype=d_class.dtype, device=hs.device)  # (P, H)
        grad_ww = torch.zeros(ww.shape, dtype=d_class.dtype, device=ww.device)  # (V, H) in row order
        grad_wb = torch.zeros(ww.shape[0], dtype=d_class.dtype, device=ww.device)  # (V,)
        for tok, wrow, d in ctx.groups:
            d.mul_(grad_grouped[tok, None])  # (n, |c|)
            dm = d.to(mm)
            grad_hs[tok] = dm @ ww[wrow]
            grad_ww[wrow] = dm.t() @ hs[tok]
            grad_wb[wrow] = d.sum(0)
        grad_h.index_add_(0, order, grad_hs[pos])
        return (grad_h.to(h_dt), grad_cw.to(cw_dt), grad_cb.to(cw_dt), grad_ww.to(ww_dt), grad_wb.to(ww_dt),
                None, None)
