"""Word lattices: HTK SLF and Kaldi text readers/writers to one graph type, and exact LM expansion.

    lats = read_lattices("utt.lat.gz")                      # SLF (gzipped or not)
    lats = read_lattices("lat.txt", words="words.txt")      # Kaldi text CompactLattice(s)
    exp = expand(lats[0], model, WordMap(model.vocab))      # exact for finite-context models
"""

from __future__ import annotations

from pathlib import Path

from seqlm.errors import SeqlmError
from seqlm.lattice.expand import Expansion, WordMap, expand
from seqlm.lattice.graph import Arc, Lattice, is_null, same_graph, words_of
from seqlm.lattice.kaldi import read_kaldi, read_symbols, write_kaldi
from seqlm.lattice.slf import read_slf, read_text, write_slf

__all__ = ["Arc", "Expansion", "Lattice", "WordMap", "best_paths", "expand", "is_null", "lattice_format",
           "read_lattices", "same_graph", "words_of", "write_lattices"]


def lattice_format(path: str | Path) -> str:
    """'slf' when the first field line has key=value fields (N=, VERSION=, ...), else 'kaldi'."""
    for line in read_text(path):
        if line.strip() and not line.lstrip().startswith("#"):
            return "slf" if "=" in line else "kaldi"
    raise SeqlmError(f"{path}: the lattice file is empty")


def read_lattices(path: str | Path, words: str | Path | None = None) -> tuple[str, list[Lattice]]:
    """(format, lattices) of a file: one SLF lattice, or every lattice of a Kaldi text archive."""
    fmt = lattice_format(path)
    if fmt == "slf":
        return fmt, [read_slf(path)]
    if words is None:
        raise SeqlmError(f"{path} is a Kaldi text lattice: give its symbol table with --words words.txt")
    return fmt, read_kaldi(path, read_symbols(words))


def write_lattices(lattices: list[Lattice], path: str | Path, fmt: str, words: str | Path | None = None) -> None:
    if fmt == "slf":
        if len(lattices) != 1:
            raise SeqlmError(f"{path}: an SLF file holds one lattice, got {len(lattices)}")
        write_slf(lattices[0], path)
    else:
        write_kaldi(lattices, path, read_symbols(words))  # type: ignore[arg-type]


def best_paths(lat: Lattice, n: int = 1) -> list[tuple[float, list[Arc]]]:
    """The n highest-scoring start-to-end paths (total scores, `Lattice.total`), best first (exact k-best DP)."""
    order = lat.topological_order(lat.name)
    inc = lat.incoming()
    # per node: up to n (score, arc, rank in the arc source's list), best first
    best: list[list[tuple[float, Arc | None, int]]] = [[] for _ in range(lat.num_nodes)]
    best[lat.start] = [(0.0, None, 0)]
    for v in order:
        if v == lat.start:
            continue
        cands = [(s + lat.total(a), a, r) for a in inc[v] for r, (s, _, _) in enumerate(best[a.src])]
        cands.sort(key=lambda c: -c[0])
        best[v] = cands[:n]
    out = []
    for score, arc, rank in best[lat.end]:
        path, a, r = [], arc, rank
        while a is not None:
            path.append(a)
            _, a, r = best[a.src][r]
        out.append((score, path[::-1]))
    return out
