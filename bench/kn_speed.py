"""Benchmark: seqlm against KenLM in the same run: KN5 estimation (text -> ARPA) and n-gram scoring.

Usage: python bench/kn_speed.py [--rows gcide-kn5-estimate,gcide-kn5-scoring] [--rounds 3]
       (lmplz / build_binary from $KENLM_BIN, PATH or ../shared/tools/kenlm; the `kenlm` Python module)

Both rows use GCIDE (../shared/data/gcide, decompressed to a temporary folder first, for both tools):
- gcide-kn5-estimate: seqlm's text -> ARPA (`to_arpa_seconds`: vocabulary, ids, counts, model, ARPA
  written; kn_scale.py's estimate worker, in a fresh process under GNU time) against `lmplz -o 5 -S 2G`
  (`lmplz_seconds`, its process's wall time), run alternately `--rounds` times each, best kept;
  peak RSS of each process from GNU time, and seqlm's peak during estimation alone.
- gcide-kn5-scoring: one process loads seqlm.kenlm.Model on seqlm's binary and kenlm.Model on
  build_binary of seqlm's ARPA (the same model), then, round after round (best of `--rounds`), scores the
  test set: BaseScore once per word from the same Python loop, full_scores and score per sentence, and batched
  (seqlm.ngram.NGramQuery.score_corpus on ids and on text lines, against kenlm.Model.score per sentence,
  kenlm having no batch call). Each timed call starts from a collected heap (gc.collect() first): the per-word
  tuples of full_scores otherwise set off Python's full collections in whichever call crossed the threshold,
  and which call that was, not the library, decided the full_scores ratio.
  The log10 p of both agree (`max_abs_diff_vs_kenlm`). `entry_tables_mb`: the
  memory of seqlm's per-call entry tables (seqlm.ngram.scalar; kenlm.Config's LoadMethod.LAZY leaves them out).
Ratios are seqlm / KenLM measured in the same run (the row says how loaded the machine was). Writes
bench/results/kn_speed.json.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _kn_common import kenlm_bin, run_measured, worker  # noqa: E402

from common import merge_rows  # noqa: E402  (stamps provenance at import)

NAME = "kn_speed"
ROWS = "gcide-kn5-estimate,gcide-kn5-scoring"
LOAD_NOTE = "the machine was loaded by other jobs while this ran: absolute rates are low; compare ratios"


def load_fields() -> dict:
    """The 1-minute load average at the row's end, and LOAD_NOTE where it shows another job (one benchmark on this
    machine holds it near 1)."""
    load = os.getloadavg()[0]
    return {"load_average_1min": load, **({"note": LOAD_NOTE} if load > 1.5 else {})}


# ---- the scoring worker: one process, both libraries, JSON on stdout ------------------------------------


def worker_scoring(args: argparse.Namespace) -> dict:
    import kenlm
    import numpy as np

    import seqlm.kenlm as ours
    from seqlm.data.corpus import encode_file
    from seqlm.ngram.native import extension
    from seqlm.ngram.query import NGramQuery

    lines = [s for s in Path(args.text).read_text(encoding="utf-8").splitlines() if s.strip()]
    tokens = sum(len(s.split()) + 1 for s in lines)
    theirs, mine = kenlm.Model(args.klm), ours.Model(args.model)
    batch = NGramQuery(mine.model)
    stream = encode_file(args.text, batch.vocab, use_cache=False)
    rates: dict[str, float] = {}
    tasks = {"base_score": lambda m, st: _per_call(m, st, lines),
             "full_scores": lambda m, _: _timed(lambda: [list(m.full_scores(s)) for s in lines])}
    for _ in range(int(args.rounds)):  # interleaved, so that both see the same load
        for task, fn in tasks.items():
            _best(rates, f"seqlm_{task}", fn(mine, ours.State))
            _best(rates, f"kenlm_{task}", fn(theirs, kenlm.State))
        _best(rates, "seqlm_batched_ids", _timed(lambda: batch.score_corpus(stream)))
        _best(rates, "seqlm_batched_text", _timed(lambda: batch.score_corpus(lines)))
        _best(rates, "kenlm_score_per_sentence", _timed(lambda: [theirs.score(s) for s in lines]))
        _best(rates, "seqlm_score_per_sentence", _timed(lambda: [mine.score(s) for s in lines]))
    a = np.array([p for s in lines for p, _, _ in theirs.full_scores(s)])
    b = np.array([p for s in lines for p, _, _ in mine.full_scores(s)])
    out = {f"{k}_tokens_per_s": tokens / v for k, v in rates.items()}
    out.update(tokens=tokens, sentences=len(lines), max_abs_diff_vs_kenlm=float(np.abs(a - b).max()),
               entry_tables_mb=batch.entry_bytes() / 2**20,
               per_call_path="compiled (seqlm/ngram/_native.cpp)" if extension() else "python")
    return out


def _per_call(m, state_type, lines: list[str]) -> float:
    """Seconds to score every word by BaseScore, as a decoder calls it."""
    s, t = state_type(), state_type()
    gc.collect()
    t0 = time.perf_counter()
    for line in lines:
        m.BeginSentenceWrite(s)
        for w in line.split():
            m.BaseScore(s, w, t)
            s, t = t, s
        m.BaseScore(s, "</s>", t)
    return time.perf_counter() - t0


def _timed(fn) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _best(rates: dict, key: str, seconds: float) -> None:
    rates[key] = min(rates.get(key, float("inf")), seconds)


# ---- the parent ----------------------------------------------------------------------------------------


def gcide(tmp: Path) -> dict[str, Path]:
    data = Path(os.environ.get("SEQLM_DATA", ROOT.parent / "shared" / "data")) / "gcide"
    out = {}
    for split in ("train", "test"):
        out[split] = tmp / f"{split}.txt"
        with gzip.open(data / f"{split}.txt.gz", "rb") as f:
            out[split].write_bytes(f.read())
    return out


def estimate_row(files: dict, tmp: Path, kb: Path, rounds: int) -> tuple[dict, Path]:
    best: dict = {}
    for r in range(rounds):
        out_dir = tmp / f"seqlm-{r}"
        out_dir.mkdir()
        est, _, rss = worker("estimate", text=files["train"], order=5, out=out_dir, tmp=tmp)
        if "to_arpa_seconds" not in best or est["to_arpa_seconds"] < best["to_arpa_seconds"]:
            best.update(to_arpa_seconds=est["to_arpa_seconds"], estimate_seconds=est["estimate_seconds"],
                        arpa_write_seconds=est["arpa_write_seconds"], peak_rss_mb=est["peak_rss_mb"],
                        process_peak_rss_mb=rss, rss_after_import_mb=est["rss_after_import_mb"],
                        ngrams=est["ngrams"], model_dir=out_dir)
        arpa = tmp / "lmplz.arpa"
        wall, rss, _ = run_measured([str(kb / "lmplz"), "-o", "5", "-S", "2G", "-T", str(tmp)],
                                    stdin=files["train"], stdout=arpa)
        if wall < best.get("lmplz_seconds", float("inf")):
            best.update(lmplz_seconds=wall, lmplz_peak_rss_mb=rss)
    model_dir = best.pop("model_dir")
    row = {"name": "gcide-kn5-estimate", "threads": 1, "order": 5, "rounds": rounds, **best,
           "time_vs_lmplz": best["to_arpa_seconds"] / best["lmplz_seconds"],
           "peak_rss_vs_lmplz": best["peak_rss_mb"] / best["lmplz_peak_rss_mb"],
           "process_peak_rss_vs_lmplz": best["process_peak_rss_mb"] / best["lmplz_peak_rss_mb"],
           **load_fields()}
    return row, model_dir


def scoring_row(files: dict, tmp: Path, kb: Path, model_dir: Path | None, rounds: int) -> dict:
    if model_dir is None:
        model_dir = tmp / "seqlm-scoring"
        model_dir.mkdir()
        worker("estimate", text=files["train"], order=5, out=model_dir, tmp=tmp)
    klm = tmp / "kenlm.klm"
    run_measured([str(kb / "build_binary"), str(model_dir / "model.arpa"), str(klm)])
    res, _, _ = worker_here("scoring", model=model_dir / "model.bin", klm=klm, text=files["test"], rounds=rounds)

    def vs(mine: str, theirs: str) -> float:
        return res[f"seqlm_{mine}_tokens_per_s"] / res[f"kenlm_{theirs}_tokens_per_s"]

    row = {"name": "gcide-kn5-scoring", "threads": 1, "rounds": rounds, **res,
           "base_score_vs_kenlm": vs("base_score", "base_score"),
           "full_scores_vs_kenlm": vs("full_scores", "full_scores"),
           "score_vs_kenlm": vs("score_per_sentence", "score_per_sentence"),
           "batched_ids_vs_kenlm": vs("batched_ids", "score_per_sentence"),
           "batched_text_vs_kenlm": vs("batched_text", "score_per_sentence"),
           **load_fields()}
    return row


def worker_here(step: str, **kw) -> tuple[dict, float, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", step]
    for k, v in kw.items():
        cmd += [f"--{k}", str(v)]
    wall, rss, out = run_measured(cmd)
    return json.loads(out.strip().splitlines()[-1]), wall, rss


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=ROWS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    for opt in ("model", "klm", "text"):  # the worker's
        p.add_argument(f"--{opt}", help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.worker:
        print(json.dumps(worker_scoring(args)))
        return
    kb = kenlm_bin()
    if kb is None:
        raise SystemExit("KenLM tools not found (set KENLM_BIN, or put lmplz on PATH): nothing to compare against")
    wanted = args.rows.split(",")
    with tempfile.TemporaryDirectory(prefix="kn-speed-") as name:
        tmp = Path(name)
        files = gcide(tmp)
        model_dir = None
        if "gcide-kn5-estimate" in wanted:
            row, model_dir = estimate_row(files, tmp, kb, args.rounds)
            merge_rows(NAME, [row])
            print(json.dumps(row), flush=True)
        if "gcide-kn5-scoring" in wanted:
            row = scoring_row(files, tmp, kb, model_dir, args.rounds)
            merge_rows(NAME, [row])
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
