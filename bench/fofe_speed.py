"""FOFE-FNNLM vs n-gram FNN-LM training throughput at equal layer sizes (fofe-fnnlm.txt Sec. 3 claims
FOFE costs the same as an FNN of the same shape), measured in one process on the same data.

    python bench/fofe_speed.py [--threads 1] [--seconds 20] [--rounds 3] [--precision bf16]

fofe-2 and fnn-3 both feed 2 x 200 inputs into 2 x 400 ReLU layers and a 10k softmax; fofe-1 and fnn-2
both feed 200. The pairs are timed alternately, `--rounds` times each, so machine noise hits both
alike; the best round of each is reported, with its ratio. After every timing the script also measures
the matmul ceiling at that model's own layer shapes (bench/fofe_ptb.py's shapes, same precision and
threads), so each round gives the model's training FLOP/s as a fraction of a ceiling taken moments apart.
"""

from __future__ import annotations

import argparse

import torch

from seqlm.config import apply_overrides
from seqlm.data.corpus import count_words, encode_file
from seqlm.data.vocab import Vocab
from seqlm.registry import family

from common import matmul_gflops, merge_rows, ptb_dir, train_speed
from fofe_ptb import ROWS, flops_per_token

PAIRS = [(("fofe", 2), ("fnn", 3)), (("fofe", 1), ("fnn", 2))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    vocab = Vocab.build(count_words(ptb_dir() / "train.txt"))
    train = encode_file(ptb_dir() / "train.txt", vocab)
    rows, summary = [], {}
    for pair in PAIRS:
        best, fractions = {}, {}
        for _ in range(args.rounds):
            for name, order in pair:
                cfg = family(name).config()
                apply_overrides([cfg], {"order": order, "precision": args.precision})
                tok_s, _model = train_speed(name, cfg, vocab, train, args.seconds)
                key = f"{name}-{order}"
                fpt, shapes = flops_per_token(ROWS[key])
                ceiling = matmul_gflops(shapes, dtype, seconds=3.0)
                best[key] = max(best.get(key, 0.0), tok_s)
                fractions.setdefault(key, []).append(fpt * tok_s / 1e9 / ceiling)
                print(key, f"{tok_s:.0f} tok/s, {fpt * tok_s / 1e9:.0f} of {ceiling:.0f} GFLOP/s", flush=True)
        (fofe, fnn) = (f"{n}-{o}" for n, o in pair)
        rows += [{"name": f"{k}-speed", "train_tokens_per_s": v, "precision": args.precision,
                  "threads": args.threads, "fraction_of_ceiling": max(fractions[k]),
                  "fraction_of_ceiling_rounds": fractions[k]} for k, v in best.items()]
        summary[f"{fofe}_vs_{fnn}"] = best[fofe] / best[fnn]
    print(summary)
    merge_rows("fofe_speed", rows, {"summary": summary})


if __name__ == "__main__":
    main()
