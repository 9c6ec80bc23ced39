"""Kaldi text lattices (CompactLattice, as `lattice-copy --write-compact=true ark:- ark,t:-` prints them).

One or more lattices per file, each an utterance-id line, arc lines `src dst word-id graph,acoustic,ali`,
final-state lines `state graph,acoustic,ali` (or just `state`), then a blank line. Costs are negated
natural-log scores (graph cost: LM plus transition and pronunciation scores, what rescoring replaces).
Word ids come from a symbol table (`words.txt`: `word id` per line; id 0 is epsilon). Final-state weights
become arcs with the word `<eps>` into one added end node (lattice/graph.py), and back on writing.
"""

from __future__ import annotations

import math
from pathlib import Path

from seqlm.checkpoint import atomic_write_text
from seqlm.errors import SeqlmError
from seqlm.lattice.graph import KALDI_EPS, Arc, Lattice, is_null
from seqlm.lattice.slf import read_text


def read_symbols(path: str | Path) -> dict[int, str]:
    """words.txt: `word id` lines -> {id: word}."""
    table: dict[int, str] = {}
    for n, line in enumerate(read_text(path), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].isdigit():
            raise SeqlmError(f"{path}:{n}: expected 'word id' in the symbol table, got {line.strip()[:40]!r}")
        table[int(parts[1])] = parts[0]
    if not table:
        raise SeqlmError(f"{path}: the symbol table is empty")
    return table


def _weight(path: Path, n: int, text: str) -> tuple[float, float, str]:
    """'graph,acoustic,ali' -> (ln p graph, ln p acoustic, ali)."""
    parts = text.split(",", 2)
    try:
        g, a = float(parts[0]), float(parts[1])
    except (ValueError, IndexError):
        g = a = math.nan
    if not (math.isfinite(g) and math.isfinite(a)):
        raise SeqlmError(f"{path}:{n}: weight {text!r} is not 'graph-cost,acoustic-cost,alignment'")
    return -g, -a, parts[2] if len(parts) > 2 else ""


def read_kaldi(path: str | Path, symbols: dict[int, str]) -> list[Lattice]:
    """Every lattice of a Kaldi text archive, in file order."""
    path = Path(path)
    lattices, name, arcs, finals, first = [], None, [], [], 0
    for n, line in enumerate([*read_text(path), ""], 1):
        parts = line.split()
        if not parts:
            if name is not None:
                lattices.append(_build(path, first, name, arcs, finals))
            name, arcs, finals = None, [], []
            continue
        if name is None:
            name, first = parts[0], n
            continue
        if len(parts) == 4:
            if not (parts[0].isdigit() and parts[1].isdigit() and parts[2].isdigit()):
                raise SeqlmError(f"{path}:{n}: expected 'src dst word-id weight', got {line.strip()[:40]!r}")
            word_id = int(parts[2])
            if word_id not in symbols:
                raise SeqlmError(f"{path}:{n}: word id {word_id} is not in the symbol table")
            g, a, ali = _weight(path, n, parts[3])
            arcs.append(Arc(int(parts[0]), int(parts[1]), symbols[word_id], a, g, {"ali": ali} if ali else {}))
        elif len(parts) <= 2 and parts[0].isdigit():
            g, a, ali = _weight(path, n, parts[1]) if len(parts) == 2 else (0.0, 0.0, "")
            finals.append((int(parts[0]), a, g, ali))
        else:
            raise SeqlmError(f"{path}:{n}: not a CompactLattice line: {line.strip()[:40]!r}")
    if not lattices:
        raise SeqlmError(f"{path}: no lattice in the file")
    return lattices


def _build(path: Path, line: int, name: str, arcs: list[Arc], finals: list) -> Lattice:
    if not finals:
        raise SeqlmError(f"{path}:{line}: lattice {name} has no final state")
    states = [s for a in arcs for s in (a.src, a.dst)] + [f[0] for f in finals]
    if max(states) > len(arcs) + len(finals):  # Kaldi numbers states 0..S-1, and S <= arcs + 1
        raise SeqlmError(f"{path}:{line}: lattice {name} names state {max(states)} but has only {len(arcs)} arcs; "
                         "Kaldi lattices number their states from 0")
    end = max(states) + 1  # the added end node
    for s, a, g, ali in finals:
        arcs.append(Arc(s, end, KALDI_EPS, a, g, {"ali": ali} if ali else {}))
    start = arcs[0].src if arcs else finals[0][0]
    lat = Lattice(name=name, num_nodes=end + 1, arcs=arcs, start=start, end=end)
    lat.check(f"{path}:{line}")
    return lat


def _cost(x: float) -> str:
    return repr(-x + 0.0) if x != 0 else "0"


def format_kaldi(lat: Lattice, ids: dict[str, int]) -> str:
    """Text CompactLattice; null-word arcs into the end node are written as final weights."""
    lines = [lat.name]
    finals = []
    for a in lat.arcs:
        ali = a.fields.get("ali", "")
        weight = f"{_cost(a.lm)},{_cost(a.acoustic)},{ali}"
        if a.dst == lat.end and is_null(a.word):
            finals.append(f"{a.src} {weight}")
            continue
        word = KALDI_EPS if a.word is None or is_null(a.word) and a.word not in ids else a.word
        if word not in ids:
            raise SeqlmError(f"lattice {lat.name}: word {word!r} is not in the symbol table")
        lines.append(f"{a.src} {a.dst} {ids[word]} {weight}")
    if any(a.src == lat.end for a in lat.arcs) or any(a.dst == lat.end and not is_null(a.word) for a in lat.arcs):
        finals.append(f"{lat.end} 0,0,")  # the end node is a real state: final with no cost
    return "\n".join(lines + finals) + "\n\n"


def write_kaldi(lattices: list[Lattice], path: str | Path, symbols: dict[int, str]) -> None:
    ids = {w: i for i, w in symbols.items()}
    atomic_write_text(path, "".join(format_kaldi(lat, ids) for lat in lattices))
