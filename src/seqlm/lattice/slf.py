"""HTK Standard Lattice Format (SLF) reader and writer (the HTK Book, 'HTK Standard Lattice Format').

Read: `key=value` fields (values may be "quoted"), `#` comment lines, gzipped files, a header (VERSION,
UTTERANCE, base, lmscale, wdpenalty, prscale, N, L, ...), node lines `I=` (t=, W=, v=) and link lines `J=`
(S=, E=, W=, a=, l=, r=, v=, ...), long field names (NODES=, LINKS=, START=, END=, WORD=, acoustic=,
language=) included. Words may sit on links or on nodes: a node's word belongs to the links entering it.
Scores (a=, l=, r=) are converted from the file's `base=` (default e; HTK reads base=1 as e too) to natural
logs; the header's acscale=, lmscale=, prscale= and wdpenalty= are read as they are (HTK does not apply
base= to them: wdpenalty is a natural log).
Write: the same layout back (words on nodes if the file had them there, else on links), scores in the
file's base, every other field as it was read.
"""

from __future__ import annotations

import gzip
import math
import re
from pathlib import Path

from seqlm.checkpoint import atomic_path
from seqlm.errors import SeqlmError
from seqlm.lattice.graph import Arc, Lattice

_FIELD = re.compile(r'([^\s=]+)=("(?:[^"\\]|\\.)*"|\S*)')
_LONG = {"NODES": "N", "LINKS": "L", "UTTERANCE": "U", "START": "S", "END": "E", "WORD": "W", "acoustic": "a",
         "language": "l", "time": "t", "var": "v", "div": "d", "VERSION": "V", "SUBLAT": "s",
         "start": "S", "end": "E"}
_LINK_SKIP = {"J", "S", "E", "W", "a", "l"}  # link fields held by Arc itself; the rest go to Arc.fields


def read_text(path: str | Path) -> list[str]:
    """The file's lines (UTF-8, gzipped or not), for the readers; one-line errors."""
    path = Path(path)
    if not path.is_file():
        raise SeqlmError(f"{path}: no such lattice file")
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise SeqlmError(f"{path}: not UTF-8 ({e.reason} at byte {e.start}); convert the lattice to UTF-8") from None
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise SeqlmError(f"{path}: cannot read ({e})") from None


def _fields(line: str) -> dict[str, str]:
    out = {}
    for k, v in _FIELD.findall(line):
        out[_LONG.get(k, k)] = v[1:-1] if v.startswith('"') else v
    return out


def _float(path: Path, n: int, fields: dict[str, str], key: str, scale: float = 1.0) -> float:
    try:
        x = float(fields.get(key, "0"))
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise SeqlmError(f"{path}:{n if n else ' header'}: {key}={fields[key]!r} is not a finite number")
    return x * scale


def _int(path: Path, n: int, fields: dict[str, str], key: str, limit: int) -> int:
    text = fields.get(key)
    if text is None or not text.isdigit() or int(text) >= limit:
        raise SeqlmError(f"{path}:{n}: {key}={text!r} is not a node number below N={limit}")
    return int(text)


def read_slf(path: str | Path) -> Lattice:
    path = Path(path)
    header: dict[str, str] = {}
    nodes: dict[int, dict[str, str]] = {}
    links: list[tuple[int, dict[str, str]]] = []
    for n, line in enumerate(read_text(path), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        f = _fields(line)
        if not f:
            raise SeqlmError(f"{path}:{n}: expected key=value fields, got {line.strip()[:40]!r}")
        if "J" in f:
            links.append((n, f))
        elif "I" in f:
            if not f["I"].isdigit():
                raise SeqlmError(f"{path}:{n}: node number I={f['I']!r} is not a number")
            nodes[int(f["I"])] = {k: v for k, v in f.items() if k != "I"}
        else:
            header.update(f)
    return _build(path, header, nodes, links)


def _build(path: Path, header: dict[str, str], nodes: dict[int, dict[str, str]],
           links: list[tuple[int, dict[str, str]]]) -> Lattice:
    if "N" not in header or not header["N"].isdigit():
        raise SeqlmError(f"{path}: no N= (node count) in the header; is this an HTK SLF lattice?")
    num = int(header["N"])
    if num > len(nodes) + 2 * len(links) + 1:  # nodes nothing names would be empty, and N sizes the tables
        raise SeqlmError(f"{path}: the header says N={num} nodes but the file lists {len(nodes)} nodes and "
                         f"{len(links)} links")
    if "L" in header and header["L"].isdigit() and int(header["L"]) != len(links):
        raise SeqlmError(f"{path}: the header says L={header['L']} links but the file has {len(links)}")
    base = _float(path, 0, header, "base") if "base" in header else math.e
    if base == 1.0:
        base = math.e  # HTK: base=1 means natural logs (its default)
    if base <= 0:
        raise SeqlmError(f"{path}: base={header['base']} is not supported (scores must be logs to a base > 0)")
    ln = math.log(base)
    node_fields = [nodes.get(i, {}) for i in range(num)]
    words_on_nodes = any("W" in f for f in node_fields)
    arcs = []
    for n, f in links:
        src, dst = _int(path, n, f, "S", num), _int(path, n, f, "E", num)
        word = f.get("W", node_fields[dst].get("W"))
        if "r" in f:
            _float(path, n, f, "r")  # a number (Lattice.side reads it)
        arcs.append(Arc(src, dst, word, _float(path, n, f, "a", ln), _float(path, n, f, "l", ln),
                        {k: v for k, v in f.items() if k not in _LINK_SKIP}))
    scales = {k: _float(path, 0, header, k) for k in ("acscale", "lmscale", "prscale") if k in header}
    lat = Lattice(name=header.get("U", path.name), num_nodes=num, arcs=arcs, start=0, end=0,
                  wdpenalty=_float(path, 0, header, "wdpenalty"), header=header, node_fields=node_fields,
                  words_on_nodes=words_on_nodes, base=base, **scales)
    lat.start, lat.end = _ends(path, lat, header)
    lat.check(str(path))
    return lat


def _ends(path: Path, lat: Lattice, header: dict[str, str]) -> tuple[int, int]:
    """start= / end= from the header, else the one node without incoming / outgoing links."""
    has_in, has_out = set(a.dst for a in lat.arcs), set(a.src for a in lat.arcs)
    found = []
    for key, free, what in (("S", has_in, "incoming"), ("E", has_out, "outgoing")):
        if key in header:
            found.append(_int(path, 0, header, key, lat.num_nodes))
            continue
        cands = [v for v in range(lat.num_nodes) if v not in free]
        if len(cands) != 1:
            raise SeqlmError(f"{path}: {len(cands)} nodes have no {what} links; a lattice needs exactly one "
                             f"{'start' if key == 'S' else 'end'} node")
        found.append(cands[0])
    return found[0], found[1]


def _quote(v: str) -> str:
    return f'"{v}"' if (not v or any(c.isspace() for c in v)) else v


def _num(x: float) -> str:
    return f"{x:.6f}".rstrip("0").rstrip(".") if x != 0 else "0"


def format_slf(lat: Lattice) -> str:
    ln = math.log(lat.base)
    head = dict(lat.header)
    head.pop("N", None), head.pop("L", None)
    if not lat.header:
        head = {"VERSION": "1.1", "UTTERANCE": lat.name, "lmscale": _num(lat.lmscale),
                "wdpenalty": _num(lat.wdpenalty), "acscale": _num(lat.acscale)}
    names = {v: k for k, v in _LONG.items() if k in ("VERSION", "UTTERANCE")}
    lines = [f"{names.get(k, k)}={_quote(v)}" for k, v in head.items()]
    lines.append(f"N={lat.num_nodes} L={len(lat.arcs)}")
    for i in range(lat.num_nodes):
        f = dict(lat.node_fields[i]) if i < len(lat.node_fields) else {}
        if not lat.words_on_nodes:
            f.pop("W", None)
        lines.append(" ".join([f"I={i}", *(f"{k}={_quote(v)}" for k, v in f.items())]))
    for j, a in enumerate(lat.arcs):
        parts = [f"J={j}", f"S={a.src}", f"E={a.dst}"]
        if not lat.words_on_nodes and a.word is not None:
            parts.append(f"W={_quote(a.word)}")
        parts += [f"a={_num(a.acoustic / ln)}", f"l={_num(a.lm / ln)}"]
        parts += [f"{k}={_quote(v)}" for k, v in a.fields.items()]
        lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"


def write_slf(lat: Lattice, path: str | Path) -> None:
    """Write `lat` as SLF (gzipped when the name ends in .gz), atomically."""
    data = format_slf(lat).encode("utf-8")
    with atomic_path(path) as tmp:
        tmp.write_bytes(gzip.compress(data, mtime=0) if str(path).endswith(".gz") else data)
