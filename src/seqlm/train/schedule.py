"""Learning-rate schedules. The loop asks one for the rate of every step (`lr_at`) and tells it each
complete epoch's validation perplexity (`update`); `done` ends training before --max-epochs.

- `NewBob` (fofe-fnnlm.txt Sec. 4, and Mikolov's rnnlm): keep the rate while validation perplexity
  improves by at least `min_improvement`; after the first epoch that does not, halve the rate after
  every epoch for `halving_epochs` more epochs, then stop. Constant within an epoch. With `rollback`
  (the FOFE authors' iNCML-DNNLM trainer), that first stalled epoch is undone and run again at the
  halved rate: `rerun` tells the loop to restore the state it started from (seqlm.train.loop).
- `WarmupCosine` (the Transformer recipe): linear warm-up over `warmup_steps`, then a cosine from the
  peak `lr` down to `min_lr` at the run's last planned step (`total_steps` = max_epochs x batches per
  epoch); a pure function of the step count, so a resumed run continues it exactly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass
class NewBob:
    lr: float
    min_improvement: float = 1.0
    halving_epochs: int = 6
    best: float = math.inf
    halving: bool = False
    left: int = 0
    rollback: bool = False
    rerun: bool = False  # the last update asks for its epoch to be undone and run again
    kind: str = "newbob"

    def lr_at(self, step: int) -> float:
        return self.lr

    def update(self, valid_ppl: float) -> bool:
        """Record an epoch's validation perplexity; return True if the rate was halved."""
        improved = self.best - valid_ppl
        self.best = min(self.best, valid_ppl)
        self.rerun = False
        if not self.halving and improved >= self.min_improvement:
            return False
        if not self.halving:
            # With rollback the stalled epoch is undone; its rerun is the first halving epoch (iNCML-DNNLM).
            self.halving, self.rerun, self.left = True, self.rollback, self.halving_epochs
        else:
            self.left -= 1
        self.lr /= 2
        return True

    def shrink(self, factor: float) -> None:
        """Scale the rate (recovery from a non-finite loss)."""
        self.lr *= factor

    def retune(self, old: dict, new: dict) -> list[str]:
        """Apply the changed TrainConfig values of a resumed run (`old` and `new` as dicts); say what changed."""
        changes = []
        if new["lr"] != old["lr"]:
            changes.append(f"lr {self.lr:g} -> {new['lr']:g}")
            self.lr = new["lr"]
        if new["min_improvement"] != old["min_improvement"]:
            changes.append(f"min_improvement {old['min_improvement']:g} -> {new['min_improvement']:g}")
            self.min_improvement = new["min_improvement"]
        if new["halving_epochs"] != old["halving_epochs"]:
            if self.halving:  # the halving epochs already run still count
                self.left += new["halving_epochs"] - old["halving_epochs"]
            changes.append(f"halving_epochs {old['halving_epochs']} -> {new['halving_epochs']}"
                           + (f" ({max(self.left, 0)} left)" if self.halving else ""))
            self.halving_epochs = new["halving_epochs"]
        if new.get("rollback", False) != old.get("rollback", False):
            changes.append(f"rollback {old.get('rollback', False)} -> {new['rollback']}")
            self.rollback = new["rollback"]
        return changes

    @property
    def done(self) -> bool:
        return self.halving and self.left <= 0

    @property
    def may_roll_back(self) -> bool:
        """Whether the coming epoch could be undone (the loop then keeps the state it starts from)."""
        return self.rollback and not self.halving

    def state(self) -> dict:
        return asdict(self)


@dataclass
class WarmupCosine:
    lr: float  # the peak rate
    warmup_steps: int
    min_lr: float
    total_steps: int
    best: float = math.inf
    kind: str = "warmup-cosine"

    def lr_at(self, step: int) -> float:
        """The rate of step `step` (0-based): lr (s+1)/W while s < W, then
        min_lr + (lr - min_lr) (1 + cos(pi (s - W) / (S - W))) / 2 until S, then min_lr."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def update(self, valid_ppl: float) -> bool:
        self.best = min(self.best, valid_ppl)
        return False

    def shrink(self, factor: float) -> None:
        self.lr *= factor
        self.min_lr *= factor

    def retune(self, old: dict, new: dict) -> list[str]:
        changes = []
        for key in ("lr", "warmup_steps", "min_lr"):
            if new[key] != old[key]:
                changes.append(f"{key} {getattr(self, key):g} -> {new[key]:g}")
                setattr(self, key, new[key])
        if new["max_epochs"] != old["max_epochs"]:  # the cosine now ends at the new last planned step
            total = self.total_steps * new["max_epochs"] // old["max_epochs"]
            changes.append(f"planned steps {self.total_steps} -> {total}")
            self.total_steps = total
        return changes

    @property
    def done(self) -> bool:
        return False

    rerun = may_roll_back = False  # no rollback under this schedule (TrainConfig refuses it)

    def state(self) -> dict:
        return asdict(self)


Schedule = NewBob | WarmupCosine


def load_schedule(state: dict) -> Schedule:
    """A schedule from its saved `state()` (resume files from before `kind` existed hold a NewBob)."""
    state = dict(state)
    kind = state.pop("kind", "newbob")
    return WarmupCosine(**state) if kind == "warmup-cosine" else NewBob(**state)
