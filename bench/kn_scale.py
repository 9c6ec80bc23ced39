"""Benchmark: seqlm's Kneser-Ney estimation, binary models and queries against KenLM, on PTB and GCIDE.

Usage: .venv/bin/python bench/kn_scale.py --rows ptb-kn3,ptb-kn5,gcide-kn3,gcide-kn5,gcide-kn5-memory,scaling
       (KenLM's lmplz / build_binary / query from $KENLM_BIN or PATH; the `kenlm` Python module if installed)

Every measurement runs in a fresh process, started through GNU time so its peak RSS is its own (Linux
keeps a peak RSS across exec: a child of this process would report at least this process's RSS):
- seqlm estimation: text -> vocabulary -> ids (a fresh id cache, so reading the text is counted) ->
  counts -> model (`estimate_seconds`, `peak_rss_mb` right after it), then the ARPA and the binary
  written (`arpa_write_seconds`, `binary_write_seconds`); `to_arpa_seconds` is text -> ARPA, the span
  lmplz's `lmplz_seconds` covers (lmplz -o N -S 2G, text on stdin, ARPA on stdout).
- loading: seqlm parsing the ARPA vs mapping the binary (seconds and RSS after load), KenLM's
  build_binary and its Python module loading that binary.
- test perplexity: seqlm's batched query; KenLM's `query -v summary` on its own binary (PTB's literal
  <unk> renamed for lmplz, which refuses it, as the kenlm-oracle data does).
- query speed on the test set: batched numpy path on encoded ids (`query_tokens_per_s`), the same from
  text lines, the per-sentence API (full_scores), and kenlm.Model.score and full_scores per sentence;
  every rate the best of 3 passes over the whole test set; one thread.
`scaling`: GCIDE KN5 on the first 1/8, 1/4, 1/2 of train (1 is row gcide-kn5), seqlm and lmplz.
`gcide-kn5-memory`: `--memory` at a quarter of gcide-kn5's in-memory peak; the ARPA must be identical.
`big-kn5`, `big-kn5-prune`, `big-kn5-frac` (or one of big-kn5-frac0.125/0.25/0.5): the 100M-token
sampled corpus within `--budget`, beside lmplz (bench/kn_big.py; `--corpus-tokens 1e6` to check them).
Writes bench/results/kn_scale.json and kn_scale.png.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _kn_common import kenlm_bin, rss_mb, run_measured, worker  # noqa: E402

from common import merge_rows  # noqa: E402  (stamps provenance at import)

NAME = "kn_scale"
FRACTIONS = (0.125, 0.25, 0.5)
BIG_ROWS = ("big-kn5", "big-kn5-prune", "big-kn5-frac", "big-kn5-frac0.125", "big-kn5-frac0.25", "big-kn5-frac0.5")


# ---- the worker: one step in a fresh process, JSON on stdout -------------------------------------------


def _rss_now_mb() -> float:
    """This process's resident set now (MB): mapped pages count only once touched."""
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmRSS")) / 1024


def worker_estimate(args: argparse.Namespace) -> dict:
    os.environ["SEQLM_CACHE"] = tempfile.mkdtemp(prefix="kn-scale-cache-", dir=args.tmp)
    from seqlm.data.corpus import build_vocab, encode_file
    from seqlm.models.kn import KNConfig, estimate_kn
    from seqlm.ngram.binary import write_binary

    base = rss_mb()
    t0 = time.perf_counter()
    vocab = build_vocab(args.text)
    stream = encode_file(args.text, vocab)
    t1 = time.perf_counter()
    model = estimate_kn(KNConfig(order=args.order, memory=args.memory or ""), stream, vocab)
    t2 = time.perf_counter()
    out = {"read_seconds": t1 - t0, "estimate_seconds": t2 - t0, "peak_rss_mb": rss_mb(), "rss_after_import_mb": base,
           "ngrams": model.sizes}
    if args.out:
        t = time.perf_counter()
        model.to_arpa(Path(args.out) / "model.arpa")
        out["arpa_write_seconds"] = time.perf_counter() - t
        out["to_arpa_seconds"] = time.perf_counter() - t0
        t = time.perf_counter()
        write_binary(model, Path(args.out) / "model.bin")
        out["binary_write_seconds"] = time.perf_counter() - t
        out["peak_rss_with_writing_mb"] = rss_mb()
    shutil.rmtree(os.environ["SEQLM_CACHE"], ignore_errors=True)
    return out


def worker_load(args: argparse.Namespace) -> dict:
    import numpy as np

    from seqlm.ngram.query import NGramQuery

    base = _rss_now_mb()
    t0 = time.perf_counter()
    m = NGramQuery(args.model)
    load = time.perf_counter() - t0
    out = {"load_seconds": load, "load_rss_mb": _rss_now_mb() - base, "peak_rss_mb": rss_mb()}
    if args.text:
        lines = _lines(Path(args.text))
        from seqlm.data.corpus import encode_file

        stream = encode_file(args.text, m.vocab, use_cache=False)
        first = m.score_corpus(stream)  # also pages in what the test set touches
        out["ppl"] = first.perplexity()
        out["ppl_excl_oov"] = first.perplexity(include_oov=False)
        out["tokens"] = len(first.log10_prob)
        out["query_tokens_per_s"] = _rate(lambda: m.score_corpus(stream), len(first.log10_prob))
        out["query_text_tokens_per_s"] = _rate(lambda: m.score_corpus(lines), len(first.log10_prob))
        n = sum(len(s.split()) + 1 for s in lines)  # best of 3 passes over the whole test set, as for kenlm:
        # the first pass also pays Python's one-time full garbage collection over the loaded vocabulary
        out["per_sentence_tokens_per_s"] = _rate(lambda: [list(m.full_scores(s)) for s in lines], n)
        out["max_abs_diff_text_vs_ids"] = float(np.abs(m.score_corpus(lines).log10_prob - first.log10_prob).max())
    return out


def worker_kenlm_py(args: argparse.Namespace) -> dict:
    import kenlm

    t0 = time.perf_counter()
    m = kenlm.Model(args.model)
    load = time.perf_counter() - t0
    lines = _lines(Path(args.text))
    n = sum(len(s.split()) + 1 for s in lines)
    total = sum(m.score(s) for s in lines)
    return {"load_seconds": load, "ppl": 10 ** (-total / n),
            "tokens_per_s": _rate(lambda: [m.score(s) for s in lines], n),
            "full_scores_tokens_per_s": _rate(lambda: [list(m.full_scores(s)) for s in lines], n)}


def _rate(fn, tokens: int, rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return tokens / best


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---- the parent: runs the steps, measures wall time and peak RSS per process ----------------------------


def corpus_files(name: str, tmp: Path, fraction: float = 1.0) -> dict[str, Path]:
    """Plain-text train/test for seqlm, and for lmplz a copy with PTB's literal <unk> renamed."""
    data = Path(os.environ.get("SEQLM_DATA", ROOT.parent / "shared" / "data")) / name
    out = {}
    for split in ("train", "test"):
        src = data / f"{split}.txt" if (data / f"{split}.txt").exists() else data / f"{split}.txt.gz"
        opener = gzip.open if src.suffix == ".gz" else open
        with opener(src, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
        if split == "train" and fraction < 1:
            lines = lines[: int(len(lines) * fraction)]
        text = "\n".join(lines) + "\n"
        out[split] = tmp / f"{name}-{fraction}-{split}.txt"
        out[split].write_text(text, encoding="utf-8")
        out[f"kenlm_{split}"] = tmp / f"{name}-{fraction}-{split}.kenlm.txt"
        out[f"kenlm_{split}"].write_text(text.replace("<unk>", "UNKTOK"), encoding="utf-8")
    return out


def lmplz(kb: Path, files: dict, order: int, tmp: Path) -> dict:
    arpa = tmp / f"lmplz-{order}.arpa"
    cmd = [str(kb / "lmplz"), "-o", str(order), "-S", "2G", "-T", str(tmp), "--discount_fallback"]
    wall, rss, _ = run_measured(cmd, stdin=files["kenlm_train"], stdout=arpa)
    return {"lmplz_seconds": wall, "lmplz_peak_rss_mb": rss, "arpa": arpa}


def kenlm_rows(kb: Path, files: dict, order: int, tmp: Path) -> dict:
    est = lmplz(kb, files, order, tmp)
    binary = tmp / f"kenlm-{order}.bin"
    wall, rss, _ = run_measured([str(kb / "build_binary"), str(est["arpa"]), str(binary)])
    out = {"lmplz_seconds": est["lmplz_seconds"], "lmplz_peak_rss_mb": est["lmplz_peak_rss_mb"],
           "kenlm_arpa_bytes": est["arpa"].stat().st_size, "kenlm_build_binary_seconds": wall,
           "kenlm_binary_bytes": binary.stat().st_size}
    wall, rss, text = run_measured([str(kb / "query"), "-v", "summary", str(binary)], stdin=files["kenlm_test"])
    summary = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
    out.update(kenlm_test_ppl=float(summary["Perplexity including OOVs"]),
               kenlm_test_ppl_excl_oov=float(summary["Perplexity excluding OOVs"]),
               kenlm_query_seconds_with_load=wall, kenlm_query_peak_rss_mb=rss)
    try:
        import kenlm  # noqa: F401
    except ImportError:
        out["kenlm_python"] = "not installed"
        return out
    py, wall, rss = worker("kenlm_py", model=binary, text=files["kenlm_test"])
    out.update(kenlm_py_load_seconds=py["load_seconds"], kenlm_py_tokens_per_s=py["tokens_per_s"],
               kenlm_py_full_scores_tokens_per_s=py["full_scores_tokens_per_s"], kenlm_py_test_ppl=py["ppl"])
    est["arpa"].unlink()
    binary.unlink()
    return out


def main_row(corpus: str, order: int, tmp: Path, kb: Path | None) -> dict:
    files = corpus_files(corpus, tmp)
    out_dir = tmp / f"{corpus}-kn{order}"
    out_dir.mkdir()
    est, wall, rss = worker("estimate", text=files["train"], order=order, out=out_dir, tmp=tmp)
    row = {"name": f"{corpus}-kn{order}", "threads": 1, "order": order, "ngrams": est["ngrams"],
           "estimate_seconds": est["estimate_seconds"], "read_seconds": est["read_seconds"],
           "to_arpa_seconds": est["to_arpa_seconds"], "arpa_write_seconds": est["arpa_write_seconds"],
           "binary_write_seconds": est["binary_write_seconds"], "peak_rss_mb": est["peak_rss_mb"],
           "peak_rss_with_writing_mb": est["peak_rss_with_writing_mb"],
           "rss_after_import_mb": est["rss_after_import_mb"],
           "estimate_process_wall_seconds": wall, "arpa_bytes": (out_dir / "model.arpa").stat().st_size,
           "binary_bytes": (out_dir / "model.bin").stat().st_size,
           "arpa_md5": hashlib.md5((out_dir / "model.arpa").read_bytes()).hexdigest(),
           "binary_md5": hashlib.md5((out_dir / "model.bin").read_bytes()).hexdigest()}
    arpa, _, _ = worker("load", model=out_dir / "model.arpa")
    binary, _, _ = worker("load", model=out_dir / "model.bin", text=files["test"])
    row.update(arpa_load_seconds=arpa["load_seconds"], arpa_load_rss_mb=arpa["load_rss_mb"],
               arpa_load_process_peak_rss_mb=arpa["peak_rss_mb"],
               binary_load_seconds=binary["load_seconds"], binary_load_rss_mb=binary["load_rss_mb"],
               load_speedup=arpa["load_seconds"] / binary["load_seconds"],
               test_ppl=binary["ppl"], test_ppl_excl_oov=binary["ppl_excl_oov"], test_tokens=binary["tokens"],
               query_tokens_per_s=binary["query_tokens_per_s"],
               query_text_tokens_per_s=binary["query_text_tokens_per_s"],
               per_sentence_tokens_per_s=binary["per_sentence_tokens_per_s"])
    if kb is None:
        row["kenlm"] = "KenLM tools not found (set KENLM_BIN): no KenLM figures in this row"
        return row
    row.update(kenlm_rows(kb, files, order, tmp))
    row["estimate_vs_lmplz"] = row["to_arpa_seconds"] / row["lmplz_seconds"]
    row["peak_rss_vs_lmplz"] = row["peak_rss_mb"] / row["lmplz_peak_rss_mb"]
    row["ppl_rel_diff_vs_kenlm"] = abs(row["test_ppl"] / row["kenlm_test_ppl"] - 1)
    if "kenlm_py_tokens_per_s" in row:
        row["query_vs_kenlm_py"] = row["query_tokens_per_s"] / row["kenlm_py_tokens_per_s"]
    return row


def memory_row(tmp: Path, kb: Path | None, reference: dict) -> dict:
    files = corpus_files("gcide", tmp)
    budget = int(reference["peak_rss_mb"] / 4)
    out_dir = tmp / "gcide-kn5-memory"
    out_dir.mkdir()
    est, wall, _ = worker("estimate", text=files["train"], order=5, out=out_dir, tmp=tmp, memory=f"{budget}M")
    md5 = hashlib.md5((out_dir / "model.arpa").read_bytes()).hexdigest()
    row = {"name": "gcide-kn5-memory", "threads": 1, "memory": f"{budget}M",
           "estimate_seconds": est["estimate_seconds"],
           "to_arpa_seconds": est["to_arpa_seconds"], "peak_rss_mb": est["peak_rss_mb"],
           "arpa_write_seconds": est["arpa_write_seconds"], "binary_write_seconds": est["binary_write_seconds"],
           "peak_rss_with_writing_mb": est["peak_rss_with_writing_mb"],
           "rss_after_import_mb": est["rss_after_import_mb"],
           "in_memory_peak_rss_mb": reference["peak_rss_mb"],
           "in_memory_estimate_seconds": reference["estimate_seconds"],
           "arpa_identical_to_in_memory": md5 == reference["arpa_md5"]}
    if "binary_md5" in reference:
        row["binary_identical_to_in_memory"] = (
            hashlib.md5((out_dir / "model.bin").read_bytes()).hexdigest() == reference["binary_md5"])
    if kb is not None:
        row["lmplz_seconds"] = reference.get("lmplz_seconds")
        row["estimate_vs_lmplz"] = row["to_arpa_seconds"] / row["lmplz_seconds"] if row["lmplz_seconds"] else None
    return row


def scaling_rows(tmp: Path, kb: Path | None) -> list[dict]:
    rows = []
    for f in FRACTIONS:
        files = corpus_files("gcide", tmp, f)
        est, wall, _ = worker("estimate", text=files["train"], order=5, tmp=tmp)
        row = {"name": f"gcide-kn5-frac{f}", "threads": 1, "fraction": f, "train_lines": len(_lines(files["train"])),
               "estimate_seconds": est["estimate_seconds"], "peak_rss_mb": est["peak_rss_mb"], "ngrams": est["ngrams"]}
        if kb is not None:
            lm = lmplz(kb, files, 5, tmp)
            lm["arpa"].unlink()
            row.update(lmplz_seconds=lm["lmplz_seconds"], lmplz_peak_rss_mb=lm["lmplz_peak_rss_mb"])
        rows.append(row)
    return rows


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from common import RESULTS

    rows = {r["name"]: r for r in json.loads((RESULTS / f"{NAME}.json").read_text())["rows"]}
    pts = [rows[n] for n in [f"gcide-kn5-frac{f}" for f in FRACTIONS] + ["gcide-kn5"] if n in rows]
    if not pts:
        return
    x = [r.get("fraction", 1.0) for r in pts]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(x, [r["estimate_seconds"] for r in pts], "o-", label="seqlm (text -> model)")
    b.plot(x, [r["peak_rss_mb"] for r in pts], "o-", label="seqlm")
    if all("lmplz_seconds" in r for r in pts):
        a.plot(x, [r["lmplz_seconds"] for r in pts], "s--", label="lmplz -S 2G (text -> ARPA)")
        b.plot(x, [r["lmplz_peak_rss_mb"] for r in pts], "s--", label="lmplz -S 2G")
    a.set(xlabel="fraction of GCIDE train (3.57M tokens)", ylabel="seconds", title="KN5 estimation time")
    b.set(xlabel="fraction of GCIDE train", ylabel="peak RSS (MB)", title="KN5 estimation peak memory")
    for ax in (a, b):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{NAME}.png", dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="ptb-kn3,ptb-kn5,gcide-kn3,gcide-kn5,gcide-kn5-memory,scaling")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--corpus-tokens", type=float, default=100e6, help="big-* rows: training tokens of the "
                   "sampled corpus (bench/big_corpus.py; e.g. 1e6 to check the rows)")
    p.add_argument("--budget", default="4G", help="big-* rows: seqlm --memory and lmplz -S (binary units)")
    for opt in ("text", "order", "out", "tmp", "memory", "model", "prune", "scratch"):
        p.add_argument(f"--{opt}", help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.worker:
        args.order = int(args.order) if args.order else None
        from kn_big import worker_estimate_big

        fn = {"estimate": worker_estimate, "load": worker_load, "kenlm_py": worker_kenlm_py,
              "estimate_big": worker_estimate_big}[args.worker]
        print(json.dumps(fn(args)))
        return
    import torch

    torch.set_num_threads(args.threads)
    kb = kenlm_bin()
    if kb is None:
        print("KenLM tools not found (KENLM_BIN or PATH): KenLM figures are left out", file=sys.stderr)
    wanted = args.rows.split(",")
    with tempfile.TemporaryDirectory(prefix="kn-scale-") as tmp_name:
        tmp = Path(tmp_name)
        done: dict[str, dict] = {}
        for corpus, order in (("ptb", 3), ("ptb", 5), ("gcide", 3), ("gcide", 5)):
            name = f"{corpus}-kn{order}"
            if name in wanted or (name == "gcide-kn5" and "gcide-kn5-memory" in wanted):
                done[name] = main_row(corpus, order, tmp, kb)
                merge_rows(NAME, [done[name]])
                print(json.dumps(done[name]), flush=True)
        if "gcide-kn5-memory" in wanted:
            row = memory_row(tmp, kb, done["gcide-kn5"])
            merge_rows(NAME, [row])
            print(json.dumps(row), flush=True)
        if "scaling" in wanted:
            rows = scaling_rows(tmp, kb)
            merge_rows(NAME, rows)
            print(json.dumps(rows), flush=True)
        if any(w in BIG_ROWS for w in wanted):
            from kn_big import big_rows

            for row in big_rows(wanted, tmp, kb, int(args.corpus_tokens), args.budget):
                merge_rows(NAME, [row])
                print(json.dumps(row), flush=True)
    plot()


if __name__ == "__main__":
    main()
