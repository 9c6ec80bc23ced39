"""Benchmark: the classic smoothing table on PTB, every `seqlm train --model kn --smoothing` method at orders 3 and 5.

    python bench/smoothing.py [--orders 3,5] [--rows NAME,...] [--reps 3] [--threads 1] [--no-kenlm]

Each row estimates one method in one form (interpolated or back-off) from PTB train (estimate_kn, as `seqlm
train` runs it; the median time over --reps runs, the text already encoded), scores valid and test with the
one evaluation protocol (seqlm.eval.perplexity.evaluate, sentence by sentence from <s>, every word and </s>),
writes the model's ARPA file and, unless --no-kenlm, scores test with the kenlm module reading that file
(`kenlm_test_ppl`: the file is a back-off model KenLM reads to the same figure). Additive smoothing runs with
k = 1 (Laplace) and a few Lidstone k: pick one by `valid_ppl`, never by test. Katz gives probability 0 where
a context's every count exceeds K (nothing is discounted there), which the file writes as log10 -99: the rows
count such tokens (`zero_prob_test`) and give test perplexity without them (`test_ppl_excl_zero`, SRILM's
zeroprobs rule) beside `test_ppl`, which scores them at 10^-99. Rows go to bench/results/smoothing.json.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from seqlm.data.corpus import count_words, encode_file
from seqlm.data.vocab import Vocab
from seqlm.eval.perplexity import evaluate, score_tokens
from seqlm.models.kn import KNConfig, estimate_kn

from common import merge_rows, ptb_dir

# name -> the options of KNConfig it sets (the order is added per row)
METHODS = {
    "modified-kn": {"smoothing": "modified-kn"},  # lmplz's estimator, the reference (KenLM 148.281 / 141.186)
    "modified-kn-backoff": {"smoothing": "modified-kn", "form": "backoff"},
    "kn": {"smoothing": "kn"},
    "kn-backoff": {"smoothing": "kn", "form": "backoff"},
    "absolute": {"smoothing": "absolute"},
    "absolute-backoff": {"smoothing": "absolute", "form": "backoff"},
    "witten-bell": {"smoothing": "witten-bell"},
    "witten-bell-backoff": {"smoothing": "witten-bell", "form": "backoff"},
    "katz": {"smoothing": "katz"},
    "katz-interpolated": {"smoothing": "katz", "form": "interpolated"},
    "laplace": {"smoothing": "additive", "add_k": 1.0},
    "lidstone-0.1": {"smoothing": "additive", "add_k": 0.1},
    "lidstone-0.01": {"smoothing": "additive", "add_k": 0.01},
    "lidstone-0.001": {"smoothing": "additive", "add_k": 0.001},
}
ZERO_LOG = -99 * math.log(10) + 1e-6  # a token at or below the file's log10 -99 has probability 0


def scored(model, stream) -> dict:
    """The protocol's figures, plus the tokens of probability 0 and the perplexity without them."""
    r = evaluate(model, stream)
    logp = score_tokens(model, stream).logp  # (N,) natural logs
    zero = logp <= ZERO_LOG
    r["zero_prob"] = int(zero.sum())
    r["ppl_excl_zero"] = math.exp(-float(logp[~zero].sum()) / int((~zero).sum()))
    return r


def kenlm_ppl(arpa: Path, text: Path) -> float:
    """Perplexity of `text` (every word and </s>) by the kenlm module reading `arpa`."""
    import kenlm

    lm = kenlm.Model(str(arpa))
    total, n = 0.0, 0
    for line in text.read_text(encoding="utf-8").splitlines():
        if line.split():
            total += lm.score(line, bos=True, eos=True)
            n += len(line.split()) + 1
    return 10 ** (-total / n)


def bench_row(name: str, order: int, data: Path, vocab: Vocab, train, reps: int, kenlm: bool, tmp: Path) -> dict:
    cfg = KNConfig(order=order, **METHODS[name])
    times, model = [], None
    for _ in range(reps):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            model = estimate_kn(cfg, train, vocab)
            times.append(time.perf_counter() - t0)
    valid, test = (scored(model, encode_file(data / f"{s}.txt", model.vocab, use_cache=False))
                   for s in ("valid", "test"))
    arpa = tmp / f"{name}-{order}.arpa"
    t0 = time.perf_counter()
    model.to_arpa(arpa)
    row = {
        "name": f"{name}-{order}", "order": order, "method": name, "options": {**METHODS[name], "order": order},
        "form": "interpolated" if cfg.spec.interpolated else "backoff",
        "valid_ppl": valid["ppl"], "test_ppl": test["ppl"], "test_ppl_excl_oov": test["ppl_excl_oov"],
        "zero_prob_valid": valid["zero_prob"], "zero_prob_test": test["zero_prob"],
        "test_ppl_excl_zero": test["ppl_excl_zero"], "tokens_test": test["tokens"], "oov_test": test["oov"],
        "ngrams": model.sizes, "zero_backoffs": int(sum((b <= -99).sum() for b in model.log10_backoff)),
        "estimate_seconds": statistics.median(times), "estimate_seconds_all": times,
        "arpa_write_seconds": time.perf_counter() - t0, "arpa_bytes": arpa.stat().st_size,
        "warnings": sorted({str(w.message) for w in caught}),
    }
    if kenlm:
        row["kenlm_test_ppl"] = kenlm_ppl(arpa, data / "test.txt")
    arpa.unlink()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", default="3,5", help="n-gram orders, comma-separated")
    parser.add_argument("--rows", default=",".join(METHODS), help="methods (names of METHODS), comma-separated")
    parser.add_argument("--reps", type=int, default=3, help="estimation runs per row (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (scoring)")
    parser.add_argument("--no-kenlm", action="store_true", help="skip scoring each ARPA file with the kenlm module")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = ptb_dir()
    vocab = Vocab.build(count_words(data / "train.txt"))
    train = encode_file(data / "train.txt", vocab, use_cache=False)
    np.asarray(train.ids)  # read before any timing
    with tempfile.TemporaryDirectory() as tmp:
        for order in (int(x) for x in args.orders.split(",")):
            for name in args.rows.split(","):
                row = {**bench_row(name, order, data, vocab, train, args.reps, not args.no_kenlm, Path(tmp)),
                       "threads": args.threads}
                merge_rows("smoothing", [row])
                print(f"{row['name']}: valid {row['valid_ppl']:.2f} test {row['test_ppl']:.2f} (zero-prob "
                      f"{row['zero_prob_test']}, kenlm {row.get('kenlm_test_ppl', float('nan')):.2f}), estimate "
                      f"{row['estimate_seconds']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
