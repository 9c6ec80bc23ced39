"""Micro-benchmark: forward+backward time of the output layers and of the Elman layer.

Usage: PYTHONPATH=src .venv/bin/python bench/micro_softmax.py [--threads 2] [--reps 15]

Prints the median over ``reps`` runs (after warm-up) in milliseconds. Counts are Zipfian
(count of rank r proportional to 1/r), like natural text.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from seqlm.nn.elman import Elman
from seqlm.nn.softmax import ClassSoftmax, FullSoftmax


def median_ms(fn: Callable[[], None], reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench_softmax(n: int, hidden: int, vocab: int, classes: int, reps: int) -> None:
    counts = [max(1, int(1e6 / (r + 1))) for r in range(vocab)]  # Zipfian unigram counts
    probs = torch.tensor(counts, dtype=torch.float)
    h = torch.randn(n, hidden, requires_grad=True)  # (N, H)
    targets = torch.multinomial(probs, n, replacement=True)  # (N,) drawn from the unigram
    for name, layer in (
        ("full", FullSoftmax(hidden, vocab)),
        ("class", ClassSoftmax(hidden, counts, classes)),
    ):

        def step(layer: torch.nn.Module = layer) -> None:
            layer.zero_grad(set_to_none=True)
            layer.target_log_probs(h, targets).sum().backward()

        ms = median_ms(step, reps)
        print(f"softmax {name:5s} N={n} H={hidden} V={vocab} C={classes}: {ms:7.2f} ms fwd+bwd")


def bench_elman(batch: int, steps: int, hidden: int, reps: int) -> None:
    x = torch.randn(batch, steps, hidden)  # (B, T, H)
    for impl in ("manual", "fused", "reference"):
        layer = Elman(hidden, hidden, activation="sigmoid", impl=impl)

        def step(layer: Elman = layer) -> None:
            layer.zero_grad(set_to_none=True)
            out, _ = layer(x)
            out.sum().backward()

        print(f"elman {impl:5s} B={batch} T={steps} H={hidden}: {median_ms(step, reps):7.2f} ms fwd+bwd")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    bench_softmax(1280, 200, 10000, 100, args.reps)
    for batch, steps in ((32, 10), (64, 20), (128, 20), (128, 40)):
        bench_elman(batch, steps, 200, args.reps)


if __name__ == "__main__":
    main()
