"""Lattice expansion and rescoring with any LanguageModel (only `initial_state` and `step` are used).

Each lattice node is split into expanded states, one per distinct key = the last n-1 tokens of the
histories reaching it (`<s>` included at the start), as SRILM's `lattice-tool -order n` does:

- exact: for a finite-context model of order n (`context_order` in the protocol: KN/FNN order n, AFP-K
  order K+1) two histories with the same key get the same probabilities, so every path of the expanded
  lattice carries exactly the model's score of its sentence;
- approximate: for unbounded histories (exact RNN, FOFE, mixtures with them) hypotheses whose last n-1
  tokens agree are merged (n = `merge_order`) and the merged state keeps the model state of the best
  hypothesis so far (Kaldi's pruned RNNLM lattice rescoring); the result says `exact: False`.

The model state of an expanded state is computed once, by `step` from the state it came from, batched over
all expanded states of a topological level (nodes whose longest path from the start is equally long),
their model states gathered by the protocol's `select_state`/`cat_states` (any family's layout);
only the log-probabilities of the words that can follow are kept (a model whose `step_targets(tokens, state,
rows, targets)` skips the table, as the AFP and class-output RNN and LSTM models', computes only those). Null words,
`<s>`, `</s>` and silence are not predicted; `</s>` is scored on the arcs into the end node. A beam (on
the forward score with the new LM scores) and a cap on expanded states per node are off by default and
counted when they bind.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.lattice.graph import Arc, Lattice, is_null
from seqlm.protocol import LanguageModel, cat_states, context_order, model_device, select_state

NOT_PREDICTED = frozenset({"<s>", "</s>", "!SIL", "<sil>"})  # sentence marks and silence: no LM score
STEP_ROWS = 1024  # expanded states per `step` call: bounds the (rows, V) log-probability block


@dataclass
class WordMap:
    """Lattice word -> model token id (None: not predicted). Unknown words become <unk> and are counted."""

    vocab: Vocab
    lowercase: bool = False
    mapping: dict[str, str] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)

    def token(self, word: str | None) -> int | None:
        if is_null(word) or word in NOT_PREDICTED:
            return None
        w = self.mapping.get(word, word.lower() if self.lowercase else word)  # type: ignore[union-attr]
        if w not in self.vocab.stoi:
            self.unknown.add(word)  # type: ignore[arg-type]
        return self.vocab.id(w)


@dataclass
class Expansion:
    lattice: Lattice  # the expanded lattice; arc lm = the new LM score (natural log)
    old_lm: list[float]  # per expanded arc: the lm score of the lattice arc it copies
    node_of: list[int]  # expanded node -> lattice node
    order: int  # n: states are keyed by the last n-1 tokens
    exact: bool  # every path's lm score is the model's sentence score
    states: int  # expanded states (nodes) in all
    max_states_per_node: int
    pruned_beam: int = 0  # expanded states dropped by the beam ...
    pruned_cap: int = 0  # ... and by the per-node cap (either makes the result inexact)
    model_steps: int = 0  # rows through model.step


class _ModelStates:
    """Model states computed by `step`, kept batched per call; a state is addressed as (call, row)."""

    def __init__(self, model: LanguageModel):
        self.model, self.calls, self.rows = model, [], 0

    def initial(self, bos: int, needed: list[int]) -> tuple[tuple[int, int], dict[int, float]]:
        (loc, probs), = self.step([(None, bos)], [needed])
        return loc, probs

    @torch.no_grad()
    def step(self, requests: list[tuple[tuple[int, int] | None, int]], needed: list[list[int]]):
        """step(token, state at loc) for every request; -> [((call, row), {token: ln p of what follows})]."""
        out = []
        for lo in range(0, len(requests), STEP_ROWS):
            out += self._step(requests[lo : lo + STEP_ROWS], needed[lo : lo + STEP_ROWS])
        return out

    def _step(self, requests, needed):
        order = list(range(len(requests)))
        if requests[0][0] is None:
            state = self.model.initial_state(len(requests))
        else:
            by_call: dict[int, list[int]] = defaultdict(list)
            for i, (loc, _) in enumerate(requests):
                by_call[loc[0]].append(i)
            order = [i for c in by_call for i in by_call[c]]
            state = cat_states(self.model, [select_state(self.model, self.calls[c],
                                                         torch.tensor([requests[i][0][1] for i in by_call[c]]))
                                            for c in by_call])
            requests, needed = [requests[i] for i in order], [needed[i] for i in order]
        tokens = torch.tensor([tok for _, tok in requests])
        rows = torch.repeat_interleave(torch.arange(len(requests)), torch.tensor([len(n) for n in needed]))
        cols = torch.tensor([t for n in needed for t in n], dtype=torch.long)
        device = model_device(self.model)
        logp, state = self.model.step_targets(tokens.to(device), state, rows.to(device), cols.to(device))  # (N,)
        vals = logp.double().cpu().tolist()  # only what follows
        self.calls.append(state)
        self.rows += len(requests)
        out, pos, call = [None] * len(order), 0, len(self.calls) - 1
        for r, n in enumerate(needed):  # row r of this call answers request order[r]
            out[order[r]] = ((call, r), dict(zip(n, vals[pos : pos + len(n)], strict=True)))
            pos += len(n)
        return out


@dataclass
class _State:
    """An expanded state: a lattice node and the key of the histories merged into it."""

    id: int
    key: tuple[int, ...]
    loc: tuple[int, int]  # its model state
    probs: dict[int, float]  # ln p of each token that can follow (and of </s> at the end)
    fwd: float  # best forward score with the new LM scores


def _useful(lat: Lattice, order: list[int]) -> set[int]:
    """Nodes on some start-to-end path."""
    out, inc = lat.outgoing(), lat.incoming()
    fwd, bwd = {lat.start}, {lat.end}
    for v in order:
        if v in fwd:
            fwd.update(a.dst for a in out[v])
    for v in reversed(order):
        if v in bwd:
            bwd.update(a.src for a in inc[v])
    return fwd & bwd


def _needed(lat: Lattice, order: list[int], tok: dict[int, int | None], eos: int, useful: set[int]) -> list[list[int]]:
    """Tokens whose probability a state at each node needs: next words, through null arcs too; </s> at the end."""
    need: list[set[int]] = [set() for _ in range(lat.num_nodes)]
    need[lat.end].add(eos)
    out = lat.outgoing()
    for v in reversed(order):
        for a in out[v]:
            if a.dst in useful:
                t = tok[id(a)]
                need[v].update(need[a.dst] if t is None else {t})
    return [sorted(n) for n in need]


def _levels(lat: Lattice, order: list[int], useful: set[int]) -> list[list[int]]:
    level = dict.fromkeys(useful, 0)
    inc = lat.incoming()
    for v in order:
        if v in useful and v != lat.start:
            level[v] = 1 + max(level[a.src] for a in inc[v] if a.src in useful)
    by_level: list[list[int]] = [[] for _ in range(max(level.values()) + 1)]
    for v in order:
        if v in useful:
            by_level[level[v]].append(v)
    return by_level


def expand(lat: Lattice, model: LanguageModel, words: WordMap, merge_order: int = 4, order: int | None = None,
           beam: float | None = None, max_states: int | None = None) -> Expansion:
    """The lattice expanded by the last n-1 tokens and rescored with `model` (module docstring).

    n: `order` if given, else the model's `context_order`, else `merge_order`. Exact when the model is
    finite-context of order <= n and neither the beam nor the cap dropped a state.
    """
    own = context_order(model)
    n = order or own or merge_order
    if n < 1:
        raise SeqlmError(f"the expansion order must be at least 1, got {n}")
    topo = lat.topological_order(lat.name)
    useful = _useful(lat, topo)
    tok = {id(a): words.token(a.word) for a in lat.arcs}
    vocab = words.vocab
    needed = _needed(lat, topo, tok, vocab.eos_id, useful)
    ms = _ModelStates(model)
    loc, probs = ms.initial(vocab.bos_id, needed[lat.start])
    key0 = (vocab.bos_id,)[: n - 1] if n > 1 else ()
    states: dict[int, list[_State]] = {lat.start: [_State(0, key0, loc, probs, 0.0)]}
    res = Expansion(Lattice(lat.name, 0, [], 0, 0, lat.lmscale, lat.wdpenalty, lat.prscale, dict(lat.header), [],
                            lat.words_on_nodes, lat.base), [], [lat.start], n, False, 1, 1)
    inc = lat.incoming()
    for level in _levels(lat, topo, useful)[1:]:
        groups = {v: _candidates(lat, v, inc[v], states, tok, n, useful) for v in level}
        for v in level:
            groups[v] = _prune(groups[v], beam, max_states, res) if v != lat.end else groups[v]
        requests, targets = [], []
        for v in level:
            for key, cands in groups[v].items():
                p, a, t, _, _ = cands[0]  # the best: its model state stands for the group (exact: all equal)
                if t is not None:
                    requests.append((p.loc, t))
                    targets.append((v, key))
        done = dict(zip(targets, ms.step(requests, [needed[v] for v, _ in targets]), strict=True))
        for v in level:
            states[v] = _make_states(lat, v, groups[v], done, states, res, vocab.eos_id)
    res.lattice.num_nodes = len(res.node_of)
    res.lattice.end = len(res.node_of) - 1
    res.lattice.node_fields = [dict(lat.node_fields[v]) if v < len(lat.node_fields) else {} for v in res.node_of]
    res.states = res.lattice.num_nodes
    res.max_states_per_node = max(len(s) for s in states.values())
    res.model_steps = ms.rows
    res.exact = own is not None and own <= n and not (res.pruned_beam or res.pruned_cap)
    return res


def _candidates(lat: Lattice, v: int, arcs: list[Arc], states: dict[int, list[_State]], tok: dict[int, int | None],
                n: int, useful: set[int]) -> dict[tuple[int, ...], list[tuple]]:
    """Incoming (state, arc, token, lm, forward score) grouped by the new key, best first in each group."""
    groups: dict[tuple[int, ...], list[tuple]] = defaultdict(list)
    for a in arcs:
        if a.src not in useful:
            continue
        t = tok[id(a)]
        for p in states[a.src]:
            lm = 0.0 if t is None else p.probs[t]
            key = p.key if t is None else (p.key + (t,))[max(0, len(p.key) + 2 - n) :] if n > 1 else ()
            groups[key].append((p, a, t, lm, p.fwd + lat.total(a, lm)))
    for cands in groups.values():
        cands.sort(key=lambda c: -c[4])
    return groups


def _prune(groups: dict, beam: float | None, cap: int | None, res: Expansion) -> dict:
    if beam is None and cap is None:
        return groups
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0][4])
    best = ranked[0][1][0][4]
    kept = [kv for kv in ranked if beam is None or kv[1][0][4] >= best - beam]
    res.pruned_beam += len(ranked) - len(kept)
    if cap is not None and len(kept) > cap:
        res.pruned_cap += len(kept) - cap
        kept = kept[:cap]
    return dict(kept)


def _make_states(lat: Lattice, v: int, groups: dict, done: dict, states: dict[int, list[_State]], res: Expansion,
                 eos: int) -> list[_State]:
    """The expanded states of node v (one node for all at the end) and the arcs into them."""
    out = []
    end_id = None
    for key, cands in groups.items():
        p, _, t, _, fwd = cands[0]
        loc, probs = done[(v, key)] if t is not None else (p.loc, p.probs)
        final = probs[eos] if v == lat.end else 0.0  # ln p(</s>): on the arcs into the end node
        if v != lat.end or end_id is None:
            res.node_of.append(v)
            state = _State(len(res.node_of) - 1, key, loc, probs, fwd)
            end_id = state.id if v == lat.end else None
            out.append(state)
        dst = end_id if v == lat.end else state.id
        for p, a, _, lm, _ in cands:
            res.lattice.arcs.append(Arc(p.id, dst, a.word, a.acoustic, lm + final, a.fields))
            res.old_lm.append(a.lm)
    return out
