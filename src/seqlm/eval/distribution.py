"""The whole next-word distribution, for many contexts at once, from any model family.

    logp10 = next_distribution(model, [[], [the_id], [the_id, cat_id]])   # (3, V) log10 p(w | <s> h)

An n-gram model answers with array lookups only (no loop over words or contexts): per order, every
context's back-off is added to all words at once and the n-grams that continue the context overwrite
their words, which is the ARPA back-off rule for all V words in one pass. A neural model runs its
`initial_state` / `step` over the histories, those of equal length as one batch. `<s>` is context only:
its column is -inf, so each row sums to 1 over the predictable words.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch

from seqlm.eval.perplexity import model_device
from seqlm.ngram.model import NGramModel
from seqlm.protocol import LanguageModel

LN10 = math.log(10.0)


def next_distribution(model: LanguageModel, histories: Sequence[Sequence[int]]) -> np.ndarray:
    """(N, V) float64 log10 p(w | <s> history) for each history (word ids read after <s>)."""
    if isinstance(model, NGramModel):
        return ngram_distribution(model, histories)
    V = len(model.vocab)
    out = np.empty((len(histories), V))  # (N, V)
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, h in enumerate(histories):
        by_length[len(h)].append(i)
    for rows in by_length.values():
        out[rows] = _neural_rows(model, [histories[i] for i in rows])
    return out


@torch.no_grad()
def _neural_rows(model: LanguageModel, histories: list[Sequence[int]]) -> np.ndarray:
    """(B, V) log10 distributions after B histories of equal length: one batched step per position."""
    if isinstance(model, torch.nn.Module):
        model.eval()
    device = model_device(model)
    ids = torch.tensor([[model.vocab.bos_id, *h] for h in histories], dtype=torch.long, device=device)  # (B, L+1)
    state = model.initial_state(len(histories))
    for t in range(ids.shape[1]):
        logp, state = model.step(ids[:, t], state)  # (B, V) natural logs
    logp10 = logp.double().cpu().numpy() / LN10  # (B, V)
    if model.vocab.bos_id != model.vocab.eos_id:
        logp10[:, model.vocab.bos_id] = -np.inf
    return logp10


def ngram_distribution(model: NGramModel, histories: Sequence[Sequence[int]]) -> np.ndarray:
    """next_distribution for an n-gram model: the last N-1 words of <s> + history, vectorised."""
    n = model.order - 1
    hist = np.full((len(histories), max(n, 0)), -1, dtype=np.int64)  # (B, N-1) oldest first, -1 = none
    for i, h in enumerate(histories):
        words = [model.vocab.bos_id, *h][-n:] if n else []
        hist[i, n - len(words) :] = words
    logp = model.log10_distribution(hist)  # (B, V)
    logp[:, model.vocab.bos_id] = -np.inf
    return logp

