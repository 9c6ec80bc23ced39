"""Neural training on the 100M-token sampled corpus, streaming from disk (bench/results/stream_scale.json).

    python bench/stream_scale.py [--rows stream-rnn,stream-rnn-node] [--corpus-tokens 1e8] [--minutes 20]
                                 [--segments 4] [--sample-seconds 60]

`stream-rnn`: the class-output RNN (H 200, sqrt(V) frequency classes, TBPTT 20 x 256 rows, Adam, one
thread) trained with `seqlm train` on big_corpus.py's corpus for `--minutes` of training, in
`--segments` invocations: each runs `--max-minutes minutes/segments` (so it stops mid-epoch, validates
and writes its resume state there) and the next one `--resume`s it. The row records
- `rss_mb_samples`: the RSS of the training process tree (sum of VmRSS), sampled every
  `--sample-seconds` (the first sample of each invocation is taken at its start), with
  `corpus_tokens` and the id cache's size beside it; `rss_anon_mb_samples` the same without file
  pages (the ids are memory-mapped: the pages read so far count in RSS, and the kernel may drop them);
- `tokens_per_s_per_minute`: from the loop's own progress line (one a minute: its batch count), per
  minute of training;
- `segments`: per invocation the batch it started from (the saved position) and stopped at, tokens
  so far, valid perplexity at the cut (the valid curve) and wall time; `resume_consistent`: every
  segment started at the batch the previous one saved, and the epoch's token total is exactly
  batches x 256 x 20 (no batch skipped or repeated across the resumes). A segment that finishes the
  epoch (a corpus too small for the time) ends the row there (`epoch_complete`).
`stream-rnn-node`: the same model, one segment, as two "nodes": two separate torchrun launchers
(`--nnodes 2 --nproc-per-node 1`, c10d rendezvous on 127.0.0.1), each as a second machine would run
it, 128 rows per rank (the same global batch); `commands` records both exactly, `tokens_per_s` against
the single process's first segment, RSS summed over both launchers' trees, `ranks_identical`: both
ranks' final weights equal. The ranks run `bench/stream_scale.py --node-worker -- train ...`:
`seqlm train` itself (seqlm.cli.main), which also saves this rank's final weights so that they can be
compared (only rank 0 writes files otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

NAME = "stream_scale"
# 256 rows: Adam's dense update of the V x H embedding and output weights costs the same per step
# whatever the batch (64 rows at V = 64k: 2/3 of the step), so a larger batch trains more tokens a second
ROWS, BPTT = 256, 20
MODEL = ["--model", "rnn", "--hidden", "200", "--seq-len", str(BPTT), "--threads", "1", "--device", "cpu",
         "--max-epochs", "1"]
PROGRESS = re.compile(r"epoch (\d+): batch (\d+)")


def tree_rss_mb(root: int) -> tuple[float, float]:
    """Sums of VmRSS and of RssAnon (RSS less file pages: the ids' page cache) over `root` and all
    its descendants (MiB)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parent[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    tree, grew = {root}, True
    while grew:
        new = {p for p, pp in parent.items() if pp in tree} - tree
        tree |= new
        grew = bool(new)
    total = anon = 0
    for pid in tree:
        try:
            status = {x.split(":")[0]: x.split()[1] for x in open(f"/proc/{pid}/status") if x.startswith(("VmRSS",
                                                                                                         "RssAnon"))}
            total, anon = total + int(status["VmRSS"]), anon + int(status["RssAnon"])
        except (OSError, KeyError):
            continue
    return total / 1024, anon / 1024


class Watch:
    """Runs processes, samples their trees' RSS every `every` seconds and keeps their stderr lines."""

    def __init__(self, every: float):
        self.every, self.samples, self.anon, self.lines = every, [], [], []

    def run(self, cmds: list[list[str]], env: dict, timeout: float) -> list[int]:
        t0 = time.time()
        procs = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for c in cmds]
        readers = [threading.Thread(target=self._read, args=(p, t0, i), daemon=True) for i, p in enumerate(procs)]
        for r in readers:
            r.start()
        while any(p.poll() is None for p in procs):
            rss = [tree_rss_mb(p.pid) for p in procs if p.poll() is None]
            self.samples.append(round(sum(r for r, _ in rss), 1))
            self.anon.append(round(sum(a for _, a in rss), 1))
            deadline = time.time() + self.every
            while time.time() < deadline and any(p.poll() is None for p in procs):
                if time.time() - t0 > timeout:
                    for p in procs:
                        p.kill()
                    raise SystemExit(f"timed out after {timeout:.0f} s: {cmds[0]}")
                time.sleep(0.2)
        for r in readers:
            r.join()
        return [p.returncode for p in procs]

    def _read(self, p: subprocess.Popen, t0: float, i: int) -> None:
        for line in p.stderr:
            self.lines.append((i, time.time() - t0, line.rstrip()))


def progress_rates(lines: list[tuple[int, float, str]], tokens_per_batch: int, start: int) -> list[float]:
    """Tokens/s for each minute of training: the loop prints its batch count after every 60 s of training
    (launcher 0's rank 0), the first 60 s after the invocation's start batch."""
    batches = [start] + [int(m.group(2)) for i, _, line in lines if i == 0 and (m := PROGRESS.search(line))]
    return [round((b - a) * tokens_per_batch / 60.0, 1) for a, b in zip(batches, batches[1:])]


def last_metrics(out: Path) -> dict:
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])


def single_row(data: Path, scratch: Path, minutes: float, segments: int, every: float, env: dict) -> dict:
    out = scratch / "single"
    segs, samples, anon, rates, batch = [], [], [], [], 0
    for k in range(segments):
        cmd = [sys.executable, "-m", "seqlm", "train", "--data", str(data), "--out", str(out), *MODEL,
               "--batch-size", str(ROWS), "--max-minutes", str(minutes / segments)] + (["--resume"] if k else [])
        watch = Watch(every)
        t = time.time()
        rc = watch.run([cmd], env, timeout=minutes / segments * 60 * 3 + 1800)
        if rc != [0]:
            raise SystemExit(f"segment {k + 1} failed: " + "\n".join(x[2] for x in watch.lines[-20:]))
        m = last_metrics(out)
        segs.append({"segment": k + 1, "start_batch": batch, "end_batch": m.get("batches"),
                     "train_tokens": m["train_tokens"], "valid_ppl": m["valid_ppl"],
                     "train_ppl": m["train_ppl"], "wall_seconds": round(time.time() - t, 1),
                     "command": " ".join(cmd)})
        segs[-1]["train_tokens_per_s"] = m["train_tokens_per_s"]
        samples += watch.samples
        anon += watch.anon
        rates += progress_rates(watch.lines, ROWS * BPTT, batch)
        if not m.get("partial"):  # the epoch ended (a corpus smaller than the time): nothing left to resume
            segs[-1]["epoch_complete"] = True
            break
        batch = m["batches"]
    cut = [s for s in segs if not s.get("epoch_complete")]
    consistent = all(s["start_batch"] == (segs[i - 1]["end_batch"] if i else 0) for i, s in enumerate(segs)) and all(
        s["train_tokens"] == s["end_batch"] * ROWS * BPTT for s in cut)
    return {"name": "stream-rnn", "model": "rnn H 200 class output", "rows": ROWS, "bptt": BPTT, "threads": 1,
            "minutes": minutes, "segments": segs, "resume_consistent": consistent,
            "rss_mb_samples": samples, "rss_anon_mb_samples": anon, "sample_seconds": every,
            "tokens_per_s_per_minute": rates,
            "valid_ppl_curve": [s["valid_ppl"] for s in segs],
            "tokens_per_s": segs[0]["train_tokens_per_s"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_row(data: Path, scratch: Path, minutes: float, every: float, env: dict, single: dict | None) -> dict:
    out, dump = scratch / "node", scratch / "node-weights"
    dump.mkdir()
    port = free_port()
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "stream-scale-node",
                str(Path(__file__).resolve()), "--node-worker", "--", "train", "--data", str(data), "--out", str(out),
                *MODEL, "--batch-size", str(ROWS // 2), "--max-minutes", str(minutes)]
    watch = Watch(every)
    t = time.time()
    rc = watch.run([launcher, launcher], {**env, "STREAM_SCALE_DUMP": str(dump)}, timeout=minutes * 60 * 3 + 1800)
    if rc != [0, 0]:
        raise SystemExit(f"node run failed {rc}: " + "\n".join(x[2] for x in watch.lines[-30:]))
    m = last_metrics(out)
    row = {"name": "stream-rnn-node", "nodes": 2, "processes_per_node": 1, "rows_per_rank": ROWS // 2,
           "global_rows": ROWS, "bptt": BPTT, "threads_per_process": 1, "minutes": minutes,
           "commands": [" ".join(launcher)] * 2, "launchers": "two separate processes, each one node's torchrun",
           "tokens_per_s": m["train_tokens_per_s"], "train_tokens": m["train_tokens"], "valid_ppl": m["valid_ppl"],
           "wall_seconds": round(time.time() - t, 1), "rss_mb_samples": watch.samples,
           "rss_anon_mb_samples": watch.anon, "sample_seconds": every,
           "tokens_per_s_per_minute": progress_rates(watch.lines, ROWS * BPTT, 0),
           "ranks_identical": ranks_identical(dump)}
    if single:
        row["single_process_tokens_per_s"] = single["tokens_per_s"]
        row["speed_vs_single_process"] = row["tokens_per_s"] / single["tokens_per_s"]
    return row


def ranks_identical(dump: Path) -> bool:
    from safetensors.torch import load_file

    files = sorted(dump.glob("rank*.safetensors"))
    if len(files) != 2:
        raise SystemExit(f"expected the weights of 2 ranks in {dump}, found {len(files)}")
    a, b = (load_file(str(f)) for f in files)
    return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def node_worker(argv: list[str]) -> None:
    """One rank under torchrun: `seqlm train` (the CLI's own main), then this rank's weights to a file."""
    from safetensors.torch import save_file

    import seqlm.registry as registry
    from seqlm.cli import main

    fit = registry.fit

    def fit_and_dump(model, *args, **kwargs):
        history = fit(model, *args, **kwargs)
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(Path(os.environ["STREAM_SCALE_DUMP"]) / f"rank{os.environ['RANK']}.safetensors"))
        return history

    registry.fit = fit_and_dump
    sys.exit(main(argv))


def main() -> None:
    if "--node-worker" in sys.argv:
        node_worker(sys.argv[sys.argv.index("--") + 1 :])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="stream-rnn,stream-rnn-node")
    p.add_argument("--corpus-tokens", type=float, default=100e6, help="training tokens of big_corpus.py's corpus")
    p.add_argument("--minutes", type=float, default=20.0, help="stream-rnn: minutes of training in all")
    p.add_argument("--segments", type=int, default=4, help="stream-rnn: invocations, each resuming the last")
    p.add_argument("--node-minutes", type=float, default=5.0, help="stream-rnn-node: minutes of training")
    p.add_argument("--sample-seconds", type=float, default=60.0, help="RSS sampling interval")
    a = p.parse_args()
    import big_corpus

    from common import merge_rows

    folder, info = big_corpus.ensure(int(a.corpus_tokens))
    scratch = Path(tempfile.mkdtemp(prefix="seqlm-stream-scale-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "SEQLM_CACHE": str(scratch / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    corpus = {k: info[k] for k in ("tokens", "order", "seed", "streams", "version", "split_tokens", "build_seconds")}
    try:
        single = None
        if "stream-rnn" in a.rows.split(","):
            single = single_row(folder, scratch, a.minutes, a.segments, a.sample_seconds, env)
            single.update(corpus_tokens=info["split_tokens"]["train"], corpus=corpus,
                          id_cache_mb=cache_mb(scratch / "cache"))
            merge_rows(NAME, [single])
            print(json.dumps(single), flush=True)
        if "stream-rnn-node" in a.rows.split(","):
            row = node_row(folder, scratch, a.node_minutes, a.sample_seconds, env, single)
            row.update(corpus_tokens=info["split_tokens"]["train"], corpus=corpus)
            merge_rows(NAME, [row])
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def cache_mb(folder: Path) -> float:
    return round(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20, 1)


if __name__ == "__main__":
    main()
