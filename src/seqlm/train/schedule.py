"""The papers' learning-rate schedule ("newbob").

fofe-fnnlm.txt Sec. 4 (and Mikolov's rnnlm): keep the rate while validation perplexity improves by at
least `min_improvement`; after the first epoch that does not, halve the rate after every epoch for
`halving_epochs` more epochs, then stop.
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

    def update(self, valid_ppl: float) -> bool:
        """Record an epoch's validation perplexity; return True if the rate was halved."""
        improved = self.best - valid_ppl
        self.best = min(self.best, valid_ppl)
        if not self.halving and improved >= self.min_improvement:
            return False
        if not self.halving:
            self.halving, self.left = True, self.halving_epochs
        else:
            self.left -= 1
        self.lr /= 2
        return True

    @property
    def done(self) -> bool:
        return self.halving and self.left <= 0

    def state(self) -> dict:
        return asdict(self)
