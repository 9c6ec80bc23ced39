"""Interpolated modified Kneser-Ney (Chen & Goodman 1998), estimated the way KenLM's lmplz does it.

The estimator is a pipeline of stages, each a plain function of arrays (see `estimate`):

    count_ngrams          TokenStream            -> NGramCounts (raw counts, trie-numbered; counts.py)
    adjust_counts         NGramCounts            -> adjusted counts per order
    compute_discounts     adjusted counts        -> Discount (D1, D2, D3+) per order
    initial_probabilities counts, adjusted, D    -> Initial: discounted u(w|c) and gamma(c) per order
    interpolate           counts, Initial        -> log10 p(w|c) and log10 back-off per order (ARPA form)
    drop_pruned           keys, p, bo, pruned    -> the tables without the pruned n-grams (renumbered)
    write_arpa            tokens, keys, p, bo    -> .arpa / .arpa.gz (arpa.py; NGramModel.to_arpa)

KenLM conventions reproduced exactly (checked against lmplz's output in tests/test_kn.py):
- adjusted count: the raw count at the highest order and for n-grams that begin with `<s>` (they
  cannot be extended to the left); otherwise the number of distinct words seen before the n-gram.
  The `<s>` unigram gets 0: it is only ever a context.
- D_k = k - (k+1) Y n_{k+1} / n_k with Y = n1 / (n1 + 2 n2), from the count-of-counts n_1..n_4 of the
  adjusted counts of each order.
- the unigram level interpolates with the uniform distribution over every word except `<s>`, so a
  word never seen in training (`<unk>` when the text has none) gets gamma_0 / (V - 1), V counting `<s>`.
  When the training text does contain `<unk>` (PTB does), it is counted as an ordinary word and gets
  that uniform share on top, like every other word; the distribution still sums to 1.
- p(w|c) = u(w|c) + gamma(c) p(w|c'), c' = c minus its first word; the ARPA back-off of c is gamma(c)
  (0 in log10 when c is never followed by anything).
The `<s>` unigram is written with log10 p 0, as lmplz writes it (SRILM writes -99); either way `<s>`
is never predicted, and the reader ignores the value.

Count pruning (lmplz --prune t1 t2 ..., `prune_marks`): an n-gram of order k >= 2 whose raw count is
at or below t_k is marked (lmplz compares the raw occurrence count of lower orders too, its
`actual_counts`; with non-decreasing thresholds no kept n-gram then loses its context or suffix).
Discounts still come from every n-gram; a marked n-gram keeps its share of the denominator a(c.)
but its whole adjusted count goes to gamma(c) instead of u, so the model stays normalised, and it is
left out of the tables after interpolation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqlm.data.corpus import TokenStream
from seqlm.data.vocab import BOS, Vocab
from seqlm.errors import SeqlmError
from seqlm.ngram.counts import NGramCounts, count_ngrams, id_dtype
from seqlm.ngram.discounts import (
    BOS_LOG10,
    FALLBACK_DISCOUNTS,
    Discount,
    _log10_f32,
    count_of_counts,
    cuts_per_order,
    discount_of,
)
from seqlm.ngram.model import NGramModel


@dataclass
class Initial:
    """Output of `initial_probabilities`: per order k, u_k (M_k,) and gamma over its contexts.

    gamma[k-1] has one entry per n-gram of order k-1 (a single entry for the unigram level's empty
    context); it is NaN for contexts never followed by anything.
    """

    u: list[np.ndarray]
    gamma: list[np.ndarray]


def adjust_counts(counts: NGramCounts) -> list[np.ndarray]:
    """Stage `adjust counts`: raw counts -> KN adjusted counts per order, (M_k,) int32 each (int64 past 2^31)."""
    adjusted = []
    for k in range(1, counts.order + 1):
        raw = counts.counts[k - 1]
        if k == counts.order:
            a = raw.copy()
        else:
            left = np.bincount(counts.suffix[k], minlength=len(raw))  # (M_k,) distinct left extensions
            a = np.where(counts.first_word(k) == counts.bos_id, raw, left)
        if k == 1:
            a[counts.bos_id] = 0
        adjusted.append(a.astype(id_dtype(int(a.max(initial=0)) + 1)))
    return adjusted


def compute_discounts(
    adjusted: list[np.ndarray], fallback: tuple[float, float, float] = FALLBACK_DISCOUNTS
) -> list[Discount]:
    """Stage `discounts`: adjusted counts -> D1, D2, D3+ per order from the count-of-counts."""
    return [discount_of(k, count_of_counts(a), fallback) for k, a in enumerate(adjusted, 1)]


def prune_marks(counts: NGramCounts, thresholds: list[int]) -> list[np.ndarray] | None:
    """Stage `prune` (lmplz --prune): (M_k,) bool per order, True where the raw count <= threshold.

    `thresholds` has one value per order (the last repeats); the unigram threshold must be 0.
    """
    if not any(thresholds):
        return None
    t = cuts_per_order(thresholds, counts.order)
    return [np.zeros(len(counts.keys[0]), dtype=bool)] + [
        counts.counts[k - 1] <= t[k - 1] for k in range(2, counts.order + 1)
    ]


def initial_probabilities(
    counts: NGramCounts, adjusted: list[np.ndarray], discounts: list[Discount],
    pruned: list[np.ndarray] | None = None,
) -> Initial:
    """Stage `initial probabilities`: u(w|c) = (a(cw) - D(a(cw))) / a(c.), gamma(c) = sum D / a(c.).

    A pruned n-gram gives all of a(cw) to gamma(c) and gets u = 0 (lmplz's CutoffCount).
    """
    us, gammas = [], []
    for k, (a, disc) in enumerate(zip(adjusted, discounts, strict=True), 1):
        ctx = counts.prefix(k) if k > 1 else np.zeros(len(a), dtype=np.int64)  # (M_k,)
        n_ctx = len(counts.keys[k - 2]) if k > 1 else 1
        taken = disc(a) if pruned is None else np.where(pruned[k - 1], a, disc(a))  # (M_k,)
        total = np.bincount(ctx, weights=a, minlength=n_ctx)  # (M_{k-1},) a(c.)
        mass = np.bincount(ctx, weights=taken, minlength=n_ctx)  # (M_{k-1},) left for lower orders
        u = np.subtract(a, taken, out=taken)  # (M_k,) then in place: (a - taken) / a(c.), in taken's memory
        del taken
        with np.errstate(divide="ignore", invalid="ignore"):
            gammas.append(mass / total)  # NaN where c is never followed by anything
            u /= total[ctx]
            us.append(u)
    return Initial(us, gammas)


def interpolate(counts: NGramCounts, initial: Initial) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Stage `interpolate`: u, gamma -> (log10 p per order, log10 back-off per order below the highest).

    Lower orders are finished first, so p(w|c') is ready when order k needs it.
    """
    V, bos = counts.vocab_size, counts.bos_id
    uniform = 1.0 / (V - 1)  # every word but <s>
    p = initial.u[0] + initial.gamma[0][0] * uniform  # (V,) float64 while the next order needs it
    p[bos] = 0.0
    log_p = [_log10_f32(p)]  # stored as float32 (like KenLM) as soon as each order is done
    for k in range(2, counts.order + 1):
        gamma = initial.gamma[k - 1][counts.prefix(k)]  # (M_k,)
        p = initial.u[k - 1] + gamma * p[counts.suffix[k - 1]]  # (M_k,)
        log_p.append(_log10_f32(p))
    log_p[0][bos] = BOS_LOG10
    backoffs = [np.nan_to_num(_log10_f32(g), nan=0.0) for g in initial.gamma[1:]]  # (M_k,) for k < N
    return log_p, backoffs


def drop_pruned(
    keys: list[np.ndarray], log_p: list[np.ndarray], backoffs: list[np.ndarray], pruned: list[np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Stage `drop`: remove marked n-grams and renumber. A kept n-gram's context is kept (thresholds
    never decrease with the order), so the new prefix ids are the ranks among the kept n-grams below."""
    V = len(keys[0])
    new_id = np.arange(V, dtype=np.int64)  # (M_1,) unigrams are never pruned
    out_k, out_p, out_b = [keys[0]], [log_p[0]], [backoffs[0]] if backoffs else []
    for k in range(2, len(keys) + 1):
        keep = ~pruned[k - 1]  # (M_k,)
        kept = keys[k - 1][keep]
        out_k.append(new_id[kept // V] * V + kept % V)  # order preserved: new_id is increasing
        out_p.append(log_p[k - 1][keep])
        if k < len(keys):
            out_b.append(backoffs[k - 1][keep])
        new_id = np.cumsum(keep) - 1  # (M_k,) id among the kept n-grams of order k
    return out_k, out_p, out_b


def estimate(
    stream: TokenStream | None,
    vocab_size: int,
    bos_id: int,
    order: int,
    fallback: tuple[float, float, float] = FALLBACK_DISCOUNTS,
    prune: tuple[int, ...] = (0,),
    counts: NGramCounts | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[Discount]]:
    """Run the stages: TokenStream -> (keys, log10 p, log10 back-off, discounts) per order.

    `counts` may be given already counted (the bounded-memory counter, external.py).
    """
    own = counts is None
    counts = counts or count_ngrams(stream, bos_id, vocab_size, order)
    adjusted = adjust_counts(counts)
    discounts = compute_discounts(adjusted, fallback)
    pruned = prune_marks(counts, list(prune))
    if own:  # the raw counts are done with: free them before the two stages that peak in memory
        counts.counts.clear()
    initial = initial_probabilities(counts, adjusted, discounts, pruned)
    del adjusted
    log_p, backoffs = interpolate(counts, initial)
    if pruned is None:
        return counts.keys, log_p, backoffs, discounts
    return *drop_pruned(counts.keys, log_p, backoffs, pruned), discounts


def estimate_model(
    stream: TokenStream, vocab: Vocab, order: int, fallback: tuple[float, float, float] = FALLBACK_DISCOUNTS,
    prune: tuple[int, ...] = (0,),
    memory: int | None = None,
    counts: NGramCounts | None = None,
) -> NGramModel:
    """Estimate a KN model from `stream`, encoded with the training `vocab` (which has no <s>).

    `prune`: lmplz's --prune thresholds; `memory`: bytes of working space (None: all in memory).
    `counts`: the n-grams already counted over the model's vocabulary (weighted lines, count files; then
    `stream` is not read).

    The model's vocabulary is `vocab` with <s> appended, so training ids stay valid model ids.
    """
    if BOS in vocab.stoi:
        raise SeqlmError(f"the training text contains {BOS}, which n-gram models reserve; remove it")
    model_vocab = Vocab(vocab.itos + [BOS], vocab.counts + [0])
    if counts is None and len(stream.ids) and (int(np.max(stream.ids)) >= len(vocab) or int(np.min(stream.ids)) < 0):
        raise SeqlmError("training ids outside the vocabulary; re-encode the text with this vocabulary")
    if memory is not None and counts is None:  # every stage on tables in files, pruning included (external_estimate)
        from seqlm.ngram.external_estimate import estimate_bounded

        return estimate_bounded(stream, model_vocab, order, fallback, memory, prune=tuple(prune))
    keys, log_p, backoffs, _ = estimate(stream, len(model_vocab), model_vocab.bos_id, order, fallback, prune, counts)
    return NGramModel(model_vocab, keys, log_p, backoffs)
