"""Shared by the benchmark scripts: the results file, the machine, and the matmul ceiling.

Every benchmark writes bench/results/NAME.json:
{"bench", "command", "git_rev", "date", "machine": {"cpu", "cores", "threads", "torch", "cpu_flags"}, "rows": [...]}
(cpu_flags: which of avx2, avx512f, avx512_bf16, avx512_vnni and amx_* the CPU has; rows before it lack it).
Rows are merged by name, so a row can be run (and re-run) alone.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import fcntl
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("SEQLM_BENCH_RESULTS", ROOT / "bench" / "results"))  # tests point it elsewhere
CHECKPOINTS = ROOT / "bench" / "checkpoints"
sys.path.insert(0, str(ROOT / "src"))


def git_rev() -> str:
    """HEAD's short hash, with "-dirty" when anything tracked in the tree differs from it, bench/results aside: the
    tables the benchmarks write (a second run in the same checkout finds the first one's rows there)."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)bench/results"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# The CPU features that bf16, int8 and wide-vector speeds depend on; a row records which of them its machine had.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni")


# Environment variables that cap the instruction sets torch's kernels use (ATen's own, MKL's, oneDNN's).
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def cpu_flags() -> list[str] | None:
    """Which of CPU_FLAGS and of the amx_* flags this CPU has, as `lscpu` (the kernel's cpuinfo) lists them;
    None when the list cannot be read (not Linux)."""
    flags = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    if flags is None:
        try:
            out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
            line = next((ln for ln in out.splitlines() if ln.startswith("Flags:")), None)
            flags = set(line.split(":", 1)[1].split()) if line else None
        except (OSError, subprocess.SubprocessError):
            pass
    if flags is None:
        return None
    return [f for f in CPU_FLAGS if f in flags] + sorted(f for f in flags if f.startswith("amx_"))


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__}
    flags = cpu_flags()
    if flags is not None:
        info["cpu_flags"] = flags  # an empty list: none of them
    info["aten_cpu_capability"] = torch.backends.cpu.get_cpu_capability()  # what ATen's kernels dispatch to
    limits = {k: os.environ[k] for k in ISA_LIMITS if k in os.environ}
    if limits:
        info["isa_limits"] = limits  # e.g. ATEN_CPU_CAPABILITY=avx2: a run that stands for AVX2-only CPUs
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _command(argv: list[str]) -> str:
    """The invocation as a fresh checkout repeats it: the script named from the repository's root, wherever
    this checkout lies (a worktree's absolute path is no command for another machine)."""
    script = Path(argv[0]).resolve() if argv and argv[0] else None
    if script is not None and script.is_relative_to(ROOT):
        argv = [str(script.relative_to(ROOT)), *argv[1:]]
    return " ".join(["python", *argv])


# Taken when the benchmark process starts (this module is imported first thing), so a row records the
# revision that produced it, not the one that happened to be checked out when it was written.
RUN = {"command": _command(sys.argv), "git_rev": git_rev(), "started": _now()}


def provenance(threads: int | None = None) -> dict:
    """This invocation's command, revision (dirty flag over the whole tree), start and end time, machine."""
    m = machine()
    if threads:
        m["threads"] = threads
    return {**RUN, "ended": _now(), "machine": m}


def ptb_dir() -> Path:
    env = os.environ.get("SEQLM_DATA")
    for cand in ([Path(env) / "ptb"] if env else []) + [ROOT.parent / "shared" / "data" / "ptb"]:
        if (cand / "train.txt").exists():
            return cand
    raise SystemExit("PTB not found: set SEQLM_DATA to a folder holding ptb/train.txt")


def merge_rows(name: str, rows: list[dict], extra: dict | None = None) -> Path:
    """Write rows into bench/results/NAME.json, replacing rows of the same name, keeping the others.

    Every row gets `runs`: the provenance of each invocation that produced it. A row with `"resumed": True`
    continued an earlier invocation's checkpoint, so the earlier row's runs are kept in front of this one;
    a row that knows those invocations itself (`earlier_runs`, recorded beside its checkpoint) passes them,
    since the row of that name in the table may be another run's whose checkpoint is gone.
    A row that continues another row's checkpoint (a chained stage) passes that row's runs as `stage_runs`:
    they go first, each marked with the `stage` (row) it ran, and the row's own `command` is its own first
    invocation, the one that reproduces the whole chain.
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    # rows of one table often run as two processes side by side: serialise the read-modify-write
    with open(RESULTS / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _merge_locked(path, name, rows, extra)


def _merge_locked(path: Path, name: str, rows: list[dict], extra: dict | None) -> Path:
    old = json.loads(path.read_text()) if path.exists() else {}
    by_name = {r["name"]: r for r in old.get("rows", [])}
    for r in rows:
        table_runs = by_name.get(r["name"], {}).get("runs", []) if r.get("resumed") else []
        earlier = r.get("earlier_runs", table_runs)  # the checkpoint's own record where the row brings it
        here = provenance(r.get("threads") or torch.get_num_threads())
        runs = _chain(r.get("stage_runs", []), earlier, r["name"])
        if "stage_runs" in r:
            here["stage"] = r["name"]
        last = runs[-1] if runs else {}
        if last.get("started") == here["started"] and last.get("stage", r["name"]) == r["name"]:
            runs[-1] = here  # a script may write its row more than once
        else:
            runs.append(here)
        # the row's own provenance is the invocation that started it (its own stage's); `runs` lists them all
        first = next((x for x in runs if x.get("stage", r["name"]) == r["name"]), runs[0])
        r = {k: v for k, v in r.items() if k not in ("stage_runs", "earlier_runs")}
        by_name[r["name"]] = {**r, "command": first["command"], "git_rev": first["git_rev"],
                              "dirty": any(x["git_rev"].endswith("-dirty") for x in runs),
                              "started": first["started"], "ended": runs[-1]["ended"],
                              "threads": here["machine"]["threads"], "runs": runs}
    doc = {
        "bench": name,
        "command": RUN["command"],
        "git_rev": RUN["git_rev"],
        "date": _now(),
        "machine": machine(),
        **{k: v for k, v in old.items() if k not in ("bench", "command", "git_rev", "date", "machine", "rows")},
        **(extra or {}),
        "rows": list(by_name.values()),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
    return path


RUNS_FILE = "bench_runs.json"  # beside a checkpoint: the invocations that trained it, for its rows' `runs`


def checkpoint_runs(out: Path) -> list[dict]:
    """The invocations recorded as training the checkpoint in `out` (none for one trained before they were
    kept); one that was stopped before it finished has `"ended": None`."""
    path = out / RUNS_FILE
    return json.loads(path.read_text()) if path.exists() else []


def record_runs(out: Path, runs: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / RUNS_FILE).write_text(json.dumps(runs, indent=1))


@contextlib.contextmanager
def recorded_training(out: Path, resumed: bool, threads: int | None = None, **fields):
    """Lists this invocation (with `fields`, e.g. its stage) beside the checkpoint in `out` while it trains it
    (`"ended": None` until the block returns, so a stopped one stays listed) and yields the invocations before it
    (none for a fresh run). A resumed row passes them to merge_rows as `earlier_runs`: the table's row of its
    name may be another run's."""
    earlier = checkpoint_runs(out) if resumed else []
    record_runs(out, [*earlier, {**provenance(threads), **fields, "ended": None}])
    yield earlier
    record_runs(out, [*earlier, {**provenance(threads), **fields}])


def with_earlier_runs(row: dict, earlier: list[dict]) -> dict:
    """`row` with the checkpoint's earlier invocations, where it has a record (an older checkpoint has none, and
    merge_rows then keeps the table's runs of a resumed row)."""
    return {**row, "earlier_runs": earlier} if earlier else row


def _chain(stage_runs: list[dict], earlier: list[dict], name: str) -> list[dict]:
    """The earlier stages' runs (marked with their stage by the caller), then this row's earlier runs (marked
    with `name` in a chain); each invocation once (a resumed row's own runs hold the stages it recorded)."""
    out, seen = [], set()
    for x in [*stage_runs, *({**x, "stage": x.get("stage", name)} if stage_runs else x for x in earlier)]:
        key = (x["command"], x["started"], x.get("stage"))  # one invocation may run several stages
        if key not in seen:
            seen.add(key)
            out.append(x)
    return out


def matmul_gflops(shapes: list[tuple[int, int, int]], dtype: torch.dtype, device: str = "cpu",
                  seconds: float = 1.5) -> float:
    """Best sustained GFLOP/s of forward+backward-like matmuls at the given (M, K, N) shapes."""
    mats = [(torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device))
            for m, k, n in shapes]
    flops = sum(2 * m * k * n for m, k, n in shapes)
    for a, b in mats:
        a @ b
    best = 0.0
    end = time.time() + seconds
    while time.time() < end:
        t = time.perf_counter()
        for _ in range(5):
            for a, b in mats:
                a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = max(best, 5 * flops / (time.perf_counter() - t) / 1e9)
    return best


def training_step(name: str, cfg, vocab, stream):
    """A fresh model of family `name` and a step() that trains it on the next batch of `stream` (through the
    family's own batches and step) and returns the tokens it trained on; (step, model)."""
    import numpy as np

    from seqlm.registry import family, new_model
    from seqlm.train.loop import make_optimizer
    from seqlm.train.memory import keep_freed_memory

    fam = family(name)
    model = new_model(name, cfg, vocab)
    opt = make_optimizer(model, cfg.train)
    if cfg.train.keep_memory:
        keep_freed_memory()  # as seqlm.train.loop.fit does
    batches = iter(fam.batches(cfg, vocab)(stream, np.random.default_rng(0), (0, 1)))
    state = None

    def step() -> int:
        nonlocal state
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.train.precision == "bf16"):
            loss, state, n = fam.step(model, next(batches), state)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.train.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip)
        opt.step()
        return n

    return step, model


def train_speed(name: str, cfg, vocab, stream, seconds: float, warmup: int = 3) -> tuple[float, object]:
    """Training tokens/s of family `name` from scratch, through the family's own batches and step."""
    step, model = training_step(name, cfg, vocab, stream)
    for _ in range(warmup):  # warm-up steps excluded
        step()
    tokens, t0 = 0, time.perf_counter()
    while True:
        try:
            tokens += step()
        except StopIteration:  # the stream ran out first
            break
        if time.perf_counter() - t0 > seconds:
            break
    return tokens / (time.perf_counter() - t0), model


def profiled(fn, repeat: int, totals: tuple[str, ...] = (), top: int = 12) -> dict:
    """torch.profiler over `repeat` calls of fn(): ms a call, the share of the time inside each of `totals`
    (events by name, children included), and the top ops by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeat):
            fn()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)  # microseconds
    by_name = {e.key: e for e in events}
    return {"calls": repeat, "ms_per_call": total / repeat / 1000,
            "share_of": {k: by_name[k].cpu_time_total / total for k in totals if k in by_name},
            "top_self_cpu": [{"op": e.key, "ms_per_call": e.self_cpu_time_total / repeat / 1000,
                              "share": e.self_cpu_time_total / total, "calls_per_call": e.count / repeat}
                             for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]]}


def row_parser(doc: str, rows: str, precision: str) -> argparse.ArgumentParser:
    """The options every PTB table script shares: which rows, and how to train them."""
    from seqlm.train.precision import fast_precision

    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=rows, help="comma-separated row names")
    p.add_argument("--precision", default=fast_precision(precision), choices=["fp32", "bf16"],
                   help="default: bf16 where the CPU has bf16 instructions (or on a GPU), else fp32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="auto")
    p.add_argument("--session-minutes", type=float, default=0.0, help="stop starting epochs after this long")
    return p
