"""The `seqlm` command line: one small function per subcommand.

User errors (SeqlmError, bad flags) print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from seqlm.errors import ERROR_DIR_ENV, SeqlmError
from seqlm.ngram.commands import add_ngram_commands


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, status 2, no usage dump
        raise SeqlmError(f"{self.prog}: {message} (see --help)")


def trainable_families() -> list[str]:
    """The families `seqlm train` can train: all but those built from saved models (a mixture)."""
    from seqlm.registry import FAMILIES, MixtureFamily

    return [name for name, fam in FAMILIES.items() if not isinstance(fam, MixtureFamily)]


def _family_name(name: str) -> str:
    """--model: a known family (`mix` passes, so that training it says how mixtures are built instead)."""
    from seqlm.registry import FAMILIES

    if name not in FAMILIES:
        raise argparse.ArgumentTypeError(f"unknown model family {name!r}; choose one of: "
                                         f"{', '.join(trainable_families())}")
    return name


def _text_stream(model, args, path: Path | None = None):
    """The text eval/score read, the way the model reads text (protocol.encode_text: its unit, raw or not)."""
    from seqlm.data.datasets import text_path
    from seqlm.protocol import encode_text

    return encode_text(model, path or text_path(args.text, args.data, args.split), raw=args.raw)


def _file_reading(args: argparse.Namespace):
    """eval/score of an n-gram file: how its words read text (--tokenizer, --arpa-encoding, --arpa-offset)."""
    from seqlm.config import DataConfig, apply_overrides

    given = {k: getattr(args, k) for k in ("tokenizer", "arpa_encoding", "arpa_offset") if getattr(args, k) is not None}
    if not given:
        return None
    data = DataConfig()
    apply_overrides([data], given | ({"unit": "token"} if args.tokenizer else {}))
    return data


def _check_peeking(args: argparse.Namespace) -> None:
    """eval/score/rescore/interpolate (the commands with --allow-peek): refuse a model that peeks at the scored
    text (dae) unless --allow-peek; then say on stderr what its figure is, and keep it for the JSON output."""
    from seqlm.models.dae import refuse_peeking

    args.peek_note = refuse_peeking(getattr(args, "model_dirs", None) or [args.model_dir], args.allow_peek)
    if args.peek_note:
        print(f"seqlm: note: {args.peek_note}", file=sys.stderr)


ALLOW_PEEK = "score a dae model that peeks at the text anyway: the figure is p(s|c(s)), c(s) computed from it"


def cmd_train(args: argparse.Namespace, rest: list[str]) -> None:
    """Train (or, for kn, estimate) a model and print its valid and test perplexity."""
    from seqlm.train.run import config_help, train_from_cli

    if args.help_config:
        print(config_help(args.model))
        return
    rest = rest + (["--prune", " ".join(args.prune)] if args.prune else [])  # kn's config field, lmplz syntax
    result = train_from_cli(args.model, args.data, args.out, args.config, rest, args.resume, args.nproc,
                            init_from=args.init_from, text=args.text, arpa=args.arpa, binary=args.binary,
                            force=args.force, counts=args.counts, weighted=args.text_has_weights)
    if result:  # data-parallel ranks other than 0 have nothing to report
        # the model itself on standard output (--arpa -): the report goes to stderr, as lmplz's does
        print(json.dumps(result), file=sys.stderr if "-" in (args.arpa, args.binary) else sys.stdout)


def cmd_eval(args: argparse.Namespace, rest: list[str]) -> None:
    """Perplexity of a text under a model, as one JSON line."""
    import seqlm
    from seqlm.eval.perplexity import evaluate

    model = seqlm.load(args.model_dir, _file_reading(args))
    if args.iterations is not None:  # another history rule for an Elman model (seqlm.models.afp)
        from seqlm.models.afp import parse_iterations, with_iterations
        model = with_iterations(model, parse_iterations(args.iterations))
    dynamic = ("lr", "segment", "rule", "decay", "stats", "stats_tokens")
    if any(getattr(args, f"dynamic_{k}") is not None for k in dynamic):  # seqlm.eval.dynamic
        from seqlm.eval.dynamic import Dynamic
        model = Dynamic(model, args.dynamic_lr, args.dynamic_segment, args.dynamic_rule or "sgd", args.dynamic_decay,
                        args.dynamic_stats, args.dynamic_stats_tokens)
    result = evaluate(model, _text_stream(model, args), stream_mode=args.stream)
    print(json.dumps(result | model.settings() | ({"peeks": args.peek_note} if args.peek_note else {})))


def cmd_score(args: argparse.Namespace, rest: list[str]) -> None:
    """log10 probability per input line (like KenLM's query), or per token with --per-token. One output line per
    input line: an empty one for a blank line (no sentence), the sum of its sentences for a raw line."""
    import tempfile

    import numpy as np

    import seqlm
    from seqlm.data.corpus import sentences_per_line, spool
    from seqlm.data.datasets import text_path
    from seqlm.eval.perplexity import LOG10, score_tokens

    model = seqlm.load(args.model_dir, _file_reading(args))
    with tempfile.TemporaryDirectory() as tmp:
        path = text_path(args.text, args.data, args.split)
        if not path.is_file():  # standard input or a pipe: read twice (sentences, then lines)
            path = spool(path, Path(tmp) / "text")
        stream = _text_stream(model, args, path)
        per_line = sentences_per_line(path, model.text_spec().raw)
    logp = score_tokens(model, stream).logp / LOG10
    bounds = np.asarray(stream.starts)[np.concatenate([[0], np.cumsum(per_line)])]  # (L + 1,) token offsets
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        sys.stdout.write(_score_line(model, stream.ids[lo:hi], logp[lo:hi], args.per_token) if hi > lo else "\n")


def _score_line(model, ids, logp, per_token: bool) -> str:
    if not per_token:
        return f"{logp.sum():.6f}\n"
    words = model.vocab.decode(ids)
    return "\t".join(f"{w} {p:.6f}" for w, p in zip(words, logp, strict=True)) + f"\tTotal: {logp.sum():.6f}\n"


def cmd_generate(args: argparse.Namespace, rest: list[str]) -> None:
    """Sample sentences from a model (or find the most probable ones with --beam N)."""
    from seqlm.eval.generate import run_generate

    print("\n".join(run_generate(args)))


def cmd_info(args: argparse.Namespace, rest: list[str]) -> None:
    """Family, config, parameter counts (n-grams per order for kn) and vocabulary size of a model, as JSON."""
    from seqlm.api import describe

    print(json.dumps(describe(args.model_dir), indent=2 if args.pretty else None))


def cmd_embed(args: argparse.Namespace, rest: list[str]) -> None:
    """Train skip-gram word vectors (gensim word2vec) on a corpus; write word2vec text format."""
    from seqlm.codes.embed import embed_from_cli

    print(json.dumps(embed_from_cli(args)))


def cmd_sparse_codes(args: argparse.Namespace, rest: list[str]) -> None:
    """Code rare words as sparse non-negative mixes of B base words (sparse-word-representations, eq. 5)."""
    from seqlm.codes.sparse_codes import codes_from_cli

    print(codes_from_cli(args))


def cmd_plot(args: argparse.Namespace, rest: list[str]) -> None:
    """Learning curves (valid perplexity against epoch and wall time) of one or more runs, as PNG."""
    from seqlm.eval.plot import plot_runs

    plot_runs([Path(d) for d in args.model_dirs], Path(args.out), force=args.force)
    print(args.out)


def cmd_fofe_collisions(args: argparse.Namespace, rest: list[str]) -> None:
    """FOFE uniqueness check: collisions among all binary sequences of length T, and on a real corpus."""
    from seqlm.data.datasets import resolve_corpus, split_path
    from seqlm.eval.fofe_collisions import run

    corpus = split_path(resolve_corpus(args.data), "train") if args.data else None

    def floats(text: str) -> list[float]:
        try:
            return [float(x) for x in text.split(",")]
        except ValueError:
            raise SeqlmError(f"expected comma-separated numbers, got {text!r}") from None

    result = run(alphas=floats(args.alphas) if args.alphas else None,
                 epsilons=floats(args.epsilons) if args.epsilons else None, max_len=args.max_len,
                 corpus_path=corpus, out_json=args.out_json, out_png=args.out_png, force=args.force)
    print(json.dumps(result if args.verbose else {k: v for k, v in result.items() if k != "examples"}))


def cmd_interpolate(args: argparse.Namespace, rest: list[str]) -> None:
    """Combine saved models by linear interpolation into a mixture model directory, or merge n-gram models into
    one back-off ARPA model (--arpa-out); weights by EM on held-out text: --text FILE, or --data CORPUS --split
    valid."""
    from seqlm.data.datasets import text_path
    from seqlm.eval.interpolate import interpolate, interpolate_arpa
    from seqlm.outputs import claim_output, clear_model

    held_out = text_path(args.text, args.data, args.split) if args.text or args.data else None
    if args.arpa_out:
        claim_output(args.arpa_out, args.force, "--arpa-out", inputs=args.model_dirs)
        print(json.dumps(interpolate_arpa(args.model_dirs, args.arpa_out, held_out, args.weights, args.em,
                                          args.stream, args.raw)))
        return
    if claim_output(args.out, args.force, "--out", directory=True, inputs=args.model_dirs):
        clear_model(args.out)
    print(json.dumps(interpolate(args.model_dirs, args.out, held_out, args.weights, args.em, args.stream,
                                 args.raw) | ({"peeks": args.peek_note} if args.peek_note else {})))


def cmd_dsae(args: argparse.Namespace, rest: list[str]) -> None:
    """Discrete sequence autoencoding efficiency of a dae model against a baseline (p, p', b, K, DSAE)."""
    from seqlm.eval.dsae import dsae_from_dirs

    print(json.dumps(dsae_from_dirs(args.baseline, args.dae, args.data, args.text, args.split)))


def cmd_rescore(args: argparse.Namespace, rest: list[str]) -> None:
    """Rescore an n-best list or lattices with a model: new totals, the 1-best per utterance (docs/combination.md)."""
    from seqlm.eval.rescore_cli import run

    run(args)


def cmd_quantize(args: argparse.Namespace, rest: list[str]) -> None:
    """int8 copy of a neural model (dynamic quantization of its Linear/LSTM layers) for CPU inference."""
    from seqlm.nn.quantize import quantize_dir

    print(json.dumps(quantize_dir(args.model_dir, args.out, args.force)))


def cmd_decode(args: argparse.Namespace, rest: list[str]) -> None:
    """CTC beam search: label posteriors to transcripts, with any model, mixture or ARPA file as the LM."""
    from seqlm.decode.command import run

    run(args)


def cmd_export(args: argparse.Namespace, rest: list[str]) -> None:
    """Write a model's step function as an ONNX graph, its state as explicit inputs and outputs."""
    from seqlm.export.onnx import export_onnx

    print(json.dumps(export_onnx(args.model_dir, args.onnx, args.force)))


def _add_train(sub) -> None:
    """`seqlm train`: a family, its text, where the model goes; the family's own options pass through."""
    from seqlm.registry import DEFAULT_FAMILY

    t = sub.add_parser("train", help=cmd_train.__doc__,
                       description="Model and training options (--hidden, --lr, --max-epochs, ...) follow as "
                                   "--key value; `seqlm train --model NAME --help-config` lists them.")
    t.add_argument("--model", type=_family_name, default=None, metavar="{" + ",".join(trainable_families()) + "}",
                   help=f"model family to train (default {DEFAULT_FAMILY})")
    t.add_argument("--data", default=None, help="dataset name (ptb), corpus directory (train.txt; valid.txt and "
                   "test.txt optional) or one text file; no default")
    t.add_argument("--text", default=None, metavar="FILE", help="or one training text file (- = standard input, "
                   "which is also read when it is a pipe or a file and neither option is given)")
    t.add_argument("--out", default=None, help="model directory to write (default runs/FAMILY; none when only "
                   "--arpa/--binary are asked for)")
    t.add_argument("--arpa", default=None, metavar="FILE", help="kn: also write the ARPA file here (- = standard "
                   "output; a name ending .gz is compressed)")
    t.add_argument("--binary", default=None, metavar="FILE", help="kn: also write seqlm's binary model here "
                   "(- = standard output)")
    t.add_argument("--force", action="store_true", help="replace a model in --out and existing --arpa/--binary "
                   "files")
    t.add_argument("--config", default=None, help="YAML file of options")
    t.add_argument("--resume", action="store_true", help="continue from the last epoch checkpoint in --out")
    t.add_argument("--nproc", type=int, default=1, help="data-parallel processes (spawns torchrun)")
    t.add_argument("--init-from", default=None, metavar="DIR",
                   help="start from a trained model's weights (same vocabulary and sizes; e.g. rnn -> afp)")
    t.add_argument("--help-config", action="store_true", help="list the family's options and defaults, then exit")
    t.add_argument("--prune", nargs="+", metavar="T", help="kn: lmplz count pruning thresholds per order")
    t.add_argument("--counts", metavar="A[,B...]", help="kn: estimate from count files instead of text (seqlm count, "
                   "SRILM's ngram-count -write), merged by summing equal n-grams")
    t.add_argument("--text-has-weights", action="store_true", help="kn: each training line starts with its weight "
                   "(SRILM's -text-has-weights); n-gram counts are summed weights")
    t.set_defaults(func=cmd_train, allow_rest=True)


def _text_args(q: argparse.ArgumentParser) -> None:
    q.add_argument("model_dir", help="model directory (or an .arpa file)")
    q.add_argument("--text", help="text file, one sentence per line (.gz ok; - = standard input, which is "
                   "also read when it is a pipe or a file and neither --text nor --data is given)")
    q.add_argument("--data", help="or a dataset name / corpus directory ...")
    q.add_argument("--split", default="test", choices=["train", "valid", "test"], help="... and its split")
    q.add_argument("--raw", action="store_true", default=None, help="untokenised text (see docs); text is "
                   "read the way the model was trained, so this only confirms a model trained with --raw")
    q.add_argument("--allow-peek", action="store_true", help=ALLOW_PEEK)
    q.add_argument("--tokenizer", metavar="MODEL", help="an n-gram file over subword tokens: their tokenizer (a "
                   "model directory has its own)")
    q.add_argument("--arpa-encoding", choices=["plain", "nemo-offset"], help="with --tokenizer: nemo-offset reads "
                   "NeMo's token ARPA, each word chr(tokenizer id + --arpa-offset)")
    q.add_argument("--arpa-offset", type=int, metavar="N", help="nemo-offset's offset (default 100, NeMo's)")


def _add_eval_score(sub) -> None:
    """`seqlm eval` and `seqlm score`: a model and the text it scores."""
    e = sub.add_parser("eval", help=cmd_eval.__doc__)
    _text_args(e)
    e.add_argument("--stream", action="store_true",
                   help="carry state across sentences (recurrent models; not --sentence-independent ones)")
    e.add_argument("--iterations", metavar="K|exact", help="Elman models: evaluate with K fixed-point iterations, "
                   "or exactly (default: the model's own history rule)")
    e.add_argument("--dynamic-lr", type=float, metavar="LR", help="dynamic evaluation: after scoring each segment, "
                   "one SGD step of this rate on it (rnn, afp, lstm, transformer; the model on disk is not changed)")
    e.add_argument("--dynamic-segment", type=int, metavar="N", help="dynamic evaluation: tokens per segment "
                   "(default 20; without --stream, whole sentences holding at least N)")
    e.add_argument("--dynamic-rule", choices=["sgd", "rms"], help="dynamic evaluation's update: sgd (default: "
                   "plain SGD) or rms (Krause et al. 2018: the step divided by the root mean square of gradients "
                   "collected on --dynamic-stats, with a decay toward the trained weights)")
    e.add_argument("--dynamic-decay", type=float, metavar="LAMBDA", help="--dynamic-rule rms: the decay toward the "
                   "trained weights (default 0.002, Krause et al.'s for 5-token segments)")
    e.add_argument("--dynamic-stats", metavar="FILE", help="--dynamic-rule rms: the training text its gradient "
                   "statistics are collected on (the weights are not changed meanwhile)")
    e.add_argument("--dynamic-stats-tokens", type=int, metavar="N", help="--dynamic-rule rms: the first whole "
                   "sentences of --dynamic-stats holding at least N tokens (default 20000)")
    e.set_defaults(func=cmd_eval)

    s = sub.add_parser("score", help=cmd_score.__doc__)
    _text_args(s)
    s.add_argument("--per-token", action="store_true", help="log10 of every token")
    s.set_defaults(func=cmd_score)


def _add_generate_info(sub) -> None:
    """`seqlm generate` and `seqlm info`."""
    g = sub.add_parser("generate", help=cmd_generate.__doc__)
    g.add_argument("model_dir", help="model directory (or an .arpa file)")
    g.add_argument("--num", type=int, default=5, help="number of sentences to sample")
    g.add_argument("--seed", type=int, default=0, help="random seed (the same seed gives the same sentences; "
                   "sampling only)")
    g.add_argument("--temperature", type=float, default=1.0, help="divide the log-probabilities by this "
                   "(<1: safer; sampling only, not with --beam)")
    g.add_argument("--max-len", type=int, default=100, help="stop a sentence after this many words")
    g.add_argument("--beam", type=int, default=0, help="beam search of this width instead of sampling; prints "
                   "the best min(--num, N)")
    g.add_argument("--latent", default=None, help="dae models: decode from these latent symbols (comma-separated) "
                   "instead of sampling them")
    g.set_defaults(func=cmd_generate)

    i = sub.add_parser("info", help=cmd_info.__doc__)
    i.add_argument("model_dir", help="model directory (or an .arpa file)")
    i.add_argument("--pretty", action="store_true", help="indented JSON instead of one line")
    i.set_defaults(func=cmd_info)


def _add_tools(sub) -> None:
    """Commands around the models: word vectors, sparse codes, learning curves, FOFE collisions."""
    em = sub.add_parser("embed", help=cmd_embed.__doc__)
    from seqlm.codes.embed import add_embed_options
    add_embed_options(em)
    em.set_defaults(func=cmd_embed)
    sc = sub.add_parser("sparse-codes", help=cmd_sparse_codes.__doc__)
    from seqlm.codes.sparse_codes import add_codes_options
    add_codes_options(sc)
    sc.set_defaults(func=cmd_sparse_codes)

    pl = sub.add_parser("plot", help=cmd_plot.__doc__)
    pl.add_argument("model_dirs", nargs="+", help="model directories with a metrics.jsonl (one curve each)")
    pl.add_argument("--out", default="learning_curves.png", help="PNG file to write (replaces an earlier plot; "
                    "any other file only with --force)")
    pl.add_argument("--force", action="store_true", help="overwrite --out even if it is not a plot")
    pl.set_defaults(func=cmd_plot)
    fc = sub.add_parser("fofe-collisions", help=cmd_fofe_collisions.__doc__)
    fc.add_argument("--alphas", help="comma-separated forgetting factors (default 0.05..1.0 step 0.05)")
    fc.add_argument("--epsilons", help="comma-separated thresholds (default 0.01,0.001,0.0001)")
    fc.add_argument("--max-len", type=int, default=20, help="sequence length T of the simulation")
    fc.add_argument("--data", help="also check every prefix of this corpus's train split (e.g. ptb)")
    fc.add_argument("--out-json", default="fofe_collisions.json", help="JSON file of the counts to write")
    fc.add_argument("--out-png", default="fofe_collisions.png", help="PNG plot of the counts to write")
    fc.add_argument("--verbose", action="store_true", help="print colliding examples too")
    fc.add_argument("--force", action="store_true", help="replace --out-json/--out-png files that an earlier "
                    "fofe-collisions run did not write")
    fc.set_defaults(func=cmd_fofe_collisions)


def _add_interpolate(sub) -> None:
    """`seqlm interpolate`: a mixture of saved models."""
    ip = sub.add_parser("interpolate", help=cmd_interpolate.__doc__,
                        description="P(w|h) = sum_i lambda_i P_i(w|h). Weights: --weights as given, else EM on "
                                    "the held-out text (--text or --data/--split), else equal. See "
                                    "docs/combination.md.")
    ip.add_argument("model_dirs", nargs="+", help="model directories or .arpa files (the first sets the vocabulary)")
    io = ip.add_mutually_exclusive_group(required=True)
    io.add_argument("--out", help="mixture model directory to write (any models; one vocabulary)")
    io.add_argument("--arpa-out", metavar="FILE", help="or merge n-gram models into one back-off ARPA file "
                    "(.gz: compressed), over the union of their vocabularies (SRILM's -mix-lm -write-lm)")
    ip.add_argument("--force", action="store_true", help="replace a model already in --out or --arpa-out")
    ip.add_argument("--text", "--valid", dest="text", metavar="FILE",
                    help="held-out text for EM and the perplexities printed (--valid: its old name, still accepted)")
    ip.add_argument("--data", help="or a dataset name / corpus directory ...")
    ip.add_argument("--split", default="valid", choices=["train", "valid", "test"], help="... and its split")
    ip.add_argument("--raw", action="store_true", help="the held-out text is untokenised (see docs)")
    iw = ip.add_mutually_exclusive_group()
    iw.add_argument("--weights", help="comma-separated weights, one per model (normalised to sum to 1)")
    iw.add_argument("--em", action="store_true", help="estimate the weights by EM on the held-out text (the default "
                    "with one)")
    ip.add_argument("--stream", action="store_true",
                    help="score the held-out text with recurrent components carrying state across sentences")
    ip.set_defaults(func=cmd_interpolate)
    ip.add_argument("--allow-peek", action="store_true", help=ALLOW_PEEK)


def _add_rescore(sub) -> None:
    """`seqlm rescore`: n-best lists and lattices (options in seqlm.eval.rescore_cli)."""
    rs = sub.add_parser("rescore", help=cmd_rescore.__doc__,
                        description="Scores are natural-log likelihoods (higher is better), or with --costs "
                                    "negative ones (lower is better, as Kaldi stores them), in and out. "
                                    "total = acoustic_scale * acoustic + lm_scale * lm - word_penalty * words "
                                    "- oov_penalty * oovs, lm = W new + (1 - W) old (W = --new-lm-weight). "
                                    "See docs/combination.md and docs/lattices.md.")
    from seqlm.eval.rescore_cli import add_options
    add_options(rs)  # n-best and lattice options, one meaning each
    rs.set_defaults(func=cmd_rescore)
    rs.add_argument("--allow-peek", action="store_true", help=ALLOW_PEEK)


def _add_model_tools(sub) -> None:
    """`seqlm dsae`, the n-gram commands (convert, query) and `seqlm quantize`."""
    ds = sub.add_parser("dsae", help=cmd_dsae.__doc__)
    ds.add_argument("baseline", help="model directory of the baseline LM (p)")
    ds.add_argument("dae", help="model directory of the dae model that peeks at c(s) (p')")
    ds.add_argument("--data", help="dataset name or corpus directory ...")
    ds.add_argument("--split", default="test", choices=["train", "valid", "test"], help="... and its split")
    ds.add_argument("--text", help="or a text file, one sentence per line")
    ds.set_defaults(func=cmd_dsae)

    add_ngram_commands(sub)  # convert, query: seqlm.ngram.commands
    qz = sub.add_parser("quantize", help=cmd_quantize.__doc__)
    qz.add_argument("model_dir", help="a neural model directory (lstm, rnn, transformer, fnn, fofe, ...)")
    qz.add_argument("--out", required=True, help="the new model directory to write")
    qz.add_argument("--force", action="store_true", help="replace a model already in --out")
    qz.set_defaults(func=cmd_quantize)


def _add_export(sub) -> None:
    """`seqlm export`: a model for another runtime."""
    ex = sub.add_parser("export", help=cmd_export.__doc__)
    ex.add_argument("model_dir", help="an rnn, lstm, transformer, afp or fnn model directory")
    ex.add_argument("--onnx", required=True, metavar="OUT.onnx", help="the ONNX file to write (needs the onnx extra: "
                    "pip install 'seqlm[onnx]')")
    ex.add_argument("--force", action="store_true", help="replace an existing --onnx file")
    ex.set_defaults(func=cmd_export)


def _add_tokenizer(sub) -> None:
    """`seqlm tokenizer train|encode|decode`: subword tokenizers for --unit token (seqlm.data.tokenizer_commands)."""
    from seqlm.data.tokenizer_commands import add_tokenizer_commands

    add_tokenizer_commands(sub)


def _add_decode(sub) -> None:
    """`seqlm decode` (options in seqlm.decode.command)."""
    from seqlm.decode.command import add_options

    de = sub.add_parser("decode", help=cmd_decode.__doc__, description="See docs/decoding.md.")
    add_options(de)
    de.set_defaults(func=cmd_decode)


def build_parser() -> argparse.ArgumentParser:
    from seqlm.about import VersionAction

    p = _Parser(prog="seqlm", description="Train, evaluate and use language models.")
    p.add_argument("--version", action=VersionAction, help="print seqlm's and torch's versions, whether the compiled "
                   "loops run, and exit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (_add_train, _add_eval_score, _add_generate_info, _add_tools, _add_interpolate, _add_rescore,
                _add_model_tools, _add_export, _add_tokenizer, _add_decode):
        add(sub)
    return p


def _report(e: SeqlmError) -> None:
    """One line on stderr; a `train --nproc` worker leaves it in a file for the launcher to print once."""
    err_dir = os.environ.get(ERROR_DIR_ENV)
    if err_dir and "RANK" in os.environ:
        Path(err_dir, f"rank{os.environ['RANK']}.err").write_text(str(e), encoding="utf-8")
        return
    print(f"seqlm: error: {e}", file=sys.stderr)


class Terminated(BaseException):
    """SIGTERM outside a training loop (which saves and stops on its own): unwinds like Ctrl-C, so atomic
    writes in progress leave the old files and the user gets one line instead of a silent death."""


def _terminate(signum, frame) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    previous = signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        return _run(argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(argv: list[str]) -> int:
    try:
        parser = build_parser()
        args, rest = parser.parse_known_args(argv)
        if rest and not getattr(args, "allow_rest", False):
            raise SeqlmError(f"unrecognized arguments: {' '.join(rest)} (see seqlm {args.command} --help)")
        if hasattr(args, "allow_peek"):
            _check_peeking(args)
        args.func(args, rest)
    except SeqlmError as e:
        _report(e)
        return 2
    except KeyboardInterrupt:
        print("seqlm: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("seqlm: terminated (SIGTERM); files being written were left as they were before", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
