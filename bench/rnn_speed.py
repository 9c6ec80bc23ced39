"""RNN LM speed on PTB: training and evaluation words/s, class-factorised vs full softmax (same H),
measured in one run, and against the reference C++ toolkit's figures given in the RNNLM issue.

    python bench/rnn_speed.py [--threads 2] [--seconds 20]

Trains each configuration for a fixed wall time from scratch (speed only: the perplexity rows are in
rnnlm_ptb.py) and evaluates PTB valid sentence by sentence. Also reports the float32 matmul ceiling
measured by this script at the model's layer shapes, for scale.
"""

from __future__ import annotations

import argparse
import time

import torch

from seqlm.config import apply_overrides
from seqlm.data.corpus import count_words, encode_file
from seqlm.data.vocab import Vocab
from seqlm.eval.perplexity import evaluate
from seqlm.registry import family

from common import matmul_gflops, merge_rows, ptb_dir, train_speed

FASTER_RNNLM_WORDS_PER_S = 150_000  # sigmoid H=200, hierarchical softmax, 2 threads (the figure)


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
                     "seq_len": cfg.train.seq_len, "optimizer": cfg.train.optimizer,
                     "train_speed_vs_faster_rnnlm": words_s / FASTER_RNNLM_WORDS_PER_S}
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
