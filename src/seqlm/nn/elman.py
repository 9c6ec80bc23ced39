"""Elman recurrent layer of the RNN language model (Mikolov et al., ICASSP 2011, 'Model description').

    s(t) = f(W_x x(t) + W_h s(t-1) + b)        f = sigmoid (paper) or tanh

The paper's weight matrix u acts on x(t) = [w(t); s(t-1)], i.e. u = [W_x, W_h]; the bias b is the
usual extra input. Parameters are kept in this (sigmoid-space) form whichever implementation runs.

Three implementations compute the same function (tests check them against each other):

- ``"manual"`` (default): forward loop without autograd plus a hand-written BPTT backward
  (:class:`_ElmanBPTT`). Backprop through time needs one (B, H) x (H, H) matmul per step; the
  gradient of W_h is accumulated afterwards in a single (H, T*B) x (T*B, H) matmul instead of T small
  ones. With `tau` (BPTT(tau), exact per position) the backward carries a (tau, B, H) stack of
  per-source gradients instead: one ((tau-1) B, H) x (H, H) matmul per step. Fastest on CPU: B=64,
  T=20, H=200, 2 threads, forward+backward about 5.4-6.3 ms against 7.4-9.9 ms for the other two
  (B=32..128, T=10..40: 10-35% faster). Under autocast (`--precision bf16`) its matmuls run in bf16
  while states, f'(a) and gradients stay in the parameters' precision (tests/test_nn_layers.py).
- ``"fused"``: torch's fused tanh RNN (``nn.RNN`` called through ``torch.func.functional_call``) with
  weights derived on the fly from the sigmoid-space parameters, using the exact identity
  sigmoid(a) = (tanh(a/2) + 1) / 2. With g = 2 s - 1:

      g(t) = tanh(W_x/2 x(t) + W_h/4 g(t-1) + (b/2 + W_h 1/4)),     s(t) = (g(t) + 1) / 2

  Gradients flow back into W_x, W_h, b through the derivation. On CPU this is no faster than the
  plain loop (torch's CPU RNN precomputes the input projection too, and its backward is the same
  per-step autograd graph); it may pay off on GPU (cuDNN).
- ``"reference"``: :func:`elman_reference`, the textbook Python loop with autograd.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

ACTIVATIONS = ("sigmoid", "tanh")
IMPLS = ("manual", "fused", "reference")


def elman_reference(
    x: Tensor, weight_ih: Tensor, weight_hh: Tensor, bias: Tensor, h0: Tensor, activation: str = "sigmoid"
) -> tuple[Tensor, Tensor]:
    """Plain Python-loop Elman net, s(t) = f(W_x x(t) + W_h s(t-1) + b); the ground truth for tests.

    x (B, T, I), h0 (B, H) -> (out (B, T, H), h_T (B, H)).
    """
    f = torch.sigmoid if activation == "sigmoid" else torch.tanh
    s = h0  # (B, H)
    outs = []
    for t in range(x.shape[1]):
        s = f(x[:, t] @ weight_ih.T + s @ weight_hh.T + bias)  # (B, H)
        outs.append(s)
    return torch.stack(outs, dim=1), s  # (B, T, H), (B, H)


def _addmm(acc: Tensor, a: Tensor, w: Tensor, out: Tensor | None = None) -> Tensor:
    """acc + a @ w. With w in a lower precision than acc (bf16 under autocast) the product runs in w's
    dtype and the sum in acc's: the state stays in full precision, only the matmul is rounded."""
    if w.dtype == acc.dtype:
        return torch.addmm(acc, a, w, out=out)
    return torch.add(acc, a.to(w.dtype) @ w, out=out)


def _mm(a: Tensor, w: Tensor, out: Tensor | None = None) -> Tensor:
    """a @ w with the product in w's dtype (bf16 under autocast) and the result in a's (into `out`)."""
    if w.dtype == a.dtype:
        return torch.mm(a, w, out=out)
    prod = a.to(w.dtype) @ w
    return prod.to(a.dtype) if out is None else out.copy_(prod)


class _ElmanBPTT(torch.autograd.Function):
    """Elman recurrence with a hand-written backward (backpropagation through time).

    Input ``pre`` = W_x x(t) + b is computed outside (by autograd) for all steps in one matmul; this
    function only does the recurrent part s(t) = f(pre(t) + W_h s(t-1)), time-major. ``mm`` is the
    matmuls' dtype (the parameters' own, or bf16 under autocast); states and gradients keep pre's.
    """

    @staticmethod
    def forward(ctx, pre: Tensor, s0: Tensor, weight_hh: Tensor, activation: str, tau: int | None,
                mm: torch.dtype) -> Tensor:
        # pre (T, B, H), s0 (B, H), weight_hh (H, H) -> out (T, B, H)
        out = torch.empty_like(pre)  # (T, B, H)
        w_t = weight_hh.T.to(mm)  # (H, H)
        prev = s0  # (B, H)
        for t in range(pre.shape[0]):
            _addmm(pre[t], prev, w_t, out=out[t])  # (B, H) pre-activation, written in place
            prev = out[t].sigmoid_() if activation == "sigmoid" else out[t].tanh_()
        ctx.save_for_backward(out, s0, weight_hh)
        ctx.activation, ctx.tau, ctx.mm = activation, tau, mm
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None, None, None]:
        # the recurrence ran in full precision (see Elman._forward_manual); so does its gradient, even
        # if backward() is called inside an autocast region
        with torch.autocast(device_type=grad_out.device.type, enabled=False):
            out, s0, weight_hh = ctx.saved_tensors  # (T, B, H), (B, H), (H, H)
            # f'(a) expressed through the output s = f(a): all steps at once
            w = weight_hh.to(ctx.mm)  # (H, H)
            if ctx.tau is None or ctx.tau > out.shape[0]:  # nothing to cut: the one-gradient loop
                grad_pre, grad_s0 = _ElmanBPTT._full(grad_out, out, ctx.activation, w)
            else:
                deriv = out * (1 - out) if ctx.activation == "sigmoid" else 1 - out * out  # (T, B, H)
                grad_pre, grad_s0 = _ElmanBPTT._truncated(grad_out, deriv, w, ctx.tau)
            grad_w = None
            if ctx.needs_input_grad[2]:
                # dL/dW_h = sum_t dL/da(t)^T s(t-1): one big matmul over all steps
                hidden, mm = out.shape[-1], ctx.mm
                grad_w = grad_pre[0].T.to(mm) @ s0.to(mm)  # (H, H)
                steps = grad_pre[1:].reshape(-1, hidden).T.to(mm) @ out[:-1].reshape(-1, hidden).to(mm)  # (H, H)
                grad_w = grad_w.to(out.dtype).add_(steps)
            return grad_pre, grad_s0 if ctx.needs_input_grad[1] else None, grad_w, None, None, None

    @staticmethod
    def _full(grad_out: Tensor, out: Tensor, activation: str, weight_hh: Tensor) -> tuple[Tensor, Tensor]:
        """Back-propagation through every step: dL/da(t) for all t, and dL/ds0."""
        grad_pre = torch.empty_like(out)  # (T, B, H) dL/da(t)
        grad_s = grad_out[-1]  # (B, H) dL/ds(T-1): only the direct gradient at the last step
        for t in range(out.shape[0] - 1, -1, -1):
            # dL/da = dL/ds f'(a), f' from s = f(a), a step at a time while the (B, H) block is in cache
            if activation == "sigmoid":  # g s (1 - s) = (g - g s) s
                torch.mul(torch.addcmul(grad_s, grad_s, out[t], value=-1.0), out[t], out=grad_pre[t])
            else:  # g (1 - s^2) = g - (g s) s
                torch.addcmul(grad_s, grad_s * out[t], out[t], value=-1.0, out=grad_pre[t])
            if t > 0:
                # dL/ds(t-1) = direct gradient + what flows back through W_h
                grad_s = _addmm(grad_out[t - 1], grad_pre[t], weight_hh)  # (B, H)
        return grad_pre, _mm(grad_pre[0], weight_hh)  # (T, B, H), (B, H)

    @staticmethod
    def _truncated(grad_out: Tensor, deriv: Tensor, weight_hh: Tensor, tau: int) -> tuple[Tensor, Tensor]:
        """BPTT(tau) exactly per position (rnnlm-extensions.txt, 'Backpropagation through time'): the error
        of the output at step u flows back through a(u), a(u-1), ..., a(u-tau+1) and no further.

        The gradients from different source steps are kept apart, since each stops at its own step: g[j]
        is dL(t+j)/ds(t), for j = 0..tau-1, a (tau, B, H) stack; going one step back, entry j moves to
        j+1 through W_h (one batched matmul) and the entry that would reach tau is dropped.
        """
        T, B, H = deriv.shape
        grad_pre = torch.empty_like(deriv)  # (T, B, H) dL/da(t), summed over the sources that reach t
        g = deriv.new_zeros(tau, B, H)  # (tau, B, H)
        p = torch.empty_like(g)  # (tau, B, H) dL(t+j)/da(t)
        g[0] = grad_out[T - 1]
        for t in range(T - 1, -1, -1):
            torch.mul(g, deriv[t], out=p)
            torch.sum(p, dim=0, out=grad_pre[t])
            if t > 0:
                _mm(p[:-1].view(-1, H), weight_hh, out=g[1:].view(-1, H))  # ((tau-1) B, H)
                g[0] = grad_out[t - 1]
        return grad_pre, _mm(p[:-1].sum(dim=0), weight_hh)  # (T, B, H), (B, H): sources within tau-1 of step 0


class Elman(nn.Module):
    """Elman (simple recurrent) layer, batch-first: x (B, T, I), h0 (B, H) -> (out (B, T, H), h_T (B, H))."""

    def __init__(
        self, input_size: int, hidden: int, activation: str = "sigmoid", impl: str = "manual"
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        self.input_size = input_size
        self.hidden = hidden
        self.activation = activation
        self.impl = impl
        # input_size 0: x already is W_x x(t) (an embedding lookup of the one-hot word, as the paper's U)
        self.weight_ih = nn.Parameter(torch.empty(hidden, input_size)) if input_size else None  # W_x
        self.weight_hh = nn.Parameter(torch.empty(hidden, hidden))  # W_h
        self.bias = nn.Parameter(torch.empty(hidden))  # b
        self.reset_parameters()
        # template for the "fused" path; kept out of the registered submodules (its own parameters are
        # never used: functional_call swaps in the derived ones), so it adds nothing to state_dict
        self._rnn_template = [nn.RNN(input_size or hidden, hidden, nonlinearity="tanh", batch_first=True)]

    def reset_parameters(self) -> None:
        # same scheme as torch.nn.RNN
        bound = 1.0 / math.sqrt(self.hidden)
        for p in (self.weight_ih, self.weight_hh, self.bias):
            if p is not None:
                nn.init.uniform_(p, -bound, bound)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> Tensor:
        """s(0): 0.1 in all units for sigmoid (as Mikolov's rnnlm toolkit), zeros for tanh."""
        value = 0.1 if self.activation == "sigmoid" else 0.0
        device = self.weight_hh.device if device is None else device
        return torch.full((batch_size, self.hidden), value, device=device, dtype=self.weight_hh.dtype)

    def forward(self, x: Tensor, h0: Tensor | None = None, tau: int | None = None) -> tuple[Tensor, Tensor]:
        """`tau`: the gradient of each step's output flows back through `tau` steps of the recurrence
        (BPTT(tau), see _ElmanBPTT._truncated; 1 = plain back-propagation); None = through all of them."""
        if h0 is None:
            h0 = self.initial_state(x.shape[0], x.device)
        if self.impl == "manual":
            return self._forward_manual(x, h0, tau)
        if tau is not None and tau <= x.shape[1] and torch.is_grad_enabled():
            raise ValueError(f"BPTT(tau) truncation is implemented by impl='manual' only, not {self.impl!r}")
        if self.impl == "fused":
            return self._forward_fused(x, h0)
        return elman_reference(x, self._input_weight(x), self.weight_hh, self.bias, h0, self.activation)

    def _input_weight(self, x: Tensor) -> Tensor:
        """W_x, or the identity when the caller already applied it (input_size 0)."""
        if self.weight_ih is not None:
            return self.weight_ih
        return torch.eye(self.hidden, dtype=self.weight_hh.dtype, device=x.device)  # (H, H)

    def forward_time_major(self, x: Tensor, h0: Tensor, tau: int | None = None) -> tuple[Tensor, Tensor]:
        """forward() with time first: x (T, B, I) -> (out (T, B, H), h_T (B, H)). The manual recurrence runs
        in this order, so a caller that keeps it (models/rnn.py) saves two copies of the batch a step."""
        if self.impl == "manual":
            out = self._recur(x, h0, tau)  # (T, B, H)
            return out, out[-1]
        out, last = self.forward(x.transpose(0, 1), h0, tau)  # (B, T, H), (B, H)
        return out.transpose(0, 1), last

    def _forward_manual(self, x: Tensor, h0: Tensor, tau: int | None = None) -> tuple[Tensor, Tensor]:
        out = self._recur(x.transpose(0, 1), h0, tau)  # (T, B, H)
        return out.transpose(0, 1).contiguous(), out[-1]  # (B, T, H), (B, H)

    def _recur(self, xt: Tensor, h0: Tensor, tau: int | None) -> Tensor:
        """The manual recurrence on xt (T, B, I): out (T, B, H)."""
        dtype, dev = self.weight_hh.dtype, xt.device.type
        # under autocast only the recurrent matmuls take its dtype (bf16 runs them several times faster
        # on CPUs with AVX512-BF16); states and gradients stay in the parameters' precision, so rounding
        # errors do not compound over time steps
        mm = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else dtype
        with torch.autocast(device_type=dev, enabled=False):
            xt = xt.to(dtype)  # (T, B, I)
            pre = F.linear(xt, self.weight_ih, self.bias) if self.weight_ih is not None else xt + self.bias  # (T, B, H)
            return _ElmanBPTT.apply(pre, h0.to(dtype), self.weight_hh, self.activation, tau, mm)  # (T, B, H)

    def _forward_fused(self, x: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
        rnn = self._rnn_template[0]
        if self.activation == "tanh":
            w_ih, w_hh, b = self._input_weight(x), self.weight_hh, self.bias
            g0 = h0  # (B, H)
        else:
            # sigmoid(a) = (tanh(a/2) + 1) / 2, with g = 2 s - 1 (see module docstring)
            w_ih = 0.5 * self._input_weight(x)  # (H, I)
            w_hh = 0.25 * self.weight_hh  # (H, H)
            b = 0.5 * self.bias + 0.25 * self.weight_hh.sum(dim=1)  # (H,)
            g0 = 2.0 * h0 - 1.0  # (B, H)
        params = {
            "weight_ih_l0": w_ih,
            "weight_hh_l0": w_hh,
            "bias_ih_l0": b,
            "bias_hh_l0": torch.zeros_like(b),
        }
        g, g_last = functional_call(rnn, params, (x, g0.unsqueeze(0)))  # (B, T, H), (1, B, H)
        if self.activation == "tanh":
            return g, g_last[0]
        return 0.5 * (g + 1.0), 0.5 * (g_last[0] + 1.0)  # (B, T, H), (B, H)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden}, activation={self.activation!r}, impl={self.impl!r}"
