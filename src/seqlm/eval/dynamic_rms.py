"""Krause et al. (2018), "Dynamic Evaluation of Neural Sequence Models" (ICML), section 5: the update rule
"RMS with a global prior" (`seqlm eval --dynamic-rule rms`), beside plain SGD (seqlm.eval.dynamic).

Before the evaluation, at the trained weights theta_g and without changing them, the gradient g of the mean
-ln p of each segment of some training text (the first whole sentences of `--dynamic-stats FILE` holding at
least `--dynamic-stats-tokens` tokens, cut into segments as the evaluation cuts its text, in its mode) gives

    MS_g = mean over those segments of g^2          (per weight)
    RMS  = sqrt(MS_g)

and then, after each segment s of the evaluated text has been scored,

    theta <- theta - lr * grad L(s) / (RMS + eps) + decay * RMS_norm * (theta_g - theta)
    RMS_norm = min(RMS / avg(RMS), 1 / decay)

where, as in the authors' code (dynamiceval.py, github.com/benkrause/dynamic-evaluation: gradstat() and
evaluate()), avg(RMS) is the mean over the weight tensors of each tensor's mean RMS, and RMS_norm is clipped at
1 / decay so that no weight's pull toward theta_g overshoots it. eps and the default decay are that code's
defaults (its segments are 5 tokens; its grid scales lr and decay by segment / 5). A weight whose gradient was
0 on all of the statistics' segments has RMS 0: its step is lr * g / eps and it is not pulled back, as there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from seqlm.data.corpus import TokenStream
from seqlm.errors import SeqlmError
from seqlm.protocol import LanguageModel, encode_text

DEFAULT_DECAY = 0.002  # lambda: dynamiceval.py's default --lamb
EPSILON = 2e-5  # dynamiceval.py's default --epsilon
DEFAULT_STATS_TOKENS = 20000  # of the training text; the authors used all of it (their --max_batches -1)

Grads = tuple[torch.Tensor | None, ...]


def first_tokens(stream: TokenStream, tokens: int) -> TokenStream:
    """The first whole sentences of `stream` holding at least `tokens` tokens (all of it if it has fewer)."""
    k = min(int((np.asarray(stream.starts)[:-1] < tokens).sum()), stream.num_sentences)
    return TokenStream(stream.ids[: stream.starts[k]], stream.starts[: k + 1])


def gradient_rms(net: LanguageModel, params: list[nn.Parameter], stream: TokenStream, stream_mode: bool,
                 segment: int) -> list[torch.Tensor]:
    """sqrt(MS_g) of every parameter: the root mean square over the segments of `stream` of the gradient of
    each one's mean -ln p, the weights left as they are (the module docstring)."""
    from seqlm.eval.dynamic import _passes

    sums = [torch.zeros_like(p) for p in params]
    count = 0
    for _, _, grads in _passes(net, stream, stream_mode, segment, params):
        for s, g in zip(sums, grads, strict=True):
            if g is not None:
                s.add_(g * g)
        count += 1
    if count == 0:
        raise SeqlmError("--dynamic-stats: the training text has no tokens to collect gradient statistics on")
    return [torch.sqrt(s / count) for s in sums]


def decay_rates(rms: list[torch.Tensor], decay: float) -> list[torch.Tensor]:
    """RMS_norm of every parameter: RMS over the mean of the tensors' mean RMS, clipped at 1 / decay."""
    avg = sum(float(r.mean()) for r in rms) / len(rms)
    rates = [r / avg if avg > 0 else torch.zeros_like(r) for r in rms]
    return [r.clamp(max=1.0 / decay) for r in rates] if decay > 0 else rates


class RmsRule:
    """`--dynamic-rule rms`: the statistics are collected once per model, mode and segment length, then
    reused by every evaluation with this rule (a grid of rates and decays costs one collection)."""

    def __init__(self, stats: str | Path, decay: float = DEFAULT_DECAY, stats_tokens: int = DEFAULT_STATS_TOKENS,
                 epsilon: float = EPSILON):
        self.stats, self.decay, self.stats_tokens, self.epsilon = Path(stats), float(decay), stats_tokens, epsilon
        self._cache: dict[tuple[int, bool, int], tuple[LanguageModel, list[torch.Tensor], int]] = {}

    @classmethod
    def from_options(cls, decay: float | None, stats: str | Path | None, stats_tokens: int | None) -> RmsRule:
        """The rule of the CLI's options, each checked (a one-line SeqlmError: exit status 2)."""
        if stats is None:
            raise SeqlmError("--dynamic-rule rms collects gradient statistics on training text: "
                             "give --dynamic-stats FILE (e.g. the model's train.txt)")
        if not Path(stats).is_file():
            raise SeqlmError(f"--dynamic-stats: no such file: {stats}")
        decay = DEFAULT_DECAY if decay is None else decay
        if not (np.isfinite(decay) and decay >= 0):
            raise SeqlmError(f"--dynamic-decay must be a non-negative number, got {decay}")
        stats_tokens = DEFAULT_STATS_TOKENS if stats_tokens is None else stats_tokens
        if stats_tokens < 1:
            raise SeqlmError(f"--dynamic-stats-tokens must be at least 1, got {stats_tokens}")
        return cls(stats, decay, stats_tokens)

    def with_decay(self, decay: float) -> RmsRule:
        """The same rule with another decay, sharing the statistics collected so far (a grid of decays)."""
        other = RmsRule(self.stats, decay, self.stats_tokens, self.epsilon)
        other._cache = self._cache
        return other

    def settings(self) -> dict[str, Any]:
        used = sorted({n for _, _, n in self._cache.values()})
        return {"dynamic_rule": "rms", "dynamic_decay": self.decay, "dynamic_epsilon": self.epsilon,
                "dynamic_stats": str(self.stats), "dynamic_stats_tokens": self.stats_tokens,
                **({"dynamic_stats_tokens_used": used[0] if len(used) == 1 else used} if used else {})}

    def statistics(self, model: LanguageModel, net: LanguageModel, params: list[nn.Parameter], stream_mode: bool,
                   segment: int) -> list[torch.Tensor]:
        """sqrt(MS_g) of `model` (computed on `net`, its copy at the trained weights), cached."""
        key = (id(model), stream_mode, segment)
        if key not in self._cache:  # the model is kept with its figures: its id cannot be reused meanwhile
            text = first_tokens(encode_text(net, self.stats), self.stats_tokens)
            self._cache[key] = (model, gradient_rms(net, params, text, stream_mode, segment), len(text.ids))
        return self._cache[key][1]

    def step(self, model: LanguageModel, net: LanguageModel, params: list[nn.Parameter], lr: float,
             stream_mode: bool, segment: int) -> Callable[[Grads], None]:
        """The update of `params` (net's, now at the trained weights) by one segment's gradients."""
        rms = self.statistics(model, net, params, stream_mode, segment)
        return rms_step(params, rms, lr, self.decay, self.epsilon)


def rms_step(params: list[nn.Parameter], rms: list[torch.Tensor], lr: float, decay: float,
             epsilon: float = EPSILON) -> Callable[[Grads], None]:
    """theta <- theta - lr * g / (RMS + eps) + decay * RMS_norm * (theta_g - theta), theta_g the weights now."""
    trained = [p.detach().clone() for p in params]
    pull = [decay * r for r in decay_rates(rms, decay)] if decay > 0 else None  # None: nothing pulls back
    denom = [r + epsilon for r in rms]

    def step(grads: Grads) -> None:
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            if pull is None:  # decay 0: the RMS-normalised step alone
                if g is not None:
                    p.addcdiv_(g, denom[i], value=-lr)
                continue
            dw = pull[i] * (trained[i] - p)
            if g is not None:
                dw.addcdiv_(g, denom[i], value=-lr)
            p.add_(dw)
    return step
