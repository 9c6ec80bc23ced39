"""`seqlm decode --tune`: alpha and beta picked on a development set by word error rate."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from seqlm.decode.decoder import CTCDecoder
from seqlm.errors import SeqlmError


def edits(a: list[str], b: list[str]) -> int:
    """Levenshtein distance between two sequences."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def wer(hyps: list[str], refs: list[str]) -> float:
    """Word edits over reference words, summed over the utterances."""
    words = sum(len(r.split()) for r in refs)
    if words == 0:
        raise SeqlmError("the reference transcripts have no words; WER is undefined")
    return sum(edits(h.split(), r.split()) for h, r in zip(hyps, refs, strict=True)) / words


def parse_grid(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SeqlmError(f"{flag} {text!r}: give comma-separated numbers, e.g. 0.3,0.5,0.7") from None
    if not values:
        raise SeqlmError(f"{flag}: give at least one value")
    return values


def tune(decoder: CTCDecoder, mats: list[np.ndarray], refs: list[str], alphas: list[float], betas: list[float],
         progress: Callable[[int], None] | None = None) -> dict:
    """Decode `mats` at every (alpha, beta) of the grid; the point with the lowest WER (the first on ties) and the
    grid. The decoder is left at the best point."""
    if len(refs) != len(mats):
        raise SeqlmError(f"--refs has {len(refs)} transcripts for {len(mats)} utterances; give one line per "
                         "utterance, in the input order")
    grid = []
    for alpha in alphas:
        for beta in betas:
            decoder.cfg.alpha, decoder.cfg.beta = alpha, beta
            hyps = [n[0].text for n in decoder.decode(mats, progress)]
            grid.append({"alpha": alpha, "beta": beta, "wer": wer(hyps, refs)})
    best = min(grid, key=lambda g: g["wer"])
    decoder.cfg.alpha, decoder.cfg.beta = best["alpha"], best["beta"]
    return {"alpha": best["alpha"], "beta": best["beta"], "wer": best["wer"], "utterances": len(refs), "grid": grid}
