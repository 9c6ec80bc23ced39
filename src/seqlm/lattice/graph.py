"""The one lattice graph type the SLF and Kaldi readers produce and their writers take.

A lattice is a DAG of numbered nodes with one start and one end node; words and scores sit on the arcs.
Scores are natural-log likelihoods (higher is better) whatever the file held: SLF's `base=` logs and
Kaldi's costs (negated) are converted on reading and back on writing. Null words (`!NULL`, `!ENTER`,
`!EXIT`, Kaldi's `<eps>`) keep their spelling, so files are written back as they were, but are words to no
one: `is_null` says which. Kaldi's final-state weights become arcs with the null word `<eps>` into one
added end node, which is how SLF spells them (`!EXIT` links into the end node).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from seqlm.errors import SeqlmError

NULL_WORDS = frozenset({"!NULL", "!ENTER", "!EXIT", "<eps>", ""})
KALDI_EPS = "<eps>"


def is_null(word: str | None) -> bool:
    return word is None or word in NULL_WORDS


@dataclass
class Arc:
    src: int
    dst: int
    word: str | None  # as spelled in the file; None: an SLF link with no word anywhere
    acoustic: float  # ln p (SLF a=, minus Kaldi's acoustic cost)
    lm: float  # ln p (SLF l=, minus Kaldi's graph cost)
    fields: dict[str, str] = field(default_factory=dict)  # other link fields, kept verbatim (SLF r= v= d=, Kaldi ali)


@dataclass
class Lattice:
    name: str  # utterance id
    num_nodes: int
    arcs: list[Arc]
    start: int
    end: int
    lmscale: float = 1.0  # total = acscale * acoustic + lmscale * lm + wdpenalty per word (+ prscale * r, SLF)
    wdpenalty: float = 0.0  # natural log, added per non-null word (HTK's wdpenalty: not in the file's base)
    prscale: float = 1.0
    header: dict[str, str] = field(default_factory=dict)  # SLF header fields, written back as read
    node_fields: list[dict[str, str]] = field(default_factory=list)  # per node (SLF t= W= v=); may be empty
    words_on_nodes: bool = False  # the SLF file had W= on its nodes (written back that way)
    base: float = math.e  # the SLF file's log base (scores are natural logs here)
    acscale: float = 1.0  # HTK's acscale: the acoustic scale of the total (Kaldi's --acoustic-scale)
    oov_penalty: float = 0.0  # subtracted from the total per word in oov_words (seqlm rescore --oov-penalty)
    oov_words: frozenset[str] = frozenset()  # spellings the model scores as <unk>

    def check(self, source: str) -> None:
        """A DAG whose every node lies on a path from start to end; one-line errors otherwise."""
        order, out = self.topological_order(source), self.outgoing()
        reach = {self.start}
        for v in order:
            if v in reach:
                reach.update(a.dst for a in out[v])
        if self.end not in reach:
            raise SeqlmError(f"{source}: the end node {self.end} cannot be reached from the start node {self.start}")

    def outgoing(self) -> list[list[Arc]]:
        out: list[list[Arc]] = [[] for _ in range(self.num_nodes)]
        for a in self.arcs:
            out[a.src].append(a)
        return out

    def incoming(self) -> list[list[Arc]]:
        inc: list[list[Arc]] = [[] for _ in range(self.num_nodes)]
        for a in self.arcs:
            inc[a.dst].append(a)
        return inc

    def topological_order(self, source: str = "lattice") -> list[int]:
        """Kahn's algorithm over all nodes; a cycle is an error (lattices are acyclic)."""
        indeg = [0] * self.num_nodes
        for a in self.arcs:
            indeg[a.dst] += 1
        out = self.outgoing()
        todo = [v for v in range(self.num_nodes) if indeg[v] == 0]
        order = []
        while todo:
            v = todo.pop()
            order.append(v)
            for a in out[v]:
                indeg[a.dst] -= 1
                if indeg[a.dst] == 0:
                    todo.append(a.dst)
        if len(order) != self.num_nodes:
            raise SeqlmError(f"{source}: the lattice has a cycle; lattices must be acyclic")
        return order

    def side(self, arc: Arc) -> float:
        """The arc's score apart from the LM: acscale * acoustic + prscale * r + wdpenalty (non-null words),
        as HTK's LArcTotLike adds them."""
        pron = float(arc.fields.get("r", 0.0)) * math.log(self.base) if "r" in arc.fields else 0.0
        return self.acscale * arc.acoustic + self.prscale * pron + (0.0 if is_null(arc.word) else self.wdpenalty)

    def total(self, arc: Arc, lm: float | None = None) -> float:
        """The arc's combined score: side(arc) + lmscale * lm, less oov_penalty for a word the model lacks."""
        oov = self.oov_penalty if self.oov_penalty and arc.word in self.oov_words else 0.0
        return self.side(arc) + self.lmscale * (arc.lm if lm is None else lm) - oov

    def paths(self, limit: int = 100_000) -> Iterator[list[Arc]]:
        """Every start-to-end path as its arcs (depth first); at most `limit` of them."""
        out = self.outgoing()
        stack: list[tuple[int, list[Arc]]] = [(self.start, [])]
        n = 0
        while stack:
            v, path = stack.pop()
            if v == self.end:
                yield path
                n += 1
                if n >= limit:
                    return
                continue
            for a in reversed(out[v]):
                stack.append((a.dst, path + [a]))


def words_of(path: list[Arc]) -> list[str]:
    return [a.word for a in path if not is_null(a.word)]  # type: ignore[misc]


def same_graph(a: Lattice, b: Lattice, tol: float = 1e-6) -> bool:
    """Same nodes, start, end and arcs (word up to null spelling, scores to tol), whatever the arc order."""
    if (a.num_nodes, a.start, a.end, len(a.arcs)) != (b.num_nodes, b.start, b.end, len(b.arcs)):
        return False

    def key(x: Arc) -> tuple:
        return (x.src, x.dst, None if is_null(x.word) else x.word, round(x.acoustic / tol), round(x.lm / tol))

    return sorted(map(key, a.arcs)) == sorted(map(key, b.arcs))
