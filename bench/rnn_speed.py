"""RNN LM speed on PTB: training and evaluation words/s, class-factorised vs full softmax (same H),
and the reference C++ toolkit, faster-rnnlm, run by this script in the same run.

    python bench/rnn_speed.py [--threads 2] [--seconds 20]
    python bench/rnn_speed.py --threads 1 --quality-seconds 180 --quality-only   # equal-time perplexity
    python bench/rnn_speed.py --threads 1 --bptt block     # rnnlm's block truncation (rows named ...-block-...)
    python bench/rnn_speed.py --threads 1 --bptt block --batch-sizes 512 --profile 16   # rows ...-profile
    python bench/rnn_speed.py --threads 1 --bptt block --precision bf16   # bf16 products (rows ...-bf16-...)
    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
        python bench/rnn_speed.py --threads 1 --bptt block --batch-sizes 512   # an AVX2-only CPU (rows ...-avx2-...)
    python bench/rnn_speed.py --threads 1 --bptt block --batch-sizes 512,1024 --output tree   # faster-rnnlm's
        # output: a hierarchical softmax on a Huffman tree (rows rnn-hH-tree-bB-...; no full-softmax row)

Trains each configuration for a fixed wall time from scratch (speed only: the perplexity rows are in
rnnlm_ptb.py) and evaluates PTB valid sentence by sentence. faster-rnnlm ($FASTER_RNNLM, the binary or
its folder, else ../shared/tools/faster-rnnlm/rnnlm) trains first, alone, for the same wall time with
the same threads and H (sigmoid Elman, hierarchical softmax, BPTT 32, as its README measures it); its
last words/s report is each row's `faster_rnnlm_words_per_s`. Without it the rows say so. Also reports
the float32 matmul ceiling measured by this script at the model's layer shapes, for scale.

--quality-seconds S adds the row `rnn-hH-quality-Ss`: seqlm's rnn (--output, the last --batch-sizes)
trained through its CLI with --max-minutes S/60, and faster-rnnlm trained for at most S seconds (its own
schedule usually ends it first), one after the other; both then score PTB test (seqlm sentence by sentence
and as one stream; faster-rnnlm by its -test entropy).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import seqlm
from seqlm.config import apply_overrides
from seqlm.data.corpus import count_words, encode_file
from seqlm.data.vocab import Vocab
from seqlm.eval.perplexity import evaluate
from seqlm.registry import family

from common import ROOT, matmul_gflops, merge_rows, profiled, ptb_dir, train_speed, training_step


def faster_rnnlm() -> Path | None:
    """The faster-rnnlm binary: $FASTER_RNNLM (the binary or its folder), else ../shared/tools."""
    for cand in (os.environ.get("FASTER_RNNLM"), ROOT.parent / "shared" / "tools" / "faster-rnnlm"):
        if cand and Path(cand).is_dir():
            cand = Path(cand) / "rnnlm"
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return Path(cand)
    return None


def faster_rnnlm_speed(binary: Path, threads: int, hidden: int, seconds: float) -> float:
    """Training words/s of faster-rnnlm on PTB: its last progress report within `seconds` of training."""
    with tempfile.TemporaryDirectory(prefix="faster-rnnlm-") as tmp:
        cmd = [str(binary), "-rnnlm", str(Path(tmp) / "model"), "-train", str(ptb_dir() / "train.txt"),
               "-valid", str(ptb_dir() / "valid.txt"), "-hidden", str(hidden), "-hidden-type", "sigmoid",
               "-bptt", "32", "-threads", str(threads)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out = proc.communicate(timeout=seconds)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
    rates = re.findall(r"([\d.]+) Kwords/sec", out)
    if not rates:
        raise SystemExit(f"faster-rnnlm printed no speed: {out[-500:]}")
    return float(rates[-1]) * 1000


def faster_rnnlm_quality(binary: Path, threads: int, hidden: int, seconds: float) -> dict:
    """faster-rnnlm trained on PTB for at most `seconds` (its own schedule may stop it first), then its
    test perplexity (its `-test` entropy in bits a word: 2^entropy)."""
    with tempfile.TemporaryDirectory(prefix="faster-rnnlm-") as tmp:
        model = Path(tmp) / "model"
        cmd = [str(binary), "-rnnlm", str(model), "-train", str(ptb_dir() / "train.txt"), "-valid",
               str(ptb_dir() / "valid.txt"), "-hidden", str(hidden), "-hidden-type", "sigmoid", "-bptt", "32",
               "-threads", str(threads)]
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, stopped = proc.communicate(timeout=seconds)[0], "its schedule ended"
        except subprocess.TimeoutExpired:
            proc.kill()
            out, stopped = proc.communicate()[0], f"killed after {seconds:g} s"
        wall = time.perf_counter() - t
        valid = re.findall(r"entropy \(bits\) valid:\s+([\d.]+)", out)
        test = subprocess.run([str(binary), "-rnnlm", str(model), "-test", str(ptb_dir() / "test.txt")],
                              capture_output=True, text=True)
    found = re.search(r"Test entropy ([\d.]+)", test.stdout + test.stderr)
    if not found:
        raise SystemExit(f"faster-rnnlm printed no test entropy: {(test.stdout + test.stderr)[-500:]}")
    return {"faster_rnnlm_train_seconds": wall, "faster_rnnlm_stopped": stopped,
            "faster_rnnlm_epochs": len(valid), "faster_rnnlm_valid_ppl": 2 ** float(valid[-1]) if valid else None,
            "faster_rnnlm_test_ppl": 2 ** float(found.group(1)),
            "faster_rnnlm_oov_words": (test.stdout + test.stderr).count("\nOOV")}


def seqlm_quality(threads: int, hidden: int, batch: int, seconds: float, bptt: str, precision: str,
                  output: str, activation: str, dropout: float) -> dict:
    """seqlm's rnn (the rnn-fast recipe of rnnlm_ptb.py: tanh (or sigmoid), BPTT 5; class or tree output)
    trained on PTB through the CLI with --max-minutes, then PTB test sentence by sentence and as one stream."""
    flags = ["--hidden", str(hidden), "--output", output, "--batch-size", str(batch), "--tau", "5",
             "--truncation", bptt, "--activation", activation, "--max-epochs", "100",
             "--max-minutes", f"{seconds / 60:g}", "--threads", str(threads), "--precision", precision,
             "--dropout", f"{dropout:g}"]
    with tempfile.TemporaryDirectory(prefix="seqlm-rnn-") as tmp:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "seqlm", "train", "--model", "rnn", "--data", str(ptb_dir()),
                        "--out", tmp, *flags], check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t
        model = seqlm.load(tmp)
        history = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        test = encode_file(ptb_dir() / "test.txt", model.vocab)
        return {"recipe": " ".join(flags), "train_process_seconds": wall, "epochs": len(history),
                "valid_ppl": min(h["valid_ppl"] for h in history), "test_ppl": evaluate(model, test)["ppl"],
                "test_ppl_stream": evaluate(model, test, stream_mode=True)["ppl"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--hidden", type=int, default=200)
    p.add_argument("--batch-sizes", default="64,128", help="class-output rows at these batch sizes (full: the first)")
    p.add_argument("--quality-seconds", type=float, default=0.0,
                   help="also the equal-time row: both toolkits trained this long, then PTB test perplexity")
    p.add_argument("--quality-only", action="store_true", help="only the equal-time row")
    p.add_argument("--profile", type=int, default=0,
                   help="only profile this many training steps at each batch size (rows ...-profile)")
    p.add_argument("--bptt", default="exact", choices=["exact", "block"],
                   help="seqlm's truncation: exact BPTT(5) per position, or rnnlm's block one (--truncation of rnn)")
    p.add_argument("--activation", default="tanh", choices=["tanh", "sigmoid"],
                   help="the quality row's recurrence (the speed rows: the family's default, sigmoid)")
    p.add_argument("--dropout", type=float, default=0.0, help="seqlm's --dropout (0: the rows so far)")
    p.add_argument("--output", default="class", choices=["class", "tree"],
                   help="seqlm's output layer: class-factorised (and a full-softmax row), or the Huffman tree")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="seqlm's --precision: bf16 runs the matmuls in bf16 (states, softmaxes, updates in fp32)")
    args = p.parse_args()
    if args.quality_seconds:
        quality_row(args)
    if args.quality_only:
        return
    torch.set_num_threads(args.threads)
    vocab = Vocab.build(count_words(ptb_dir() / "train.txt"))
    train = encode_file(ptb_dir() / "train.txt", vocab)
    valid = encode_file(ptb_dir() / "valid.txt", vocab)
    if args.profile:
        profile_rows(args, vocab, train)
        return
    peer = faster_rnnlm()
    peer_speed = faster_rnnlm_speed(peer, args.threads, args.hidden, args.seconds) if peer else None
    print({"faster_rnnlm": str(peer), "faster_rnnlm_words_per_s": peer_speed}, flush=True)
    rows = {}
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    full = [("full", sizes[0])] if args.output == "class" else []  # class against full at equal H and batch
    for output, batch in [(args.output, b) for b in sizes] + full:
        cfg = family("rnn").config()
        apply_overrides([cfg], {"output": output, "hidden": args.hidden, "batch_size": batch, "truncation": args.bptt,
                                "precision": args.precision, "dropout": args.dropout})
        words_s, model = train_speed("rnn", cfg, vocab, train, args.seconds)
        t = time.perf_counter()
        evaluate(model, valid)
        eval_s = len(valid.ids) / (time.perf_counter() - t)
        key = f"{output}-b{batch}"
        drop = f"-drop{args.dropout:g}" if args.dropout else ""
        rows[key] = {"name": f"rnn-h{args.hidden}-{key}{_tag(args.bptt, args.precision)}{drop}-speed",
                     "train_tokens_per_s": words_s, "eval_tokens_per_s": eval_s, "threads": args.threads,
                     "batch_size": batch, "bptt": args.bptt, "precision": args.precision,
                     "seq_len": cfg.train.seq_len, "optimizer": cfg.train.optimizer}
        if peer_speed:
            rows[key].update(faster_rnnlm_words_per_s=peer_speed, train_speed_vs_faster_rnnlm=words_s / peer_speed,
                             faster_rnnlm_setup=f"sigmoid H={args.hidden}, hierarchical softmax, BPTT 32, "
                             f"{args.threads} threads, {args.seconds:g} s, run by this script before seqlm")
        else:
            rows[key]["faster_rnnlm"] = "not found ($FASTER_RNNLM or ../shared/tools/faster-rnnlm): no comparison"
        print(rows[key], flush=True)
    if not full:
        merge_rows("rnn_speed", list(rows.values()))
        return
    H, V, B = args.hidden, len(vocab), 64 * 20
    ceiling = matmul_gflops([(B, H, H), (B, H, 100), (B, H, V)], torch.float32)
    same = (rows[f"class-b{sizes[0]}"], rows[f"full-b{sizes[0]}"])  # equal H and batch
    speedup = {"train_speedup": same[0]["train_tokens_per_s"] / same[1]["train_tokens_per_s"],
               "eval_speedup": same[0]["eval_tokens_per_s"] / same[1]["eval_tokens_per_s"],
               "matmul_ceiling_gflops": ceiling}
    print(speedup)
    merge_rows("rnn_speed", list(rows.values()), {"summary": speedup})


def profile_steps(cfg, vocab, stream, steps: int) -> dict:
    """common.profiled over `steps` training steps (after 5 unprofiled ones), with the Elman layer's share."""
    step, _ = training_step("rnn", cfg, vocab, stream)
    for _ in range(5):
        step()
    return profiled(step, steps, totals=("_ElmanBPTT", "_ElmanBPTTBackward"))


def profile_rows(args: argparse.Namespace, vocab: Vocab, train) -> None:
    """Rows rnn-hH-class-bB[-block]-profile: where a training step's time goes (no speed rows)."""
    rows = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        cfg = family("rnn").config()
        apply_overrides([cfg], {"output": "class", "hidden": args.hidden, "batch_size": batch, "truncation": args.bptt,
                                "precision": args.precision})
        rows.append({"name": f"rnn-h{args.hidden}-class-b{batch}{_tag(args.bptt, args.precision)}-profile",
                     "threads": args.threads, "batch_size": batch, "bptt": args.bptt, "precision": args.precision,
                     "profile": profile_steps(cfg, vocab, train, args.profile)})
        print(rows[-1], flush=True)
    merge_rows("rnn_speed", rows)


def _tag(bptt: str, precision: str = "fp32") -> str:
    """Row-name part: the exact fp32 rows keep the names they had before --bptt and --precision existed; a run
    under ATEN_CPU_CAPABILITY=X (kernels capped at X, e.g. avx2) adds -X."""
    capped = os.environ.get("ATEN_CPU_CAPABILITY", "")
    return (("" if bptt == "exact" else f"-{bptt}") + ("" if precision == "fp32" else f"-{precision}")
            + (f"-{capped.lower()}" if capped else ""))


def quality_row(args: argparse.Namespace) -> None:
    """Row rnn-hH-quality-Ss: the perplexity each toolkit reaches in the same wall time (issue 26), both
    run by this script one after the other, with the same threads and H."""
    batch = int(args.batch_sizes.split(",")[-1])
    size = "" if batch == 128 else f"-b{batch}"  # the rows from before other batch sizes were run keep their names
    tree = (("-tree" if args.output == "tree" else "") + ("-sigmoid" if args.activation == "sigmoid" else "")
            + (f"-drop{args.dropout:g}" if args.dropout else ""))
    row = {"name": f"rnn-h{args.hidden}-quality{_tag(args.bptt, args.precision)}{tree}-{args.quality_seconds:g}s{size}",
           "seconds": args.quality_seconds, "threads": args.threads, "hidden": args.hidden, "batch_size": batch,
           "bptt": args.bptt, "precision": args.precision, "output": args.output, "activation": args.activation,
           "dropout": args.dropout, **seqlm_quality(args.threads, args.hidden, batch, args.quality_seconds, args.bptt,
                                                    args.precision, args.output, args.activation, args.dropout)}
    peer = faster_rnnlm()
    if peer:
        row.update(faster_rnnlm_quality(peer, args.threads, args.hidden, args.quality_seconds),
                   faster_rnnlm_setup=f"sigmoid H={args.hidden}, hierarchical softmax, BPTT 32, {args.threads} "
                   "threads, its own learning-rate schedule; test perplexity from its -test entropy")
        row["test_ppl_vs_faster_rnnlm"] = row["test_ppl"] / row["faster_rnnlm_test_ppl"]
    else:
        row["faster_rnnlm"] = "not found ($FASTER_RNNLM or ../shared/tools/faster-rnnlm): no comparison"
    print(row, flush=True)
    merge_rows("rnn_speed", [row])


if __name__ == "__main__":
    main()
