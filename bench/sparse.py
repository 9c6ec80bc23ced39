"""Vocabulary-sized layers (sparse-word-representations.txt): full softmax, NCE (Z_h = 1 / ZRegression) and
sparse-code compression on the same LSTM encoder, on GCIDE (V = 61k) and PTB (V = 10k), with KN5 beside them.

    python bench/sparse.py --rows gcide-full,gcide-nce-zreg,gcide-codes-ibias --threads 1
    python bench/sparse.py --rows lstm-ptb --threads 1 --session-minutes 10      # resumes when run again
    python bench/sparse.py --rows gcide-all-full --threads 1 --session-minutes 120   # the full-corpus recipe

THE FULL-CORPUS RECIPE (`gcide-all-*` rows): every row trains the same 2 x 200 LSTM on the WHOLE GCIDE training
split (3.57M tokens) for ALL_EPOCHS epochs (no early stop), is validated on the whole valid split and tested on
the whole test split (187,786 tokens); the skip-gram vectors behind the codes are trained on that same training
split and nothing else. Training runs in slices of SLICE_MINUTES, each ending with a validation, so every row
has a validation-perplexity-against-training-time curve (`time_curve`) and a checkpoint to resume from: run the
same command again and the row continues where it stopped. Checkpoints live under ~/.cache/seqlm/bench-checkpoints
(outside the work tree, so an interrupted row survives a fresh checkout), or $SEQLM_BENCH_CHECKPOINTS.

A SHORTENED RECIPE (the CPU budget of the issue that asked for this table is ~45 CPU-minutes for all rows,
where one full-softmax epoch over GCIDE alone takes about an hour): every `gcide-*` / `ptb-*` row trains the
same 2 x 200 LSTM for one epoch over the first TRAIN_TOKENS tokens (whole sentences) of the training split,
with the vocabulary of the whole split (`--min-count 2` on GCIDE: V = 61k), validates on the first
EVAL_TOKENS of valid and is tested on the first EVAL_TOKENS of test (whole sentences; both written to
bench/checkpoints/sparse/data/). KN5 rows: the same training text, vocabulary and test text. Each row's
JSON holds the recipe it ran. `lstm-ptb` is the family's own PTB row (whole PTB, full softmax, dropout).

Codes rows first make skip-gram vectors of the whole training split (`seqlm embed`, gensim, 1 thread) and
sparse codes over the B most frequent words (`seqlm sparse-codes`, B = 8000 on GCIDE, 2000 on PTB).
Peak RSS: the training process (`train_peak_rss_mb`) and the test evaluation (`eval_peak_rss_mb`, a
separate `seqlm eval` process) of every row, from the kernel's rusage of each process.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import seqlm
from seqlm.config import DataConfig, apply_overrides
from seqlm.data.corpus import TokenStream, build_vocab, encode_file
from seqlm.data.datasets import resolve_corpus, split_path
from seqlm.models.kn import KNConfig
from seqlm.models.lstm import LSTMConfig
from seqlm.nn.softmax import parameters_by_layer
from seqlm.registry import Splits, family, new_model
from seqlm.train.resume import run_status
from seqlm.train.run import fit_family

from common import CHECKPOINTS, RESULTS, merge_rows, recorded_training, row_parser, with_earlier_runs

WORK = CHECKPOINTS / "sparse"
ALL_WORK = Path(os.environ.get("SEQLM_BENCH_CHECKPOINTS", Path.home() / ".cache" / "seqlm" / "bench-checkpoints")) \
    / "sparse-all"
ALL_EPOCHS = 2
SLICE_MINUTES = 20.0  # the full-corpus rows validate (whole valid split) and checkpoint this often
CORPORA = {"gcide": {"min_count": 2, "base": 8000}, "ptb": {"min_count": 1, "base": 2000}}
TRAIN_TOKENS = {"gcide": 200_000, "ptb": 200_000}  # the shortened recipe: one epoch over this much text
EVAL_TOKENS = 20_000  # valid (schedule) and test text of the gcide-/ptb- rows
ENCODER = ["--hidden", "200", "--layers", "2", "--batch-size", "32", "--seq-len", "20", "--lr", "0.003",
           "--max-epochs", "1"]
NCE = ["--objective", "nce", "--noise-samples", "100", "--noise-sharing", "token"]  # k noise words per position
NCE_BATCH = [*NCE[:-1], "batch"]  # one draw of k noise words shared by the whole batch: cheaper, and worse here
# torch's adaptive softmax tuned as a user would (#44 item 3), on the shortened recipe: cut-offs (frequency
# ranks), div_value (tail cluster i projects to 200 / div^i dims) and Adam's rate, picked on valid


def _adaptive(cutoffs: str = "", div: str = "", lr: str = "", tail_bias: bool = False) -> list[str]:
    """The flags of an adaptive-output row: the layer's defaults where an argument is left empty."""
    return ["--output", "adaptive", *(["--cutoffs", cutoffs] if cutoffs else []),
            *(["--div-value", div] if div else []), *(["--tail-bias", "true"] if tail_bias else []),
            *(["--lr", lr] if lr else [])]


ADAPTIVE = {"adaptive": _adaptive(),  # the defaults: 2k / 10k / 50k, div 4 (50 / 12 / 3 dims)
            "adaptive-div2": _adaptive(div="2"),
            "adaptive-c2k10k-div2": _adaptive("2000,10000", "2"),
            "adaptive-c4k20k-div2": _adaptive("4000,20000", "2"),
            "adaptive-c2k10k-div1": _adaptive("2000,10000", "1")}
ADAPTIVE |= {f"adaptive-c2k10k-div{div}-lr{lr}": _adaptive("2000,10000", div, lr) for div in ("2", "1")
             for lr in ("0.001", "0.006")}
# the rows above ran with torch's layer as it comes (random head biases, no tail biases: 885cfc9); from
# the next revision the adaptive layer starts from the unigram model as the full one does (head biases), and
# `--tail-bias` gives each tail word a bias (its log p within its cluster at the start)
ADAPTIVE |= {"adaptive-unigram": _adaptive(), "adaptive-unigram-tailbias": _adaptive(tail_bias=True),
             "adaptive-div2-tailbias": _adaptive(div="2", tail_bias=True)}
ADAPTIVE |= {f"adaptive-c{name}-div{div}-tailbias": _adaptive(cutoffs, div, tail_bias=True)
             for name, cutoffs, div in (("2k10k", "2000,10000", "2"), ("2k10k", "2000,10000", "1"),
                                        ("4k20k", "4000,20000", "2"))}
ADAPTIVE |= {f"adaptive-c2k10k-div2-tailbias-lr{lr}": _adaptive("2000,10000", "2", lr, tail_bias=True)
             for lr in ("0.001", "0.006")}
VARIANTS = {  # (a) .. (e) of the issue, on the same encoder
    "full": [],
    "full-bf16": ["--precision", "bf16"],  # (a) under bf16 autocast: what bf16 training costs in perplexity
    "full-bf16-lr0.006": ["--precision", "bf16", "--lr", "0.006"],  # (a) at the rate the adaptive rows picked
    "nce": [*NCE, "--normaliser", "one"],
    "nce-zreg": [*NCE, "--normaliser", "regression"],
    # compressed models are trained as in the paper: NCE with ZRegression (a softmax over the rebuilt
    # V x H output matrix trains at a third of the full softmax's speed here, beyond this budget)
    "codes-cbias": ["--codes", "{codes}", *NCE, "--normaliser", "regression"],
    "codes-ibias": ["--codes", "{codes}", "--code-bias", "true", *NCE, "--normaliser", "regression"],
    # (d) plus a fixed log-unigram offset per word (not trained): what (d) lacks to keep rare words low
    "codes-cbias-prior": ["--codes", "{codes}", *NCE, "--normaliser", "regression", "--code-bias-prior", "true"],
    # the first table's rows, noise shared by the batch (measured against per-token noise: worse at equal epochs)
    "nce-batchnoise": [*NCE_BATCH, "--normaliser", "one"],
    "nce-zreg-batchnoise": [*NCE_BATCH, "--normaliser", "regression"],
    "codes-cbias-batchnoise": ["--codes", "{codes}", *NCE_BATCH, "--normaliser", "regression"],
    "codes-ibias-batchnoise": ["--codes", "{codes}", "--code-bias", "true", *NCE_BATCH, "--normaliser", "regression"],
    # (b) and (c) over 4 epochs of the same text, batch-shared noise: the drift of log Z_h (the paper's Fig. 5)
    "nce-4ep": [*NCE_BATCH, "--normaliser", "one", "--max-epochs", "4", "--min-improvement", "0"],
    "nce-zreg-4ep": [*NCE_BATCH, "--normaliser", "regression", "--max-epochs", "4", "--min-improvement", "0"],
    # (c) with per-token noise, run before it became these rows' setting: the same flags as nce-zreg now
    "nce-zreg-token": [*NCE, "--normaliser", "regression"],
    # (c) with glibc's memory defaults (train/memory.py): the peak RSS and words/s that keeping freed blocks costs
    "nce-zreg-nokeep": [*NCE, "--normaliser", "regression", "--keep-memory", "false"],
} | ADAPTIVE
# the full-corpus recipe: the same encoder, every epoch run (no early stop); output layers users pick today
def all_encoder(epochs: int) -> list[str]:
    return [*ENCODER[:-1], str(epochs), "--min-improvement", "0"]


ALL_ENCODER = all_encoder(ALL_EPOCHS)
ALL_VARIANTS = {v: VARIANTS[v] for v in ("full", "nce", "nce-zreg", "codes-ibias", "codes-cbias-prior")} | {
    "adaptive": VARIANTS["adaptive"],  # torch.nn.AdaptiveLogSoftmaxWithLoss (Grave et al. 2017)
    "class": ["--output", "class"],  # the rnn family's frequency-binned class output, sqrt(V) classes
    "tree": ["--output", "tree"],  # a hierarchical softmax on a Huffman tree (faster-rnnlm's -hs)
    # the adaptive variant picked on the shortened recipe's valid split, out of the 17 ADAPTIVE rows tried
    "adaptive-tuned": VARIANTS["adaptive-c2k10k-div2-tailbias-lr0.006"],
    "full-lr0.006": ["--lr", "0.006"],  # (a) at the adaptive row's rate: equal terms for the rate too
    # and the tuned layer at the recipe's rate, 0.003, as (a) ran: each layer at both rates
    "adaptive-tuned-lr0.003": VARIANTS["adaptive-c2k10k-div2-tailbias"],
    # (e) over twice the base words (the paper's B is a choice; 8,000 here so far): {codes:B} names the codes
    "codes-ibias-b16k": ["--codes", "{codes:16000}", *VARIANTS["codes-ibias"][2:]],
}
ALL_ROWS = ("gcide-all-full", "gcide-all-nce", "gcide-all-nce-zreg", "gcide-all-codes-ibias",
            "gcide-all-codes-cbias-prior", "gcide-all-adaptive", "gcide-all-adaptive-tuned", "gcide-all-full-lr0.006",
            "gcide-all-adaptive-tuned-lr0.003", "gcide-all-codes-ibias-b16k",
            "gcide-all-class", "gcide-all-kn5", "gcide-all-kn5-allwords",
            # (a) and (e) over LONG_EPOCHS epochs (#44 item 2): the same recipe otherwise, from scratch
            "gcide-all-full-4ep", "gcide-all-codes-ibias-4ep")
LONG_EPOCHS = 4
LSTM_PTB = ["--hidden", "200", "--layers", "2", "--dropout", "0.3", "--max-epochs", "13"]


def _subset(stream: TokenStream, tokens: int) -> TokenStream:
    """The first whole sentences of `stream` holding at least `tokens` tokens."""
    k = min(int((stream.starts < tokens).sum()), stream.num_sentences)
    return TokenStream(stream.ids[: stream.starts[k]], stream.starts[: k + 1])


def _head_file(src: Path, dst: Path, tokens: int) -> Path:
    """The first sentences of a text file holding at least `tokens` tokens (</s> counted), as plain text."""
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        opener = gzip.open if src.name.endswith(".gz") else open
        n, lines = 0, []
        with opener(src, "rt", encoding="utf-8") as f:
            for line in f:
                if n >= tokens:
                    break
                if line.split():
                    lines.append(line)
                    n += len(line.split()) + 1
        tmp = dst.with_suffix(".tmp")
        tmp.write_text("".join(lines), encoding="utf-8")
        os.replace(tmp, dst)
    return dst


def _data(corpus: str):
    root = resolve_corpus(corpus)
    data_cfg = DataConfig(min_count=CORPORA[corpus]["min_count"])
    vocab = build_vocab(split_path(root, "train"), min_count=data_cfg.min_count)
    train = _subset(encode_file(split_path(root, "train"), vocab), TRAIN_TOKENS[corpus])
    valid_file = _head_file(split_path(root, "valid"), WORK / "data" / f"{corpus}-valid.txt", EVAL_TOKENS)
    test_file = _head_file(split_path(root, "test"), WORK / "data" / f"{corpus}-test.txt", EVAL_TOKENS)
    return root, data_cfg, vocab, train, encode_file(valid_file, vocab), test_file


# A child's rusage peak includes its parent's memory at fork time (Linux carries it across exec); the
# kernel's VmHWM of the child's own address space does not. The child reports it when seqlm returns.
CHILD = ("import sys\nfrom seqlm.cli import main\nrc = main(sys.argv[1:])\n"
         "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
         "print('peak_rss_kb', hwm, file=sys.stderr)\nsys.exit(rc)")


def peak_rss_mb() -> float:
    """This process's own peak resident memory (VmHWM), MB."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) / 1024


def _seqlm(*argv: str) -> tuple[str, float, float]:
    """Run `seqlm ...` as a child process: (stdout, seconds, its own peak RSS in MB)."""
    t = time.time()
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"seqlm {' '.join(argv)} failed: {proc.stderr[-2000:]}")
    kb = next(line.split()[1] for line in proc.stderr.splitlines() if line.startswith("peak_rss_kb"))
    return proc.stdout, time.time() - t, int(kb) / 1024


def _codes(corpus: str, root: Path, threads: int, work: Path | None = None, base: int = 0) -> tuple[Path, dict]:
    """Skip-gram vectors of the whole training split, then sparse codes over the B most frequent words (`base`;
    0: the corpus's B in CORPORA)."""
    work = work or WORK
    work.mkdir(parents=True, exist_ok=True)
    base = base or CORPORA[corpus]["base"]
    suffix = "" if base == CORPORA[corpus]["base"] else f"-b{base}"
    vec, codes = work / f"{corpus}-vectors.txt", work / f"{corpus}-codes{suffix}.txt"
    info = {}
    if not vec.exists():
        out, secs, _ = _seqlm("embed", str(split_path(root, "train")), "--out", str(vec), "--dim", "200",
                              "--min-count", str(CORPORA[corpus]["min_count"]), "--threads", str(threads))
        info["embed"] = {**json.loads(out), "wall_seconds": round(secs, 1)}
    if not codes.exists():
        _, secs, _ = _seqlm("sparse-codes", str(vec), "--base", str(base), "--out", str(codes),
                            "--threads", str(threads), "--steps", "300",
                            "--show", "algorithms,secrets,debates,companies,prices")
        info["codes_wall_seconds"] = round(secs, 1)
    report = json.loads(Path(str(codes) + ".report.json").read_text())
    return codes, {**info, "codes_report": {k: report[k] for k in
                                            ("base_words", "rare_words", "seconds", "nonzeros_per_word",
                                             "relative_fit_error", "samples", "options")}}


def _with_codes(flags: list[str], corpus: str, threads: int, work: Path) -> tuple[list[str], dict]:
    """A variant's flags with its codes placeholder ({codes}, or {codes:B} for B base words) replaced by the codes
    file, built first if need be (_codes), and what building them reported; unchanged flags and {} without one."""
    wanted = [f for f in flags if f.startswith("{codes")]
    if not wanted:
        return flags, {}
    base = int(wanted[0].strip("{}").partition(":")[2] or 0)
    codes, info = _codes(corpus, resolve_corpus(corpus), threads, work, base)
    return [str(codes) if f == wanted[0] else f for f in flags], info


def _dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())


def _test(out: Path, test_file: Path, recurrent: bool) -> dict:
    res, secs, rss = _seqlm("eval", str(out), "--text", str(test_file))
    row = {"test_ppl": json.loads(res)["ppl"], "test_tokens": json.loads(res)["tokens"],
           "eval_seconds": round(secs, 1), "eval_peak_rss_mb": round(rss, 1)}
    if recurrent:
        row["test_ppl_stream"] = json.loads(_seqlm("eval", str(out), "--text", str(test_file), "--stream")[0])["ppl"]
    return row


def _lstm_setup(corpus: str, flags: list[str], data_cfg: DataConfig, vocab, args) -> LSTMConfig:
    cfg = LSTMConfig()
    # a row's own --precision (the bf16 twin of a row) wins over the command line's
    apply_overrides([cfg, data_cfg], {"threads": str(args.threads), "precision": args.precision}
                    | dict(zip(flags[::2], flags[1::2], strict=True)))
    return cfg


def run_lstm(name: str, corpus: str, flags: list[str], args, extra: dict, full_data: bool = False) -> dict:
    out = WORK / name
    if full_data:  # lstm-ptb: the whole corpus, the family's own settings
        root = resolve_corpus(corpus)
        data_cfg = DataConfig()
        vocab = build_vocab(split_path(root, "train"))
        train, valid = (encode_file(split_path(root, s), vocab) for s in ("train", "valid"))
        test_file = split_path(root, "test")
    else:
        root, data_cfg, vocab, train, valid, test_file = _data(corpus)
    resumed = run_status(out)["started"]
    cfg = _lstm_setup(corpus, flags, data_cfg, vocab, args)
    model = new_model("lstm", cfg, vocab)
    model.data_config = data_cfg
    with recorded_training(out, resumed, args.threads) as earlier:
        fit_family(family("lstm"), model, Splits(train, valid), out, lambda m: seqlm.save(m, out, data_cfg),
                   resumed, args.session_minutes)
    return with_earlier_runs(_lstm_row(name, corpus, out, vocab, train, valid, test_file, flags, args, extra,
                                       resumed), earlier)


def _lstm_row(name: str, corpus: str, out: Path, vocab, train, valid, test_file: Path, flags: list[str], args,
              extra: dict, resumed: bool) -> dict:
    train_rss = peak_rss_mb()  # the row runs in a process of its own (see main)
    status = run_status(out)
    hist = [h for h in status["history"] if not h.get("partial")]
    best = seqlm.load(out)
    layers = parameters_by_layer(best)
    secs = sum(h["epoch_seconds"] for h in hist)
    config = json.loads((out / "config.json").read_text())["model"]
    return {
        "name": name, "corpus": corpus, "vocab_size": len(vocab), "train_tokens": int(len(train.ids)),
        "valid_tokens": int(len(valid.ids)), **_test(out, test_file, recurrent=True),
        "valid_ppl": min((h["valid_ppl"] for h in hist), default=None),
        "params": sum(p.numel() for p in best.parameters() if p.requires_grad), "params_by_layer": layers,
        "embed_output_params": layers["embedding+output"], "model_dir_bytes": _dir_bytes(out),
        "train_words_per_s": sum(h["train_tokens"] for h in hist) / max(secs, 1e-9), "train_seconds": secs,
        "epochs": len(hist), "finished": status["done"],
        "wall_seconds": hist[-1]["wall_seconds"] if hist else 0.0, "train_peak_rss_mb": round(train_rss, 1),
        "curve": [{k: h[k] for k in h if k in ("epoch", "train_ppl", "valid_ppl") or k.startswith("log_z")}
                  for h in hist],
        "flags": flags, "config": config,
        "precision": config["train"]["precision"], "threads": args.threads, "resumed": resumed, **extra,
    }


def _time_curve(history: list[dict]) -> list[dict]:
    """Validation perplexity against training seconds (validation time excluded) at every slice and epoch end."""
    done, curve = {}, []
    for h in history:  # a partial row's epoch_seconds counts its own epoch so far
        before = sum(s for e, s in done.items() if e < h["epoch"])
        curve.append({"train_seconds": round(before + h["epoch_seconds"], 1), "epoch": h["epoch"],
                      "partial": bool(h.get("partial")), "valid_ppl": h["valid_ppl"],
                      **{k: v for k, v in h.items() if k.startswith("log_z") or k == "valid_mode"}})
        if not h.get("partial"):
            done[h["epoch"]] = h["epoch_seconds"]
    return curve


def _in_progress(name: str, corpus: str, out: Path, resumed: bool, flags: list[str], args, extra: dict) -> dict:
    """The row of a full-corpus run that has not finished its epochs: how far it got, and its curve so far."""
    return {"name": name, "corpus": corpus, "in_progress": True, "finished": False, "resumed": resumed,
            "time_curve": _time_curve(run_status(out)["history"]), "flags": flags, "threads": args.threads,
            "recipe": extra["recipe"]}


def _all_data(corpus: str, min_count: int | None = None):
    """The whole training, valid and test splits (the full-corpus recipe)."""
    root = resolve_corpus(corpus)
    data_cfg = DataConfig(min_count=CORPORA[corpus]["min_count"] if min_count is None else min_count)
    vocab = build_vocab(split_path(root, "train"), min_count=data_cfg.min_count)
    train, valid = (encode_file(split_path(root, s), vocab) for s in ("train", "valid"))
    return root, data_cfg, vocab, train, valid, split_path(root, "test")


def run_all_lstm(name: str, corpus: str, flags: list[str], args, extra: dict, epochs: int = ALL_EPOCHS) -> dict:
    """A full-corpus row, trained in validated slices; an `in_progress` row until its epochs are all done."""
    out = ALL_WORK / name
    root, data_cfg, vocab, train, valid, test_file = _all_data(corpus)
    resumed = run_status(out)["started"]
    cfg = _lstm_setup(corpus, flags, data_cfg, vocab, args)
    cfg.train.max_minutes = SLICE_MINUTES
    t0 = time.time()
    with recorded_training(out, resumed, args.threads) as earlier:
        while True:
            status = run_status(out)
            if sum(1 for h in status["history"] if not h.get("partial")) >= epochs:
                break
            if args.session_minutes and time.time() - t0 >= args.session_minutes * 60:
                print(f"{name}: stopped after --session-minutes; run the same command again to continue", flush=True)
                return with_earlier_runs(_in_progress(name, corpus, out, resumed, flags, args, extra), earlier)
            model = new_model("lstm", cfg, vocab)
            model.data_config = data_cfg
            try:
                fit_family(family("lstm"), model, Splits(train, valid), out,
                           lambda m: seqlm.save(m, out, data_cfg), status["started"], 0.0)
            except SystemExit:  # SIGTERM/SIGINT: the state is saved; record this invocation before leaving
                merge_rows("sparse", [with_earlier_runs(_in_progress(name, corpus, out, resumed, flags, args, extra),
                                                        earlier)])
                raise
    row = with_earlier_runs(_lstm_row(name, corpus, out, vocab, train, valid, test_file, flags, args, extra,
                                      resumed), earlier)
    history = run_status(out)["history"]
    row["time_curve"] = _time_curve(history)
    row["finished"] = True  # every recipe epoch ran (the schedule's own flag stays open at --max-epochs)
    row["valid_ppl_final"] = [h for h in history if not h.get("partial")][-1]["valid_ppl"]
    return row


def run_kn5(name: str, corpus: str, whole: bool = False, min_count: int | None = None) -> dict:
    out = (ALL_WORK if whole else WORK) / name
    root, data_cfg, vocab, train, valid, test_file = _all_data(corpus, min_count) if whole else _data(corpus)
    t = time.time()
    if not (out / "config.json").exists():
        model = new_model("kn", KNConfig(order=5), vocab)
        family("kn").train(model, Splits(train, valid), out, lambda m: seqlm.save(m, out, data_cfg), False)
    return {"name": name, "corpus": corpus, "vocab_size": len(vocab), "train_tokens": int(len(train.ids)),
            "estimate_seconds": round(time.time() - t, 1), "model_dir_bytes": _dir_bytes(out),
            **_test(out, test_file, recurrent=False)}


def run_row(name: str, args) -> dict:
    if name == "lstm-ptb":
        return run_lstm(name, "ptb", LSTM_PTB, args, {"recipe": "whole PTB, family defaults + flags"},
                        full_data=True)
    if name.startswith("gcide-all-"):
        return run_all_row(name, name.removeprefix("gcide-all-"), args)
    corpus, _, variant = name.partition("-")
    if corpus not in CORPORA or variant not in [*VARIANTS, "kn5-200k"]:
        raise SystemExit(f"unknown row {name}")
    if variant == "kn5-200k":  # not "kn5": kn_scale.json's ptb-kn5 / gcide-kn5 are the whole corpora
        return run_kn5(name, corpus)
    extra = {"recipe": f"1 epoch over the first {TRAIN_TOKENS[corpus]} training tokens; valid/test: the first "
                       f"{EVAL_TOKENS} tokens", "objective_note": "train_ppl of NCE rows is exp(NCE loss)"}
    flags = list(ENCODER) + list(VARIANTS[variant])
    flags, info = _with_codes(flags, corpus, args.threads, WORK)
    extra.update(info)
    return run_lstm(name, corpus, flags, args, extra)


def run_all_row(name: str, variant: str, args) -> dict:
    if variant == "kn5":  # the neural rows' vocabulary (--min-count 2): the n-gram figure they compare with
        return {**run_kn5(name, "gcide", whole=True), "recipe": "whole training split; whole test split"}
    if variant == "kn5-allwords":  # every training word in the vocabulary, as lmplz does: KenLM's own figure
        return {**run_kn5(name, "gcide", whole=True, min_count=1),
                "recipe": "whole training split, every word type in the vocabulary; whole test split"}
    if name not in ALL_ROWS:
        raise SystemExit(f"unknown row {name}; full-corpus variants: kn5, kn5-allwords, {', '.join(ALL_VARIANTS)}")
    epochs = LONG_EPOCHS if variant.endswith(f"-{LONG_EPOCHS}ep") else ALL_EPOCHS
    extra = {"recipe": f"{epochs} epochs over the whole training split; valid/test: the whole splits",
             "objective_note": "train_ppl of NCE rows is exp(NCE loss)"}
    flags = all_encoder(epochs) + list(ALL_VARIANTS[variant.removesuffix(f"-{LONG_EPOCHS}ep")])
    flags, info = _with_codes(flags, "gcide", args.threads, ALL_WORK)
    if info:  # the vectors are trained on the training split alone: the same text the LSTM trains on
        extra.update(info, codes_train_tokens=int(len(_all_data("gcide")[3].ids)))
    return run_all_lstm(name, "gcide", flags, args, extra, epochs)


def plot(path: Path) -> Path:
    """sparse.png: per corpus, test perplexity, embedding + output parameters and training speed of each row,
    and the NCE rows' valid perplexity and log Z_h by epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.loads(path.read_text())["rows"]
    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    for ax_row, corpus in zip(axes, ("gcide", "ptb"), strict=True):
        mine = [r for r in rows if r.get("corpus") == corpus and r["name"] != "lstm-ptb" and "test_ppl" in r
                and not r["name"].startswith("gcide-all-")]
        names = [r["name"].removeprefix(corpus + "-") for r in mine]
        ax_row[0].bar(names, [r["test_ppl"] for r in mine])
        ax_row[0].set(title=f"{corpus}: test perplexity (exact)", yscale="log")
        lstm = [r for r in mine if r.get("embed_output_params")]
        ax_row[1].bar([r["name"].removeprefix(corpus + "-") for r in lstm], [r["embed_output_params"] for r in lstm])
        ax_row[1].set(title="embedding + output parameters", yscale="log")
        ax_row[2].bar([r["name"].removeprefix(corpus + "-") for r in lstm], [r["train_words_per_s"] for r in lstm])
        ax_row[2].set(title="training words/s (1 thread)", yscale="log")
        for r in lstm:
            z = [c for c in r["curve"] if "log_z_mean" in c]
            if z:
                ax_row[3].errorbar([c["epoch"] for c in z], [c["log_z_mean"] for c in z],
                                   yerr=[c["log_z_std"] for c in z], marker="o", capsize=3,
                                   label=r["name"].removeprefix(corpus + "-"))
        ax_row[3].set(title="NCE rows: true log Z_h at validation (mean +- std)", xlabel="epoch")
        ax_row[3].legend(fontsize=7)
        for ax in ax_row[:3]:
            ax.tick_params(axis="x", rotation=45, labelsize=7)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=90)
    plt.close(fig)
    plot_all(rows, path.with_name("sparse_all.png"))
    return out


def _valid_mode(row: dict) -> str:
    """", valid in stream mode" for a row validated so (training does since 5a4bc0a, whose rows' configs carry
    `valid_mode` and their curves the mode used), else "": their figures and the older ones' do not compare."""
    modes = {p.get("valid_mode") for p in row["time_curve"]}
    stream = "stream" in modes or (modes == {None} and "valid_mode" in row.get("config", {}).get("train", {}))
    return ", valid in stream mode" if stream else ""


def plot_all(rows: list[dict], out: Path) -> None:
    """sparse_all.png: the full-corpus rows' validation perplexity against training time, all on one plot."""
    import matplotlib.pyplot as plt

    curves = [r for r in rows if r["name"].startswith("gcide-all-") and r.get("time_curve")]
    if not curves:
        return
    fig, ax = plt.subplots(figsize=(9, 6))
    for r in curves:
        c = r["time_curve"]
        label = (r["name"].removeprefix("gcide-all-") + f" ({r.get('precision', 'fp32')}, {r.get('git_rev', '?')}"
                 + f"{_valid_mode(r)})" + (" (running)" if r.get("in_progress") else ""))
        ax.plot([p["train_seconds"] / 60 for p in c], [p["valid_ppl"] for p in c], marker="o", label=label)
    kn = next((r for r in rows if r["name"] == "gcide-all-kn5" and "test_ppl" in r), None)
    if kn:
        ax.axhline(kn["test_ppl"], color="gray", linestyle="--", label=f"KN5 (test) {kn['test_ppl']:.1f}")
    # the rows ran at different precisions, revisions, machines and loads: the legend says which;
    # bench/results/output_speed.json compares their speeds in one run
    ax.set(title="GCIDE, whole corpus: valid perplexity against training time (1 thread, as each row ran;\n"
                 "by sentence unless the legend says stream mode: the two do not compare)",
           xlabel="training minutes (validation excluded)", ylabel="valid perplexity (exact)", yscale="log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main() -> None:
    global WORK, EVAL_TOKENS
    p = row_parser(__doc__, "gcide-full,gcide-nce-zreg,gcide-codes-ibias", "fp32")
    p.add_argument("--train-tokens", type=int, help="override TRAIN_TOKENS (both corpora; for a quick check)")
    p.add_argument("--eval-tokens", type=int, help="override EVAL_TOKENS (for a quick check)")
    p.add_argument("--work", help="override the checkpoint folder (for a quick check)")
    p.add_argument("--plot-only", action="store_true", help="only redraw sparse.png from sparse.json")
    args = p.parse_args()
    if args.plot_only:
        print(plot(RESULTS / "sparse.json"))
        return
    if args.train_tokens:
        TRAIN_TOKENS.update(gcide=args.train_tokens, ptb=args.train_tokens)
    EVAL_TOKENS = args.eval_tokens or EVAL_TOKENS
    WORK = Path(args.work) if args.work else WORK
    torch.set_num_threads(args.threads)
    rows = args.rows.split(",")
    if len(rows) > 1:  # one process per row, so each row's peak memory is its own
        for name in rows:
            argv = list(sys.argv[1:])
            argv[argv.index("--rows") + 1] = name
            if subprocess.run([sys.executable, sys.argv[0], *argv]).returncode != 0:
                sys.exit(f"row {name} failed")
        return
    for name in rows:
        row = run_row(name, args)
        plot(merge_rows("sparse", [row]))
        print(json.dumps({k: row.get(k) for k in ("name", "test_ppl", "test_ppl_stream", "embed_output_params",
                                                  "train_words_per_s", "epochs")}), flush=True)


if __name__ == "__main__":
    main()
