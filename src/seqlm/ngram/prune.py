"""Relative-entropy pruning of a back-off model (Stolcke 1998, "Entropy-based pruning of back-off
language models"; SRILM's `ngram -prune`), vectorised per order.

Removing the n-gram (h, w) makes p(w|h) fall back to bo'(h) p(w|h'), h' = h minus its first word, and
changes the back-off weight of h to keep the distribution normalised (section 3):

    bo'(h) = (1 - sum_{v in S(h), v != w} p(v|h)) / (1 - sum_{v in S(h), v != w} p(v|h'))

with S(h) the words listed after h. The relative entropy between the model before and after (eq. 7):

    D = -P(h) [ p(w|h) (log p(w|h') + log bo'(h) - log p(w|h)) + (log bo'(h) - log bo(h)) (1 - sum_S p(v|h)) ]

An n-gram is dropped when D < threshold, each computed against the model as it was before that order
was pruned (SRILM does the same per context). Orders go from the highest down; an n-gram that is the
context of a kept longer n-gram stays. P(h) is the model's own probability of the history (the chain
rule over its words; a history starting with <s> counts <s> as certain). At the end every back-off
weight is recomputed from the surviving n-grams, lowest order first, so the model sums to 1 again.
"""

from __future__ import annotations

import numpy as np

from seqlm.ngram.model import NGramModel


def lower_log10(model: NGramModel, words: np.ndarray) -> np.ndarray:
    """(m,) log10 p(w_k | w_2 .. w_{k-1}) for rows (m, k) of words: each n-gram's back-off estimate."""
    if words.shape[1] == 2:
        return model.log10_prob[0][words[:, 1]].astype(np.float64)
    seq = words[:, 1:]  # (m, k-1)
    starts = np.zeros((len(seq), seq.shape[1] - 1), dtype=bool)
    starts[:, 0] = seq[:, 0] == model.vocab.bos_id
    return model.walk(seq[:, :-1], starts, seq[:, 1:])[0][:, -1]


def history_log10(model: NGramModel, words: np.ndarray) -> np.ndarray:
    """(m,) log10 P(h) of histories (m, j) by the chain rule; a leading <s> has probability 1."""
    bos = words[:, 0] == model.vocab.bos_id  # (m,)
    first = np.where(bos, 0.0, model.log10_prob[0][words[:, 0]].astype(np.float64))  # (m,)
    if words.shape[1] == 1:
        return first
    starts = np.zeros((len(words), words.shape[1] - 1), dtype=bool)
    starts[:, 0] = bos
    return first + model.walk(words[:, :-1], starts, words[:, 1:])[0].sum(axis=1)


def _context_sums(model: NGramModel, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For the order-k n-grams: context ids (M_k,), p(w|h) and p(w|h') (M_k,), and per context
    (M_{k-1},) the sums of both over its listed words."""
    V = len(model.vocab)
    ctx = model.keys[k - 1] // V  # (M_k,)
    p = 10.0 ** model.log10_prob[k - 1].astype(np.float64)  # (M_k,)
    q = 10.0 ** lower_log10(model, model.words_of(k, np.arange(len(ctx))))  # (M_k,)
    n_ctx = len(model.keys[k - 2])
    return ctx, p, q, np.stack([np.bincount(ctx, p, n_ctx), np.bincount(ctx, q, n_ctx)])


def entropy_deltas(model: NGramModel, k: int) -> np.ndarray:
    """(M_k,) the relative entropy D (natural log) that removing each order-k n-gram alone would cost."""
    ctx, p, q, sums = _context_sums(model, k)
    numer, denom = sums[0][ctx] - p, sums[1][ctx] - q  # (M_k,) sums without this n-gram
    with np.errstate(divide="ignore", invalid="ignore"):
        log_bo_new = np.log(np.maximum(1.0 - numer, 1e-300)) - np.log(np.maximum(1.0 - denom, 1e-300))
    log_bo = model.log10_backoff[k - 2][ctx].astype(np.float64) * np.log(10.0)  # (M_k,)
    hist = model.words_of(k - 1, np.unique(ctx))  # (C, k-1) only the contexts in use
    p_hist = np.zeros(len(model.keys[k - 2]))
    p_hist[np.unique(ctx)] = 10.0 ** history_log10(model, hist)
    backed_off = 1.0 - sums[0][ctx]  # (M_k,) mass of the words h does not list
    return -p_hist[ctx] * (p * (np.log(q) + log_bo_new - np.log(p)) + (log_bo_new - log_bo) * backed_off)


def _remove(model: NGramModel, k: int, keep: np.ndarray) -> NGramModel:
    """The model without the order-k n-grams where keep is False; order k+1 prefixes renumbered."""
    V = len(model.vocab)
    keys, probs, bos = list(model.keys), list(model.log10_prob), list(model.log10_backoff)
    keys[k - 1], probs[k - 1] = keys[k - 1][keep], probs[k - 1][keep]
    if k < model.order:
        bos[k - 1] = bos[k - 1][keep]
        new_id = np.cumsum(keep) - 1  # kept contexts only are referenced (checked by the caller)
        keys[k] = new_id[keys[k] // V] * V + keys[k] % V
    return NGramModel(model.vocab, keys, probs, bos)


def recompute_backoffs(model: NGramModel) -> NGramModel:
    """Every back-off weight from the listed n-grams, lowest order first (each uses the orders below)."""
    bos = [b.astype(np.float32) for b in model.log10_backoff]
    model = NGramModel(model.vocab, model.keys, model.log10_prob, bos)
    for k in range(2, model.order + 1):
        _, _, _, sums = _context_sums(model, k)
        with np.errstate(divide="ignore", invalid="ignore"):
            bo = np.log10(np.maximum(1.0 - sums[0], 1e-300)) - np.log10(np.maximum(1.0 - sums[1], 1e-300))
        model.log10_backoff[k - 2][:] = bo.astype(np.float32)
    return model


def prune_entropy(model: NGramModel, threshold: float) -> NGramModel:
    """Drop every n-gram of order >= 2 whose removal costs less than `threshold` in relative entropy."""
    if not isinstance(model, NGramModel):  # a bounded-memory estimate (tables in files): pruned in memory
        model = model.load()
    V = len(model.vocab)
    for k in range(model.order, 1, -1):
        keep = entropy_deltas(model, k) >= threshold  # (M_k,)
        if k < model.order:  # contexts of kept longer n-grams stay
            keep[np.unique(model.keys[k] // V)] = True
        model = _remove(model, k, keep)
    return recompute_backoffs(model)
