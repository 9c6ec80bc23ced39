"""Static interpolation: n-gram models merged into one back-off model, as SRILM's
`ngram -lm A -mix-lm B -lambda 0.6 -write-lm mix.arpa` builds it (`seqlm interpolate A B --arpa-out mix.arpa`).

    P(w | h) = sum_i lambda_i P_i(w | h)                for every n-gram "h w" that some component lists
    P(w | h) = bo(h) P(w | h without its first word)    for every other one

P_i is component i's own back-off probability (its order, its back-off weights); bo(h) is recomputed so that
P(. | h) sums to 1 over the merged vocabulary, the union of the components'. The order is the largest.

A word outside component i's vocabulary reads as component i's <unk> in a context (what scoring the text
with component i alone does), and as the predicted word has probability 0 under component i; the merged
<unk> (a word no component knows) gets sum_i lambda_i P_i(<unk> | h). Giving such a word component i's
<unk> probability instead, as scoring with component i alone would, counts that probability once per word
component i lacks: the mixture would sum to 1 + sum_i lambda_i n_i P_i(<unk> | h) over the union (n_i
words missing from component i), which no back-off weight repairs (the unigrams have none). SRILM's
merge gives such a word 0 too (a model without a word's unigram gives it no probability). When the
components share one vocabulary the rule never applies.

On every listed n-gram the merged model is the dynamic mixture (`seqlm interpolate --out`); an n-gram that
no component lists backs off with the one weight bo(h), where the dynamic mixture backs off with each
component's own: the approximation every static merge makes.

How: orders lowest first, each step one array operation over a chunk of an order's n-grams (no loop per
n-gram or per context). The union's n-grams of order k are keys `prefix * V + w` (counts.py's trie
numbering). For each model (each component, and the merged model as far as it is built) a `Walker` holds,
per union n-gram of the order below, that model's ids of its last j words, j = 1, 2, ...: the contexts the
back-off walk visits (NGramModel.walk). Appending w costs one lookup per order; the hits are both the
walk's matches and the new n-gram's ids of its last j words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from seqlm.data.corpus import TokenStream
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.ngram.index import build_slots
from seqlm.ngram.model import NGramModel
from seqlm.ngram.query import NGramQuery

CHUNK = 1 << 20  # n-grams per array step: the temporaries stay bounded on models of any size
TINY = 1e-12  # a back-off mass below this is rounding: nothing is left to back off to


@dataclass
class Merged:
    model: NGramModel  # the merged tables, over the union vocabulary
    tables: list[np.ndarray]  # per component (V,): its id of each merged word, -1 where it lacks the word


class Walker:
    """One model's view of the union's n-grams of the order last extended: `ids[g, j-1]`, the model's id at
    order j of the last j words of union n-gram g (-1: not listed), j = 1 .. depth."""

    def __init__(self, model: NGramModel, read: np.ndarray, depth: int):
        self.model, self.read, self.depth = model, read, depth  # read (V,): its id of each union word
        self.ids = np.zeros((0, 0), np.int64)  # nothing extended yet

    def extend(self, prefix: np.ndarray | None, words: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """log10 P(words | prefixes) (M,) and the ids (M, min(k, depth)) of the new n-grams' last j words;
        prefix: the union ids of the order-(k-1) prefixes (None at k = 1), words: union word ids."""
        reach = min(k - 1, self.model.order - 1)  # context words the model reads
        ctx = self.ids[prefix, :reach] if prefix is not None else np.zeros((len(words), 0), np.int64)
        hits, logp = walk(self.model, ctx, self.read[words])
        return logp, hits[:, : min(k, self.depth)]


def walk(model: NGramModel, ctx: np.ndarray, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The back-off walk of NGramModel.walk for one position: `words` (M,) after contexts given by their ids,
    ctx[:, j-1] the id at order j of the last j context words (-1: not listed). Returns the ids (M, L+1) at
    order j of the last j words of each extended n-gram (j = 1 .. L+1) and log10 p (M,) float64."""
    hits = [words]
    logp = model.log10_prob[0][words].astype(np.float64)  # (M,)
    for j in range(1, ctx.shape[1] + 1):
        c = ctx[:, j - 1]  # (M,)
        hit = model.find(j + 1, c, words)  # (M,)
        logp = np.where(hit >= 0, _at(model.log10_prob[j], hit), logp + _at(model.log10_backoff[j - 1], c))
        hits.append(hit)
    return np.stack(hits, axis=1), logp


def _at(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """values[ids], 0 where ids is -1 (an unlisted context has back-off weight 1)."""
    return np.where(ids >= 0, values[np.maximum(ids, 0)], 0.0) if len(values) else np.zeros(ids.shape)


def union_vocab(models: Sequence[NGramModel]) -> tuple[Vocab, list[np.ndarray]]:
    """The words of every model (the first model's in its order, then each next model's new ones) and, per
    model, its id of each union word (-1 where it lacks it). One pass over each vocabulary."""
    words, seen = [], set()
    for m in models:
        new = [w for w in m.vocab.itos if w not in seen]
        words += new
        seen.update(new)
    vocab = Vocab(words)
    return vocab, [np.array([m.vocab.stoi.get(w, -1) for w in words], dtype=np.int64) for m in models]


def union_keys(models: Sequence[NGramModel], tables: list[np.ndarray], V: int) -> list[np.ndarray]:
    """Per order, the sorted keys of every n-gram some model lists, in the union's trie numbering. Each model
    lists the prefixes of what it lists (from_grams adds missing ones), so the union does too."""
    keys = [np.arange(V, dtype=np.int64)]
    words = [_inverse(t, len(m.vocab)) for m, t in zip(models, tables, strict=True)]  # its id -> union id
    to_union = list(words)  # per model: union id of each of its n-grams of the order below
    for k in range(2, max(m.order for m in models) + 1):
        parts = {i: to_union[i][m.keys[k - 1] // len(m.vocab)] * V + words[i][m.keys[k - 1] % len(m.vocab)]
                 for i, m in enumerate(models) if m.order >= k}  # (M_k^i,) union keys
        keys.append(np.unique(np.concatenate(list(parts.values()))))
        to_union = {i: np.searchsorted(keys[-1], part) for i, part in parts.items()}
    return keys


def _inverse(table: np.ndarray, size: int) -> np.ndarray:
    inv = np.empty(size, dtype=np.int64)  # (V_i,) every word of a model is a union word
    known = np.flatnonzero(table >= 0)
    inv[table[known]] = known
    return inv


def merge(components: Sequence[NGramModel], weights: Sequence[float]) -> Merged:
    """The merged back-off model of `components` with interpolation weights `weights` (positive, sum 1)."""
    lam = np.asarray(weights, dtype=np.float64)
    if len(components) < 2 or len(lam) != len(components) or np.any(lam <= 0) or abs(lam.sum() - 1) > 1e-6:
        raise SeqlmError("a merge needs two or more n-gram models and one positive weight each, summing to 1")
    vocab, tables = union_vocab(components)
    V, N = len(vocab), max(m.order for m in components)
    keys = union_keys(components, tables, V)
    walkers = [Walker(m, np.where(t >= 0, t, m.vocab.unk_id), m.order - 1)
               for m, t in zip(components, tables, strict=True)]
    merged = Walker(NGramModel(vocab, keys[:1], [np.zeros(V, np.float32)], []), np.arange(V), N - 1)
    probs, backoffs, index = [], [], [None]  # index: hash slots, so the merged model's lookups are probes
    for k in range(1, N + 1):
        p, lower = _order(k, keys, V, walkers, tables, lam, merged)
        if k == 1:
            p[vocab.bos_id] = 0.0  # <s> is only a context; log10 p 0, as lmplz writes it
        else:
            backoffs.append(_backoffs(keys[k - 1] // V, p, lower, len(keys[k - 2])))
            index.append(build_slots(keys[k - 1]) if k < N else None)
        probs.append(p)
        merged.model = NGramModel(vocab, keys[:k], probs, backoffs, index)
    return Merged(NGramModel(vocab, keys, probs, backoffs), tables)


def _order(k: int, keys: list[np.ndarray], V: int, walkers: list[Walker], tables: list[np.ndarray],
           lam: np.ndarray, merged: Walker) -> tuple[np.ndarray, np.ndarray]:
    """log10 p (float32) of the union's order-k n-grams, and (k >= 2) log10 P(w | prefix minus its first word)
    under the merged model of the orders below; each walker moves on to order k (the top order needs no ids)."""
    M, top = len(keys[k - 1]), k == len(keys)
    prob, lower = np.empty(M, np.float32), np.zeros(M)  # (M,)
    after = [np.empty((M, 0 if top else min(k, w.depth)), np.int64) for w in [*walkers, merged]]
    for a in range(0, M, CHUNK):
        key, rows = keys[k - 1][a : a + CHUNK], slice(a, a + CHUNK)  # (m,)
        prefix, word = (key // V, key % V) if k > 1 else (None, key)
        mixed = np.zeros(len(key))  # (m,) sum_i lambda_i P_i(w | prefix)
        for i, w in enumerate(walkers):
            logp, ids = w.extend(prefix, word, k)
            after[i][rows] = ids[:, : after[i].shape[1]]
            mixed += np.where(tables[i][word] >= 0, lam[i] * 10.0**logp, 0.0)  # 0 from a model lacking the word
        prob[rows] = np.log10(mixed)
        ids = key[:, None]  # (m, 1) the merged model's ids of the new n-grams' last j words, j = 1 .. k
        if k > 1:  # the merged model reads one word less: orders below k, back-offs below k - 1
            lower[rows], shorter = merged.extend(prefix, word, k - 1)
            ids = np.concatenate([shorter, a + np.arange(len(key))[:, None]], axis=1)
        after[-1][rows] = ids[:, : after[-1].shape[1]]
    for w, ids in zip([*walkers, merged], after, strict=True):
        w.ids = ids
    return prob, lower


def _backoffs(prefix: np.ndarray, prob: np.ndarray, lower: np.ndarray, contexts: int) -> np.ndarray:
    """log10 bo(c) for every context c of order k-1: bo(c) = (1 - sum_w P(w | c)) / (1 - sum_w P(w | c')),
    the sums over the words w listed after c, c' = c without its first word; a context with nothing listed
    after it gets bo 1. As in SRILM, a denominator that rounding leaves at zero (every word listed after c)
    gives bo 1: no word backs off."""
    num = 1.0 - np.bincount(prefix, 10.0 ** prob.astype(np.float64), minlength=contexts)  # (contexts,)
    den = 1.0 - np.bincount(prefix, 10.0**lower, minlength=contexts)  # (contexts,)
    gone = den < TINY
    return np.where(gone, 0.0, np.log10(np.maximum(num, TINY)) - np.log10(np.where(gone, 1.0, den))).astype(np.float32)


def heldout_log10(components: Sequence[NGramModel], tables: list[np.ndarray], stream: TokenStream
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(K, N) log10 p of each token of `stream` (union ids) under each component alone (a word it lacks read
    as its <unk>), and (K, N) whether the component has the predicted word at all (the merge's rule: it
    gives a word it lacks 0)."""
    ids = np.asarray(stream.ids, dtype=np.int64)
    alone, has = [], []
    for m, t in zip(components, tables, strict=True):
        own = TokenStream(np.where(t >= 0, t, m.vocab.unk_id)[ids], np.asarray(stream.starts))
        alone.append(NGramQuery(m).score_corpus(own).log10_prob)
        has.append(t[ids] >= 0)
    return np.stack(alone), np.stack(has)


def check_components(components: Sequence[NGramModel], names: Sequence[str]) -> None:
    """Components of a merge are n-gram models that read text alike (vocabularies may differ)."""
    for m, name in zip(components, names, strict=True):
        if not isinstance(m, NGramModel):
            raise SeqlmError(f"{name} is a {getattr(m, 'family', type(m).__name__)} model: --arpa-out merges n-gram "
                             "models (kn directories, ARPA or seqlm binary files); use --out DIR for a dynamic "
                             "mixture of any models")
        if not m.text_spec().same_reading(components[0].text_spec()):
            raise SeqlmError(f"{name} reads {m.text_spec().describe()}, {names[0]} reads "
                             f"{components[0].text_spec().describe()}: models merged must read text alike")
