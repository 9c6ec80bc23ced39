"""Elman histories as approximate fixed points (approximate-fixed-points-rnn.txt, Sec. 3).

Stack the states of a sequence, h = [h_1; ...; h_T]. The Elman recurrence h_t = phi(V x_t + W h_{t-1})
says that h is a fixed point of

    h = f(h, x) = phi(V x + W shift(h))            shift(h)_t = h_{t-1}, and h_0 (or a carried state) at t = 1

Fixed-point iteration h^(k+1) = f(h^(k), x) from h^(0) = h_0 everywhere updates all T positions at once:
one (B*T, H) x (H, H) matmul per iteration, no loop over time. After k iterations positions 1..k are exact;
after T the whole sequence is. Stopping at K gives the approximate fixed point (AFP): h^(K)_t is the exact
RNN run from h_0 over the last K inputs x_{t-K+1..t} only, so an AFP-K model is a finite-context model of
order K + 1 (`context_order`), which is what makes exact lattice rescoring possible (seqlm.lattice).

Sentence starts (`resets`) take h_0 as their previous state, exactly as the sequential RNN restarts there.
Gradients flow back through the K iterations by autograd (the paper's training: no sequential BPTT).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seqlm.nn.elman import Elman


def input_preactivation(elman: Elman, x: Tensor) -> Tensor:
    """V x_t + b for every position at once: x (B, T, I) -> (B, T, H), the part that does not iterate."""
    if elman.weight_ih is None:  # input_size 0: the embedding lookup already is V x_t
        return x + elman.bias  # (B, T, H)
    return F.linear(x, elman.weight_ih, elman.bias)  # (B, T, H)


def fixed_point_iterations(pre: Tensor, weight_hh: Tensor, h0: Tensor, h_first: Tensor, resets: Tensor,
                           iterations: int, activation: str = "sigmoid") -> Tensor:
    """h^(K) of the iteration h^(k+1) = phi(pre + W shift(h^(k))), h^(0) = h0 at every position.

    pre (B, T, H) = V x + b; h0 (H,) or (B, H): the state before a sentence start; h_first (B, H): the
    previous state of position 0 (h0, or the state carried from the previous batch in stream mode);
    resets (B, T) bool: positions whose previous state is h0. Returns (B, T, H).
    """
    phi = torch.sigmoid if activation == "sigmoid" else torch.tanh
    B, T, H = pre.shape
    h0 = h0.expand(B, H)  # (B, H)
    restart = resets.unsqueeze(-1)  # (B, T, 1)
    h = h0.unsqueeze(1).expand(B, T, H)  # (B, T, H) h^(0)
    for _ in range(iterations):
        prev = torch.cat([h_first.unsqueeze(1), h[:, :-1]], dim=1)  # (B, T, H) shift(h^(k))
        prev = torch.where(restart, h0.unsqueeze(1), prev)  # (B, T, H)
        a = torch.addmm(pre.reshape(B * T, H), prev.reshape(B * T, H), weight_hh.T)  # (B*T, H): one matmul
        h = phi(a).view(B, T, H)  # (B, T, H)
    return h


def fixed_point(elman: Elman, x: Tensor, h_first: Tensor, resets: Tensor, iterations: int) -> Tensor:
    """AFP-K states of an Elman layer (its own parameters): x (B, T, I) -> (B, T, H).

    Runs in the parameters' precision even under autocast (like the sequential layer: K matmuls compound).
    """
    dtype = elman.weight_hh.dtype
    with torch.autocast(device_type=x.device.type, enabled=False):
        pre = input_preactivation(elman, x.to(dtype))  # (B, T, H)
        h0 = elman.initial_state(1, x.device)[0]  # (H,)
        return fixed_point_iterations(pre, elman.weight_hh, h0, h_first.to(dtype), resets, iterations,
                                      elman.activation)


def window_state(elman: Elman, x: Tensor, valid: Tensor) -> Tensor:
    """The AFP-K state after a window of K inputs, by the sequential recurrence from h_0.

    x (B, K, I), valid (B, K) bool: False on the positions before the sentence start (a prefix of the
    window). Equal to the last position of `fixed_point` over that window; used by `step`. -> (B, H).
    """
    h = elman.initial_state(x.shape[0], x.device)  # (B, H)
    for j in range(x.shape[1]):
        _, nxt = elman(x[:, j : j + 1], h)  # (B, H)
        h = torch.where(valid[:, j : j + 1], nxt, h)  # (B, H)
    return h
