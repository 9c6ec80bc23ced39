"""The kenlm calls on a neural model (any family's `initial_state` / `step`), with batched steps.

A State holds a `Node`: the words read since <s>, and once stepped the model's state after them (one
row) and the log10 distribution of the next word. BaseScore(in, w, out) reads p(w) off in's
distribution and makes out a new node that is *pending*: it is stepped only when its own distribution
is first needed, and then together with every other pending node, in batches of rows read after
histories of equal length (joined and split by seqlm.protocol's cat_states / select_state, as beam search
does). A beam decoder that extends W hypotheses by a word and then scores from them pays about one
batched `step` of W rows per word, not W steps, and never re-reads a history.

What a neural model supports: BeginSentenceWrite, BaseScore, BaseFullScore (ngram_length = the words of
context used, <s> included, capped by the model's finite context if it has one), score / full_scores /
perplexity with bos=True (eos either way), `word in model`, next_distribution and State equality (equal
histories). Not supported: NullContextWrite and bos=False (a neural model has no "no context": every
family is trained from <s>); they raise SeqlmError. `order` is the model's finite context (FNN order,
AFP K + 1) or 0 when the history is unbounded.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from seqlm.errors import SeqlmError
from seqlm.eval.perplexity import model_device
from seqlm.ngram.query import FullScoreReturn
from seqlm.protocol import LanguageModel, Prefixes, cat_states, context_order, select_state

if TYPE_CHECKING:
    from seqlm.ngram.query import PyState as State

LN10 = math.log(10.0)
MAX_ROWS = 256  # the most pending nodes stepped in one call
NO_NULL_CONTEXT = ("a neural model has no null context (it is trained from <s> on): use BeginSentenceWrite "
                   "and bos=True")
_SCORERS: weakref.WeakSet = weakref.WeakSet()  # every live scorer, whose lock a forked child must renew


def _renew_locks() -> None:
    """In a forked child: a lock some other thread of the parent held at the fork would stay held for ever."""
    for scorer in _SCORERS:
        scorer._lock = threading.RLock()


os.register_at_fork(after_in_child=_renew_locks)


class Node:
    """One history. `state`/`logp` are None until stepped; `parent` is dropped once they are set."""

    __slots__ = ("history", "parent", "token", "state", "logp")

    def __init__(self, history: tuple[int, ...], parent: Node | None, token: int):
        self.history = history  # word ids read after <s>
        self.parent = parent  # the node whose state this one continues by reading `token`
        self.token = token
        self.state: Any = None  # the model's state after `token`, a batch of one row
        self.logp: np.ndarray | None = None  # (V,) float64 log10 p of the next word

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and self.history == other.history

    def __hash__(self) -> int:
        return hash(self.history)


class NeuralScorer:
    """kenlm's calls for a protocol model; see the module docstring."""

    def __init__(self, model: LanguageModel):
        if isinstance(model, torch.nn.Module):
            model.eval()
        self.model, self.vocab = model, model.vocab
        self.order = context_order(model) or 0
        self._stoi, self._unk, self._eos = self.vocab.stoi, self.vocab.unk_id, self.vocab.eos_id
        self._device = model_device(model)
        start = Node((), None, -1)
        start.state = model.initial_state(1)
        self._root = Node((), start, self.vocab.bos_id)  # after <s>: shared by every BeginSentenceWrite
        self._pending: list[Node] = [self._root]
        # threads share the pending list and the nodes being stepped: one of them at a time creates or steps
        self._lock = threading.RLock()
        _SCORERS.add(self)

    def BeginSentenceWrite(self, state: State) -> None:  # noqa: N802 (kenlm's names)
        state.words = self._root

    def NullContextWrite(self, state: State) -> None:  # noqa: N802
        raise SeqlmError(NO_NULL_CONTEXT)

    def _child(self, in_state: State, word: str) -> tuple[np.ndarray, Node, int]:
        """in_state's distribution, the (pending) node after `word`, and the word's id."""
        node = in_state.words
        if not isinstance(node, Node):
            raise SeqlmError("this State has no context: call BeginSentenceWrite on it first")
        w = self._stoi.get(word)
        if w is None:
            if not isinstance(word, str):
                raise TypeError(f"Argument 'word' has incorrect type (expected str, got {type(word).__name__})")
            w = self._unk
        with self._lock:
            self._ready(node)
            child = Node(node.history + (w,), node, w)
            self._pending.append(child)
        return node.logp, child, w

    def _ready(self, node: Node) -> None:
        """Step `node` if it has not been; a node that is not pending either was taken by a flush that a fork
        cut short (it ran in another thread of the parent), so it is queued again."""
        if node.logp is None:
            self.flush()
        if node.logp is None:
            self._pending.append(node)
            self.flush()

    def BaseScore(self, in_state: State, word: str, out_state: State) -> float:  # noqa: N802
        logp, out_state.words, w = self._child(in_state, word)
        return float(logp[w])

    def BaseFullScore(self, in_state: State, word: str, out_state: State) -> FullScoreReturn:  # noqa: N802
        logp, out_state.words, w = self._child(in_state, word)
        length = len(out_state.words.history) + 1  # the words read, <s> included
        return FullScoreReturn(float(logp[w]), min(length, self.order) if self.order else length, w == self._unk)

    @torch.no_grad()
    def flush(self) -> None:
        """Step every pending node: rows of equal history length together, at most MAX_ROWS a call."""
        with self._lock:
            nodes, self._pending = self._pending, []
            groups: dict[int, list[Node]] = defaultdict(list)
            for n in nodes:
                if n.logp is None:
                    groups[len(n.history)].append(n)
            for group in groups.values():
                for lo in range(0, len(group), MAX_ROWS):
                    self._step(group[lo : lo + MAX_ROWS])

    def _step(self, nodes: list[Node]) -> None:
        parents = Prefixes(cat_states(self.model, [n.parent.state for n in nodes]))
        tokens = torch.tensor([n.token for n in nodes], dtype=torch.long, device=self._device)  # (B,)
        read = self.model.extend(parents, torch.arange(len(nodes)), tokens)
        logp10 = (self.model.advance(read).double() / LN10).cpu().numpy()  # (B, V)
        state = read.state
        for i, n in enumerate(nodes):
            row = torch.tensor([i], device=self._device)
            n.state, n.logp, n.parent = select_state(self.model, state, row), logp10[i], None

    def full_scores(self, words: list[str], bos: bool, eos: bool) -> Iterator[tuple[float, int, bool]]:
        """One forward pass over the sentence (seqlm.score_text), the numbers `seqlm score` prints."""
        from seqlm.api import score_text

        if not bos:
            raise SeqlmError(NO_NULL_CONTEXT)
        logp = score_text(self.model, [words])[0]  # log10, </s> last
        ids = [self._stoi.get(w, self._unk) for w in words]
        for t, (p, w) in enumerate(zip(logp[: len(words)], ids, strict=True)):
            yield p, min(t + 2, self.order) if self.order else t + 2, w == self._unk
        if eos:
            yield logp[-1], min(len(words) + 2, self.order) if self.order else len(words) + 2, False

    def kenlm_score(self, words: list[str], bos: bool, eos: bool) -> float:
        """log10 P summed in float32 word after word, as the kenlm module adds."""
        probs = np.array([p for p, _, _ in self.full_scores(words, bos, eos)], dtype=np.float32)
        return float(np.cumsum(probs, dtype=np.float32)[-1]) if len(probs) else 0.0

    def next_distribution(self, states: list[State]) -> np.ndarray:
        nodes = [s.words for s in states]
        if not all(isinstance(n, Node) for n in nodes):
            raise SeqlmError("a State has no context: call BeginSentenceWrite on it first")
        with self._lock:
            for n in nodes:
                self._ready(n)
        return np.stack([n.logp for n in nodes]) if nodes else np.zeros((0, len(self.vocab)))
