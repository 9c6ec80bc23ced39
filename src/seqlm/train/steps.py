"""Step functions: what one training batch does. The loop (seqlm.train.loop) calls one of these.

Steps call the model's `forward(batch, state) -> (log_probs (B, T), state)` (not `score`), so that a
DistributedDataParallel wrapper sees the call and averages gradients across ranks.
A step returns (mean loss per scored token, the state to carry into the next batch, tokens scored).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from seqlm.protocol import Batch

StepFn = Callable[[nn.Module, Batch, Any], tuple[Tensor, Any, int]]


def sentence_step(model: nn.Module, batch: Batch, state: Any = None) -> tuple[Tensor, Any, int]:
    """Plain back-propagation: every row's history is inside the batch (FNN, FOFE, sentence RNNs)."""
    logp, _ = model(batch, None)  # (B, T)
    n = batch.num_tokens
    return -logp.sum() / max(n, 1), None, n


def detach_state(state: Any) -> Any:
    if isinstance(state, Tensor):
        return state.detach()
    if isinstance(state, (tuple, list)):
        return type(state)(detach_state(s) for s in state)
    return state


def tbptt_step(model: nn.Module, batch: Batch, state: Any = None) -> tuple[Tensor, Any, int]:
    """Truncated BPTT: carry the state from the previous chunk, but not its gradient path.

    Each chunk is `bptt` steps, so gradients flow back at most `bptt` steps (rnnlm-extensions.txt, BPTT).
    """
    logp, state = model(batch, state)  # (B, T)
    n = batch.num_tokens
    return -logp.sum() / max(n, 1), detach_state(state), n

