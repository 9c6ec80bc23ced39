"""A back-off n-gram model (ARPA semantics) behind seqlm's LanguageModel protocol.

Storage is trie-numbered (see counts.py): order k keeps its n-grams as sorted int64 keys
`prefix_id * V + last_word`, with float32 log10 probabilities and back-offs like KenLM. Every lookup
is one np.searchsorted over all positions at once, so scoring never loops over tokens in Python.

Scoring follows the ARPA back-off rule, which for an interpolated Kneser-Ney model gives exactly the
interpolated probability:
    p(w | h) = p_arpa(h w)                 if the n-gram h w is listed,
             = bo(h) * p(w | h minus its first word)   otherwise (bo = 1 when h is not listed).
Natural logs come out of `score` and `step` (the protocol); ARPA files hold log10.
"""

from __future__ import annotations

import math
import warnings
from bisect import bisect_left
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from seqlm.data.vocab import BOS, EOS, UNK, Vocab
from seqlm.errors import SeqlmError
from seqlm.ngram.advance import NGramTensors, shift_windows
from seqlm.ngram.arpa import ArpaData, read_arpa
from seqlm.ngram.arpa_write import write_arpa
from seqlm.ngram.index import FIB_INT, lookup, table_bits
from seqlm.protocol import Batch, Capabilities, LMBase, Prefixes

LN10 = math.log(10.0)
FROM_FILE = ("vocab", "order", "keys", "log10_prob", "log10_backoff", "index", "mapped_file")  # what read_binary sets
MASK64 = (1 << 64) - 1  # the hash probe multiplies modulo 2^64 (index.py)
UNK_LOG10_PROB = -100.0  # what KenLM substitutes when an ARPA file has no <unk>


def ngram_capabilities(order: int) -> Capabilities:
    """A finite-context model (lattices expand exactly) whose entries are lookups (advance_targets)."""
    return Capabilities(context_order=order, sparse_targets=True)


class NGramModel(LMBase):
    """Back-off n-gram tables of orders 1..N over `vocab` (which contains <s>, </s> and <unk>)."""

    # (path, binary.file_stamp) of the binary file whose read-only mapped pages the tables are (read_binary)
    mapped_file: tuple[str, tuple[int, int, int]] | None = None

    def __init__(
        self,
        vocab: Vocab,
        keys: list[np.ndarray],
        log10_prob: list[np.ndarray],
        log10_backoff: list[np.ndarray],
        index: list[np.ndarray | None] | None = None,
    ):
        if BOS not in vocab.stoi:
            raise SeqlmError(f"an n-gram model's vocabulary must contain {BOS}")
        if len(keys) != len(log10_prob) or len(log10_backoff) != len(keys) - 1 or len(keys[0]) != len(vocab):
            raise ValueError("n-gram tables do not match each other or the vocabulary")
        self.vocab = vocab
        self.order = len(keys)
        self.keys = [np.ascontiguousarray(k, dtype=np.int64) for k in keys]  # (M_k,) sorted
        self.log10_prob = [np.asarray(p, dtype=np.float32) for p in log10_prob]  # (M_k,)
        self.log10_backoff = [np.asarray(b, dtype=np.float32) for b in log10_backoff]  # (M_k,) k < N
        # hash slot tables per order (index.py), as the binary format stores them; None: binary search
        self.index = list(index) if index is not None else [None] * self.order
        self._tensors: dict[tuple, NGramTensors] = {}  # the tables on each (device, dtype) asked for

    def __repr__(self) -> str:
        return f"NGramModel(order={self.order}, sizes={self.sizes})"

    def __reduce_ex__(self, protocol):
        """A model mapped from a binary file pickles as that file: the receiving process (a spawned worker) maps
        it again, so all of them share its pages instead of each holding a copy; any other model pickles its
        arrays. Attributes set after loading (seqlm.load's family, config) travel with it; caches do not."""
        if self.mapped_file is None:
            return super().__reduce_ex__(protocol)
        kept = {k: v for k, v in vars(self).items() if not k.startswith("_") and k not in FROM_FILE}
        return _remap, (*self.mapped_file, kept)

    def __getstate__(self) -> dict:
        # memoryviews do not pickle, and the tensor tables (advance) are rebuilt where they are asked for
        return {k: v for k, v in vars(self).items() if k not in ("_views", "_tensors")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._tensors = {}

    def capabilities(self) -> Capabilities:
        return ngram_capabilities(self.order)

    def describe(self) -> dict:
        sizes = self.sizes  # an n-gram model's parameters: a probability per n-gram, a backoff below order N
        return {"order": len(sizes), "ngrams": {str(n): c for n, c in enumerate(sizes, 1)},
                "parameters": sum(sizes) + sum(sizes[:-1])}

    @property
    def sizes(self) -> list[int]:
        """Number of n-grams of each order, as in the ARPA header."""
        return [len(k) for k in self.keys]

    # ---- lookups -------------------------------------------------------------------------------

    def find(self, k: int, context: np.ndarray, words: np.ndarray) -> np.ndarray:
        """Id at order k of the n-gram (context, word), context an id at order k-1; -1 where absent.

        Any shape; context or word -1 means "none" and gives -1. At k = 1 the id is the word itself.
        """
        V = len(self.vocab)
        if k == 1:
            return np.where((words >= 0) & (words < V), words, -1)
        keys = self.keys[k - 1]
        if len(keys) == 0:
            return np.full(np.broadcast(context, words).shape, -1, dtype=np.int64)
        query = np.where((context >= 0) & (words >= 0), context * V + words, -1)  # (...) int64
        if self.index[k - 1] is not None:
            return lookup(self.index[k - 1], keys, query)
        at = np.minimum(np.searchsorted(keys, query), len(keys) - 1)  # (...)
        return np.where((context >= 0) & (words >= 0) & (keys[at] == query), at, -1)

    def context_ids(self, inputs: np.ndarray, starts: np.ndarray) -> list[np.ndarray]:
        """ids[k-1][b, t]: id at order k of the k inputs ending at t, -1 if they cross a sentence start.

        inputs (B, T) int64 (-1 = none), starts (B, T) bool. The k-gram ending at t extends the
        (k-1)-gram ending at t-1 by one word, so each order is one lookup over all positions.
        """
        if self.order == 1:
            return []
        ids = [self.find(1, inputs, inputs)]  # (B, T)
        for k in range(2, self.order):
            prev = np.full_like(inputs, -1)  # (B, T) the (k-1)-gram ending one position earlier
            prev[:, 1:] = ids[-1][:, :-1]
            prev[starts] = -1
            ids.append(self.find(k, prev, inputs))
        return ids

    def log10_score(self, inputs: np.ndarray, starts: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """(B, T) float64 log10 p(target | inputs so far), walking from the unigram up to the full context."""
        return self.walk(inputs, starts, targets)[0]

    def walk(self, inputs: np.ndarray, starts: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, T) log10 p(target | inputs so far) and the length of the longest n-gram matched (KenLM's).

        Each order is one lookup over all positions. When every input repeats the previous target (any
        sentence batch), the (k+1)-gram ending at target t is the context of order k+1 at t+1, so the
        contexts come free with the hits: N-1 lookups instead of 2(N-1).
        """
        logp = self.log10_prob[0][np.clip(targets, 0, len(self.vocab) - 1)].astype(np.float64)  # (B, T)
        length = np.ones(targets.shape, dtype=np.int64)  # (B, T)
        chained = np.array_equal(inputs[:, 1:][~starts[:, 1:]], targets[:, :-1][~starts[:, 1:]])
        ctx = self.find(1, inputs, inputs) if self.order > 1 else None  # (B, T) ids at order 1
        for k in range(1, self.order):  # ctx: (B, T) ids at order k of the k inputs ending at t
            bo = _take(self.log10_backoff[k - 1], ctx, 0.0)  # (B, T)
            hit = self.find(k + 1, ctx, targets)  # (B, T)
            logp = np.where(hit >= 0, _take(self.log10_prob[k], hit, 0.0), logp + bo)
            length = np.where(hit >= 0, k + 1, length)
            if k + 1 < self.order:
                prev = np.full_like(inputs, -1)  # (B, T) the order-k context one position earlier
                prev[:, 1:] = hit[:, :-1] if chained else ctx[:, :-1]
                if not chained:
                    prev[:, 1:] = self.find(k + 1, prev[:, 1:], inputs[:, 1:])
                prev[starts] = -1
                ctx = prev
        return logp, length

    def score_word(self, context: tuple[int, ...], word: int) -> tuple[float, int, tuple[int, ...]]:
        """`walk` for one token, in Python scalars (a decoder's step, a single sentence): far less
        overhead than the array path on one token. context[k-1] is the id at order k of the k words
        before `word` (-1 = not listed), as walk chains them. Returns log10 p, the matched length and
        the context after `word`, cut to the matched length (KenLM's state minimisation).

        The hash probe (index.probe) is inlined: this loop is the per-token cost of full_scores."""
        V, unigram, views = self._scalar_views()
        logp, length = unigram[word], 1
        after = [word]
        for k, (c, (keys, probs, backoff, slots, shift)) in enumerate(zip(context, views), 1):  # c: order k
            hit = -1
            if c >= 0:
                q = c * V + word
                if slots is not None:
                    pos = ((q * FIB_INT) & MASK64) >> shift
                    hit = slots[pos]
                    while hit >= 0 and keys[hit] != q:
                        pos += 1
                        hit = slots[pos]
                else:
                    at = bisect_left(keys, q)
                    hit = at if at < len(keys) and keys[at] == q else -1
            if hit >= 0:
                logp, length = probs[hit], k + 1
            elif c >= 0:
                logp += backoff[c]
            after.append(hit)
        return logp, length, tuple(after[: min(length, self.order - 1)])

    def _scalar_views(self) -> tuple[int, memoryview, list[tuple]]:
        """V, the unigram log10 p, and per order k + 1 >= 2 memoryviews of its keys, log10 p, order k's
        back-off, its hash slots (or None) and the probe's shift (64 - table bits)."""
        if getattr(self, "_views", None) is None:
            def view(a):
                return memoryview(np.ascontiguousarray(a)) if a is not None else None

            self._views = len(self.vocab), view(self.log10_prob[0]), [
                (view(self.keys[k]), view(self.log10_prob[k]), view(self.log10_backoff[k - 1]),
                 view(self.index[k]), 64 - table_bits(len(self.keys[k])))
                for k in range(1, self.order)
            ]
        return self._views

    # ---- the LanguageModel protocol ------------------------------------------------------------

    def score(self, batch: Batch) -> Tensor:
        """(B, T) float64 natural-log probability of each target; 0 on padding.

        The context is `history(batch, order - 1)`: inputs back to the last reset, where the input is
        read as <s> whatever the batch holds there.
        """
        inputs = batch.inputs.cpu().numpy().astype(np.int64)  # (B, T)
        starts = batch.resets.cpu().numpy()  # (B, T)
        inputs = np.where(starts, self.vocab.bos_id, inputs)
        logp = self.log10_score(inputs, starts, batch.targets.cpu().numpy().astype(np.int64)) * LN10
        logp = torch.from_numpy(logp).to(batch.targets.device)
        return logp.masked_fill(~batch.mask, 0.0)

    def initial_state(self, batch_size: int) -> Tensor:
        """(B, N-1) the most recent inputs, oldest first; -1 = nothing read yet."""
        return torch.full((batch_size, self.order - 1), -1, dtype=torch.long)

    def step(self, tokens: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Read tokens (B,); return float32 natural logs of the next word (B, V) (<s>: -inf), new state."""
        read = self.extend(Prefixes(state), torch.arange(len(tokens)), tokens.cpu())
        return self.advance(read).to(tokens.device), read.state

    def advance(self, prefixes: Prefixes) -> Tensor:
        """(B, V) float32 ln p of the next word (<s>: -inf) after each window of the last N-1 words, on the
        window's device (ngram/advance.py); nothing read yet: no context, as KenLM's NullContextWrite."""
        window = prefixes.state  # (B, N-1)
        return self.tensors(window.device).advance(window)

    def advance_targets(self, prefixes: Prefixes, rows: Tensor, targets: Tensor) -> Tensor:
        """(N,) advance's ln p of targets[i] after prefix rows[i], each the longest listed n-gram's lookup."""
        window = prefixes.state.index_select(0, rows.to(prefixes.state.device))  # (N, N-1)
        return self.tensors(window.device).targets(window, targets)

    def extend(self, prefixes: Prefixes, rows: Tensor, tokens: Tensor) -> Prefixes:
        """The windows shifted by one word; no distribution is computed until `advance` asks for one."""
        return Prefixes(shift_windows(prefixes.state, rows, tokens))

    def tensors(self, device: torch.device, dtype: torch.dtype = torch.float32) -> NGramTensors:
        """The tables as tensors on `device`, natural logs in `dtype` (made on first use, then kept)."""
        if (device, dtype) not in self._tensors:
            self._tensors[device, dtype] = NGramTensors(self, device, dtype)
        return self._tensors[device, dtype]

    def log10_distribution(self, hist: np.ndarray) -> np.ndarray:
        """(B, V) float64 log10 p(w | hist) for every word w; hist (B, N-1), oldest first, -1 = none."""
        ctx_ids = self.context_ids(hist, np.zeros(hist.shape, dtype=bool))
        last = [ctx[:, -1] for ctx in ctx_ids]  # per order k: (B,) id at order k of the last k words
        return self.log10_distribution_after(np.stack(last, axis=1) if last else np.full((len(hist), 0), -1))

    def log10_distribution_after(self, ctx: np.ndarray) -> np.ndarray:
        """(B, V) float64 log10 p(w | context) for every word w, the context given by its ids: ctx (B, K),
        ctx[b, k-1] the id at order k of row b's last k words (-1 = not listed), as a decoder's State
        keeps them (seqlm.ngram.query). Per order, the context's back-off goes to every word and the
        n-grams continuing it (keys[lo:hi], contiguous in the trie) overwrite their words: score_word's
        walk for all words at once."""
        B, V = len(ctx), len(self.vocab)
        logp = np.tile(self.log10_prob[0].astype(np.float64), (B, 1))  # (B, V)
        for k in range(1, ctx.shape[1] + 1):
            c = ctx[:, k - 1]  # (B,)
            logp += _take(self.log10_backoff[k - 1], c, 0.0)[:, None]
            keys = self.keys[k]
            lo = np.searchsorted(keys, c * V)  # (B,) the n-grams continuing c are keys[lo:hi]
            hi = np.where(c >= 0, np.searchsorted(keys, (c + 1) * V), lo)  # (B,)
            n = hi - lo  # (B,)
            rows = np.repeat(np.arange(B), n)  # (E,)
            entry = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n - lo, n)  # (E,) indices into order k+1
            logp[rows, keys[entry] % V] = self.log10_prob[k][entry]
        return logp

    # ---- ARPA ----------------------------------------------------------------------------------

    def to_arpa(self, path: str | Path) -> None:
        """Write the model as an ARPA file (atomically; gzipped if the name ends .gz)."""
        write_arpa(path, self.vocab.itos, self.keys, self.log10_prob, self.log10_backoff)

    @classmethod
    def from_arpa(cls, path: str | Path) -> NGramModel:
        """Load an ARPA file written by seqlm, KenLM or SRILM."""
        return cls.from_grams(read_arpa(path), str(path))

    @classmethod
    def from_grams(cls, data: ArpaData, source: str = "ARPA file") -> NGramModel:
        """Build the trie-numbered tables from n-grams listed as word ids, in any order.

        An n-gram whose context (its first k-1 words) is not listed, as in some pruned SRILM files,
        gets that context added as a blank entry: probability = its back-off estimate, back-off 0.
        """
        for sym in (BOS, EOS):
            if sym not in data.tokens:
                raise SeqlmError(f"{source}: the unigrams lack {sym}; not a sentence-level ARPA model")
        if UNK not in data.tokens:
            warnings.warn(f"{source}: no {UNK} unigram; giving it log10 p {UNK_LOG10_PROB}", stacklevel=2)
            data = _with_unk(data)
        grams, probs, backoffs = list(data.grams), list(data.log10_prob), list(data.log10_backoff)
        V = len(data.tokens)
        keys, perms = [np.arange(V, dtype=np.int64)], [np.arange(V)]
        while len(keys) < len(grams):
            k = len(keys) + 1
            prefix, found = _row_ids(keys, V, grams[k - 1][:, :-1])  # (M_k,)
            if not found.all():  # add the missing contexts to order k-1 as blanks, then rebuild it
                missing = np.unique(grams[k - 1][~found, :-1], axis=0)  # (m, k-1)
                grams[k - 2] = np.concatenate([grams[k - 2], missing])
                probs[k - 2] = np.concatenate([probs[k - 2], np.full(len(missing), np.nan, np.float32)])
                backoffs[k - 2] = np.concatenate([backoffs[k - 2], np.zeros(len(missing), np.float32)])
                keys.pop()
                perms.pop()
                continue
            key = prefix * V + grams[k - 1][:, -1]  # (M_k,)
            perm = np.argsort(key, kind="stable")
            if np.any(np.diff(key[perm]) == 0):
                raise SeqlmError(f"{source}: a {k}-gram is listed twice; the ARPA file is corrupt")
            keys.append(key[perm])
            perms.append(perm)
        probs = [p[perm] for p, perm in zip(probs, perms, strict=True)]
        backoffs = [b[perm] for b, perm in zip(backoffs, perms[:-1], strict=True)]
        model = cls(Vocab(list(data.tokens)), keys, probs, backoffs)
        model._fill_blanks()
        return model

    def _fill_blanks(self) -> None:
        """Blank entries (NaN probability) get bo(context) * p(w | context minus its first word)."""
        V = len(self.vocab)
        for k in range(2, self.order + 1):  # lowest order first: a blank's estimate uses lower orders only
            blank = np.flatnonzero(np.isnan(self.log10_prob[k - 1]))  # (m,)
            if len(blank) == 0:
                continue
            words = self.words_of(k, blank)  # (m, k)
            if k == 2:
                shorter = self.log10_prob[0][words[:, 1]].astype(np.float64)  # (m,)
            else:
                seq = words[:, 1:]  # (m, k-1) score w_k after w_2 .. w_{k-1}
                no_starts = np.zeros((len(blank), k - 2), dtype=bool)
                shorter = self.log10_score(seq[:, :-1], no_starts, seq[:, 1:])[:, -1]  # (m,)
            context = self.keys[k - 1][blank] // V  # (m,)
            self.log10_prob[k - 1][blank] = shorter + self.log10_backoff[k - 2][context]

    def words_of(self, k: int, ids: np.ndarray) -> np.ndarray:
        """(m, k) the words of the order-k n-grams with the given ids."""
        V = len(self.vocab)
        cols = []
        for j in range(k, 1, -1):
            key = self.keys[j - 1][ids]  # (m,)
            cols.append(key % V)
            ids = key // V
        cols.append(ids)
        return np.stack(cols[::-1], axis=1)


def _remap(path: str, stamp: tuple[int, int, int], kept: dict) -> NGramModel:
    """NGramModel.__reduce_ex__'s other half: the same file mapped again, refused if it changed since."""
    from seqlm.ngram.binary import file_stamp, read_binary

    if file_stamp(path) != stamp:
        raise SeqlmError(f"{path}: the binary n-gram file changed (or went) since this model was pickled; load it "
                         "again")
    model = read_binary(path)
    vars(model).update(kept)
    return model


def _take(values: np.ndarray, ids: np.ndarray, default: float) -> np.ndarray:
    """values[ids] where ids >= 0, else `default` (also when an order has no entries at all)."""
    if len(values) == 0:
        return np.full(ids.shape, default)
    return np.where(ids >= 0, values[np.maximum(ids, 0)], default)


def _row_ids(keys: list[np.ndarray], V: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Id of each (m, j) row of word ids among the order-j keys built so far, and whether it is listed."""
    ids = rows[:, 0]  # (m,)
    found = np.ones(len(rows), dtype=bool)  # (m,)
    for j in range(2, rows.shape[1] + 1):
        query = ids * V + rows[:, j - 1]  # (m,)
        ids = np.minimum(np.searchsorted(keys[j - 1], query), max(len(keys[j - 1]) - 1, 0))
        found &= keys[j - 1][ids] == query if len(keys[j - 1]) else False
    return ids, found


def _with_unk(data: ArpaData) -> ArpaData:
    """Append <unk> as a unigram with KenLM's substitute probability."""
    tokens = data.tokens + [UNK]
    grams = [np.arange(len(tokens), dtype=np.int64)[:, None]] + data.grams[1:]
    prob = [np.append(data.log10_prob[0], np.float32(UNK_LOG10_PROB))] + data.log10_prob[1:]
    backoff = list(data.log10_backoff)
    if backoff:
        backoff[0] = np.append(backoff[0], np.float32(0.0))
    return ArpaData(tokens, grams, prob, backoff)
