"""The n-gram subcommands for KenLM and SRILM users: `seqlm convert` (ARPA <-> binary), `seqlm query` (KenLM's
query), `seqlm prune` (SRILM's ngram -prune / -order, KenLM's filter, on a finished model) and `seqlm count`
(SRILM's ngram-count -write)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from seqlm.errors import SeqlmError


def cmd_convert(args: argparse.Namespace, rest: list[str]) -> None:
    """Convert an n-gram model: ARPA (KenLM, SRILM) to seqlm's memory-mapped binary, or back to ARPA."""
    from seqlm.ngram.tools import convert
    from seqlm.outputs import claim_output

    claim_output(args.dst, args.force, "output", inputs=[args.src])
    print(json.dumps(convert(_ngram_source(args.src, "convert"), args.dst)))


def cmd_query(args: argparse.Namespace, rest: list[str]) -> None:
    """Score stdin, one sentence per line, printing KenLM `query`-style lines and perplexities (or SRILM's
    `ngram -ppl -debug 2` output: --format srilm)."""
    from seqlm.ngram.tools import query_main

    model = args.model if args.format == "srilm" else _ngram_source(args.model, "query")  # srilm: any family
    query_main(model, args.verbose, args.format, args.null_context, args.load)


def cmd_prune(args: argparse.Namespace, rest: list[str]) -> None:
    """Shrink a finished n-gram model: entropy pruning, fewer orders, a vocabulary (ngram/shrink.py)."""
    from seqlm.ngram.shrink import shrink
    from seqlm.outputs import claim_output

    if args.prune is not None:
        raise SeqlmError("--prune (by count) needs the n-gram counts, which a finished model does not hold: prune "
                         "by count at estimation (seqlm train --model kn --prune ...), or use --entropy")
    claim_output(args.dst, args.force, "output", inputs=[args.src])
    print(json.dumps(shrink(_ngram_source(args.src, "prune"), args.dst, args.entropy, args.order, args.vocab)))


def cmd_count(args: argparse.Namespace, rest: list[str]) -> None:
    """Count the n-grams of a text and write them as an SRILM count file (ngram-count -text -order -write)."""
    from seqlm.ngram.from_counts import count_main

    count_main(args.text, args.data, args.order, args.write_counts, args.text_has_weights, args.force, rest)


def _ngram_source(path: str, command: str) -> str:
    """query and convert take n-gram models: a model directory of another family says which family it is and
    what to use instead (not that its model.arpa is missing)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return path
    from seqlm.checkpoint import read_json

    meta = read_json(config, "config.json")
    fam = meta.get("family") if isinstance(meta, dict) else None
    if fam in (None, "kn"):
        return path
    instead = {"query": f"score its text with `seqlm score {path}` (reads standard input too) or `seqlm eval`",
               "convert": "a neural or mixture model has no ARPA or binary form (only kn models do)",
               "prune": "only n-gram models are pruned this way (a neural model: seqlm quantize)"}[command]
    raise SeqlmError(f"{path} is a {fam} model directory; `seqlm {command}` takes an n-gram model (a kn model "
                     f"directory, an ARPA file or a seqlm binary): {instead}")


def add_ngram_commands(sub) -> None:
    """Add `convert`, `query`, `prune` and `count` to the `seqlm` subcommand parsers."""
    cv = sub.add_parser("convert", help=cmd_convert.__doc__)
    cv.add_argument("src", help="ARPA file (.gz ok), binary model or kn model directory")
    cv.add_argument("dst", help="output: binary model (e.g. model.bin), or ARPA when it ends .arpa[.gz]")
    cv.add_argument("--force", action="store_true", help="replace dst if it exists")
    cv.set_defaults(func=cmd_convert)
    qy = sub.add_parser("query", help=cmd_query.__doc__)
    qy.add_argument("model", help="kn model directory, binary model or ARPA file (--format srilm: any model)")
    qy.add_argument("-v", "--verbose", default="word", choices=["word", "sentence", "summary"],
                    help="per-token lines (word), totals per sentence, or the perplexity summary only (SRILM's "
                    "-debug 2, 1, 0)")
    qy.add_argument("--format", default="kenlm", choices=["kenlm", "srilm"],
                    help="KenLM query's lines, or SRILM `ngram -ppl - -debug N`'s (docs/ngram.md)")
    qy.add_argument("-n", dest="null_context", action="store_true",
                    help="no <s> before a line and no </s> after it (KenLM query -n; KenLM format only)")
    qy.add_argument("-l", dest="load", choices=["lazy", "populate", "read", "parallel"],
                    help="KenLM query -l: lazy maps the model only (no per-call tables in this process: less "
                    "memory, slower lookups); the others, the default, build them (n-gram models only)")
    qy.set_defaults(func=cmd_query)
    pr = sub.add_parser("prune", help=cmd_prune.__doc__)
    pr.add_argument("src", help="ARPA file (.gz ok), binary model (seqlm's or KenLM's) or kn model directory")
    pr.add_argument("dst", help="output: binary model (e.g. small.bin), or ARPA when it ends .arpa[.gz]")
    pr.add_argument("--entropy", type=float, default=0.0,
                    help="drop n-grams whose removal raises the relative entropy less than this (SRILM -prune)")
    pr.add_argument("--order", type=int, default=0, help="keep orders 1..N only (SRILM -order)")
    pr.add_argument("--vocab", default="", help="keep the n-grams of these words only, numbers unchanged "
                    "(KenLM filter): a word list, one a line (a model's vocab.txt works)")
    pr.add_argument("--prune", default=None, help=argparse.SUPPRESS)  # refused with the reason (cmd_prune)
    pr.add_argument("--force", action="store_true", help="replace dst if it exists")
    pr.set_defaults(func=cmd_prune)
    _add_count(sub)


def _add_count(sub) -> None:
    """`seqlm count`: SRILM's ngram-count -text T -order N -write F (seqlm.ngram.from_counts)."""
    ct = sub.add_parser("count", help=cmd_count.__doc__, description="The text is read as `seqlm train --model kn` "
                        "reads it; its reading options (--vocab, --unk, --unit, --raw, --max-vocab, --min-count) "
                        "follow as --key value. See docs/ngram.md.")
    ct.add_argument("--text", metavar="FILE", help="the text to count (- = standard input, also read when it is a "
                    "pipe or a file and neither --text nor --data is given)")
    ct.add_argument("--data", help="or a dataset name, corpus directory (its train.txt) or text file")
    ct.add_argument("--order", type=int, default=5, help="count n-grams of orders 1..N (default 5)")
    ct.add_argument("--write-counts", required=True, metavar="FILE", help="the count file to write (.gz: compressed; "
                    "- = standard output)")
    ct.add_argument("--text-has-weights", action="store_true", help="each line starts with its weight (SRILM's "
                    "-text-has-weights); counts are summed weights")
    ct.add_argument("--force", action="store_true", help="replace --write-counts if it exists")
    ct.set_defaults(func=cmd_count, allow_rest=True)
