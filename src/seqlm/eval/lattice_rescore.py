"""`seqlm rescore MODEL --lattice FILE...`: lattice rescoring with any model (seqlm.lattice.expand).

For each lattice file: read it (HTK SLF, or Kaldi text with `--words`), expand it by the model's context
(exact for finite-context models: KN/FNN order n, AFP-K order K+1; the n-gram-merging approximation for
unbounded histories, reported as such), and
- with `--out DIR`: write the expanded lattice to DIR/<file name> in the format it was read, its LM scores
  (SLF `l=`, Kaldi graph cost) replaced by the model's, or interpolated: l = W new + (1 - W) old, W = `--lm-weight`;
  with `--nbest N` also DIR/nbest.tsv (key, acoustic, lm, text: the table `seqlm rescore --tsv` reads);
- print the 1-best of every lattice (`uttid word ...`) to stdout or `--best FILE`;
- report per lattice, as one JSON line on stderr: sizes, expanded states, order, whether the scores are exact,
  what the beam / the per-node cap pruned, unknown words, seconds.
Total path score: acoustic + lmscale * lm + wdpenalty per word (+ prscale * r), lmscale and wdpenalty from
the lattice header unless `--lmscale` is given (Kaldi lattices: 1).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from seqlm import checkpoint as ckpt
from seqlm.errors import SeqlmError
from seqlm.lattice import Lattice, WordMap, best_paths, expand, read_lattices, words_of, write_lattices
from seqlm.lattice.slf import read_text


def read_map(path: str | Path) -> dict[str, str]:
    """`lattice-word model-word` per line."""
    out = {}
    for n, line in enumerate(read_text(path), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise SeqlmError(f"{path}:{n}: expected 'lattice-word model-word', got {len(parts)} fields")
        out[parts[0]] = parts[1]
    return out


def rescore_lattice(lat: Lattice, model, words: WordMap, lm_weight: float = 1.0, lmscale: float | None = None,
                    merge_order: int = 4, order: int | None = None, beam: float | None = None,
                    max_states: int | None = None, nbest: int = 1) -> tuple[Lattice, list, dict]:
    """(rescored expanded lattice, [(total, arcs)] n best, report)."""
    if not 0.0 <= lm_weight <= 1.0:
        raise SeqlmError(f"with --lattice, --lm-weight is the new LM's share of l= (0..1), got {lm_weight}")
    if lmscale is not None:
        lat.lmscale = lmscale
        if "lmscale" in lat.header:
            lat.header["lmscale"] = repr(lmscale)  # the written lattice says what the 1-best used
    t0 = time.perf_counter()
    exp = expand(lat, model, words, merge_order, order, beam, max_states)
    out = exp.lattice
    for arc, old in zip(out.arcs, exp.old_lm, strict=True):
        arc.lm = lm_weight * arc.lm + (1.0 - lm_weight) * old
    paths = best_paths(out, max(nbest, 1))
    report = {"utterance": lat.name, "nodes": lat.num_nodes, "arcs": len(lat.arcs), "expanded_nodes": out.num_nodes,
              "expanded_arcs": len(out.arcs), "max_states_per_node": exp.max_states_per_node, "order": exp.order,
              "exact": exp.exact, "pruned_beam": exp.pruned_beam, "pruned_cap": exp.pruned_cap,
              "model_steps": exp.model_steps, "seconds": time.perf_counter() - t0}
    if not exp.exact:
        report["note"] = ("approximate: " + ("the beam or the state cap pruned states" if exp.pruned_beam or
                          exp.pruned_cap else f"unbounded history merged by its last {exp.order - 1} words"))
    return out, paths, report


def rescore_lattice_files(model_dir: str, files: list[str], words_txt: str | None = None, out_dir: str | None = None,
                          best: str | None = None, nbest: int = 0, lm_weight: float = 1.0,
                          lmscale: float | None = None, merge_order: int = 4, order: int | None = None,
                          beam: float | None = None, max_states: int | None = None, lowercase: bool = False,
                          map_file: str | None = None) -> list[dict]:
    """What `seqlm rescore --lattice` does (module docstring); returns the reports."""
    import seqlm

    if nbest and not out_dir:
        raise SeqlmError("--nbest N with --lattice writes OUT/nbest.tsv: give --out DIR")
    model = seqlm.load(model_dir)
    wm = WordMap(model.vocab, lowercase, read_map(map_file) if map_file else {})
    reports, best_lines, rows = [], [], ["key\tacoustic\tlm\ttext"]
    for f in files:
        fmt, lattices = read_lattices(f, words_txt)
        done = []
        for lat in lattices:
            wm.unknown.clear()
            out, paths, rep = rescore_lattice(lat, model, wm, lm_weight, lmscale, merge_order, order, beam,
                                              max_states, nbest)
            rep |= {"file": f, "unknown_words": len(wm.unknown)}
            print(json.dumps(rep), file=sys.stderr)
            reports.append(rep)
            done.append(out)
            best_lines.append(" ".join([lat.name.replace(" ", "_"), *words_of(paths[0][1])]) + "\n")
            for i, (_, arcs) in enumerate(paths[:nbest], 1):
                rows.append(f"{lat.name.replace(' ', '_')}-{i}\t{sum(a.acoustic for a in arcs):.6f}\t"
                            f"{sum(a.lm for a in arcs):.6f}\t{' '.join(words_of(arcs))}")
        if out_dir:
            write_lattices(done, Path(out_dir) / Path(f).name, fmt, words_txt)
    if nbest:
        ckpt.atomic_write_text(Path(out_dir) / "nbest.tsv", "\n".join(rows) + "\n")  # type: ignore[arg-type]
    if best:
        ckpt.atomic_write_text(best, "".join(best_lines))
    else:
        sys.stdout.write("".join(best_lines))
    return reports


def add_lattice_options(p) -> None:
    """The `seqlm rescore` options of lattice rescoring (argparse parser `p`)."""
    p.add_argument("--lattice", nargs="+", metavar="FILE",
                   help="rescore lattices instead: HTK SLF (.gz ok) or Kaldi text (with --words); see docs/lattices.md")
    p.add_argument("--words", metavar="FILE", help="with --lattice: the Kaldi symbol table (words.txt)")
    p.add_argument("--lowercase", action="store_true", help="with --lattice: lowercase lattice words for the model")
    p.add_argument("--map", metavar="FILE", help="with --lattice: 'lattice-word model-word' lines")
    p.add_argument("--order", type=int, metavar="N", help="with --lattice: expand by the last N-1 words "
                   "(default: the model's own context order, else --merge-order)")
    p.add_argument("--merge-order", type=int, default=4, metavar="N", help="with --lattice, unbounded-history "
                   "models: merge hypotheses whose last N-1 words agree (approximate)")
    p.add_argument("--beam", type=float, metavar="B", help="with --lattice: drop expanded states B below the "
                   "node's best forward score (off by default; reported when it binds)")
    p.add_argument("--max-states", type=int, metavar="S", help="with --lattice: keep at most S expanded states "
                   "per node (off by default; reported when it binds)")
    p.add_argument("--lmscale", type=float, help="with --lattice: LM scale of the total (default: the lattice's)")


def rescore_from_args(args) -> None:
    """`seqlm rescore MODEL --lattice FILE...`: --nbest N is a count here; --lm-weight W mixes l= (module doc)."""
    if args.tsv or args.acoustic or args.lm_scores or args.interpolate_old is not None or args.costs:
        raise SeqlmError("--lattice takes no --tsv/--acoustic/--lm-scores/--costs/--interpolate-old; "
                         "use --lm-weight W to interpolate l= with the old LM score")
    nbest = args.nbest or "0"
    if not nbest.isdigit():
        raise SeqlmError(f"with --lattice, --nbest is a number of hypotheses per lattice, got {nbest!r}")
    for name in ("order", "merge_order", "max_states"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SeqlmError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    rescore_lattice_files(args.model_dir, args.lattice, args.words, args.out, args.best, int(nbest), args.lm_weight,
                          args.lmscale, args.merge_order, args.order, args.beam, args.max_states, args.lowercase,
                          args.map)
