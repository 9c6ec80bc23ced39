"""Benchmark (#43 section 3): a memory-mapped binary n-gram model opened by forked workers is shared, not copied.

    SEQLM_DATA=../shared/data python bench/shared_memory.py [--workers 4] [--order 5]

The model: `seqlm train --model kn --order 5` on PTB ($SEQLM_DATA/ptb), or, where PTB is absent, on a corpus this
script writes (bench/checkpoints/shared-memory-corpus: 40k sentences over a 5k-word Zipf vocabulary, each word
drawn after its predecessor from a few dozen likely followers, so that the 5-gram tables hold millions of
entries). The parent opens it with seqlm.kenlm.Model (the directory's model.bin, mapped; loading checks every
section's checksum, so the parent has touched every page) and scores the test text once, the reference.

Each configuration forks 1 worker, then --workers workers; each scores the whole test text with full_scores
(one sentence at a time, as a decoder or a scorer process would) and checks its total against the parent's,
then all of them (and the parent) read /proc/self/smaps_rollup while every one is still alive:
USS = Private_Clean + Private_Dirty (what this process alone holds), PSS (each page divided among the
processes that map it), RSS. Configurations: `shared`, the workers use the parent's model (the fork inherits
the mapping); `copied`, each worker copies the tables into its own memory first, as a model pickled by value
arrives in a worker (what a mapped model avoids by pickling as its file, docs/integrations.md).

Each row holds both worker counts (`one`, `many`), `uss_sum_ratio` (the workers' summed USS with N workers over
one worker's) and `pss_per_added_worker_mb` (what the whole group, parent included, grows by per worker past
the first: the memory a worker costs). `table_mb` is the size of the binary file. Writes
bench/results/shared_memory.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from common import CHECKPOINTS, ROOT, merge_rows

NAME = "shared_memory"
FIELDS = ("Rss", "Pss", "Private_Clean", "Private_Dirty", "Shared_Clean")


def rollup() -> dict[str, float]:
    """This process's memory from /proc/self/smaps_rollup, in MB: rss, pss, uss (private clean + dirty)."""
    kb = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        if key in FIELDS:
            kb[key] = int(value.split()[0])
    return {"rss_mb": kb["Rss"] / 1024, "pss_mb": kb["Pss"] / 1024,
            "uss_mb": (kb["Private_Clean"] + kb["Private_Dirty"]) / 1024}


def corpus_dir() -> Path:
    """$SEQLM_DATA/ptb (or ../shared/data/ptb) when there, else the generated corpus (written once)."""
    env = os.environ.get("SEQLM_DATA")
    for cand in ([Path(env) / "ptb"] if env else []) + [ROOT.parent / "shared" / "data" / "ptb"]:
        if (cand / "train.txt").exists():
            return cand
    out = CHECKPOINTS / "shared-memory-corpus"
    if not (out / "test.txt").exists():
        write_corpus(out)
    return out


def write_corpus(out: Path, sentences: int = 40_000, vocab: int = 5_000, seed: int = 0) -> None:
    """train.txt, valid.txt and test.txt (90/5/5) of Zipf-distributed words with a bigram structure."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    weights = [1.0 / (i + 1) for i in range(vocab)]
    followers = {w: rng.choices(words, weights, k=40) for w in words}
    lines = []
    for _ in range(sentences):
        w = rng.choices(words, weights)[0]
        sentence = [w]
        for _ in range(rng.randint(4, 25)):
            w = rng.choice(followers[w]) if rng.random() < 0.8 else rng.choices(words, weights)[0]
            sentence.append(w)
        lines.append(" ".join(sentence))
    out.mkdir(parents=True, exist_ok=True)
    cut = [0, int(0.9 * sentences), int(0.95 * sentences), sentences]
    for split, a, b in zip(("train", "valid", "test"), cut, cut[1:], strict=True):
        (out / f"{split}.txt").write_text("\n".join(lines[a:b]) + "\n", encoding="utf-8")


def kn_model(order: int) -> tuple[Path, Path]:
    """(the model directory, its corpus), trained by the seqlm CLI when absent."""
    corpus = corpus_dir()
    out = CHECKPOINTS / f"shared-memory-kn{order}-{corpus.name}"
    if not (out / "model.bin").exists():
        subprocess.run([sys.executable, "-m", "seqlm", "train", "--model", "kn", "--order", str(order), "--data",
                        str(corpus), "--out", str(out), "--force"], check=True, cwd=ROOT)
    return out, corpus


def test_sentences(corpus: Path) -> list[str]:
    return [s for s in (corpus / "test.txt").read_text(encoding="utf-8").splitlines() if s.strip()]


def total(model, sentences: list[str]) -> float:
    return sum(p for s in sentences for p, _, _ in model.full_scores(s))


def private_copy(model):
    """The model's tables copied into this process's memory (as a model pickled by value arrives), queried."""
    from seqlm.ngram.model import NGramModel
    from seqlm.ngram.query import NGramQuery

    m = model.model
    return NGramQuery(NGramModel(m.vocab, [np.array(k) for k in m.keys], [np.array(p) for p in m.log10_prob],
                                 [np.array(b) for b in m.log10_backoff],
                                 [None if i is None else np.array(i) for i in m.index]))


def worker(model, mode: str, sentences: list[str], done, results) -> None:
    t = time.perf_counter()
    if mode == "copied":
        model = private_copy(model)
    score = total(model, sentences)
    seconds = time.perf_counter() - t
    done.wait()  # every worker has scored: each one's pages are all mapped while the others measure
    results.put({"pid": os.getpid(), "total": score, "seconds": seconds, **rollup()})
    done.wait()  # keep the mapping alive until the parent has read every worker's figures


def run_workers(model, mode: str, n: int, sentences: list[str], want: float) -> dict:
    """Fork n workers that score `sentences` through `model`; their memory, summed, and the parent's."""
    ctx = mp.get_context("fork")
    done, results = ctx.Barrier(n + 1), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(model, mode, sentences, done, results)) for _ in range(n)]
    for p in procs:
        p.start()
    done.wait(timeout=600)
    parent = rollup()
    got = [results.get(timeout=600) for _ in range(n)]
    done.wait(timeout=600)
    for p in procs:
        p.join()
    if any(abs(g["total"] - want) > 1e-6 * abs(want) for g in got):
        raise SystemExit(f"{mode}: a worker's total differs from the parent's {want}: {[g['total'] for g in got]}")
    return {"workers": n, "uss_sum_mb": round(sum(g["uss_mb"] for g in got), 1),
            "pss_sum_mb": round(sum(g["pss_mb"] for g in got), 1),
            "pss_with_parent_mb": round(sum(g["pss_mb"] for g in got) + parent["pss_mb"], 1),
            "rss_mean_mb": round(sum(g["rss_mb"] for g in got) / n, 1),
            "parent": {k: round(v, 1) for k, v in parent.items()},
            "seconds_mean": round(sum(g["seconds"] for g in got) / n, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--order", type=int, default=5)
    p.add_argument("--modes", default="shared,copied")
    args = p.parse_args()
    if not Path("/proc/self/smaps_rollup").exists():
        raise SystemExit("this benchmark reads /proc/PID/smaps_rollup (Linux 4.14 and later)")
    import seqlm.kenlm as kenlm

    model_dir, corpus = kn_model(args.order)
    model = kenlm.Model(str(model_dir))
    sentences = test_sentences(corpus)
    want = total(model, sentences)
    rows = []
    for mode in args.modes.split(","):
        one, many = (run_workers(model, mode, n, sentences, want) for n in (1, args.workers))
        rows.append({"name": f"kn{args.order}-{corpus.name}-{mode}", "mode": mode, "threads": 1,
                     "model": str(model_dir.relative_to(ROOT)), "table_mb": round((model_dir / "model.bin").stat()
                                                                                  .st_size / 2**20, 1),
                     "ngrams": model.model.sizes, "test_sentences": len(sentences), "one": one, "many": many,
                     "uss_sum_ratio": round(many["uss_sum_mb"] / one["uss_sum_mb"], 2),
                     "pss_per_added_worker_mb": round((many["pss_with_parent_mb"] - one["pss_with_parent_mb"])
                                                      / (args.workers - 1), 1)})
        print(rows[-1], flush=True)
    merge_rows(NAME, rows)


if __name__ == "__main__":
    main()
