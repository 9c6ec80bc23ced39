"""What the two Kneser-Ney estimators share: discounts from count-of-counts, and how values are stored.

kneser_ney.py estimates in memory and hands bounded-memory estimation to external_estimate.py, which
needs these same pieces; keeping them here means neither estimator imports the other's module at load.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)  # lmplz --discount_fallback defaults
BOS_LOG10 = 0.0  # what lmplz writes for the <s> unigram; it is never predicted (readers also accept -99)


@dataclass(frozen=True)
class Discount:
    """Modified-KN discounts of one order: D1 for count 1, D2 for count 2, D3 for counts >= 3."""

    d1: float
    d2: float
    d3: float

    def __call__(self, adjusted: np.ndarray) -> np.ndarray:
        """(M,) the discount taken from each n-gram with the given adjusted counts (0 for count 0)."""
        table = np.array([0.0, self.d1, self.d2, self.d3])
        return table[np.minimum(adjusted, 3)]


def cuts_per_order(prune, order: int) -> list[int]:
    """lmplz's --prune thresholds, one per order 1..N (the last given repeats; 0: nothing pruned there)."""
    t = list(prune) or [0]
    return (t + [t[-1]] * order)[:order]


def count_of_counts(adjusted: np.ndarray) -> np.ndarray:
    """(4,) int64 n_1..n_4: how many n-grams have adjusted count 1, 2, 3, 4 (sums over chunks add up)."""
    return np.bincount(np.minimum(adjusted, 5), minlength=6)[1:5].astype(np.int64)


def discount_of(k: int, n: np.ndarray, fallback: tuple[float, float, float] = FALLBACK_DISCOUNTS) -> Discount:
    """D1, D2, D3+ of order k from its count-of-counts n_1..n_4.

    Where the statistics are too sparse (n_1, n_2 or n_3 is 0, or a discount falls outside [0, j]) lmplz
    stops and asks for --discount_fallback; we warn once for that order and use `fallback` instead. n_4 = 0
    is no such case: D3+ is then 3, as lmplz computes it (lm/builder/adjust_counts.cc).
    """
    n = np.asarray(n, dtype=np.float64)
    d = None
    if np.all(n[:3] > 0):
        y = n[0] / (n[0] + 2 * n[1])
        d = [j - (j + 1) * y * n[j] / n[j - 1] for j in (1, 2, 3)]
        if not all(0 <= dj <= j for j, dj in zip((1, 2, 3), d, strict=True)):
            d = None
    if d is None:
        counts = " ".join(f"n{j}={int(x)}" for j, x in enumerate(n, 1))
        warnings.warn(
            f"Kneser-Ney order {k}: count-of-counts too sparse for discounts ({counts}); "
            f"using fallback discounts {' '.join(f'{x:g}' for x in fallback)}",
            stacklevel=3,
        )
        d = list(fallback)
    return Discount(*(float(x) for x in d))


def _log10_f32(x: np.ndarray) -> np.ndarray:
    """log10 computed in float64, stored as float32 (log10 0 = -inf, NaN stays NaN)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log10(x).astype(np.float32)
