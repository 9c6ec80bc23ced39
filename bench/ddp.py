"""Data-parallel throughput: tokens/s of 1 and 2 processes at equal global batch (docs/scaling.md).

    .venv/bin/python bench/ddp.py [--seconds 30] [--rows ddp-1,ddp-2,...] [--synthetic]

Each row is a short `seqlm train` run (PTB, or a synthetic corpus of PTB's size with --synthetic or
when PTB is absent) of the PTB-size FNN (order 3, embed 200, two hidden layers of 400, full softmax
over 10k words: 6.3 M parameters), one thread per process, cut after `--seconds` of training; the
row's figure is the loop's own `train_tokens_per_s` (all ranks' tokens / rank 0's epoch seconds).
Rows:
  ddp-1, ddp-2             global batch 16 rows x 200 tokens: 1 process x 16 rows vs 2 x 8
  ddp-1-small, ddp-2-small global batch 2 rows x 200 tokens (the paper's small-batch regime)
  rnn-1x2threads, rnn-2x1thread  the class-output RNN (H 200) at 64 x 20 tokens: 1 process x 2 threads
                           vs 2 processes x 1 thread (not in the default --rows)
  allreduce-2              gloo all-reduce of one step's gradients (parameters x 4 bytes), 2 processes
Writes bench/results/ddp.json (rows merged by name). The machine is shared: the load average at the
start of each row is recorded next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import CHECKPOINTS, matmul_gflops, merge_rows, ptb_dir

MODEL = ["--model", "fnn", "--order", "3", "--embed", "200", "--hidden", "400", "--layers", "2", "--seq-len", "200"]
# Training FLOPs per token of that model: 6 per multiply-add (forward 2, backward 4) of
# (n-1)E*H + H*H + H*V = 400*400 + 400*400 + 400*10000 (docs/scaling.md, cost model).
FLOPS_PER_TOKEN = 6 * (400 * 400 + 400 * 400 + 400 * 10_000)
RNN = ["--model", "rnn", "--hidden", "200", "--seq-len", "20"]  # the RNNLM issue's class-output H = 200 model
ROWS = {  # name: (processes, rows per process, model, threads per process)
    "ddp-1": (1, 16, MODEL, 1),
    "ddp-2": (2, 8, MODEL, 1),
    "ddp-1-small": (1, 2, MODEL, 1),
    "ddp-2-small": (2, 1, MODEL, 1),
    # both cores on the RNN at a global batch of 64 x 20: one process with 2 threads vs 2 with 1 each
    "rnn-1x2threads": (1, 64, RNN, 2),
    "rnn-2x1thread": (2, 32, RNN, 1),
}
DEFAULT_ROWS = ["ddp-1", "ddp-2", "ddp-1-small", "ddp-2-small", "allreduce-2"]


def synthetic_corpus(dest: Path, tokens: int = 930_000, vocab: int = 10_000, seed: int = 0) -> Path:
    """PTB-sized training text over a Zipfian 10k-word vocabulary (PTB-like sentence lengths), small valid/test."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    weights = [1.0 / (i + 1) for i in range(vocab)]
    dest.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", tokens), ("valid", 2000), ("test", 2000)):
        lines, left = [], n
        while left > 0:
            k = min(left, rng.randint(5, 40))
            lines.append(" ".join(rng.choices(words, weights, k=k)))
            left -= k
        (dest / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dest


def run_row(name: str, data: Path, seconds: float) -> dict:
    nproc, rows, model, threads = ROWS[name]
    width = int(model[model.index("--seq-len") + 1])
    out = CHECKPOINTS / "ddp" / name
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "seqlm", "train", "--data", str(data), "--out", str(out), *model,
           "--batch-size", str(rows), "--threads", str(threads), "--device", "cpu", "--max-epochs", "1",
           "--max-minutes", str(seconds / 60), "--nproc", str(nproc)]
    load = os.getloadavg()[0]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    m = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    params = _parameters(out)
    steps = m["train_tokens"] / (nproc * rows * width)
    return {"name": name, "model": model[1], "processes": nproc, "rows_per_process": rows,
            "global_batch_tokens": nproc * rows * width,
            "tokens_per_s": round(m["train_tokens_per_s"], 1), "train_tokens": m["train_tokens"],
            "train_seconds": round(m["epoch_seconds"], 2), "steps_per_s": round(steps / m["epoch_seconds"], 2),
            "parameters": params, "gradient_bytes_per_step": params * 4, "threads_per_process": threads,
            "wall_seconds_with_startup": round(time.time() - t0, 1), "load_average_at_start": round(load, 2)}


def _parameters(out: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(out / "weights.safetensors"), "pt") as f:
        return sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _ptb() -> Path | None:
    try:
        return ptb_dir()
    except SystemExit:
        return None


def ptb_train_short_eval(dest: Path, lines: int = 100) -> Path:
    """PTB's train split with the first `lines` lines of valid and test: the rows time training, and
    the per-epoch validation and final test passes over full PTB would take longer than the training."""
    src = ptb_dir()
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "train.txt").symlink_to(src / "train.txt")
    for split in ("valid", "test"):
        head = (src / f"{split}.txt").read_text(encoding="utf-8").split("\n")[:lines]
        (dest / f"{split}.txt").write_text("\n".join(head) + "\n", encoding="utf-8")
    return dest


ALLREDUCE = r"""
import os, sys, time, json, torch, torch.distributed as dist
dist.init_process_group("gloo")
numel, reps = int(sys.argv[1]), int(sys.argv[2])
t = torch.ones(numel)
dist.all_reduce(t)  # warm-up: connections, buffers
dist.barrier()
best = float("inf")
for _ in range(reps):
    t0 = time.perf_counter()
    dist.all_reduce(t)
    best = min(best, time.perf_counter() - t0)
if dist.get_rank() == 0:
    print(json.dumps({"seconds": best}))
dist.barrier()
dist.destroy_process_group()
"""


def allreduce_row(numel: int, reps: int = 10) -> dict:
    """Best-of-`reps` time of one gloo all-reduce of `numel` float32 values between 2 local processes."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(ALLREDUCE)
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(port), f.name, str(numel), str(reps)]
    load = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    os.unlink(f.name)
    if proc.returncode != 0:
        raise SystemExit(f"allreduce failed:\n{proc.stderr[-3000:]}")
    sec = json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]
    return {"name": "allreduce-2", "processes": 2, "bytes": numel * 4, "seconds": round(sec, 5),
            "algorithm_bandwidth_GB_s": round(numel * 4 / sec / 1e9, 3), "backend": "gloo (loopback)",
            "load_average_at_start": round(load, 2)}


# ---------------------------------------------------------------- the cost model of docs/scaling.md

V, E, H_FF, H_RNN, CLASSES, T_PACK = 10_000, 200, 400, 200, 100, 200
FAMILIES = {  # forward multiply-adds per token and parameters, PTB sizes (registry defaults)
    # fnn order 3: (n-1)E*H + H*H + H*V;  fofe order 2: the same MLP on k*E = 2E inputs, plus the FOFE
    # code as a (T x T) x (T x E) product per packed row of T = 200 positions: T*E per token.
    "fnn": {"macs": 2 * E * H_FF + H_FF * H_FF + H_FF * V, "params": 6_330_800, "sequential_steps": 0},
    "fofe": {"macs": 2 * E * H_FF + H_FF * H_FF + H_FF * V + T_PACK * E, "params": 6_330_800,
             "sequential_steps": 0},
    # rnn: E*H input + H*H recurrence + H*(C + class size) class-factorised output, class size <= V/C
    "rnn": {"macs": E * H_RNN + H_RNN * H_RNN + H_RNN * (CLASSES + V // CLASSES), "params": 4_070_300,
            "sequential_steps": 20},
}
# Assumptions for a GPU (not measured in this repository): see docs/scaling.md, "Assumptions".
GPU = {"peak_flops": 989e12, "mfu": 0.30, "host_seconds_per_step": 1.5e-3, "seconds_per_sequential_step": 60e-6,
       "intra_node_bytes_per_s": 200e9, "inter_node_bytes_per_s": 25e9, "gpus_per_node": 8}


def plan(tokens: float = 1e9, gpus: tuple[int, ...] = (1, 8, 32, 128), batch_tokens: tuple[int, ...] = (200, 16_384)
         ) -> list[dict]:
    """Hours per epoch over `tokens` on N GPUs: (host + compute + all-reduce) per step, no overlap."""
    out = []
    for fam, f in FAMILIES.items():
        flops = 6 * f["macs"]
        grad_bytes = 4 * f["params"]
        for b in batch_tokens:
            compute = b * flops / (GPU["peak_flops"] * GPU["mfu"]) + f["sequential_steps"] * GPU[
                "seconds_per_sequential_step"]
            for n in gpus:
                bw = GPU["intra_node_bytes_per_s"] if n <= GPU["gpus_per_node"] else GPU["inter_node_bytes_per_s"]
                comm = 2 * (n - 1) / n * grad_bytes / bw
                step = GPU["host_seconds_per_step"] + compute + comm
                out.append({"family": fam, "train_flops_per_token": flops, "gradient_bytes_per_step": grad_bytes,
                            "tokens_per_gpu_step": b, "gpus": n, "step_ms": round(step * 1e3, 3),
                            "comm_share": round(comm / step, 3), "tokens_per_s": round(n * b / step),
                            "hours_per_epoch": round(tokens / (n * b / step) / 3600, 3)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS))
    ap.add_argument("--seconds", type=float, default=30.0, help="training seconds per row")
    ap.add_argument("--synthetic", action="store_true", help="use a synthetic PTB-sized corpus even if PTB is here")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="seqlm-ddp-bench-"))
    os.environ.setdefault("SEQLM_CACHE", str(scratch / "cache"))
    try:
        if args.synthetic or _ptb() is None:
            data, label = synthetic_corpus(scratch / "corpus"), "synthetic (PTB-sized, Zipf 10k words)"
        else:
            data, label = ptb_train_short_eval(scratch / "ptb"), "ptb train (valid/test: first 100 lines)"
        # The FNN's own matmul shapes (16 x 200 tokens, forward and backward), one thread: the ceiling that
        # tokens/s x FLOPs/token is compared with in docs/scaling.md.
        torch.set_num_threads(1)
        t = 16 * 200
        shapes = [(t, 400, 400), (t, 400, 10_000), (t, 10_000, 400), (400, t, 10_000)]
        extra = {"torch": torch.__version__, "cpu_cores": os.cpu_count(), "gpu_assumptions": GPU,
                 "plan_1e9_tokens": plan(),
                 "matmul_gflops_1_thread": round(matmul_gflops(shapes, torch.float32), 1),
                 "train_flops_per_token": FLOPS_PER_TOKEN,
                 "note": "2-core machine shared with other jobs; see load_average_at_start of each row"}
        rows = []
        for name in args.rows.split(","):
            if name == "allreduce-2":
                params = next((r["parameters"] for r in rows if "parameters" in r), 6_330_810)
                row = allreduce_row(params)
            else:
                row = run_row(name, data, args.seconds) | {"data": label}
            print(json.dumps(row), flush=True)
            rows.append(row)
            merge_rows("ddp", [row], extra)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
