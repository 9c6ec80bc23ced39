"""Step functions: what one training batch does. The loop (seqlm.train.loop) calls one of these.

The contract between a model and a step:

- Steps call the model's `forward(batch, state)` (never `score`), so that a DistributedDataParallel
  wrapper sees the call and averages gradients across ranks.
- `forward` returns `(log_probs (B, T), state)`: the natural-log probability of each target, 0 on
  padding. That is also the training loss (-log p) unless the model says otherwise:
- a model whose training objective is not -log p (NCE, a sampled or regularised loss) returns
  `(log_probs, state, loss (B, T))` in training mode, with `loss` the per-token training loss (0 on
  padding); `log_probs` may then be None, since the exact normalised log-probability is what
  training avoids computing. In eval mode (`score`, evaluation) forward returns exact log-probs.
- A step returns (mean loss per scored token, the state to carry into the next batch, tokens scored).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from seqlm.protocol import Batch

StepFn = Callable[[nn.Module, Batch, Any], tuple[Tensor, Any, int]]


def token_losses(model: nn.Module, batch: Batch, state: Any) -> tuple[Tensor, Any]:
    """(per-token training loss (B, T), next state) from the model's forward (see the contract above)."""
    out = model(batch, state)
    if len(out) == 3:
        return out[2], out[1]
    return -out[0], out[1]


def sentence_step(model: nn.Module, batch: Batch, state: Any = None) -> tuple[Tensor, Any, int]:
    """Plain back-propagation: every row's history is inside the batch (FNN, FOFE, sentence RNNs)."""
    loss, _ = token_losses(model, batch, None)  # (B, T)
    n = batch.num_tokens
    return loss.sum() / max(n, 1), None, n


def detach_state(state: Any) -> Any:
    if isinstance(state, Tensor):
        return state.detach()
    if isinstance(state, (tuple, list)):
        return type(state)(detach_state(s) for s in state)
    return state


def tbptt_step(model: nn.Module, batch: Batch, state: Any = None) -> tuple[Tensor, Any, int]:
    """Truncated BPTT over a stream: carry the state from the previous chunk, but not its gradient path
    (how far back each position's gradient reaches is the model's business: RNNLM's `tau`)."""
    loss, state = token_losses(model, batch, state)  # (B, T)
    n = batch.num_tokens
    return loss.sum() / max(n, 1), detach_state(state), n
