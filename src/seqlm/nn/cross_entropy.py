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


def upcast(x: Tensor) -> Tensor:
    """float32 for half-precision tensors (autocast), unchanged for float32/float64."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


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


def _groups(tgt_class: Tensor, num_classes: int, pad: int) -> tuple[Tensor, ...]:
    """Tokens grouped by target class, each group starting at a multiple of `pad` rows: (order (N,): the
    tokens in group order, their classes (N,), rows per group (C,), each group's first row (C,), each
    grouped token's row (N,))."""
    sorted_class, order = torch.sort(tgt_class, stable=True)  # (N,), (N,)
    counts = torch.bincount(sorted_class, minlength=num_classes)  # (C,)
    padded = (counts + pad - 1) // pad * pad  # (C,)
    starts = torch.cumsum(padded, 0) - padded  # (C,)
    rank = torch.arange(tgt_class.shape[0], device=tgt_class.device) - (torch.cumsum(counts, 0) - counts)[sorted_class]
    return order, sorted_class, padded, starts, starts[sorted_class] + rank


def linear_cross_entropy(h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor) -> Tensor:
    """(N,) training losses of the linear layer (weight (V, H), bias (V,)) on h (N, H) for targets (N,)."""
    return LinearCrossEntropy.apply(h, weight, bias, targets)


class ClassCrossEntropy(torch.autograd.Function):
    """-log P(c(w)|h) - log P(w|c(w),h) per row for nn/class_softmax.py's ClassSoftmax, its gradient prepared
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

        order, sorted_class, padded, starts, pos = _groups(tgt_class, len(class_sizes),
                                                           ClassCrossEntropy.group_pad(mm, acc))
        hs = h_mm.new_zeros(int(padded.sum()), h.shape[1]).index_copy_(0, pos, h_mm[order])  # (P, H) grouped
        # every group's (rows, |c|) log-softmax is a view of one flat buffer D, so that reading the
        # targets' entries, exp and subtracting the onehot are single operations over all classes
        sizes = torch.tensor(class_sizes, device=h.device)  # (C,)
        used = (padded > 0) & (sizes > 1)  # (C,) one-word classes have P(w|c) = 1: nothing to compute
        elems = torch.where(used, padded * sizes, 0)  # (C,)
        offsets = torch.cumsum(elems, 0) - elems  # (C,) where each group's block starts in D
        local = word_to_row[targets[order]] - class_start[sorted_class]  # (N,) target's row within its class
        flat = offsets[sorted_class] + (pos - starts[sorted_class]) * sizes[sorted_class] + local  # (N,)
        n_elems = int(elems.sum())
        flat = torch.where(used[sorted_class], flat, n_elems)  # (N,) one-word classes: a spare last entry
        D = torch.empty(n_elems + 1, dtype=acc, device=h.device)  # (E + 1,) the groups below fill all but the spare
        D[-1] = 0.0
        groups, first = [], 0
        for n, size, start, off in zip(padded.tolist(), class_sizes, starts.tolist(), offsets.tolist()):
            if n and size > 1:
                tok, wrow = slice(start, start + n), slice(first, first + size)
                logits = torch.addmm(wb[wrow], hs[tok], ww[wrow].t())  # (n, |c|)
                torch.log_softmax(logits, 1, dtype=acc, out=D[off:off + n * size].view(n, size))
                groups.append((tok, wrow, off))
            first += size
        loss.index_add_(0, order, -D[flat])  # -log P(w|c,h); 0 for one-word classes
        D.exp_().index_put_((flat,), torch.tensor(-1.0, dtype=acc), accumulate=True)  # softmax - onehot
        ctx.groups = groups
        ctx.save_for_backward(h_mm, hs, order, pos, d_class, class_w, ww, D)
        ctx.dtypes = (h.dtype, class_w.dtype, word_w.dtype)
        return loss  # (N,)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        h_mm, hs, order, pos, d_class, class_w, ww, D = ctx.saved_tensors
        h_dt, cw_dt, ww_dt = ctx.dtypes
        mm, grad = h_mm.dtype, grad.to(d_class.dtype)
        d_class.mul_(grad[:, None])  # (N, C)
        dc = d_class.to(mm)
        grad_h = (dc @ class_w.to(mm)).to(d_class.dtype)  # (N, H)
        grad_cw, grad_cb = dc.t() @ h_mm, d_class.sum(0)  # (C, H), (C,)
        grad_rows = grad.new_zeros(hs.shape[0]).index_copy_(0, pos, grad[order])  # (P,) 0 on padding
        grad_hs = torch.zeros(hs.shape, dtype=mm, device=hs.device)  # (P, H)
        grad_ww = torch.zeros(ww.shape, dtype=mm, device=ww.device)  # (V, H) in row order
        grad_wb = torch.zeros(ww.shape[0], dtype=D.dtype, device=ww.device)  # (V,)
        for tok, wrow, off in ctx.groups:
            n, size = tok.stop - tok.start, wrow.stop - wrow.start
            d = D[off:off + n * size].view(n, size).mul_(grad_rows[tok, None])  # (n, |c|) dloss/dlogits
            torch.sum(d, 0, out=grad_wb[wrow])
            d = d.to(mm)
            torch.mm(d, ww[wrow], out=grad_hs[tok])
            torch.mm(d.t(), hs[tok], out=grad_ww[wrow])
        grad_h.index_add_(0, order, grad_hs[pos].to(grad_h.dtype))
        return (grad_h.to(h_dt), grad_cw.to(cw_dt), grad_cb.to(cw_dt), grad_ww.to(ww_dt), grad_wb.to(ww_dt),
                None, None)
