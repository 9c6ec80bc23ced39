"""Benchmark: one merged back-off ARPA from two KN5 models (SRILM's `ngram -mix-lm -write-lm`) against the
dynamic mixture it stands for, on PTB test.

    python bench/merge.py [--threads 1]

Stages, each a `seqlm` command in a fresh process (wall time and peak RSS of that command alone):
1. KN5 on PTB train and KN5 on GCIDE train, each with its own vocabulary (10,001 and 114,360 words), as
   `seqlm train --model kn --order 5 --text TRAIN --binary X.bin`;
2. `seqlm interpolate ptb5.bin gcide5.bin --text PTB_VALID --arpa-out mix.arpa`: weights by EM on PTB valid,
   the merged file over the union vocabulary; the command prints the dynamic mixture's and the merged
   model's valid perplexity;
3. `seqlm interpolate ... --weights W --text PTB_TEST --arpa-out mix-test.arpa`: the same weights, the same
   merge, the perplexities on PTB test (the file is the same as stage 2's: checked byte for byte);
4. where the kenlm module is installed, it reads mix.arpa and scores PTB test: `kenlm_test_ppl`.
Goal (#42): the merged model's test perplexity within 1% of the dynamic mixture's. Row `merge-kn5-ptb-gcide` in
bench/results/merge.json.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import math
import sys
import tempfile
from pathlib import Path

from _kn_common import run_measured

from common import merge_rows, ptb_dir

SEQLM = [sys.executable, "-m", "seqlm"]


def train(text: Path, out: Path) -> dict:
    wall, rss, _ = run_measured([*SEQLM, "train", "--model", "kn", "--order", "5", "--text", str(text),
                                 "--binary", str(out)])
    return {"seconds": round(wall, 2), "peak_rss_mb": round(rss, 1), "bytes": out.stat().st_size}


def interpolate(models: list[Path], text: Path, out: Path, weights: list[float] | None) -> dict:
    cmd = [*SEQLM, "interpolate", *map(str, models), "--text", str(text), "--arpa-out", str(out)]
    if weights:
        cmd += ["--weights", ",".join(repr(w) for w in weights)]
    wall, rss, stdout = run_measured(cmd)
    return {**json.loads(stdout.strip().splitlines()[-1]), "seconds": round(wall, 2), "peak_rss_mb": round(rss, 1)}


def kenlm_ppl(arpa: Path, text: Path) -> float | None:
    try:
        import kenlm
    except ImportError:
        return None
    model = kenlm.Model(str(arpa))
    lines = [line for line in text.read_text().splitlines() if line.split()]
    log10 = sum(model.score(line) for line in lines)
    tokens = sum(len(line.split()) + 1 for line in lines)
    return 10 ** (-log10 / tokens)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1, help="torch threads of this script (the commands are numpy)")
    args = p.parse_args()
    ptb = ptb_dir()
    gcide = ptb.parent / "gcide"
    with tempfile.TemporaryDirectory(prefix="seqlm-merge-") as tmp:
        work = Path(tmp)
        models = [work / "ptb5.bin", work / "gcide5.bin"]
        stages = {"train_ptb": train(ptb / "train.txt", models[0]),
                  "train_gcide": train(gcide / "train.txt.gz", models[1])}
        valid = interpolate(models, ptb / "valid.txt", work / "mix.arpa", None)
        test = interpolate(models, ptb / "test.txt", work / "mix-test.arpa", valid["weights"])
        same = filecmp.cmp(work / "mix.arpa", work / "mix-test.arpa", shallow=False)
        row = {
            "name": "merge-kn5-ptb-gcide", "components": ["kn5 ptb train (own vocabulary)",
                                                          "kn5 gcide train (own vocabulary)"],
            "weights": valid["weights"], "weights_from": "em on ptb valid", "vocab_size": valid["vocab_size"],
            "ngrams": valid["ngrams"], "arpa_bytes": (work / "mix.arpa").stat().st_size,
            "component_valid_ppl": valid["component_valid_ppl"], "component_test_ppl": test["component_valid_ppl"],
            "valid_ppl_dynamic": valid["dynamic_valid_ppl"], "valid_ppl_merged": valid["valid_ppl"],
            "test_ppl_dynamic": test["dynamic_valid_ppl"], "test_ppl_merged": test["valid_ppl"],
            "test_tokens": test["valid_tokens"], "kenlm_test_ppl": kenlm_ppl(work / "mix.arpa", ptb / "test.txt"),
            "merged_over_dynamic_test": test["valid_ppl"] / test["dynamic_valid_ppl"],
            "same_file_both_runs": same, "merge_seconds": valid["seconds"], "merge_peak_rss_mb": valid["peak_rss_mb"],
            "stages": stages, "threads": args.threads,
        }
    row["goal_within_1pct"] = abs(math.log(row["merged_over_dynamic_test"])) <= math.log(1.01)
    print(json.dumps(row, indent=1))
    print(f"wrote {merge_rows('merge', [row])}")


if __name__ == "__main__":
    main()
