"""RNN LM speed on PTB: training and evaluation words/s, class-factorised vs full softmax (same H),
and the reference C++ toolkit, faster-rnnlm, run by this script in the same run.

    python bench/rnn_speed.py [--threads 2] [--seconds 20]

Trains each configuration for a fixed wall time from scratch (speed only: the perplexity rows are in
rnnlm_ptb.py) and evaluates PTB valid sentence by sentence. faster-rnnlm ($FASTER_RNNLM, the binary or
its folder, else ../shared/tools/faster-rnnlm/rnnlm) trains first, alone, for the same wall time with
the same threads and H (sigmoid Elman, hierarchical softmax, BPTT 32, as its README measures it); its
last words/s report is each row's `faster_rnnlm_words_per_s`. Without it the rows say so. Also reports
the float32 matmul ceiling measured by this script at the model's layer shapes, for scale.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from seqlm.config import apply_overrides
from seqlm.data.corpus import count_words, encode_file
from seqlm.data.vocab import Vocab
from seqlm.eval.perplexity import evaluate
from seqlm.registry import family

from common import ROOT, matmul_gflops, merge_rows, ptb_dir, train_speed


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--hidden", type=int, default=200)
    p.add_argument("--batch-sizes", default="64,128", help="class-output rows at these batch sizes (full: the first)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    vocab = Vocab.build(count_words(ptb_dir() / "train.txt"))
    train = encode_file(ptb_dir() / "train.txt", vocab)
    valid = encode_file(ptb_dir() / "valid.txt", vocab)
    peer = faster_rnnlm()
    peer_speed = faster_rnnlm_speed(peer, args.threads, args.hidden, args.seconds) if peer else None
    print({"faster_rnnlm": str(peer), "faster_rnnlm_words_per_s": peer_speed}, flush=True)
    rows = {}
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    for output, batch in [("class", b) for b in sizes] + [("full", sizes[0])]:
        cfg = family("rnn").config()
        apply_overrides([cfg], {"output": output, "hidden": args.hidden, "batch_size": batch})
        words_s, model = train_speed("rnn", cfg, vocab, train, args.seconds)
        t = time.perf_counter()
        evaluate(model, valid)
        eval_s = len(valid.ids) / (time.perf_counter() - t)
        key = f"{output}-b{batch}"
        rows[key] = {"name": f"rnn-h{args.hidden}-{key}-speed", "train_tokens_per_s": words_s,
                     "eval_tokens_per_s": eval_s, "threads": args.threads, "batch_size": batch,
                     "seq_len": cfg.train.seq_len, "optimizer": cfg.train.optimizer}
        if peer_speed:
            rows[key].update(faster_rnnlm_words_per_s=peer_speed, train_speed_vs_faster_rnnlm=words_s / peer_speed,
                             faster_rnnlm_setup=f"sigmoid H={args.hidden}, hierarchical softmax, BPTT 32, "
                             f"{args.threads} threads, {args.seconds:g} s, run by this script before seqlm")
        else:
            rows[key]["faster_rnnlm"] = "not found ($FASTER_RNNLM or ../shared/tools/faster-rnnlm): no comparison"
        print(rows[key], flush=True)
    H, V, B = args.hidden, len(vocab), 64 * 20
    ceiling = matmul_gflops([(B, H, H), (B, H, 100), (B, H, V)], torch.float32)
    same = (rows[f"class-b{sizes[0]}"], rows[f"full-b{sizes[0]}"])  # equal H and batch
    speedup = {"train_speedup": same[0]["train_tokens_per_s"] / same[1]["train_tokens_per_s"],
               "eval_speedup": same[0]["eval_tokens_per_s"] / same[1]["eval_tokens_per_s"],
               "matmul_ceiling_gflops": ceiling}
    print(speedup)
    merge_rows("rnn_speed", list(rows.values()), {"summary": speedup})


if __name__ == "__main__":
    main()
