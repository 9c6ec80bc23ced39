"""Noise-contrastive estimation for a full output layer, with Z_h = 1 or ZRegression
(Gutmann & Hyvarinen 2012; Chen et al. 2016, sparse-word-representations.txt Sec. 3.4).

The model's unnormalised score of word w after history h is s(w, h) = W_w . h + b_w, and

    log P(w | h) = s(w, h) - log Z_h,   log Z_h = 0 (Z_h = 1)  or  w_Z . h + b_Z (ZRegression, eq. 11).

NCE tells each target from k noise words drawn from P_n = unigram^power (normalised). With
delta(w) = log P(w | h) - log(k P_n(w)) the loss of one position is (eq. 9)

    -log sigmoid(delta(target)) - sum_{j=1..k} log sigmoid(-delta(noise_j)).

Only the target's and the noise words' rows of W are touched: the cost per token is O((k + 1) H), not
O(V H). Noise is drawn once per batch and shared by every position (`sharing="batch"`: one (N, H) x (H, k)
matmul), or k words per position (`"token"`: (N, k, H) gathered rows, costlier; same estimator).
Evaluation never uses this: the output layer normalises exactly (Sec. 3.4, "we explicitly normalize").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from seqlm.nn.kernels import compiled_for, numpy_view
from seqlm.nn.sparse_code import linear_rows


class NCE(nn.Module):
    def __init__(self, hidden: int, counts: Tensor, k: int, power: float, sharing: str, normaliser: str):
        super().__init__()
        self.k, self.sharing = k, sharing
        noise = counts.double().clamp(min=1) ** power  # words never seen still get a little noise mass
        noise = (noise / noise.sum()).float()
        self.register_buffer("noise", noise, persistent=False)  # (V,) from the vocabulary counts
        self.register_buffer("log_k_noise", math.log(k) + noise.log(), persistent=False)  # (V,) log(k P_n(w))
        self.zreg = nn.Linear(hidden, 1) if normaliser == "regression" else None  # log Z_h = w_Z . h + b_Z
        if self.zreg is not None:
            nn.init.zeros_(self.zreg.weight)
            nn.init.zeros_(self.zreg.bias)
        self._stats = torch.zeros(6, dtype=torch.float64)  # n, sum/sumsq of true log Z_h, of predicted, sq. error

    def log_z(self, h: Tensor) -> Tensor:
        """(N,) the normaliser the NCE model assumes: 0, or ZRegression's prediction."""
        if self.zreg is None:
            return h.new_zeros(h.shape[0], dtype=torch.float32)
        return self.zreg(h).squeeze(-1).float()  # (N,)

    def _noise_scores(self, proj: nn.Module, h: Tensor) -> tuple[Tensor, Tensor]:
        """Scores s(noise, h) (N, k) and log(k P_n(noise)) (N, k) of k noise words shared by the batch."""
        ids = torch.multinomial(self.noise, self.k, replacement=True)  # (k,) shared by all positions
        w, b = linear_rows(proj, ids)  # (k, H), (k,)
        return F.linear(h, w, b).float(), self.log_k_noise[ids].expand(h.shape[0], -1)  # (N, k)

    def _scores(self, proj: nn.Module, h: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """s(target, h) (N,), s(noise, h) (N, k) and log(k P_n(noise)) (N, k). Per-token noise: the targets'
        rows and the noise rows in one gather and one bmm, so that the backward pass builds one (V, H)
        gradient of the output matrix, not one for each (a (V, H) zero fill and a sum saved a step)."""
        if self.sharing == "batch":
            w, b = linear_rows(proj, targets)  # (N, H), (N,)
            return ((h * w).sum(-1) + b).float(), *self._noise_scores(proj, h)
        n = h.shape[0]
        noise = torch.multinomial(self.noise, n * self.k, replacement=True).view(n, self.k)  # (N, k)
        ids = torch.cat([targets[:, None], noise], 1)  # (N, 1 + k): the target first
        if isinstance(proj, nn.Linear):
            s = GatherDot.apply(h, proj.weight, proj.bias, ids).float()  # (N, 1 + k)
        else:  # sparse-code rows (CodedLinear): built from the codes, then dotted
            w, b = linear_rows(proj, ids.flatten())  # (N (1 + k), H), (N (1 + k),)
            s = (torch.bmm(w.view(n, self.k + 1, -1), h.unsqueeze(2)).squeeze(2) + b.view(n, -1)).float()
        return s[:, 0], s[:, 1:], self.log_k_noise[noise]

    def loss(self, proj: nn.Module, h: Tensor, targets: Tensor) -> Tensor:
        """(N,) the NCE loss of each position (eq. 9), for the output projection `proj`."""
        s_target, s_noise, log_k_noise = self._scores(proj, h, targets)  # (N,), (N, k), (N, k)
        log_z = self.log_z(h)  # (N,)
        delta_target = s_target - log_z - self.log_k_noise[targets]  # (N,)
        delta_noise = s_noise - log_z.unsqueeze(1) - log_k_noise  # (N, k)
        return -(F.logsigmoid(delta_target) + F.logsigmoid(-delta_noise).sum(1))  # (N,)

    @torch.no_grad()
    def record(self, h: Tensor, logits: Tensor) -> None:
        """Accumulate the true log Z_h (log-sum-exp of the scores) and the assumed one, at evaluation."""
        true = torch.logsumexp(logits.float(), dim=-1).double()  # (N,)
        pred = self.log_z(h).double()  # (N,)
        self._stats += torch.stack([true.new_tensor(float(true.numel())), true.sum(), (true * true).sum(),
                                    pred.sum(), (pred * pred).sum(), ((true - pred) ** 2).sum()]).cpu()

    def epoch_stats(self) -> dict[str, float]:
        """Mean and spread of log Z_h over the positions evaluated since the last call (then reset)."""
        n, s, ss, p, pp, err = self._stats.tolist()
        self._stats.zero_()
        if n == 0:
            return {}
        mean, pmean = s / n, p / n
        out = {"log_z_mean": mean, "log_z_std": math.sqrt(max(ss / n - mean * mean, 0.0))}
        if self.zreg is not None:
            out.update(log_z_pred_mean=pmean, log_z_pred_std=math.sqrt(max(pp / n - pmean * pmean, 0.0)),
                       log_z_pred_rmse=math.sqrt(err / n))
        return out


class GatherDot(torch.autograd.Function):
    """s[n, j] = W[ids[n, j]] . h[n] + b[ids[n, j]] for ids (N, m), j < lengths[n] (all m without lengths; 0 past
    it, and no gradient). Compiled (_gather_dot.cpp) for float32 on the CPU: each row of W read where it lies.
    The twin, a block of positions at a time: the (N, m, H) gathered rows (52 MB at N = 640, m = 101, H = 200)
    and their gradient never exist whole, and the backward pass adds each block's outer products into the one
    (V, H) gradient of W. Both equal autograd's gather and bmm (tests/test_nce.py). Products in W's dtype (fp32
    under autocast too: this is memory-bound)."""

    BLOCK = 32  # positions a block: 32 x 101 x 200 fp32 = 2.6 MB of rows, in cache while used

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, bias: Tensor, ids: Tensor, lengths: Tensor | None = None) -> Tensor:
        hw = h.to(weight.dtype).contiguous()
        longs = ids.dtype == torch.int64 and (lengths is None or lengths.dtype == torch.int64)
        kernel = compiled_for(hw, weight, bias) if longs else None
        mask = None  # (N, m) the entries within each row's length, for the twin (the kernel reads lengths)
        if lengths is not None and kernel is None:
            mask = torch.arange(ids.shape[1], device=ids.device) < lengths[:, None]
        ctx.save_for_backward(hw, weight, ids, lengths, mask)
        ctx.h_dtype, ctx.compiled = h.dtype, kernel is not None
        s = torch.empty(ids.shape, dtype=weight.dtype, device=h.device)  # (N, m)
        if kernel is not None:
            kernel.gather_dot(*map(numpy_view, (hw, weight, bias, ids, lengths, s)), hw.shape[1], ids.shape[1])
            return s
        with torch.autocast(h.device.type, enabled=False):  # the backward pass runs without it too
            for i in range(0, ids.shape[0], GatherDot.BLOCK):
                rows = slice(i, i + GatherDot.BLOCK)
                s[rows] = torch.bmm(weight[ids[rows]], hw[rows].unsqueeze(2)).squeeze(2)  # (c, m)
        s.add_(bias[ids])
        return s if mask is None else s.masked_fill_(~mask, 0.0)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        hw, weight, ids, lengths, mask = ctx.saved_tensors
        g = grad.to(weight.dtype).contiguous()  # (N, m)
        grad_h, grad_w = torch.empty_like(hw), torch.zeros_like(weight)  # (N, H), (V, H)
        grad_b = torch.zeros(weight.shape[0], dtype=g.dtype, device=g.device)  # (V,)
        if ctx.compiled:
            buffers = map(numpy_view, (g, hw, weight, ids, lengths, grad_h, grad_w, grad_b))
            compiled_for(hw, weight, grad_b).gather_dot_backward(*buffers, hw.shape[1], ids.shape[1])
            return grad_h.to(ctx.h_dtype), grad_w, grad_b, None, None
        if mask is not None:
            g = g.masked_fill(~mask, 0.0)
        for i in range(0, ids.shape[0], GatherDot.BLOCK):
            rows = slice(i, i + GatherDot.BLOCK)
            grad_h[rows] = torch.bmm(g[rows].unsqueeze(1), weight[ids[rows]]).squeeze(1)  # (c, H)
            outer = g[rows].unsqueeze(2) * hw[rows].unsqueeze(1)  # (c, m, H)
            grad_w.index_add_(0, ids[rows].flatten(), outer.flatten(0, 1))
        grad_b.index_add_(0, ids.flatten(), g.flatten())
        return grad_h.to(ctx.h_dtype), grad_w, grad_b, None, None

