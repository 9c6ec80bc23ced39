"""Smoothing methods besides lmplz's modified Kneser-Ney, each written as a back-off ARPA model.

Chen & Goodman 1998 ("An empirical study of smoothing techniques for language modeling", TR-10-98) put the
classic methods in one frame: each decides how much of its count a seen n-gram keeps, and the mass taken
from a context goes to the lower order, by interpolation or by backing off. So every method here is one
rule giving, per n-gram hw of order k and per context h,

    taken(hw)  what the n-gram gives up of its count r(hw)
    extra(h)   what the context adds to its denominator
    alpha(w|h) = (r(hw) - taken(hw)) / (C(h) + extra(h))                C(h) = sum_w r(hw)
    gamma(h)   = (extra(h) + sum_w taken(hw)) / (C(h) + extra(h))       so sum_w alpha + gamma = 1

| method      | r         | taken                 | extra    | Chen & Goodman 1998 |
|-------------|-----------|-----------------------|----------|---------------------|
| additive    | raw       | -k                    | k V'     | section 2.1 (Lidstone; Laplace k = 1) |
| katz        | raw       | r (1 - d_r)           | 0        | section 2.4 (d_r from Good-Turing, 2.2) |
| witten-bell | raw       | 0                     | T(h)     | section 2.5 (T(h): distinct words after h) |
| absolute    | raw       | D                     | 0        | section 2.6 (D = n1 / (n1 + 2 n2)) |
| kn          | adjusted  | D                     | 0        | section 2.7 (Kneser & Ney 1995) |
| modified-kn | adjusted  | D1, D2 or D3+         | 0        | section 3 |

"adjusted" are lmplz's counts (kneser_ney.adjust_counts: continuation counts below the highest order,
raw counts for n-grams that begin with <s>); V' is the vocabulary without <s>, which is never predicted.
Then, in the two forms section 2.8 sets side by side, with h' = h minus its first word:

    interpolated  p(w|h) = alpha(w|h) + gamma(h) p(w|h')    ARPA back-off of h: gamma(h) exactly
    back-off      p(w|h) = alpha(w|h) for w seen after h, else bo(h) p(w|h'),
                  bo(h) = gamma(h) / (1 - sum_{w seen after h} p(w|h'))   (Katz 1987)

The recursion ends at the uniform distribution over V' (section 2.3): interpolated unigrams get gamma/V'
each on top of alpha; backed-off ones give gamma to the words never seen (alpha 0), or to every word when
all were seen. A back-off context whose seen words already cover V' has nowhere to back off to, so it
interpolates instead (bo is then never used). Count pruning (lmplz --prune) works as in kneser_ney.py: a
pruned n-gram gives its whole count to gamma(h) and is left out of the file, so each context still sums
to 1 in either form.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from seqlm.data.corpus import TokenStream
from seqlm.data.vocab import BOS, Vocab
from seqlm.errors import SeqlmError
from seqlm.ngram.counts import NGramCounts, count_ngrams
from seqlm.ngram.discounts import BOS_LOG10, _log10_f32, count_of_counts, discount_of
from seqlm.ngram.kneser_ney import adjust_counts, drop_pruned, prune_marks
from seqlm.ngram.model import NGramModel

METHODS = ("modified-kn", "kn", "absolute", "witten-bell", "katz", "additive")
BACKOFF_BY_DEFAULT = ("katz", "additive")  # the methods as first published back off; the others interpolate
ADJUSTED = ("kn", "modified-kn")  # the methods that read lmplz's adjusted counts
LOG10_ZERO = -99.0  # how ARPA files write probability 0 (SRILM's value): KenLM refuses -inf


@dataclass(frozen=True)
class Smoothing:
    """What a method reads (seqlm.models.kn.KNConfig holds the defaults and documents each field)."""

    method: str
    interpolated: bool
    discount: float  # kn, absolute: one D for every order; 0 = estimated per order
    fallback: tuple[float, float, float]  # discounts where count-of-counts are too sparse
    add_k: float  # additive
    katz_max: int  # katz: counts above it are not discounted


@dataclass
class Tables:
    """An estimate in float64, before it is cut to the ARPA file's float32 logs and pruned n-grams dropped."""

    counts: NGramCounts  # keys per order, as in the file (pruned n-grams included)
    prob: list[np.ndarray]  # (M_k,) p(w|h) per order
    backoff: list[np.ndarray]  # (M_k,) bo(h) per order below the highest (1 for a context never continued)
    pruned: list[np.ndarray] | None  # (M_k,) bool per order, or None


def estimate_smoothed(stream: TokenStream | None, vocab: Vocab, order: int, spec: Smoothing,
                      prune: tuple[int, ...], counts: NGramCounts | None = None) -> NGramModel:
    """Estimate with `spec` from `stream`, encoded with the training `vocab` (no <s>), or from `counts` already
    made over the model's vocabulary, which is `vocab` with <s> appended, as kneser_ney.estimate_model makes it."""
    if BOS in vocab.stoi:
        raise SeqlmError(f"the training text contains {BOS}, which n-gram models reserve; remove it")
    model_vocab = Vocab(vocab.itos + [BOS], vocab.counts + [0])
    t = estimate_tables(stream, len(model_vocab), model_vocab.bos_id, order, spec, prune, counts)
    log_p = [np.maximum(_log10_f32(p), np.float32(LOG10_ZERO)) for p in t.prob]  # (M_k,)
    log_p[0][model_vocab.bos_id] = BOS_LOG10
    log_bo = [np.maximum(_log10_f32(b), np.float32(LOG10_ZERO)) for b in t.backoff]  # (M_k,) k < N
    keys = t.counts.keys
    if t.pruned is not None:
        keys, log_p, log_bo = drop_pruned(keys, log_p, log_bo, t.pruned)
    return NGramModel(model_vocab, keys, log_p, log_bo)


def estimate_tables(stream: TokenStream | None, vocab_size: int, bos_id: int, order: int, spec: Smoothing,
                    prune: tuple[int, ...], counts: NGramCounts | None = None) -> Tables:
    """Count (unless `counts` are given), discount and assemble: float64 probabilities and back-offs per order."""
    if spec.method not in METHODS:
        raise SeqlmError(f"--smoothing must be one of {', '.join(METHODS)}; got {spec.method!r}")
    if counts is None:
        counts = count_ngrams(stream, bos_id, vocab_size, order)
    pruned = prune_marks(counts, list(prune))
    alpha, gamma = discounted(counts, counts_read(counts, spec.method), spec, pruned)
    prob, backoff = assemble(counts, alpha, gamma, spec.interpolated, pruned)
    return Tables(counts, prob, backoff, pruned)


def counts_read(counts: NGramCounts, method: str) -> list[np.ndarray]:
    """(M_k,) per order: lmplz's adjusted counts for the Kneser-Ney methods, else the raw counts, <s> 0 (the
    count tables give the <s> unigram the number of sentences, but it is never predicted)."""
    if method in ADJUSTED:
        return adjust_counts(counts)
    raw = [c.astype(c.dtype if c.dtype.kind == "f" else np.int64) for c in counts.counts]  # copies; fractional stay
    raw[0][counts.bos_id] = 0
    return raw


def discounted(counts: NGramCounts, read: list[np.ndarray], spec: Smoothing,
               pruned: list[np.ndarray] | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """alpha (M_k,) and gamma (M_{k-1},) per order (order 1: gamma has the one entry of the empty context;
    NaN for a context never continued), from the method's taken and extra (module docstring)."""
    V1 = counts.vocab_size - 1  # every word but <s>
    alphas, gammas = [], []
    for k, r in enumerate(read, 1):
        ctx = counts.prefix(k) if k > 1 else np.zeros(len(r), dtype=np.int64)  # (M_k,)
        n_ctx = len(counts.keys[k - 2]) if k > 1 else 1
        taken, extra = RULES[spec.method](k, r, ctx, n_ctx, V1, spec)  # (M_k,), (M_{k-1},)
        if k == 1:
            taken[counts.bos_id] = 0.0  # <s> keeps alpha 0: additive would add k to it
        if pruned is not None:
            taken = np.where(pruned[k - 1], r, taken)  # (M_k,) its whole count goes to gamma
        den = np.bincount(ctx, weights=r, minlength=n_ctx) + extra  # (M_{k-1},)
        with np.errstate(divide="ignore", invalid="ignore"):
            gamma = (extra + np.bincount(ctx, weights=taken, minlength=n_ctx)) / den  # (M_{k-1},)
            gammas.append(np.maximum(gamma, 0.0))  # -1e-17 from rounding would be a NaN log; NaN stays
            alphas.append((r - taken) / den[ctx])
    return alphas, gammas


def assemble(counts: NGramCounts, alpha: list[np.ndarray], gamma: list[np.ndarray], interpolated: bool,
             pruned: list[np.ndarray] | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """p per order and bo per order below the highest, in either form (module docstring), lowest order first:
    order k needs p(w|h') of each n-gram's suffix, which is listed (its count is at least as large)."""
    prob = [unigrams(alpha[0], gamma[0][0], counts.bos_id, interpolated)]
    backoff = []
    for k in range(2, counts.order + 1):
        ctx = counts.prefix(k)  # (M_k,)
        lower = prob[-1][counts.suffix[k - 1]]  # (M_k,) p(w|h')
        if interpolated:
            p, bo = alpha[k - 1] + gamma[k - 1][ctx] * lower, gamma[k - 1]
        else:
            kept = None if pruned is None else ~pruned[k - 1]
            p, bo = backed_off(alpha[k - 1], gamma[k - 1], ctx, lower, kept, counts.vocab_size - 1)
        prob.append(p)
        backoff.append(np.nan_to_num(bo, nan=1.0))  # a context never continued: bo is never read
    return prob, backoff


def unigrams(alpha: np.ndarray, gamma: float, bos: int, interpolated: bool) -> np.ndarray:
    """(V,) the unigram level: alpha plus gamma spread uniformly, over every word (interpolated) or over the
    words never seen (back-off; every word when there are none); <s> gets 0."""
    words = np.ones(len(alpha), dtype=bool)  # (V,)
    words[bos] = False
    unseen = words & (alpha == 0)  # (V,)
    share = words if interpolated or not unseen.any() else unseen
    p = alpha + gamma * share / share.sum()  # (V,)
    p[bos] = 0.0
    return p


def backed_off(alpha: np.ndarray, gamma: np.ndarray, ctx: np.ndarray, lower: np.ndarray,
               kept: np.ndarray | None, V1: int) -> tuple[np.ndarray, np.ndarray]:
    """Katz's form: p = alpha for the n-grams listed, bo(h) = gamma(h) / (the lower order's mass of the words
    not listed after h). A context listing all V1 words (or, in floating point, all the lower order's mass)
    interpolates instead."""
    n_ctx = len(gamma)
    listed = np.ones(len(alpha)) if kept is None else kept.astype(np.float64)  # (M_k,)
    room = 1.0 - np.bincount(ctx, weights=lower * listed, minlength=n_ctx)  # (M_{k-1},)
    covered = (np.bincount(ctx, weights=listed, minlength=n_ctx) >= V1) | (room <= 0)  # (M_{k-1},)
    with np.errstate(divide="ignore", invalid="ignore"):
        bo = np.where(covered, gamma, gamma / room)  # (M_{k-1},)
    p = alpha + np.where(covered[ctx], gamma[ctx] * lower, 0.0)  # (M_k,)
    return p, bo


# ---- the methods: (order k, counts r (M_k,), context ids (M_k,), contexts, V', spec) -> taken, extra ----

def _additive(k, r, ctx, n_ctx, V1, s):
    """Lidstone's k added to every count (section 2.1): at the unigram level every word is an entry, so no
    word is left at 0; above it the unseen words get gamma = k (V' - T(h)) / (C(h) + k V') together."""
    return np.full(len(r), -s.add_k), np.full(n_ctx, s.add_k * V1)


def _witten_bell(k, r, ctx, n_ctx, V1, s):
    """Witten-Bell (section 2.5): a context's distinct followers T(h) stand for the words it has yet to show,
    so the lower order gets weight T(h) / (C(h) + T(h)) and nothing is subtracted."""
    return np.zeros(len(r)), np.bincount(ctx, weights=r > 0, minlength=n_ctx).astype(np.float64)


def _absolute(k, r, ctx, n_ctx, V1, s):
    """Absolute discounting (section 2.6) and, on adjusted counts, Kneser-Ney (section 2.7): one D per order."""
    d = s.discount or one_discount(k, r, s.fallback[0])
    return np.where(r > 0, d, 0.0), np.zeros(n_ctx)


def _modified(k, r, ctx, n_ctx, V1, s):
    """Modified Kneser-Ney (section 3): D1, D2, D3+ by count, lmplz's estimate and fallback (discounts.py)."""
    return discount_of(k, count_of_counts(r), s.fallback)(r), np.zeros(n_ctx)


def _katz(k, r, ctx, n_ctx, V1, s):
    """Katz (section 2.4): counts up to K keep d_r of themselves, larger ones all (Good-Turing, good_turing)."""
    d = good_turing(k, r, s.katz_max)  # (K+2,) d_0 .. d_K, then 1 for every larger count
    return r * (1.0 - d[np.minimum(r, len(d) - 1)]), np.zeros(n_ctx)


RULES = {"additive": _additive, "katz": _katz, "witten-bell": _witten_bell, "absolute": _absolute,
         "kn": _absolute, "modified-kn": _modified}


def one_discount(k: int, r: np.ndarray, fallback: float) -> float:
    """D = n1 / (n1 + 2 n2) (Ney, Essen & Kneser 1994; section 2.6); `fallback` where n1 = 0 (D would be 0,
    leaving nothing for unseen words), with a warning as lmplz's fallback gives one."""
    n1, n2 = (int(np.count_nonzero(r == j)) for j in (1, 2))
    if n1 > 0:
        return n1 / (n1 + 2 * n2)
    warnings.warn(f"order {k}: no n-gram seen once, so no discount estimate (n1=0, n2={n2}); using {fallback:g}",
                  stacklevel=4)
    return fallback


def good_turing(k: int, r: np.ndarray, top: int) -> np.ndarray:
    """Katz's d_r for r = 0..K and 1 past it, (K+2,): d_r = (r*/r - c) / (1 - c), r* = (r+1) n_{r+1} / n_r,
    c = (K+1) n_{K+1} / n_1 (section 2.4), so the counts up to K give up exactly what Good-Turing gives
    unseen events, n_1. K is `top`, or the largest K below it whose d_1..d_K all lie in (0, 1]: sparse
    count-of-counts (an n_r of 0, d_r > 1) make Good-Turing meaningless there. None: no discount (warned)."""
    n = np.bincount(np.minimum(r, top + 2), minlength=top + 3)[1:top + 2].astype(np.float64)  # n_1..n_{top+1}
    for K in range(top, 0, -1):
        c = (K + 1) * n[K] / n[0] if n[0] > 0 else np.inf
        if not (np.all(n[:K + 1] > 0) and c < 1):
            continue
        j = np.arange(1, K + 1)  # (K,)
        d = ((j + 1) * n[1:K + 1] / (j * n[:K]) - c) / (1 - c)  # (K,)
        if np.all((d > 0) & (d <= 1)):
            return np.concatenate([[1.0], d, [1.0]])
    counts = " ".join(f"n{j}={int(x)}" for j, x in enumerate(n, 1))
    warnings.warn(f"katz order {k}: count-of-counts give no Good-Turing discounts ({counts}); not discounting, "
                  "so this order leaves nothing for unseen words", stacklevel=4)
    return np.ones(2)
