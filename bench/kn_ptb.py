"""Benchmark: Kneser-Ney 3-gram and 5-gram on PTB against KenLM's perplexities, and estimation time.

    python bench/kn_ptb.py [--reps 3] [--threads 1]

Estimates each model from PTB train (median time over `reps` runs: the machine is shared), saves its
model directory (the ARPA file and what else save_kn writes), re-reads the ARPA file, and scores valid
and test with the one evaluation protocol (seqlm.eval.perplexity.evaluate: sentence by sentence from
<s>, every word and </s> predicted; OOV = a token scored as <unk>, which on PTB is the literal <unk> of
the preprocessed text). The KenLM figures are the perplexities `lmplz` + `query` gave on these files as
recorded in $SEQLM_DATA/ptb/README.md, to 3 decimals, so agreement is checked to 0.001 (not measured in
this run); the lmplz estimation time is the issue's figure for this machine, not measured in this run
either. Rows go to bench/results/kn_ptb.json through common.merge_rows (each row with its own command and revision).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from seqlm.data.corpus import count_words, encode_file
from seqlm.data.vocab import Vocab
from seqlm.eval.perplexity import evaluate
from seqlm.models.kn import ARPA, KNConfig, estimate_kn, load_ngram_file, save_kn

from common import merge_rows, ptb_dir

# KenLM (lmplz + query, <unk> as an ordinary word) on these files, as $SEQLM_DATA/ptb/README.md gives them.
KENLM = {3: {"valid": 157.765, "test": 148.281}, 5: {"valid": 148.007, "test": 141.186}}
KENLM_SOURCE = "$SEQLM_DATA/ptb/README.md (3 decimals; not measured in this run)"
KENLM_ESTIMATE_SECONDS = {5: 1.4}  # lmplz -o 5 on PTB train on this machine, as the issue gives it
KENLM_ESTIMATE_SOURCE = "the issue's figure for lmplz -o 5 on this machine (not measured in this run)"


def perplexities(model, path: Path) -> dict:
    """The protocol's figures (seqlm eval's JSON) for one file."""
    return evaluate(model, encode_file(path, model.vocab, use_cache=False))


def _timed(fn, reps: int) -> tuple[list[float], object]:
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def bench_order(order: int, data: Path, vocab: Vocab, reps: int, workdir: Path) -> dict:
    train = encode_file(data / "train.txt", vocab, use_cache=False)
    times, model = _timed(lambda: estimate_kn(KNConfig(order=order), train, vocab), reps)
    out = workdir / f"kn{order}"
    write_times, _ = _timed(lambda: save_kn(model, out), reps)  # the model directory: ARPA (+ binary)
    read_times, reloaded = _timed(lambda: load_ngram_file(out / ARPA), 1)  # the ARPA file alone
    valid, test = (perplexities(model, data / f"{s}.txt") for s in ("valid", "test"))
    score_times, (valid_re, test_re) = _timed(
        lambda: tuple(perplexities(reloaded, data / f"{s}.txt") for s in ("valid", "test")), 1)
    est, kenlm_s = statistics.median(times), KENLM_ESTIMATE_SECONDS.get(order)
    ref = KENLM[order]
    return {
        "name": f"kn{order}", "order": order,
        "valid_ppl": valid["ppl"], "test_ppl": test["ppl"],
        "valid_ppl_excl_oov": valid["ppl_excl_oov"], "test_ppl_excl_oov": test["ppl_excl_oov"],
        "oov_valid": valid["oov"], "oov_test": test["oov"],
        "tokens_valid": valid["tokens"], "tokens_test": test["tokens"],
        "ngrams": model.sizes,
        "estimate_seconds": est, "estimate_seconds_all": times,
        "save_seconds": statistics.median(write_times), "arpa_read_seconds": read_times[0],
        "score_seconds_valid_and_test": score_times[0], "arpa_bytes": (out / ARPA).stat().st_size,
        "valid_ppl_reloaded": valid_re["ppl"], "test_ppl_reloaded": test_re["ppl"],
        "kenlm_valid_ppl": ref["valid"], "kenlm_test_ppl": ref["test"], "kenlm_ppl_source": KENLM_SOURCE,
        "abs_diff_valid": valid["ppl"] - ref["valid"], "abs_diff_test": test["ppl"] - ref["test"],
        "rel_diff_valid": valid["ppl"] / ref["valid"] - 1, "rel_diff_test": test["ppl"] / ref["test"] - 1,
        "kenlm_estimate_seconds": kenlm_s, "kenlm_estimate_source": KENLM_ESTIMATE_SOURCE if kenlm_s else None,
        "speed_ratio_vs_kenlm": est / kenlm_s if kenlm_s else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="estimation runs per order (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (scoring)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = ptb_dir()
    vocab = Vocab.build(count_words(data / "train.txt"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for order in (3, 5):
            row = bench_order(order, data, vocab, args.reps, Path(tmp))
            rows.append({**row, "threads": args.threads})
            print(f"{row['name']}: valid {row['valid_ppl']:.4f} (KenLM {row['kenlm_valid_ppl']}), test "
                  f"{row['test_ppl']:.4f} (KenLM {row['kenlm_test_ppl']}), oov {row['oov_test']}, estimate "
                  f"{row['estimate_seconds']:.2f} s, save {row['save_seconds']:.2f} s", flush=True)
    print(f"wrote {merge_rows('kn_ptb', rows)}")


if __name__ == "__main__":
    main()
