"""A recurrent family's output read from its state, for decoders that score a few words per history.

An Elman RNN's s(t) and an LSTM's top-layer h(t) are all that their output layer reads, and both are part of
the state `step` returns. With a class-factorised, adaptive or tree output (nn/class_softmax.py, softmax.py,
tree_softmax.py), log P(w|h) of one word costs C + |c(w)| dot products (a head and one cluster; a tree: those
of its path), where `advance`'s (B, V) table costs V per row: a CTC
decoder with a word LM asks for the words its beams end, a handful per history (seqlm.decode.lmpool). Such a
model declares `sparse_targets`: its `extend` steps the recurrence alone, `advance` and `advance_targets` read
the output layer from the state (and `step_targets`, a lattice expander's arcs, as well). With the full
softmax nothing changes (a target's normaliser needs all V logits anyway), and the protocol's defaults (LMBase)
serve.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from seqlm.nn.class_softmax import ClassSoftmax
from seqlm.nn.softmax import AdaptiveSoftmax
from seqlm.nn.tree_softmax import TreeSoftmax
from seqlm.protocol import Prefixes


class StateReadout:
    """Mixed into a family's model class before LMBase. The family gives `recur` (a step's new state, without
    the output layer) and `readout(state)`: the (B, H) vector its output layer `out` reads."""

    out: nn.Module

    def recur(self, tokens: Tensor, state: Any) -> Any:
        raise NotImplementedError

    def readout(self, state: Any) -> Tensor:
        raise NotImplementedError

    def reads_targets(self) -> bool:
        """The output layer prices one word below the whole table: what `sparse_targets` declares."""
        return isinstance(self.out, (ClassSoftmax, AdaptiveSoftmax, TreeSoftmax))

    def extend(self, prefixes: Prefixes, rows: Tensor, tokens: Tensor) -> Prefixes:
        if not self.reads_targets():
            return super().extend(prefixes, rows, tokens)  # type: ignore[misc]
        return Prefixes(self.recur(tokens, self.select_state(prefixes.state, rows)))  # type: ignore[attr-defined]

    def advance(self, prefixes: Prefixes) -> Tensor:
        if not self.reads_targets():
            return super().advance(prefixes)  # type: ignore[misc]
        return self.out.log_probs(self.readout(prefixes.state))  # (B, V)

    def advance_targets(self, prefixes: Prefixes, rows: Tensor, targets: Tensor) -> Tensor:
        if not self.reads_targets():
            return super().advance_targets(prefixes, rows, targets)  # type: ignore[misc]
        h = self.readout(prefixes.state)  # (B, H)
        return self.out.pair_log_probs(h, rows.to(h.device), targets.to(h.device), prefixes.memo)  # (N,)

    def step_targets(self, tokens: Tensor, state: Any, rows: Tensor, targets: Tensor) -> tuple[Tensor, Any]:
        """A lattice expander's arcs: ln p of targets (N,) after rows (N,) of the states read."""
        if not self.reads_targets():
            return super().step_targets(tokens, state, rows, targets)  # type: ignore[misc]
        state = self.recur(tokens, state)
        return self.advance_targets(Prefixes(state), rows, targets), state
