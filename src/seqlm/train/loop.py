"""The one training loop for every neural family.

What differs between families is passed in: `batches` (how the training text is cut: packed sentences,
TBPTT streams) and `step` (what one batch does: seqlm.train.steps). Everything else is here, once:
optimiser and learning-rate schedule (seqlm.train.optim), clipping, bf16 autocast, progress bar,
metrics.jsonl, checkpoints and --resume (seqlm.train.resume), the time limit, SIGINT/SIGTERM, and
recovery from a non-finite loss, and --rollback (an epoch after which validation stalls is undone:
weights, optimizer state, position and random state go back to its start, and it runs again at the
halved rate).

An epoch ends complete, or cut short by --max-minutes or a signal. A cut-short epoch is recorded as
partial (a metrics row with "partial": true, no schedule decision) and its position is saved, so
--resume finishes that epoch with the same batches, state and random numbers as an uninterrupted run.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from seqlm.checkpoint import atomic_write_text
from seqlm.config import TrainConfig
from seqlm.data.batching import Batches
from seqlm.data.corpus import TokenStream
from seqlm.errors import SeqlmError
from seqlm.eval.perplexity import can_stream, evaluate
from seqlm.nn.softmax import layer_stats
from seqlm.train import distributed as dist
from seqlm.train.memory import keep_freed_memory
from seqlm.train.optim import build_optimizer, build_schedule, set_lr
from seqlm.train.precision import check_precision
from seqlm.train.resume import (
    EPOCH_START,
    RESUME,
    Position,
    Snapshot,
    load_resume,
    read_snapshot,
    restore_snapshot,
    rng_states,
    run_status,
    save_resume,
    take_snapshot,
)
from seqlm.train.schedule import Schedule
from seqlm.train.steps import StepFn, tbptt_step

make_optimizer = build_optimizer  # the name benchmarks import
__all__ = ["fit", "resolve_device", "make_optimizer", "run_status", "RESUME", "Batches"]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SeqlmError("--device cuda: no CUDA device is available; use --device cpu or auto")
    return torch.device(name)


class Stopped(Exception):
    """Training stopped by SIGINT/SIGTERM after saving its state; the process exits with 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Signals:
    """While training: the first SIGINT/SIGTERM asks the loop to stop after the current batch (and save);
    a second one stops at once."""

    def __init__(self) -> None:
        self.requested = 0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


@dataclass
class Run:
    """What every part of one training run shares."""

    model: nn.Module
    net: nn.Module  # what steps call: `model`, or its DDP wrapper
    opt: torch.optim.Optimizer
    step: StepFn
    batches: Batches
    train: TokenStream
    valid: TokenStream
    cfg: TrainConfig
    out: Path
    save_best: Callable[[nn.Module], None]
    ctx: dist.Context
    signals: Signals
    valid_mode: str  # sentence | stream: how validation scores (--valid-mode resolved)

    @property
    def autocast(self) -> torch.autocast:
        return torch.autocast(self.ctx.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16")


def fit(
    model: nn.Module,
    step: StepFn,
    batches: Batches,
    train: TokenStream,
    valid: TokenStream,
    cfg: TrainConfig,
    out: Path,
    save_best: Callable[[nn.Module], None],
    resume: bool = False,
    session_minutes: float = 0.0,
) -> list[dict]:
    """Train `model` until the schedule ends, the epochs run out or the time is up; return the metrics.

    `cfg.max_minutes` bounds this call and may cut an epoch short; `session_minutes` only stops this
    call before it starts an epoch, leaving a clean checkpoint to --resume (long benchmark rows).
    """
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.keep_memory:
        keep_freed_memory()  # each step's big buffers reused, not mapped again (train/memory.py)
    torch.manual_seed(cfg.seed)
    mode = valid_mode(model, step, cfg)
    check_precision(model, cfg.precision, resolve_device(cfg.device))
    ctx = dist.setup(resolve_device(cfg.device))
    model.to(ctx.device)  # under torchrun on GPUs: this rank's own GPU
    net = ctx.wrap(model)
    opt = build_optimizer(model, cfg)
    clean, stopped = False, 0
    try:
        with Signals() as signals:
            run = Run(model, net, opt, step, batches, train, valid, cfg, out, save_best, ctx, signals, mode)
            history = _epochs(run, resume, session_minutes)
        clean = True
    except SeqlmError as e:
        clean = True  # raised on every rank alike (the non-finite decision is agreed): a clean exit is safe
        raise e.with_traceback(None) from None  # drop the frame of _epochs: it holds the DDP wrapper
    except Stopped as e:
        clean, stopped = True, e.signum  # every rank stopped at the same batch (agreed)
    finally:
        run = net = opt = None  # the gloo teardown trap: no DDP reducer may outlive the process group
        ctx.finish(clean)
    if stopped:
        raise SystemExit(128 + stopped)
    return history


def valid_mode(model: nn.Module, step: StepFn, cfg: TrainConfig) -> str:
    """The mode validation scores in: --valid-mode, or for auto the mode the model trains in. A model trains
    on a stream when its step carries the state from batch to batch (tbptt_step) and it can stream at all
    (seqlm.eval.perplexity.can_stream: not one that restarts at every sentence)."""
    streams = can_stream(model)
    if cfg.valid_mode == "stream" and not streams:
        raise SeqlmError(f"--valid-mode stream: a {model.family} model like this one cannot carry "
                         "its state across sentences; use --valid-mode sentence (or auto)")
    if cfg.valid_mode == "auto":
        return "stream" if step is tbptt_step and streams else "sentence"
    return cfg.valid_mode


def _check_valid_mode(run: Run, history: list[dict]) -> None:
    """A resumed run validates as its earlier epochs did: the schedule and the best epoch compare their
    perplexities (rows from before the option hold no mode: they were validated by sentence)."""
    before = history[-1].get("valid_mode", "sentence") if history else run.valid_mode
    if before != run.valid_mode:
        raise SeqlmError(f"--valid-mode {run.cfg.valid_mode} validates by {run.valid_mode}, but this run's epochs "
                         f"so far were validated by {before}; resume with --valid-mode {before}")


def _epochs(run: Run, resume: bool, session_minutes: float) -> list[dict]:
    cfg, ctx = run.cfg, run.ctx
    sched = build_schedule(cfg, _steps_per_epoch(run))
    pos, history = Position(), []
    if resume:
        pos, history, sched = load_resume(run.out, run.model, run.opt, sched, cfg, ctx.log)
        _check_valid_mode(run, history)
        if ctx.is_main:  # drop rows of an epoch that was logged but not checkpointed before a crash
            atomic_write_text(run.out / "metrics.jsonl", "".join(json.dumps(row) + "\n" for row in history))
        if sched.done or pos.epoch > cfg.max_epochs:
            ctx.log(f"seqlm: {run.out}: nothing to resume: " + (
                f"the learning-rate schedule ended after epoch {pos.epoch - 1}" if sched.done else
                f"all --max-epochs {cfg.max_epochs} epochs ran (give a larger --max-epochs to train on)"))
            return history
    t_start = time.time() - (history[-1]["wall_seconds"] if history else 0.0)
    now = time.time()
    deadline = now + cfg.max_minutes * 60 if cfg.max_minutes else math.inf
    session_end = now + session_minutes * 60 if session_minutes else math.inf
    first = True  # every invocation trains at least one batch, however small its time limit
    start: Snapshot | None = None  # --rollback: the state the epoch in progress started from
    while pos.epoch <= cfg.max_epochs and not sched.done:
        late, stop = ctx.agree(not first and time.time() >= min(deadline, session_end), run.signals.requested != 0)
        first = False
        if stop:
            save_resume(run.out, run.model, run.opt, sched, pos, history, cfg, rng_states(), ctx)
            _stop(run, pos, None)
        if late:
            break
        if sched.may_roll_back:
            start = _epoch_start(run, sched, pos, history)
        cut, total, rng = _epoch_with_retries(run, sched, pos, deadline)
        if cut == "signal":
            save_resume(run.out, run.model, run.opt, sched, pos, history, cfg, rng, ctx)
            _stop(run, pos, total)
        row = _end_epoch(run, sched, pos, cut == "end", total, t_start)
        if sched.rerun:
            rng = _roll_back(run, sched, pos, start, row) or rng
        history.append(row)
        if ctx.is_main:
            with open(run.out / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        save_resume(run.out, run.model, run.opt, sched, pos, history, cfg, rng, ctx)
        ctx.barrier()
    return history


def _epoch_start(run: Run, sched: Schedule, pos: Position, history: list[dict]) -> Snapshot | None:
    """The state epoch `pos.epoch` starts from: taken now (and saved, for a run resumed inside the
    epoch), or read back when this run resumes inside it."""
    if pos.batch:
        return read_snapshot(run.out, pos.epoch)
    snap = take_snapshot(run.model, run.opt, pos)
    save_resume(run.out, run.model, run.opt, sched, pos, history, run.cfg, snap.rng, run.ctx, EPOCH_START)
    return snap


def _roll_back(run: Run, sched: Schedule, pos: Position, start: Snapshot | None, row: dict) -> dict | None:
    """Undo the epoch just validated (the schedule asked for it); return the random state to save."""
    sched.rerun = False
    if start is None or start.pos.epoch != pos.epoch - 1:
        run.ctx.log(f"seqlm: --rollback: the state epoch {pos.epoch - 1} started from was not saved "
                    "(rollback turned on inside it); the epoch is kept")
        return None
    restore_snapshot(start, run.model, run.opt, pos)
    row["rolled_back"] = True
    run.ctx.log(f"epoch {pos.epoch}: valid ppl improved by less than {run.cfg.min_improvement:g}: "
                f"undone, run again at lr {sched.lr:g}")
    return start.rng


def _steps_per_epoch(run: Run) -> int:
    """Optimizer steps in one epoch, the same number on every rank (rank 0's)."""
    planned = run.batches(run.train, np.random.default_rng([run.cfg.seed, 1]), run.ctx.shard)
    n = len(planned) if hasattr(planned, "__len__") else sum(1 for _ in planned)
    return round(run.ctx.broadcast(float(n)))


def _epoch_with_retries(run: Run, sched: Schedule, pos: Position, deadline: float) -> tuple[str, int | None, dict]:
    """Train epoch `pos.epoch` from `pos` on; after a non-finite loss, restore, halve the rate and retry.

    Returns how it ended ("end", "time" or "signal"), its batch count and the RNG state at its end;
    `pos` is advanced in place.
    """
    good = (copy.deepcopy(run.model.state_dict()), copy.deepcopy(run.opt.state_dict()), copy.deepcopy(pos))
    for retry in range(run.cfg.max_nan_retries + 1):
        rng = np.random.default_rng([run.cfg.seed, pos.epoch])  # the data order depends on seed and epoch only
        batches = run.batches(run.train, rng, run.ctx.shard)
        total = len(batches) if hasattr(batches, "__len__") else None
        cut = _run_epoch(run, sched, pos, batches, total, deadline)
        if cut is not None:
            return cut, total, rng_states()  # the random state here, not after validation: resume continues here
        if retry == run.cfg.max_nan_retries:
            raise SeqlmError(f"loss became NaN/inf {retry + 1} times in epoch {pos.epoch} (lr halved each time, "
                             f"down to {sched.lr:g}); lower --lr or set --clip (e.g. --clip 1.0)")
        run.model.load_state_dict(good[0])
        run.opt.load_state_dict(good[1])
        pos.__dict__.update(copy.deepcopy(good[2]).__dict__)
        sched.shrink(0.5)
        run.ctx.log(f"seqlm: non-finite loss in epoch {pos.epoch}; restored the last good state, lr -> {sched.lr:g}")
    raise AssertionError("unreachable")


def _run_epoch(run: Run, sched: Schedule, pos: Position, batches, total: int | None, deadline: float) -> str | None:
    """Batches `pos.batch` on of this rank's epoch; None if the loss became NaN/inf (on any rank)."""
    ctx, cfg = run.ctx, run.cfg
    run.net.train()
    prog, state = pos.progress, pos.carry
    t0 = time.time() - prog.seconds
    next_log = prog.seconds + 60.0
    bar = tqdm(total=total, initial=pos.batch, desc=f"epoch {pos.epoch}", unit="batch", leave=False,
               disable=None if ctx.is_main else True, file=sys.stderr, mininterval=1.0)
    it = itertools.islice(iter(batches), pos.batch, None)  # a resumed epoch skips the batches already trained
    try:
        while True:
            batch = next(it, None)
            loss = None
            if batch is not None:
                with run.autocast:
                    loss, new_state, n = run.step(run.net, batch.to(ctx.device), state)
            # Decided together, so the ranks stay in step: all stop when any runs out of batches (shards
            # may differ by one), of time or is signalled, and all restart when any sees a non-finite loss.
            ended, bad, late, stop = ctx.agree(batch is None, loss is not None and not bool(torch.isfinite(loss)),
                                               time.time() >= deadline, run.signals.requested != 0)
            if bad:
                return None
            if ended:
                return "end"
            run.opt.zero_grad(set_to_none=True)
            set_lr(run.opt, sched.lr_at(pos.step))
            loss.backward()
            if cfg.clip:
                torch.nn.utils.clip_grad_norm_(run.net.parameters(), cfg.clip)
            run.opt.step()
            state, pos.step, pos.batch = new_state, pos.step + 1, pos.batch + 1
            prog.loss += float(loss.detach()) * n
            prog.tokens += n
            prog.seconds = time.time() - t0
            bar.update(1)
            bar.set_postfix(ppl=f"{prog.ppl:.1f}", tok_s=f"{prog.tokens / max(prog.seconds, 1e-9):.0f}", refresh=False)
            if bar.disable and prog.seconds >= next_log:  # no terminal (logs, nohup): a line a minute instead
                next_log += 60
                ctx.log(_progress_line(pos, total))
            if late or stop:
                pos.carry = state
                if total is not None and pos.batch >= total:
                    return "end"
                return "signal" if stop else "time"
    finally:
        bar.close()


def _progress_line(pos: Position, total: int | None) -> str:
    prog = pos.progress
    line = f"epoch {pos.epoch}: batch {pos.batch}"
    if total:
        left = prog.seconds / max(pos.batch, 1) * (total - pos.batch)  # from this epoch's pace so far
        line += f"/{total} (about {left / 60:.1f} min left)"
    return line + f", running ppl {prog.ppl:.2f}, {prog.tokens / max(prog.seconds, 1e-9):.0f} tok/s"


def _validate(run: Run) -> float:
    """Validation perplexity, computed on rank 0 and broadcast: every rank takes the schedule decision
    (halve, stop) from the same number, whatever its own kernels would have given."""
    stream = run.valid_mode == "stream"
    ppl = evaluate(run.model, run.valid, stream, run.cfg.eval_tokens)["ppl"] if run.ctx.is_main else 0.0
    return run.ctx.broadcast(ppl)


def _end_epoch(run: Run, sched: Schedule, pos: Position, complete: bool, total: int | None, t_start: float) -> dict:
    """Validate; on a complete epoch let the schedule decide; save the best model; the metrics row."""
    ctx, prog = run.ctx, pos.progress
    lr_used = sched.lr_at(max(pos.step - 1, 0))
    valid_ppl = _validate(run)
    halved = sched.update(valid_ppl) if complete else False
    row = {"epoch": pos.epoch, "lr": lr_used, "train_ppl": prog.ppl, "valid_ppl": valid_ppl,
           "train_tokens": prog.tokens * ctx.world, "epoch_seconds": prog.seconds,
           "train_tokens_per_s": prog.tokens * ctx.world / max(prog.seconds, 1e-9),
           "wall_seconds": time.time() - t_start, "lr_halved": halved, "precision": run.cfg.precision,
           "valid_mode": run.valid_mode}
    if not complete:
        row.update(partial=True, batches=pos.batch, of=total)
    row.update(layer_stats(run.model))  # what output layers measured during validation (NCE: log Z_h)
    ctx.log(f"epoch {pos.epoch}{' (cut short: partial)' if not complete else ''}: lr {lr_used:g}  "
            f"train ppl {prog.ppl:.2f}  valid ppl {valid_ppl:.2f} ({run.valid_mode})  "
            f"({row['train_tokens_per_s']:.0f} tok/s{', lr halved' if halved else ''})")
    if valid_ppl < pos.best_saved:
        if ctx.is_main:
            run.save_best(run.model)
        pos.best_saved = valid_ppl
    if complete:
        pos.next_epoch()
    return row


def _stop(run: Run, pos: Position, total: int | None) -> None:
    """After SIGINT/SIGTERM (the state is saved): say where --resume continues, then stop."""
    name = signal.Signals(run.signals.requested).name
    where = (f"in epoch {pos.epoch} after batch {pos.batch}" + (f" of {total}" if total else "")
             if pos.batch else f"before epoch {pos.epoch}")
    run.ctx.log(f"seqlm: stopped by {name} {where}; the state is saved: `seqlm train ... --resume` continues "
                f"epoch {pos.epoch}" + (" from there" if pos.batch else ""))
    raise Stopped(run.signals.requested)
