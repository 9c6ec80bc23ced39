"""The training state behind --resume: one file, `resume/state.safetensors`, written atomically.

It holds the weights, the optimiser state (tensors in safetensors, the rest as JSON metadata: no
pickle), the schedule, the CPU and CUDA random states, where the run stands (`Position`: the epoch,
how many of its batches a cut-short epoch got through, the state carried between batches, the
running totals) and the training settings it ran with. A resumed run applies changed schedule
settings (--lr, --halving-epochs, --min-improvement, ...) and says so; a change that the saved state
cannot follow (--optimizer, --schedule, --batch-size, --seq-len) is a one-line error.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from seqlm.checkpoint import CONFIG, load_tensors, read_json, save_tensors, write_json
from seqlm.config import TrainConfig
from seqlm.errors import SeqlmError
from seqlm.train.optim import reset_hyperparameters
from seqlm.train.schedule import Schedule, load_schedule

RESUME = "resume"  # sub-directory with the full training state
STATE = "state.safetensors"  # the latest state: what --resume continues from
EPOCH_START = "epoch_start.safetensors"  # --rollback: the state the epoch in progress started from
UNTRAINED = "untrained"  # config.json key: the weights there are a new run's initial ones
FIXED = ("optimizer", "schedule", "batch_size", "seq_len")  # the saved state holds only for these values


@dataclass
class Progress:
    """Running totals of one epoch."""

    loss: float = 0.0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def ppl(self) -> float:
        return math.exp(min(self.loss / max(self.tokens, 1), 50.0))


@dataclass
class Position:
    """Where a run stands."""

    epoch: int = 1  # the epoch in progress, or the next one
    batch: int = 0  # batches of `epoch` already trained: > 0 only for an epoch cut short
    step: int = 0  # optimizer steps so far (per-step schedules)
    best_saved: float = math.inf  # validation perplexity of the model saved as the best one
    progress: Progress = field(default_factory=Progress)  # totals of `epoch` so far
    carry: Any = None  # the state the step function carries between batches (TBPTT), at the cut

    def next_epoch(self) -> None:
        self.epoch, self.batch, self.progress, self.carry = self.epoch + 1, 0, Progress(), None


def rng_states() -> dict[str, torch.Tensor]:
    states = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states.update({f"rng.cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return states


def set_rng_states(rng: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(rng["rng.torch"])
    cuda = [rng[k] for k in sorted((k for k in rng if k.startswith("rng.cuda.")), key=lambda k: int(k[9:]))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def save_resume(out: Path, model: nn.Module, opt: torch.optim.Optimizer, sched: Schedule, pos: Position,
                history: list[dict], cfg: TrainConfig, rng: dict[str, torch.Tensor], ctx: Any,
                name: str = STATE) -> None:
    """Everything needed to continue exactly (rank 0 writes it), in RESUME/`name`."""
    if not ctx.is_main:
        return
    d = out / RESUME
    d.mkdir(parents=True, exist_ok=True)
    tensors, opt_meta = _flatten_optimizer(opt.state_dict())
    tensors.update({f"model.{k}": v for k, v in model.state_dict().items()})
    tensors.update(rng)
    # Under DDP the carried state is per rank and only rank 0 writes: the ranks resume from a fresh state.
    carry = _flatten_carry(pos.carry if ctx.world == 1 else None)
    tensors.update(carry)
    position = {"epoch": pos.epoch, "batch": pos.batch, "step": pos.step, "best_saved": pos.best_saved,
                "progress": asdict(pos.progress), "carry": len(carry) or None,
                "carry_kind": type(pos.carry).__name__ if carry else None}
    meta = {"epoch": pos.epoch - 1, "position": position, "schedule": sched.state(), "done": sched.done,
            "optimizer": opt_meta, "history": history, "train": asdict(cfg)}
    # One file, so the tensors and the bookkeeping can never come from different moments.
    save_tensors(d / name, tensors, metadata={"seqlm": json.dumps(meta)})


def load_resume(out: Path, model: nn.Module, opt: torch.optim.Optimizer, sched: Schedule, cfg: TrainConfig,
                log: Callable[[str], None]) -> tuple[Position, list[dict], Schedule]:
    path = out / RESUME / STATE
    if not path.exists():
        raise SeqlmError(f"{out}: nothing to resume ({RESUME}/state.safetensors missing); train without --resume")
    meta = _meta(path)
    old_train = meta.get("train")
    if old_train:
        _check_fixed(old_train, cfg)
    tensors = load_tensors(path)
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    fresh = copy.deepcopy(opt.state_dict()["param_groups"])
    opt.load_state_dict(_unflatten_optimizer(tensors, meta["optimizer"]))
    reset_hyperparameters(opt, fresh)  # momentum, weight decay, betas, eps as given now
    sched = load_schedule(meta["schedule"]) if meta.get("schedule") else sched
    if old_train:
        _apply_changes(old_train, cfg, sched, log)
    set_rng_states(tensors)
    return _position(meta, tensors, sched.best), list(meta["history"]), sched


@dataclass
class Snapshot:
    """The state an epoch starts from, kept while the epoch may be undone (--rollback)."""

    model: dict[str, torch.Tensor]
    opt: dict
    pos: Position
    rng: dict[str, torch.Tensor]


def take_snapshot(model: nn.Module, opt: torch.optim.Optimizer, pos: Position) -> Snapshot:
    return Snapshot(copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), copy.deepcopy(pos),
                    rng_states())


def read_snapshot(out: Path, epoch: int) -> Snapshot | None:
    """The start of `epoch` as saved in RESUME/EPOCH_START (a run resumed inside it); None if not saved."""
    path = out / RESUME / EPOCH_START
    if not path.exists():
        return None
    meta = _meta(path)
    if meta["position"]["epoch"] != epoch or meta["position"]["batch"] != 0:
        return None
    tensors = load_tensors(path)
    model = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
    rng = {k: v for k, v in tensors.items() if k.startswith("rng.")}
    return Snapshot(model, _unflatten_optimizer(tensors, meta["optimizer"]), _position(meta, tensors, math.inf), rng)


def restore_snapshot(snap: Snapshot, model: nn.Module, opt: torch.optim.Optimizer, pos: Position) -> None:
    """Weights, optimizer state, random state and position back to `snap`; the best model saved so far stays
    saved, so `pos.best_saved` is kept."""
    model.load_state_dict(snap.model)
    fresh = copy.deepcopy(opt.state_dict()["param_groups"])
    opt.load_state_dict(copy.deepcopy(snap.opt))
    reset_hyperparameters(opt, fresh)
    best = pos.best_saved
    pos.__dict__.update(copy.deepcopy(snap.pos).__dict__)
    pos.best_saved = best
    set_rng_states(snap.rng)


def _position(meta: dict, tensors: dict[str, torch.Tensor], best: float) -> Position:
    p = meta.get("position")
    if p is None:  # a state written before positions were saved: always at an epoch's end
        return Position(epoch=int(meta["epoch"]) + 1, best_saved=best)
    carry: Any = None
    if p["carry"]:
        parts = [tensors[f"carry.{i}"] for i in range(p["carry"])]
        carry = parts[0] if p["carry_kind"] == "Tensor" else tuple(parts)
    return Position(epoch=p["epoch"], batch=p["batch"], step=p["step"], best_saved=p["best_saved"],
                    progress=Progress(**p["progress"]), carry=carry)


def _check_fixed(old: dict, cfg: TrainConfig) -> None:
    new = asdict(cfg)
    for key in FIXED:
        if key in old and old[key] != new[key]:
            flag = "--" + key.replace("_", "-")
            raise SeqlmError(f"{flag} cannot change on --resume (this run was trained with {flag} {old[key]}); "
                             f"drop {flag}, or train a new model in another --out")


def _apply_changes(old: dict, cfg: TrainConfig, sched: Schedule, log: Callable[[str], None]) -> None:
    """A resumed run follows its new settings; the schedule's running state (halvings so far) is kept."""
    new = asdict(cfg)
    old = {k: old.get(k, v) for k, v in new.items()}
    changes = sched.retune(old, new)
    skip = {"lr", "min_improvement", "halving_epochs", "warmup_steps", "min_lr", "rollback"}
    changes += [f"{k} {old[k]} -> {new[k]}" for k in new if k not in skip and old[k] != new[k]]
    if changes:
        log("seqlm: --resume with changed settings: " + ", ".join(changes))


def mark_untrained(out: Path) -> None:
    """Say in config.json that the weights in `out` are a new run's initial ones. The first best model
    saved (seqlm.save writes config.json anew) drops the mark: from then on the run's state says where it is."""
    write_json(out / CONFIG, read_json(out / CONFIG, "config.json") | {UNTRAINED: True})


def check_resumable(out: Path) -> None:
    """--resume continues from the training state. Without one, only a run stopped before it saved any
    (its weights still the initial ones, marked so) may start again: a trained model without its state
    (copied without resume/, or written by seqlm.save) would be trained from scratch over its weights."""
    if (out / RESUME / STATE).exists() or read_json(out / CONFIG, "config.json").get(UNTRAINED):
        return
    raise SeqlmError(f"{out} holds a trained model but not its training state ({RESUME}/{STATE}), so --resume "
                     f"cannot continue it (nothing there was changed); to train on from its weights, give "
                     f"--init-from {out} and a new --out")


def run_status(out: Path) -> dict:
    """How far the run in `out` got: {"epoch": last complete epoch, "done": the schedule ended,
    "partial": an epoch was cut short, "history": the metrics rows, "started": a state exists}."""
    path = out / RESUME / STATE
    if not path.exists():
        return {"epoch": 0, "done": False, "partial": False, "history": [], "started": False}
    meta = _meta(path)
    sched = meta["schedule"]
    done = meta.get("done", bool(sched.get("halving") and sched.get("left", 1) <= 0))
    partial = bool(meta.get("position", {}).get("batch", 0))
    return {"epoch": meta["epoch"], "done": done, "partial": partial, "history": meta["history"], "started": True}


def _meta(path: Path) -> dict:
    with safe_open(str(path), "pt") as f:
        return json.loads((f.metadata() or {})["seqlm"])


def _flatten_carry(carry: Any) -> dict[str, torch.Tensor]:
    """A carried state of one tensor or a tuple of tensors; anything else is not saved (a fresh state)."""
    if isinstance(carry, torch.Tensor):
        return {"carry.0": carry}
    if isinstance(carry, tuple) and carry and all(isinstance(t, torch.Tensor) for t in carry):
        return {f"carry.{i}": t for i, t in enumerate(carry)}
    return {}


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
