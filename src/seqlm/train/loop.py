"""The one training loop for every neural family.

What differs between families is passed in: `batches` (how the training text is cut: packed sentences,
TBPTT streams) and `step` (what one batch does: seqlm.train.steps). Everything else is here, once:
optimiser, newbob schedule, clipping, bf16 autocast, progress bar, metrics.jsonl, per-epoch
checkpoints and --resume, the time limit, and recovery from a non-finite loss.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from seqlm.checkpoint import atomic_write_text, load_tensors, save_tensors
from seqlm.config import TrainConfig
from seqlm.data.corpus import TokenStream
from seqlm.errors import SeqlmError
from seqlm.eval.perplexity import evaluate
from seqlm.protocol import Batch
from seqlm.train import distributed as dist
from seqlm.train.schedule import NewBob
from seqlm.train.steps import StepFn

RESUME = "resume"  # sub-directory with the last epoch's full training state
Batches = Callable[[TokenStream, np.random.Generator, tuple[int, int]], Iterator[Batch]]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SeqlmError("--device cuda: no CUDA device is available; use --device cpu or auto")
    return torch.device(name)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adam":
        # The fused kernel is ~5x faster than the default on CPU (14 vs 66 ms a step for 4M parameters,
        # one thread): at RNN sizes the optimiser step would otherwise cost as much as the model.
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


@dataclass
class Progress:
    """Running totals of one epoch."""

    loss: float = 0.0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def ppl(self) -> float:
        return math.exp(min(self.loss / max(self.tokens, 1), 50.0))


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

    `cfg.max_minutes` bounds the whole run (and may cut an epoch short); `session_minutes` only stops
    this call before it starts an epoch, leaving a clean checkpoint to --resume (long benchmark rows).
    """
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    ctx = dist.setup(resolve_device(cfg.device))
    device = ctx.device  # under torchrun on GPUs: this rank's own GPU
    model.to(device)
    net = ctx.wrap(model)
    opt = make_optimizer(model, cfg)
    clean = False
    try:
        history = _epochs(model, net, opt, step, batches, train, valid, cfg, out, save_best, resume,
                          session_minutes, ctx, device)
        clean = True
    except SeqlmError as e:
        clean = True  # raised on every rank alike (the non-finite decision is agreed): a clean exit is safe
        raise e.with_traceback(None) from None  # drop the frame of _epochs: it holds the DDP wrapper
    finally:
        del net, opt  # the gloo teardown trap: no DDP reducer may outlive the process group (Context.finish)
        ctx.finish(clean)
    return history


def _epochs(model: nn.Module, net: nn.Module, opt: torch.optim.Optimizer, step: StepFn, batches: Batches,
            train: TokenStream, valid: TokenStream, cfg: TrainConfig, out: Path,
            save_best: Callable[[nn.Module], None], resume: bool, session_minutes: float, ctx: dist.Context,
            device: torch.device) -> list[dict]:
    sched = NewBob(cfg.lr, cfg.min_improvement, cfg.halving_epochs)
    history: list[dict] = []
    first_epoch = 1
    if resume:
        first_epoch, history = _load_resume(out, model, opt, sched)
        if ctx.is_main:  # drop rows of an epoch that was logged but not checkpointed before a crash
            atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(row) + "\n" for row in history))
    t_start = time.time() - (history[-1]["wall_seconds"] if history else 0.0)
    deadline = t_start + cfg.max_minutes * 60 if cfg.max_minutes else math.inf
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")
    session_end = time.time() + session_minutes * 60 if session_minutes else math.inf
    for epoch in range(first_epoch, cfg.max_epochs + 1):
        if sched.done or ctx.agree(time.time() >= min(deadline, session_end))[0]:
            break
        good = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
        for retry in range(cfg.max_nan_retries + 1):
            rng = np.random.default_rng([cfg.seed, epoch])  # the data order depends on seed and epoch only
            prog = _run_epoch(net, step, batches(train, rng, ctx.shard), opt, cfg, device, autocast,
                              deadline, f"epoch {epoch}", ctx)
            if prog is not None:
                break
            if retry == cfg.max_nan_retries:
                raise SeqlmError(f"loss became NaN/inf {retry + 1} times in epoch {epoch} (lr halved each time, "
                                 f"down to {sched.lr:g}); lower --lr or set --clip (e.g. --clip 1.0)")
            model.load_state_dict(good[0])
            opt.load_state_dict(good[1])
            sched.lr /= 2
            _set_lr(opt, sched.lr)
            ctx.log(f"seqlm: non-finite loss in epoch {epoch}; restored the last good state, lr -> {sched.lr:g}")
        lr_used = sched.lr
        valid_ppl = evaluate(model, valid, max_tokens=cfg.eval_tokens)["ppl"]
        improved = valid_ppl < sched.best
        halved = sched.update(valid_ppl)
        _set_lr(opt, sched.lr)
        row = {"epoch": epoch, "lr": lr_used, "train_ppl": prog.ppl, "valid_ppl": valid_ppl,
               "train_tokens": prog.tokens * ctx.world, "epoch_seconds": prog.seconds,
               "train_tokens_per_s": prog.tokens * ctx.world / max(prog.seconds, 1e-9),
               "wall_seconds": time.time() - t_start, "lr_halved": halved, "precision": cfg.precision}
        history.append(row)
        ctx.log(f"epoch {epoch}: lr {lr_used:g}  train ppl {prog.ppl:.2f}  valid ppl {valid_ppl:.2f}  "
                f"({row['train_tokens_per_s']:.0f} tok/s{', lr halved' if halved else ''})")
        if ctx.is_main:
            with open(out / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            if improved:
                save_best(model)
            _save_resume(out, model, opt, sched, epoch, history)
        ctx.barrier()
    return history


def _set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def _run_epoch(net, step, batches, opt, cfg, device, autocast, deadline, desc, ctx) -> Progress | None:
    """One pass over this rank's batches; None if the loss became NaN/inf (on any rank)."""
    net.train()
    prog = Progress()
    t0 = time.time()
    state: Any = None
    next_log = 60.0
    bar = tqdm(batches, desc=desc, unit="batch", leave=False, disable=None if ctx.is_main else True,
               file=sys.stderr, mininterval=1.0)
    it = iter(bar)
    while True:
        batch = next(it, None)
        loss = None
        if batch is not None:
            with autocast:
                loss, state, n = step(net, batch.to(device), state)
        # Decided together, so the ranks stay in step: all stop when any runs out of batches (shards
        # may differ by one) or of time, and all restart the epoch when any sees a non-finite loss.
        ended, bad, late = ctx.agree(batch is None, loss is not None and not bool(torch.isfinite(loss)),
                                     time.time() >= deadline)
        if bad:
            bar.close()
            return None
        if ended:
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.clip)
        opt.step()
        prog.loss += float(loss.detach()) * n
        prog.tokens += n
        prog.seconds = time.time() - t0
        bar.set_postfix(ppl=f"{prog.ppl:.1f}", tok_s=f"{prog.tokens / max(prog.seconds, 1e-9):.0f}", refresh=False)
        if bar.disable and prog.seconds >= next_log:  # no terminal (logs, nohup): a line a minute instead
            next_log += 60
            ctx.log(f"{desc}: {prog.tokens} tokens, running ppl {prog.ppl:.2f}, "
                    f"{prog.tokens / max(prog.seconds, 1e-9):.0f} tok/s")
        if late:
            break
    bar.close()
    return prog


def _save_resume(out: Path, model: nn.Module, opt: torch.optim.Optimizer, sched: NewBob, epoch: int,
                 history: list[dict]) -> None:
    """Everything needed to continue exactly: weights, optimiser, schedule, RNG, metrics."""
    d = out / RESUME
    d.mkdir(parents=True, exist_ok=True)
    tensors, opt_meta = _flatten_optimizer(opt.state_dict())
    tensors.update({f"model.{k}": v for k, v in model.state_dict().items()})
    tensors["rng.torch"] = torch.get_rng_state()
    meta = {"epoch": epoch, "schedule": sched.state(), "optimizer": opt_meta, "history": history}
    # One file, so the tensors and the bookkeeping can never come from different epochs.
    save_tensors(d / "state.safetensors", tensors, metadata={"seqlm": json.dumps(meta)})


def _load_resume(out: Path, model: nn.Module, opt: torch.optim.Optimizer, sched: NewBob) -> tuple[int, list[dict]]:
    path = out / RESUME / "state.safetensors"
    if not path.exists():
        raise SeqlmError(f"{out}: nothing to resume ({RESUME}/state.safetensors missing); train without --resume")
    tensors = load_tensors(path)
    with safe_open(str(path), "pt") as f:
        meta = json.loads((f.metadata() or {})["seqlm"])
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    opt.load_state_dict(_unflatten_optimizer(tensors, meta["optimizer"]))
    for k, v in meta["schedule"].items():
        setattr(sched, k, v)
    torch.set_rng_state(tensors["rng.torch"])
    return int(meta["epoch"]) + 1, list(meta["history"])


def run_status(out: Path) -> dict:
    """How far the run in `out` got: {"epoch": last finished epoch, "done": schedule or epochs ran out}."""
    path = out / RESUME / "state.safetensors"
    if not path.exists():
        return {"epoch": 0, "done": False, "history": []}
    with safe_open(str(path), "pt") as f:
        meta = json.loads((f.metadata() or {})["seqlm"])
    sched = meta["schedule"]
    return {"epoch": meta["epoch"], "done": bool(sched["halving"] and sched["left"] <= 0), "history": meta["history"]}


def _flatten_optimizer(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """Optimiser state without pickle: tensors go to safetensors, the rest to JSON."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict] = {}
    for pid, st in sd["state"].items():
        for name, val in st.items():
            if isinstance(val, torch.Tensor):
                tensors[f"opt.{pid}.{name}"] = val
            else:
                scalars.setdefault(str(pid), {})[name] = val
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for key, val in tensors.items():
        if key.startswith("opt."):
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = val
    for pid, vals in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(vals)
    return {"state": state, "param_groups": meta["param_groups"]}
