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

from seqlm.nn.class_softmax import ClassSoftmax
from seqlm.nn.elman import Elman
from seqlm.nn.softmax import FullSoftmax


def compare_ms(fns: dict[str, Callable[[], None]], reps: int, warmup: int = 3) -> dict[str, float]:
    """Median time of each function in ms; runs are interleaved so that load from other processes on a
    shared machine hits all candidates alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def fwd_bwd(layer: torch.nn.Module, loss: Callable[[], torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        layer.zero_grad(set_to_none=True)
        loss().backward()

    return step


def bench_softmax(n: int, hidden: int, vocab: int, classes: int, reps: int) -> None:
    counts = [max(1, int(1e6 / (r + 1))) for r in range(vocab)]  # Zipfian unigram counts
    probs = torch.tensor(counts, dtype=torch.float)
    h = torch.randn(n, hidden, requires_grad=True)  # (N, H)
    targets = torch.multinomial(probs, n, replacement=True)  # (N,) drawn from the unigram
    full, cls = FullSoftmax(hidden, vocab), ClassSoftmax(hidden, counts, classes)
    fns = {
        "full": fwd_bwd(full, lambda: full.target_log_probs(h, targets).sum()),
        "class": fwd_bwd(cls, lambda: cls.target_log_probs(h, targets).sum()),
    }
    for name, ms in compare_ms(fns, reps).items():
        print(f"softmax {name:9s} N={n} H={hidden} V={vocab} C={classes}: {ms:7.2f} ms fwd+bwd")


def bench_elman(batch: int, steps: int, hidden: int, reps: int) -> None:
    x = torch.randn(batch, steps, hidden)  # (B, T, H)
    fns = {}
    for impl in ("manual", "fused", "reference"):
        layer = Elman(hidden, hidden, activation="sigmoid", impl=impl)
        fns[impl] = fwd_bwd(layer, lambda layer=layer: layer(x)[0].sum())
    for name, ms in compare_ms(fns, reps).items():
        print(f"elman {name:9s} B={batch} T={steps} H={hidden}: {ms:7.2f} ms fwd+bwd")


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
