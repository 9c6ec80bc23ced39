"""The options of `seqlm rescore`, one name and one meaning each for n-best lists and lattices.

    --lm-scale X        LM scale (HTK lmscale, Kaldi --lm-scale); default 1, or the lattice's lmscale=
    --acoustic-scale X  acoustic scale (HTK acscale, Kaldi --acoustic-scale); default 1, or the lattice's acscale=
    --word-penalty P    subtracted per word (Kaldi's word insertion penalty; HTK's wdpenalty= is -P)
    --new-lm-weight W   the new LM's share: lm = W new + (1 - W) old (Kaldi's RNNLM rescoring --weight)
    --nbest FILE        an n-best list to rescore (SRILM's ngram -nbest)
    --nbest-decode N    the N best paths of each lattice (SRILM's lattice-tool -nbest-decode), written by
    --nbest-out FILE    ... as the TSV that --tsv reads, and by
    --out FILE          the score table (key acoustic old_lm new_lm total oov), in both modes
    --lattice-out DIR   the rescored lattices

Old spellings stay as aliases of the new meaning, with a one-line note on stderr: --lm-weight and --lmscale
are --lm-scale; --interpolate-old W (the old LM's share) is --new-lm-weight 1-W.
"""

from __future__ import annotations

import sys
from pathlib import Path

from seqlm.errors import SeqlmError

LATTICE_ONLY = {"words": "--words", "lowercase": "--lowercase", "map": "--map", "order": "--order",
                "merge_order": "--merge-order", "beam": "--beam", "max_states": "--max-states",
                "lattice_out": "--lattice-out", "nbest_decode": "--nbest-decode", "nbest_out": "--nbest-out"}
NBEST_ONLY = {"nbest": "--nbest", "tsv": "--tsv", "acoustic": "--acoustic", "lm_scores": "--lm-scores",
              "costs": "--costs"}


def add_options(p) -> None:
    """Every `seqlm rescore` option (argparse parser `p`)."""
    p.add_argument("model_dir", help="model directory (or an .arpa file)")
    p.add_argument("--force", action="store_true", help="replace existing --out/--best/--nbest-out/--lattice-out files")
    p.add_argument("--nbest", metavar="FILE", help="an n-best list to rescore: uttid-N word word ... per line")
    p.add_argument("--acoustic", metavar="FILE", help="with --nbest: lines 'uttid-N score'")
    p.add_argument("--lm-scores", metavar="FILE", help="with --nbest: the old LM scores, lines 'uttid-N score'")
    p.add_argument("--tsv", metavar="FILE", help="or an n-best list as one TSV file: key, acoustic, lm, text")
    p.add_argument("--costs", action="store_true", help="n-best scores are costs (-ln p), in the input and the output")
    p.add_argument("--lattice", nargs="+", metavar="FILE",
                   help="or lattices: HTK SLF (.gz ok) or Kaldi text (with --words); see docs/lattices.md")
    p.add_argument("--lm-scale", type=float, metavar="X",
                   help="LM scale of the total (default 1; with --lattice the lattice's lmscale=, else 1)")
    p.add_argument("--acoustic-scale", type=float, metavar="X",
                   help="acoustic scale of the total (default 1; with --lattice the lattice's acscale=, else 1)")
    p.add_argument("--word-penalty", type=float, metavar="P", help="subtracted from the total per word "
                   "(default 0; with --lattice minus the lattice's wdpenalty=)")
    p.add_argument("--oov-penalty", type=float, default=0.0, metavar="P",
                   help="subtracted from the total per word the model scores as <unk> (nats; column oov)")
    p.add_argument("--new-lm-weight", type=float, metavar="W", help="the new LM's share: lm = W new + (1 - W) old "
                   "(default 1: the new LM alone; the old LM: --lm-scores, the --tsv lm column, the lattice's)")
    p.add_argument("--out", metavar="FILE", help="the score table: key, acoustic, old_lm, new_lm, total, oov "
                   "(n-best lists: default stdout; lattices: their --nbest-decode N best)")
    p.add_argument("--best", metavar="FILE", help="the best hypothesis of each utterance, uttid word ... "
                   "(lattices: default stdout)")
    p.add_argument("--lattice-out", metavar="DIR", help="with --lattice: write the rescored lattices here")
    p.add_argument("--nbest-decode", type=int, metavar="N", help="with --lattice: the N best distinct texts of "
                   "each lattice go to --out and --nbest-out (default 1)")
    p.add_argument("--nbest-out", metavar="FILE", help="with --lattice: those hypotheses as the TSV --tsv reads")
    p.add_argument("--words", metavar="FILE", help="with --lattice: the Kaldi symbol table (words.txt)")
    p.add_argument("--lowercase", action="store_true", help="with --lattice: lowercase lattice words for the model")
    p.add_argument("--map", metavar="FILE", help="with --lattice: 'lattice-word model-word' lines")
    p.add_argument("--order", type=int, metavar="N", help="with --lattice: expand by the last N-1 words "
                   "(default: the model's own context order, else --merge-order)")
    p.add_argument("--merge-order", type=int, metavar="N", help="with --lattice, unbounded-history "
                   "models: merge hypotheses whose last N-1 words agree (approximate; default 4)")
    p.add_argument("--beam", type=float, metavar="B", help="with --lattice: drop expanded states B below the "
                   "node's best forward score (off by default; reported when it binds)")
    p.add_argument("--max-states", type=int, metavar="S", help="with --lattice: keep at most S expanded states "
                   "per node (off by default; reported when it binds)")
    p.add_argument("--lm-weight", type=float, metavar="X", help="old spelling of --lm-scale (with --lattice it "
                   "used to be the new LM's share: now --new-lm-weight)")
    p.add_argument("--lmscale", type=float, metavar="X", help="old spelling of --lm-scale")
    p.add_argument("--interpolate-old", type=float, metavar="W", help="old spelling of --new-lm-weight 1-W "
                   "(W: the old LM's share)")


def combination(args, notes: list[str]):
    """The Combination of the flags, old spellings mapped to the new names (a note for each in `notes`)."""
    from seqlm.eval.rescore import Combination

    scale = args.lm_scale
    for dest, flag in (("lm_weight", "--lm-weight"), ("lmscale", "--lmscale")):
        value = getattr(args, dest)
        if value is None:
            continue
        if scale is not None:
            raise SeqlmError(f"{flag} is an old spelling of --lm-scale: give one of them")
        scale = value
        notes.append(f"{flag} is an old spelling of --lm-scale (the LM scale); the new LM's share is "
                     "--new-lm-weight W")
    weight = args.new_lm_weight
    if args.interpolate_old is not None:
        if weight is not None:
            raise SeqlmError("--interpolate-old W is an old spelling of --new-lm-weight 1-W: give one of them")
        if not 0.0 <= args.interpolate_old <= 1.0:
            raise SeqlmError(f"--interpolate-old is the old LM's share, between 0 and 1, got {args.interpolate_old}")
        weight = 1.0 - args.interpolate_old
        notes.append(f"--interpolate-old {args.interpolate_old:g} is an old spelling of --new-lm-weight {weight:g}")
    comb = Combination(scale, args.acoustic_scale, args.word_penalty, 1.0 if weight is None else weight,
                       args.oov_penalty)
    comb.check()
    return comb


def _given(args, names: dict[str, str]) -> list[str]:
    return [flag for dest, flag in names.items() if getattr(args, dest) not in (None, False)]


def run(args) -> None:
    """`seqlm rescore`: an n-best list (seqlm.eval.rescore) or lattices (seqlm.eval.lattice_rescore).
    Notes on old spellings come last, after a run that worked (an error stays one line)."""
    from seqlm.eval.rescore import rescore_files

    notes: list[str] = []
    comb = combination(args, notes)
    if not args.lattice:
        if extra := _given(args, LATTICE_ONLY):
            raise SeqlmError(f"{', '.join(extra)}: lattice options (with --lattice); n-best lists take --nbest/--tsv")
        _claim_outputs(args)
        rescore_files(args.model_dir, args.nbest, args.tsv, args.acoustic, args.lm_scores, args.costs, comb,
                      args.out, args.best)
    else:
        _run_lattices(args, comb)
    for note in notes:
        print(f"seqlm: {note}", file=sys.stderr)


def _claim_outputs(args) -> None:
    """No file this run writes is one it reads, and an existing file is replaced only with --force (the rule of
    every writing command: seqlm.outputs)."""
    from seqlm.outputs import claim_output

    inputs = [args.model_dir, args.nbest, args.acoustic, args.lm_scores, args.tsv, args.words, args.map,
              *(args.lattice or [])]
    outputs = [("--out", args.out), ("--best", args.best), ("--nbest-out", args.nbest_out)]
    if args.lattice and args.lattice_out:  # the rescored lattices keep their files' names
        if Path(args.lattice_out).is_file():
            raise SeqlmError(f"--lattice-out {args.lattice_out} is a file; give a directory for the lattices")
        outputs += [("--lattice-out", Path(args.lattice_out) / Path(f).name) for f in args.lattice]
    for what, path in outputs:
        claim_output(path, args.force, what, inputs=inputs)


def _run_lattices(args, comb) -> None:
    from seqlm.eval.lattice_rescore import Outputs, rescore_lattice_files

    if args.nbest is not None:
        raise SeqlmError("with --lattice, --nbest FILE (an n-best list to rescore) does not apply; for the N best "
                         "paths of each lattice give --nbest-decode N with --nbest-out FILE and/or --out FILE")
    if extra := _given(args, NBEST_ONLY):
        raise SeqlmError(f"--lattice takes no {', '.join(extra)} (the lattice holds the acoustic and old LM "
                         "scores; --new-lm-weight W mixes in the old one)")
    if args.out and (Path(args.out).is_dir() or args.out.endswith(("/", "\\"))):
        raise SeqlmError(f"--out is the score table, a file; {args.out} is a directory: rescored lattices go to "
                         "--lattice-out DIR")
    for name in ("order", "merge_order", "max_states", "nbest_decode"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SeqlmError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.nbest_decode and not (args.out or args.nbest_out):
        raise SeqlmError("--nbest-decode N writes the N best of each lattice to --nbest-out FILE and/or --out FILE: "
                         "give one")
    _claim_outputs(args)
    outputs = Outputs(args.lattice_out, args.best, args.out, args.nbest_out, args.nbest_decode or 1)
    rescore_lattice_files(args.model_dir, args.lattice, outputs, comb, args.words, args.lowercase, args.map,
                          args.merge_order or 4, args.order, args.beam, args.max_states)
