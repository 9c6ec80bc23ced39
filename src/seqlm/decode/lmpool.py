"""The LM histories a beam search holds, in one pool: a row per history (words or tokens read after <s>), made
when a beam reads a word, and read, once some word ends after it, as the model's state and the (V,)
distribution of what comes next.

A new row is only (parent row, token) until a word ends after it: most beams die before that, and their rows
never cost an LM call. Then every row asked for in one frame is read with one `extend` from the parents' states
and one `advance` (seqlm.protocol), whatever its utterance. A row's parent is read before the row is made (its
word was scored from it), so one step always suffices. A `sparse` pool (a model that declares sparse_targets,
scored word by word) keeps only the states and asks `advance_targets` for the (row, token) pairs scored: an
n-gram's lookups, where a row of the table is the whole vocabulary. Rows no beam needs any more are dropped now
and then (`compact`), so the pool holds at most about twice the rows the beams read.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqlm.protocol import LanguageModel, Prefixes, begin, cat_states, model_device, select_state


class LMPool:
    def __init__(self, model: LanguageModel, device: torch.device, sparse: bool = False):
        self.model, self.device, self.sparse = model, device, sparse  # `device`: where the decoder's tensors are
        root = begin(model, 1)
        self.state = root.state  # the states of the rows read, in `slot` order
        self.dist = None  # (capacity, V) the rows read, past `read` free; None when sparse
        if not sparse:
            first = model.advance(root)  # (1, V) on the model's device
            self.dist = first.new_empty((64, first.shape[1]))
            self.dist[:1] = first
        self.read = 1
        self.memo: dict = {}  # what advance_targets keeps for the rows read (protocol.Prefixes), by slot
        long = lambda fill: torch.full((64,), fill, dtype=torch.long, device=device)  # noqa: E731
        self.parent, self.token, self.slot = long(-1), long(-1), long(-1)  # (capacity,) per row; slot -1: unread
        self.slot[0] = 0
        self.size = 1
        self.live = 0  # the distinct rows the beams read when last counted (decoder.py's _compact)

    def logp(self, rows: Tensor, tokens: Tensor) -> Tensor:
        """(R,) float64 ln p(tokens[i] | history of rows[i]), on the decoder's device."""
        self.read_rows(rows)
        if self.sparse:
            lnp = self.model.advance_targets(Prefixes(self.state, memo=self.memo), self.slot[rows], tokens)  # (R,)
            return lnp.to(self.device, torch.float64)
        at = self.dist.device
        return self.dist[self.slot[rows].to(at), tokens.to(at)].to(self.device, torch.float64)

    def add(self, parents: Tensor, tokens: Tensor) -> Tensor:
        """New rows (R,) for the histories parents[i] + tokens[i], not read yet."""
        n = len(parents)
        while self.size + n > len(self.parent):
            self.parent, self.token, self.slot = (_grown(x, -1) for x in (self.parent, self.token, self.slot))
        at = slice(self.size, self.size + n)
        self.parent[at], self.token[at] = parents, tokens
        self.size += n
        return torch.arange(at.start, at.stop, device=self.device)

    def add_pairs(self, parents: Tensor, tokens: Tensor) -> Tensor:
        """The rows (R,) for parents[i] + tokens[i], equal pairs sharing one new row."""
        V = len(self.model.vocab)
        pairs, inverse = torch.unique(parents * V + tokens, return_inverse=True)  # (N,)
        return self.add(pairs // V, pairs % V)[inverse]

    def read_rows(self, rows: Tensor) -> None:
        """Read the unread rows among `rows`: one extend from their parents' states, one advance (not when sparse)."""
        todo = torch.unique(rows[self.slot[rows] < 0])
        if len(todo) == 0:
            return
        at = model_device(self.model)
        read = self.model.extend(Prefixes(self.state), self.slot[self.parent[todo]].to(at), self.token[todo].to(at))
        if not self.sparse:
            self._keep(self.model.advance(read))  # (N, V)
        self.state = cat_states(self.model, [self.state, read.state])
        self.slot[todo] = torch.arange(self.read, self.read + len(todo), device=self.device)
        self.read += len(todo)

    def _keep(self, dist: Tensor) -> None:
        """Rows (N, V) stored after those read."""
        if self.read + len(dist) > len(self.dist):
            bigger = self.dist.new_empty((2 * (self.read + len(dist)), self.dist.shape[1]))
            bigger[: self.read] = self.dist[: self.read]
            self.dist = bigger
        self.dist[self.read : self.read + len(dist)] = dist

    def compact(self, live: Tensor) -> Tensor:
        """Keep rows `live` (unique) and the parents of the unread ones; (size,) each old row's new index (-1:
        dropped)."""
        unread = live[self.slot[live] < 0]
        rows = torch.unique(torch.cat([live, self.parent[unread]]))
        remap = torch.full((self.size,), -1, dtype=torch.long, device=self.device)
        remap[rows] = torch.arange(len(rows), device=self.device)
        slots = self.slot[rows]
        was_read = slots >= 0
        new_slot = torch.full_like(slots, -1)
        new_slot[was_read] = self._pack(slots[was_read])
        parent = torch.where(self.parent[rows] >= 0, remap[self.parent[rows].clamp(min=0)], -1)
        self.parent, self.token, self.slot = _sized(parent), _sized(self.token[rows]), _sized(new_slot)
        self.size = len(rows)
        return remap

    def _pack(self, old: Tensor) -> Tensor:
        """Move the read rows in slots `old` (N,) (unique) to slots 0..N-1 and return each one's new slot. A row
        already below N stays; only those above move, into the slots below N that no kept row holds (rows as
        wide as the vocabulary: copying them is most of a compaction's cost). The buffer keeps its size."""
        at, n = model_device(self.model), len(old)
        old = old.to(at)
        stays = old < n
        free = torch.ones(n, dtype=torch.bool, device=at)
        free[old[stays]] = False
        free = free.nonzero().squeeze(1)  # (M,) as many as the rows above N
        movers = old[~stays]  # (M,)
        if self.dist is not None:  # sources >= N > targets: no overlap
            self.dist.index_copy_(0, free, self.dist.index_select(0, movers))
        order = torch.arange(n, device=at)
        order[free] = movers  # (N,) the old slot of each new one
        self.state = select_state(self.model, self.state, order)
        _select_rows(self.memo, order)  # its tensors are by slot too
        position = torch.empty(self.read, dtype=torch.long, device=at)
        position[order] = torch.arange(n, device=at)
        self.read = n
        return position[old].to(self.device)


def _select_rows(memo: dict, order: Tensor) -> None:
    """Each tensor in `memo` (dicts in it too) becomes its rows `order` (protocol.Prefixes.memo: by row); one
    without some of those rows (written before they were read) is dropped."""
    last = int(order.max()) if len(order) else -1
    for key, value in list(memo.items()):
        if isinstance(value, dict):
            _select_rows(value, order)
        elif len(value) > last:
            memo[key] = value.index_select(0, order.to(value.device))
        else:
            del memo[key]


def _grown(x: Tensor, fill: float) -> Tensor:
    """x with twice the rows, the new ones `fill`."""
    out = torch.full((2 * len(x), *x.shape[1:]), fill, dtype=x.dtype, device=x.device)
    out[: len(x)] = x
    return out


def _sized(x: Tensor) -> Tensor:
    """x in a buffer with room to grow (capacity twice its length, at least 64), -1 past its end."""
    out = torch.full((max(64, 2 * len(x)),), -1, dtype=x.dtype, device=x.device)
    out[: len(x)] = x
    return out
