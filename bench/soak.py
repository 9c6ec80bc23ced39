"""Soak test (#43 section 3; minutes, not in CI): processes and threads scoring through shared models for a while.

    SEQLM_DATA=../shared/data python bench/soak.py [--minutes 10] [--processes 4] [--threads 2] [--start fork]

Models: the KN5 binary of bench/shared_memory.py (PTB, or its generated corpus where PTB is absent) and a small
LSTM trained on the same corpus by the seqlm CLI for --train-minutes (1 x 64; its quality does not matter here).
The parent draws --sentences random sentences (1-30 words of the test text, one word in fifty replaced by a word
no model knows) and, on one torch thread, scores each the reference way: KN through seqlm.kenlm.Model
(`score`, `full_scores`, a BaseScore walk) and the LSTM through seqlm.score_text on fixed groups of four sentences.

Then --processes workers (forked, or spawned with --start spawn: the models pickled, the binary mapped again)
run --threads threads each; every thread repeats, until the time is up, a random choice of: a KN sentence's
three calls, or an LSTM group's score_text, and compares each result with the reference, exactly (equal
floats: the same calls on the same inputs, one torch thread per process). The parent samples every worker's
RSS and PSS (/proc/PID/smaps_rollup) every --sample-seconds. The row: calls and tokens per kind, mismatches,
errors (the first few messages), and per worker the first, largest and last memory sample and the RSS growth
from a quarter of the run to its end (a leak would show there; before it the pages of the models are still
being touched for the first time). Writes bench/results/soak.json (row soak-MINUTESmin).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

from shared_memory import kn_model, test_sentences

from common import CHECKPOINTS, ROOT, merge_rows

NAME = "soak"
GROUP = 4  # sentences per LSTM score_text call
OOV = "qqqzx"  # in no vocabulary


def lstm_model(corpus: Path, minutes: float) -> Path:
    out = CHECKPOINTS / f"soak-lstm-{corpus.name}"
    if not (out / "weights.safetensors").exists():
        subprocess.run([sys.executable, "-m", "seqlm", "train", "--model", "lstm", "--hidden", "64", "--layers", "1",
                        "--data", str(corpus), "--max-minutes", str(minutes), "--out", str(out), "--force"],
                       check=True, cwd=ROOT)
    return out


def random_sentences(corpus: Path, n: int, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    words = [w for s in test_sentences(corpus) for w in s.split()]
    return [[OOV if rng.random() < 0.02 else rng.choice(words) for _ in range(rng.randint(1, 30))] for _ in range(n)]


def kn_calls(kn, words: list[str]) -> tuple:
    """score, full_scores and a BaseScore walk of one sentence: a scorer's and a decoder's calls."""
    import seqlm.kenlm as kenlm

    sentence = " ".join(words)
    state, after = kenlm.State(), kenlm.State()
    kn.BeginSentenceWrite(state)
    walk = []
    for w in words:
        walk.append(kn.BaseScore(state, w, after))
        state, after = after, state
    return kn.score(sentence), list(kn.full_scores(sentence)), walk


def lstm_call(lstm, group: list[list[str]]) -> list[list[float]]:
    import seqlm

    return seqlm.score_text(lstm, group)


def references(kn, lstm, sentences: list[list[str]]) -> tuple[list, list]:
    groups = [sentences[i : i + GROUP] for i in range(0, len(sentences), GROUP)]
    return [kn_calls(kn, s) for s in sentences], [lstm_call(lstm, g) for g in groups]


def thread_loop(kn, lstm, sentences, ref_kn, ref_lstm, deadline: float, seed: int, out: dict, lock) -> None:
    rng = random.Random(seed)
    tally = {"kn_calls": 0, "kn_tokens": 0, "lstm_calls": 0, "lstm_tokens": 0, "mismatches": 0, "errors": 0}
    messages = []
    while time.time() < deadline:
        try:
            if rng.random() < 0.5:
                i = rng.randrange(len(sentences))
                same = kn_calls(kn, sentences[i]) == ref_kn[i]
                tally["kn_calls"] += 1
                tally["kn_tokens"] += len(sentences[i]) + 1
            else:
                j = rng.randrange(len(ref_lstm))
                group = sentences[j * GROUP : (j + 1) * GROUP]
                same = lstm_call(lstm, group) == ref_lstm[j]
                tally["lstm_calls"] += 1
                tally["lstm_tokens"] += sum(len(s) + 1 for s in group)
            tally["mismatches"] += not same
        except Exception as e:  # noqa: BLE001 (counted and reported: the soak's finding, not its end)
            tally["errors"] += 1
            messages.append(f"{type(e).__name__}: {e}"[:300])
    with lock:
        for k, v in tally.items():
            out[k] = out.get(k, 0) + v
        out.setdefault("messages", []).extend(messages[:3])


def worker(kn, lstm, sentences, ref_kn, ref_lstm, threads: int, seconds: float, seed: int, results) -> None:
    import torch

    deadline = time.time() + seconds  # from here: a spawned worker's imports may take seconds
    torch.set_num_threads(1)  # as the reference ran (a forked worker starts so anyway: seqlm/forking.py)
    out: dict = {"pid": os.getpid()}
    lock = threading.Lock()
    pool = [threading.Thread(target=thread_loop, args=(kn, lstm, sentences, ref_kn, ref_lstm, deadline,
                                                        seed * 100 + t, out, lock)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    results.put(out)


def memory_mb(pid: int) -> tuple[float, float] | None:
    """(RSS, PSS) of a process in MB, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kb = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:]}
    return round(kb["Rss"] / 1024, 1), round(kb["Pss"] / 1024, 1)


def sample(procs, every: float, results, n: int) -> tuple[dict, list]:
    """Memory samples of each worker every `every` seconds until all have reported; their reports."""
    samples: dict[int, list] = {p.pid: [] for p in procs}
    reports, start = [], time.time()
    while len(reports) < n and (any(p.is_alive() for p in procs) or not results.empty()):  # a dead one reports not
        for p in procs:
            m = memory_mb(p.pid)
            if m is not None:
                samples[p.pid].append((round(time.time() - start), *m))
        try:
            while True:
                reports.append(results.get(timeout=every))
        except queue.Empty:
            pass
    return samples, reports


def summary(samples: list) -> dict:
    """First, largest and last (seconds, RSS MB, PSS MB) sample, and RSS growth to the last from the first sample
    past a quarter of the run (before it the worker is still touching pages of the models for the first time)."""
    if not samples:
        return {}
    top = max(samples, key=lambda s: s[1])
    warm = next(s for s in samples if s[0] >= samples[-1][0] / 4)
    return {"first": samples[0], "max_rss": top, "last": samples[-1], "count": len(samples),
            "after_warmup": warm, "rss_growth_after_warmup_mb": round(samples[-1][1] - warm[1], 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--start", default="fork", choices=["fork", "spawn", "forkserver"])
    p.add_argument("--sentences", type=int, default=2000)
    p.add_argument("--sample-seconds", type=float, default=10.0)
    p.add_argument("--train-minutes", type=float, default=1.0, help="the LSTM's training time, when it is absent")
    p.add_argument("--note", default="", help="recorded in the row")
    args = p.parse_args()
    import torch

    import seqlm
    import seqlm.kenlm as kenlm

    load_before = [round(x, 2) for x in os.getloadavg()]  # 1, 5, 15 minutes: what else the machine was running
    kn_dir, corpus = kn_model(5)
    lstm_dir = lstm_model(corpus, args.train_minutes)
    torch.set_num_threads(1)
    kn, lstm = kenlm.Model(str(kn_dir)), seqlm.load(lstm_dir)
    sentences = random_sentences(corpus, args.sentences)
    t = time.time()
    ref_kn, ref_lstm = references(kn, lstm, sentences)
    print(f"references: {time.time() - t:.1f} s", flush=True)
    ctx = mp.get_context(args.start)
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(kn, lstm, sentences, ref_kn, ref_lstm, args.threads, 60 * args.minutes,
                                              i, results)) for i in range(args.processes)]
    for proc in procs:
        proc.start()
    samples, reports = sample(procs, args.sample_seconds, results, args.processes)
    for proc in procs:
        proc.join()
    totals = {k: sum(r.get(k, 0) for r in reports) for k in ("kn_calls", "kn_tokens", "lstm_calls", "lstm_tokens",
                                                               "mismatches", "errors")}
    row = {"name": f"soak-{args.minutes:g}min", "minutes": args.minutes, "processes": args.processes,
           "threads_per_process": args.threads, "threads": 1, "start": args.start, "note": args.note,
           "load_average_before": load_before,
           "kn": str(kn_dir.relative_to(ROOT)), "lstm": str(lstm_dir.relative_to(ROOT)),
           "sentences": len(sentences), **totals,
           "exit_codes": [proc.exitcode for proc in procs],
           "messages": [m for r in reports for m in r.get("messages", [])][:10],
           "memory": {str(pid): summary(s) for pid, s in samples.items()}}
    print(row, flush=True)
    merge_rows(NAME, [row])
    if totals["mismatches"] or totals["errors"] or any(proc.exitcode for proc in procs):
        raise SystemExit(f"soak: {totals['mismatches']} mismatches, {totals['errors']} errors")


if __name__ == "__main__":
    main()
