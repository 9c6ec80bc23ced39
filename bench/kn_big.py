"""kn_scale.py's big-* rows: KN5 on the 100M-token sampled corpus (big_corpus.py) within a memory budget,
beside lmplz with the same budget on the same file in the same run.

    python bench/kn_scale.py --rows big-kn5,big-kn5-prune,big-kn5-frac [--corpus-tokens 100000000] [--budget 4G]

- `big-kn5`: seqlm `--memory BUDGET` (every stage on tables in files) in a fresh process: text -> ARPA
  (`seconds`, the span lmplz covers) and text -> binary (`to_binary_seconds`: estimation plus writing
  the binary, the ARPA not counted); `peak_rss_mb` is the whole process's peak (Python, reading the
  text, estimating, writing), from GNU time; `tmp_disk_mb` the peak of its scratch folder (TMPDIR for
  the estimate's tables, SEQLM_CACHE for the id cache: 4 bytes a token), polled every 0.5 s (open
  but unlinked files included, as lmplz keeps its own). lmplz
  `-o 5 -S BUDGET -T scratch` (text on stdin, ARPA on stdout) measured the same way; its test
  perplexity from KenLM's `query -v summary` on its ARPA. Then seqlm's binary mapped and the test split
  scored (`binary_load_seconds`, `query_tokens_per_s`: batched, best of 3, one thread).
- `big-kn5-prune`: the same with `--prune 0 1 1 2` on both sides (seqlm prunes on files too, within the
  budget, external_estimate.py; before 2026-12-01's change it pruned in memory).
- `big-kn5-frac0.125/0.25/0.5`: the first fraction of the train lines (the corpus is sampled
  sentence by sentence, so a prefix is a smaller corpus of the same kind): seconds and peaks of both.
Budgets are binary: 4G = 4 GiB = 4096 MiB, as lmplz -S and seqlm --memory read them; RSS and disk in MiB.
Each side starts after os.sync(), so that neither pays for write-back of gigabytes written before it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from _kn_common import rss_mb, run_measured, worker

BIG_FRACTIONS = (0.125, 0.25, 0.5)
PRUNE = "0 1 1 2"


def worker_estimate_big(args) -> dict:
    """In a fresh process: text -> model (bounded memory) -> ARPA, then the binary; timings and peaks."""
    scratch = Path(args.scratch)
    os.environ["TMPDIR"] = str(scratch / "tables")
    os.environ["SEQLM_CACHE"] = str(scratch / "cache")
    tempfile.tempdir = None  # re-read TMPDIR
    from seqlm.data.corpus import build_vocab, encode_file
    from seqlm.models.kn import KNConfig, estimate_kn
    from seqlm.ngram.binary import write_binary

    base = rss_mb()  # Python, numpy and torch (imported by seqlm) before any work
    t0 = time.perf_counter()
    vocab = build_vocab(args.text)
    stream = encode_file(args.text, vocab)
    t1 = time.perf_counter()
    model = estimate_kn(KNConfig(order=int(args.order), memory=args.memory, prune=args.prune or "0"), stream, vocab)
    t2 = time.perf_counter()
    out = {"read_seconds": t1 - t0, "estimate_seconds": t2 - t0, "estimate_peak_rss_mb": rss_mb(),
           "rss_after_import_mb": base,
           "ngrams": model.sizes}
    t = time.perf_counter()
    model.to_arpa(Path(args.out) / "model.arpa")
    out["arpa_write_seconds"] = time.perf_counter() - t
    t = time.perf_counter()
    write_binary(model, Path(args.out) / "model.bin")
    out["binary_write_seconds"] = time.perf_counter() - t
    out["to_arpa_seconds"] = out["estimate_seconds"] + out["arpa_write_seconds"]
    out["to_binary_seconds"] = out["estimate_seconds"] + out["binary_write_seconds"]
    return out


class DiskPeak:
    """The peak total size (MiB) of folder trees while a `with` block runs, polled from a thread."""

    def __init__(self, *folders: Path, every: float = 0.5):
        self.folders, self.every, self.peak = folders, every, 0
        self._stop = threading.Event()

    def _size(self) -> int:
        """Bytes of the files under the folders, counting files still open but already unlinked (lmplz
        unlinks its temporary files as soon as it has opened them), each inode once."""
        seen: dict[tuple[int, int], int] = {}
        for folder in self.folders:
            for root, _, files in os.walk(folder):
                for f in files:
                    self._add(seen, os.path.join(root, f))
        prefixes = tuple(str(f) + "/" for f in self.folders)
        for fd_dir in Path("/proc").glob("[0-9]*/fd"):
            try:
                for fd in os.scandir(fd_dir):
                    if os.readlink(fd.path).startswith(prefixes):
                        self._add(seen, fd.path)
            except OSError:  # a process that ended, or one we may not look into
                continue
        return sum(seen.values())

    @staticmethod
    def _add(seen: dict, path: str) -> None:
        try:
            st = os.stat(path)
        except OSError:  # deleted between listing and stat
            return
        seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._size())
            self._stop.wait(self.every)

    def __enter__(self) -> DiskPeak:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = self.peak / 2**20


def fresh(tmp: Path, name: str) -> Path:
    d = tmp / name
    for sub in ("tables", "cache", "out"):
        (d / sub).mkdir(parents=True)
    return d


def seqlm_side(train: Path, tmp: Path, name: str, budget: str, prune: str | None) -> tuple[dict, Path]:
    scratch = fresh(tmp, f"seqlm-{name}")
    os.sync()  # each side starts with no write-back of earlier gigabytes pending (theirs, ours, anyone's)
    with DiskPeak(scratch / "tables") as tables, DiskPeak(scratch / "tables", scratch / "cache") as disk:
        est, wall, rss = worker("estimate_big", text=train, order=5, out=scratch / "out", memory=budget,
                                prune=prune, scratch=scratch)
    row = {"seconds": est["to_arpa_seconds"], "to_binary_seconds": est["to_binary_seconds"],
           "estimate_seconds": est["estimate_seconds"], "read_seconds": est["read_seconds"],
           "arpa_write_seconds": est["arpa_write_seconds"], "binary_write_seconds": est["binary_write_seconds"],
           "process_wall_seconds": wall, "peak_rss_mb": rss, "estimate_peak_rss_mb": est["estimate_peak_rss_mb"],
           "rss_after_import_mb": est["rss_after_import_mb"],
           "tmp_disk_mb": disk.peak_mb, "tmp_tables_disk_mb": tables.peak_mb,
           "ngrams": est["ngrams"],
           "arpa_bytes": (scratch / "out" / "model.arpa").stat().st_size,
           "binary_bytes": (scratch / "out" / "model.bin").stat().st_size}
    return row, scratch / "out"


def lmplz_side(kb: Path, train: Path, test: Path | None, tmp: Path, name: str, budget: str,
               prune: str | None) -> dict:
    scratch = fresh(tmp, f"lmplz-{name}")
    arpa = scratch / "out" / "lmplz.arpa"
    os.sync()
    cmd = [str(kb / "lmplz"), "-o", "5", "-S", budget, "-T", str(scratch / "tables"), "--discount_fallback"]
    cmd += ["--prune", *prune.split()] if prune else []
    with DiskPeak(scratch / "tables") as disk:
        wall, rss, _ = run_measured(cmd, stdin=train, stdout=arpa)
    row = {"lmplz_seconds": wall, "lmplz_peak_rss_mb": rss, "lmplz_tmp_disk_mb": disk.peak_mb,
           "lmplz_arpa_bytes": arpa.stat().st_size}
    if test is not None:
        qwall, qrss, text = run_measured([str(kb / "query"), "-v", "summary", str(arpa)], stdin=test)
        summary = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        row.update(lmplz_test_ppl=float(summary["Perplexity including OOVs"]),
                   lmplz_query_seconds_with_arpa_load=qwall, lmplz_query_peak_rss_mb=qrss)
    arpa.unlink()
    return row


def budget_mb(budget: str) -> float:
    from seqlm.models.kn import KNConfig

    return KNConfig(memory=budget).memory_bytes / 2**20


def full_row(name: str, files: dict, info: dict, tmp: Path, kb: Path | None, budget: str, prune: str | None) -> dict:
    row = {"name": name, "threads": 1, "order": 5, "tokens": info["split_tokens"]["train"],
           "memory_budget": budget, "memory_budget_mb": budget_mb(budget), "prune": prune or "0",
           "corpus": corpus_fields(info)}
    seq, out = seqlm_side(files["train"], tmp, name, budget, prune)
    row.update(seq)
    load, _, _ = worker("load", model=out / "model.bin", text=files["test"])
    row.update(binary_load_seconds=load["load_seconds"], binary_load_rss_mb=load["load_rss_mb"],
               test_ppl=load["ppl"], test_tokens=load["tokens"], query_tokens_per_s=load["query_tokens_per_s"],
               query_text_tokens_per_s=load["query_text_tokens_per_s"])
    arpa_md5 = hashlib.md5((out / "model.arpa").read_bytes()).hexdigest()
    for f in out.iterdir():
        f.unlink()
    row["arpa_md5"] = arpa_md5
    row["peak_rss_vs_budget"] = row["peak_rss_mb"] / row["memory_budget_mb"]
    if kb is None:
        row["kenlm"] = "KenLM tools not found (set KENLM_BIN): no lmplz figures in this row"
        return row
    row.update(lmplz_side(kb, files["train"], files["test"], tmp, name, budget, prune))
    row["seconds_vs_lmplz"] = row["seconds"] / row["lmplz_seconds"]
    row["peak_rss_vs_lmplz"] = row["peak_rss_mb"] / row["lmplz_peak_rss_mb"]
    row["ppl_rel_diff_vs_lmplz"] = abs(row["test_ppl"] / row["lmplz_test_ppl"] - 1)
    return row


def frac_rows(files: dict, info: dict, tmp: Path, kb: Path | None, budget: str, fractions) -> list[dict]:
    rows = []
    with open(files["train"], encoding="utf-8") as fin:
        n_lines = sum(1 for _ in fin) if fractions else 0
    for f in fractions:
        part = tmp / f"big-train-{f}.txt"
        tokens = prefix(files["train"], part, int(n_lines * f))
        name = f"big-kn5-frac{f}"
        seq, out = seqlm_side(part, tmp, name, budget, None)
        for x in out.iterdir():
            x.unlink()
        row = {"name": name, "threads": 1, "order": 5, "fraction": f, "tokens": tokens,
               "memory_budget": budget, "memory_budget_mb": budget_mb(budget),
               "corpus": corpus_fields(info), **seq}
        if kb is not None:
            row.update(lmplz_side(kb, part, None, tmp, name, budget, None))
        part.unlink()
        rows.append(row)
    return rows


def prefix(src: Path, dest: Path, n_lines: int) -> int:
    """Copy the first n_lines of src to dest, streaming; their tokens (words + </s>)."""
    tokens = 0
    with open(src, encoding="utf-8") as fin, open(dest, "w", encoding="utf-8") as fout:
        for i, line in enumerate(fin):
            if i == n_lines:
                break
            fout.write(line)
            tokens += len(line.split()) + 1
    return tokens


def corpus_fields(info: dict) -> dict:
    """The corpus recipe and build figures a row carries (big_corpus.py)."""
    keep = ("source", "source_file", "order", "seed", "rng", "streams", "max_len", "burn_in_steps", "tokens",
            "heldout_tokens", "banned", "version", "split_tokens", "build_seconds", "sample_seconds", "draws_per_s")
    return {k: info[k] for k in keep if k in info}


def big_rows(wanted: list[str], tmp: Path, kb: Path | None, corpus_tokens: int, budget: str) -> list[dict]:
    """The big-* rows asked for, on the corpus of `corpus_tokens` training tokens (built when missing)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import big_corpus

    folder, info = big_corpus.ensure(corpus_tokens)
    files = {"train": folder / "train.txt", "test": folder / "test.txt"}
    rows = []
    if "big-kn5" in wanted:
        rows.append(full_row("big-kn5", files, info, tmp, kb, budget, None))
    if "big-kn5-prune" in wanted:
        rows.append(full_row("big-kn5-prune", files, info, tmp, kb, budget, PRUNE))
    fracs = [f for f in BIG_FRACTIONS if f"big-kn5-frac{f}" in wanted or "big-kn5-frac" in wanted]
    rows += frac_rows(files, info, tmp, kb, budget, fracs)
    return rows
