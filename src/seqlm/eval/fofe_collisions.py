"""How often do FOFE codes of different sequences collide? (fofe-fnnlm.txt Sec. 2.1, Figure 2.)

A collision is two different sequences whose codes' largest element-wise difference (Chebyshev / max
norm) is below a threshold epsilon. The paper checks this two ways, and so does this module:

- `simulate`: every sequence over a small alphabet (Figure 2: 2 symbols, "all possible sequences up to
  T = 20 symbols ... out of the total 2^20 tested cases"). 2^20 cases is exactly the number of binary
  sequences of length T = 20, so by default every sequence has length exactly `max_len`
  (`lengths="all"` uses every length 1..max_len instead: 2^21 - 2 cases).
- `corpus_collisions`: every sentence prefix of a real corpus (Sec. 2.1 reports none on PTB for nine
  alphas in [0.55, 1.0] at epsilon = 0.01). This exact search does find some on PTB for alpha <= 0.9,
  nearly all between prefixes that share a long ending and differ only further back than
  log(epsilon) / log(alpha) words (e.g. "... contract rose N cents a pound to $ N" vs "advanced").

What is counted: the number of sequences (prefixes) involved in at least one collision, i.e. having
at least one other, different sequence within epsilon; the corpus check also counts colliding pairs.

Note on the simulation: with 2 symbols a length-T code (a, b) always has a + b = (1 - alpha^T)/(1 - alpha)
<= T, so the 2^T codes lie on a segment of length <= T, and at most T/epsilon + 1 of them can keep every
other code at distance >= epsilon. At T = 20 nearly all 2^20 sequences therefore collide at
epsilon = 0.01 whatever alpha is; only the small epsilons separate the alphas.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seqlm.checkpoint import atomic_path, atomic_write_text
from seqlm.outputs import claim_output, made_by_matplotlib

DEFAULT_ALPHAS = tuple(round(0.05 * k, 2) for k in range(1, 21))  # 0.05 .. 1.0
DEFAULT_EPSILONS = (0.01, 0.001, 0.0001)
CORPUS_ALPHAS = tuple(round(0.55 + 0.05 * k, 2) for k in range(10))  # 0.55 .. 1.0

# -----------------------------------------------------------------------------
# simulation over all sequences of a small alphabet


def all_codes(max_len: int, alpha: float, vocab: int = 2, lengths: str = "exact") -> np.ndarray:
    """FOFE codes of every sequence over `vocab` symbols: (N, vocab) float64.

    lengths="exact": the vocab^max_len sequences of length max_len; "all": every length 1..max_len.
    Built by doubling: codes of length L+1 are alpha * (codes of length L) + e_v for each symbol v.
    """
    if lengths not in ("exact", "all"):
        raise ValueError(f"lengths must be 'exact' or 'all', got {lengths!r}")
    eye = np.eye(vocab)
    level = eye.copy()  # (vocab, vocab): the length-1 sequences
    levels = [level]
    for _ in range(max_len - 1):
        level = (alpha * level[None, :, :] + eye[:, None, :]).reshape(-1, vocab)  # (vocab * n, vocab)
        levels.append(level)
    return level if lengths == "exact" else np.concatenate(levels)


def _expand(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ranges [starts[i], starts[i] + counts[i]): (which range, position) of every element."""
    which = np.repeat(np.arange(len(counts)), counts)
    first = np.cumsum(counts) - counts  # where each range begins in the flat output
    return which, starts[which] + np.arange(len(which)) - first[which]


def colliding(codes: np.ndarray, eps: float) -> np.ndarray:
    """Mask (N,) of the codes that have another code within max-norm distance < eps.

    Grid sweep, O(N log N) instead of O(N^2) pairs: cut space into cubes of side eps. Two codes in one
    cube differ by < eps in every element, so every code sharing a cube collides. A code alone in its
    cube can only collide with codes in the 3^K - 1 neighbouring cubes; those are checked exactly. Each
    cube neighbours at most 3^K - 1 others, so this checks at most (3^K - 1) * N pairs, K = codes.shape[1].
    """
    N, K = codes.shape
    if N < 2:
        return np.zeros(N, dtype=bool)
    cell = np.floor(codes / eps).astype(np.int64)  # (N, K)
    cell -= cell.min(axis=0) - 1  # >= 1, so a neighbour at -1 stays >= 0
    radix = cell.max(axis=0) + 2
    if np.prod(radix.astype(float)) >= 2**62:
        raise ValueError("grid too fine to index with int64; use a larger epsilon or fewer symbols")
    strides = np.cumprod(np.concatenate([[1], radix[:-1]])).astype(np.int64)  # mixed radix
    key = cell @ strides  # (N,) cube id
    order = np.argsort(key, kind="stable")
    skey = key[order]
    ukey, ustart, ucount = np.unique(skey, return_index=True, return_counts=True)
    hit = np.zeros(N, dtype=bool)
    hit[order] = np.repeat(ucount >= 2, ucount)  # shared cube: collides
    lone = order[np.repeat(ucount == 1, ucount)]  # ids of codes alone in their cube
    for off in itertools.product((-1, 0, 1), repeat=K):
        if not any(off) or lone.size == 0:
            continue
        nkey = key[lone] + np.asarray(off, dtype=np.int64) @ strides
        u = np.searchsorted(ukey, nkey)
        found = (u < len(ukey)) & (ukey[np.minimum(u, len(ukey) - 1)] == nkey)
        qi, pos = _expand(ustart[u[found]], ucount[u[found]])
        q = lone[found][qi]  # a lone code ...
        p = order[pos]  # ... and one code of a neighbouring cube
        close = np.abs(codes[q] - codes[p]).max(axis=1) < eps
        hit[q[close]] = True
    return hit


def simulate(
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    max_len: int = 20,
    vocab: int = 2,
    lengths: str = "exact",
) -> dict:
    """Figure 2: for each epsilon and alpha, how many of all sequences collide with another one.

    Every sequence over `vocab` symbols (of length exactly max_len, or 1..max_len with lengths="all")
    is encoded; `collisions[str(eps)][i]` is the number of them that have a different sequence within
    max-norm distance < eps at alphas[i]. Sequences are all distinct, so identical codes count.
    """
    t0 = time.perf_counter()
    counts: dict[str, list[int]] = {str(e): [] for e in epsilons}
    n = 0
    for alpha in alphas:
        codes = all_codes(max_len, float(alpha), vocab, lengths)
        n = len(codes)
        for e in epsilons:
            counts[str(e)].append(int(colliding(codes, float(e)).sum()))
    return {
        "alphas": [float(a) for a in alphas],
        "epsilons": [float(e) for e in epsilons],
        "max_len": max_len,
        "vocab": vocab,
        "lengths": lengths,
        "n_sequences": n,
        "counted": "sequences with at least one other sequence within max-norm < epsilon",
        "collisions": counts,
        "seconds": round(time.perf_counter() - t0, 3),
    }


# -----------------------------------------------------------------------------
# collisions among the sentence prefixes of a corpus


class _PrefixTrie:
    """Every distinct sentence prefix (history) of a corpus, as a trie: node 0 = the empty prefix.

    Duplicated histories ("the" opening thousands of sentences) become one node with a multiplicity,
    so repeats of the same token sequence can never be counted as collisions.
    """

    def __init__(self, sentences: Sequence[np.ndarray], vocab_size: int):
        V = vocab_size
        lens = np.array([len(s) for s in sentences], dtype=np.int64)
        flat = np.concatenate([np.asarray(s, dtype=np.int64) for s in sentences] + [np.zeros(0, np.int64)])
        by_len = np.argsort(-lens, kind="stable")  # longest first: the active sentences are a prefix
        starts = (np.cumsum(lens) - lens)[by_len]
        n_active = np.searchsorted(-lens[by_len], -np.arange(int(lens.max(initial=0))), "left")  # lens > t
        parent, last, mult = [np.array([-1])], [np.array([-1])], [np.array([0])]
        node = np.zeros(len(lens), dtype=np.int64)  # current prefix node of every sentence (by_len order)
        n_nodes = 1
        for t, n in enumerate(n_active):
            keys = node[:n] * V + flat[starts[:n] + t]
            ukeys, inv, cnt = np.unique(keys, return_inverse=True, return_counts=True)
            parent.append(ukeys // V)
            last.append(ukeys % V)
            mult.append(cnt)
            node[:n] = n_nodes + inv
            n_nodes += len(ukeys)
        self.parent = np.concatenate(parent)  # (U,) node id of the prefix minus its last word
        self.last = np.concatenate(last)  # (U,) last word of each prefix
        self.mult = np.concatenate(mult)  # (U,) how often each prefix occurs in the corpus
        self.n_nodes = n_nodes
        self.V = V
        self._build_code_pattern()

    def _build_code_pattern(self) -> None:
        """Sparse (CSR) layout of all prefix codes, independent of alpha: entry = (prefix, word, distances).

        The code of prefix h is sum over its words of alpha^distance; entries of one (h, word) are
        summed by `codes(alpha)`, so this costs one sort for all alphas. Memory grows with the summed
        prefix lengths, ~ sum of len^2 / 2 over sentences (PTB: ~13M entries).
        """
        rows, cols, dist = [], [], []
        h = np.arange(1, self.n_nodes)
        cur, d = h.copy(), 0
        while cur.size:
            rows.append(h)
            cols.append(self.last[cur])
            dist.append(np.full(cur.size, d, dtype=np.int32))
            cur = self.parent[cur]
            keep = cur > 0
            h, cur, d = h[keep], cur[keep], d + 1
        rows, cols, dist = np.concatenate(rows), np.concatenate(cols), np.concatenate(dist)
        order = np.argsort(rows * self.V + cols, kind="stable")
        rows, cols, self._dist = rows[order], cols[order], dist[order]
        new = np.ones(len(rows), dtype=bool)
        new[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
        self._seg = np.flatnonzero(new)  # first raw entry of each (row, col)
        self.indices = cols[self._seg]  # (nnz,) word of each stored element
        self.indptr = np.concatenate([[0], np.cumsum(np.bincount(rows[self._seg], minlength=self.n_nodes))])
        # Position of every prefix's own last word in its row (the element that is >= 1).
        r = np.repeat(np.arange(self.n_nodes), np.diff(self.indptr))
        own = self.indices == self.last[r]
        self.own = np.full(self.n_nodes, -1, dtype=np.int64)
        self.own[r[own]] = np.flatnonzero(own)

    def codes(self, alpha: float) -> np.ndarray:
        """CSR data (nnz,) of all prefix codes at this alpha (layout: self.indptr, self.indices)."""
        return np.add.reduceat(np.power(alpha, self._dist.astype(np.float64)), self._seg)

    def words(self, node: int) -> list[int]:
        out = []
        while node > 0:
            out.append(int(self.last[node]))
            node = int(self.parent[node])
        return out[::-1]

    def suffix_levels(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """For m = 0, 1, ...: the prefixes h that share their last m words with another prefix.

        Level m holds (h, g, p): g numbers the distinct length-m suffixes s, p is h with s removed
        (its "parent at depth m", 0 when h = s). Two different prefixes h, h' have one longest common
        suffix length m, and there p, p' end in different words (or one is empty); since
        z_h - z_h' = alpha^m (z_p - z_p'), they collide iff |z_p - z_p'|_max < epsilon / alpha^m.
        Prefixes whose suffix group shrinks to one member are dropped: they have no partner deeper.
        """
        levels = []
        h = np.arange(1, self.n_nodes)
        g = np.zeros(h.size, dtype=np.int64)
        p = h.copy()
        while h.size:
            levels.append((h, g, p))
            lab = self.last[p]
            keep = p > 0  # h longer than the suffix: it goes one word deeper
            h, g, p, lab = h[keep], g[keep], self.parent[p[keep]], lab[keep]
            _, g, cnt = np.unique(g * self.V + lab, return_inverse=True, return_counts=True)
            keep = cnt[g] >= 2
            h, g, p = h[keep], g[keep], p[keep]
        return levels


def _max_diff(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    chunk: int = 200_000,
) -> np.ndarray:
    """Exact max-norm distance between the non-empty sparse rows a[i] and b[i] of one CSR matrix."""
    out = np.empty(len(a), dtype=np.float64)
    ncol = int(indices.max(initial=0)) + 1
    for s in range(0, len(a), chunk):
        ra, rb = a[s : s + chunk], b[s : s + chunk]
        ia, ja = _expand(indptr[ra], indptr[ra + 1] - indptr[ra])
        ib, jb = _expand(indptr[rb], indptr[rb + 1] - indptr[rb])
        pair = np.concatenate([ia, ib])
        col = np.concatenate([indices[ja], indices[jb]]).astype(np.int64)
        val = np.concatenate([data[ja], -data[jb]])
        order = np.argsort(pair * ncol + col, kind="stable")  # group by pair, then word
        pair, col, val = pair[order], col[order], val[order]
        new = np.ones(len(pair), dtype=bool)
        new[1:] = (pair[1:] != pair[:-1]) | (col[1:] != col[:-1])
        seg = np.flatnonzero(new)
        diff = np.abs(np.add.reduceat(val, seg))  # |z_a[w] - z_b[w]| for every word w of either row
        first = np.ones(len(seg), dtype=bool)
        first[1:] = pair[seg[1:]] != pair[seg[:-1]]
        out[s : s + len(ra)] = np.maximum.reduceat(diff, np.flatnonzero(first))  # every pair has entries
    return out


def _heavy_candidates(
    trie: _PrefixTrie, data: np.ndarray, h: np.ndarray, g: np.ndarray, p: np.ndarray, tau: float
) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pairs among one level's prefixes whose parents p must be within tau <= 1 (see below).

    p ends in word a, p' in word b != a (an empty parent is > tau away from any other, since every
    non-empty code has an element >= 1). Then |z_p - z_p'| < tau needs z_p'[a] > z_p[a] - tau >= 1 - tau
    and z_p[b] > 1 - tau: each parent must hold the other's last word as a "heavy" element. So emit one
    point per (prefix, heavy word b) keyed by (suffix group, {a, b}) at coordinates (z[min], z[max]),
    and pair points from the two sides of a key whose coordinates are within tau (a 2-D grid of side
    tau, 3 x 3 neighbouring cells): a necessary condition only, the caller verifies exactly.
    """
    nonempty = p > 0
    h, g, p = h[nonempty], g[nonempty], p[nonempty]
    tau = tau * (1 + 1e-9) + 1e-12  # slack: the caller's exact check on z_h decides, not round-off here
    a = trie.last[p]
    za = data[trie.own[p]]  # z_p[a] >= 1
    which, pos = _expand(trie.indptr[p], np.diff(trie.indptr)[p])
    b, zb = trie.indices[pos], data[pos]
    heavy = (zb > 1.0 - tau) & (b != a[which])
    which, b, zb = which[heavy], b[heavy], zb[heavy]
    if which.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    a, za, hh, gg = a[which], za[which], h[which], g[which]
    side = a > b  # side 0: a < b; side 1: a > b; coordinates ordered (z[min word], z[max word])
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    x = np.where(side, zb, za)
    y = np.where(side, za, zb)
    _, key = np.unique((gg * trie.V + lo) * trie.V + hi, return_inverse=True)
    cx, cy = np.floor(x / tau).astype(np.int64) + 1, np.floor(y / tau).astype(np.int64) + 1
    nx, ny = int(cx.max()) + 2, int(cy.max()) + 2
    fine = (key * nx + cx) * ny + cy
    s1 = np.flatnonzero(side)
    s1 = s1[np.argsort(fine[s1], kind="stable")]
    f1 = fine[s1]
    s0 = np.flatnonzero(~side)
    out_a, out_b = [], []
    for dx, dy in itertools.product((-1, 0, 1), repeat=2):
        target = fine[s0] + dx * ny + dy
        lo_i, hi_i = np.searchsorted(f1, target, "left"), np.searchsorted(f1, target, "right")
        qi, pos1 = _expand(lo_i, hi_i - lo_i)
        i0, i1 = s0[qi], s1[pos1]
        close = (np.abs(x[i0] - x[i1]) < tau) & (np.abs(y[i0] - y[i1]) < tau)
        out_a.append(hh[i0[close]])
        out_b.append(hh[i1[close]])
    return np.concatenate(out_a), np.concatenate(out_b)


def _pairs_within(group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All index pairs i < j with group[i] == group[j], for a sorted (contiguous) group array."""
    n = len(group)
    end = np.searchsorted(group, group, "right")  # (n,) one past each member's group
    i, j = _expand(np.arange(1, n + 1), end - np.arange(1, n + 1))
    return i, j


def _cross_pairs(
    trie: _PrefixTrie, h: np.ndarray, g: np.ndarray, p: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every pair within a suffix group whose parents end in different words (or one is empty)."""
    lab = np.where(p > 0, trie.last[p], -1)
    order = np.argsort(g, kind="stable")
    h, g, lab = h[order], g[order], lab[order]
    i, j = _pairs_within(g)
    keep = lab[i] != lab[j]
    return h[i[keep]], h[j[keep]]


def corpus_collisions(
    sentences: Sequence[np.ndarray],
    vocab_size: int,
    alphas: Sequence[float] = CORPUS_ALPHAS,
    epsilon: float = 0.01,
    max_prefixes: int | None = None,
    max_examples: int = 5,
) -> dict:
    """Collisions among the FOFE codes of all sentence prefixes w_1..w_t of a corpus (Sec. 2.1).

    A collision is a pair of prefixes with different token sequences whose one-hot codes are within
    max-norm distance < epsilon; a history that occurs twice is one prefix, never a collision. FOFE
    restarts at every sentence, as in the paper's block-diagonal M. `max_prefixes` keeps only the first
    sentences, up to that many prefixes in total (the last one cut short).

    Exact, not sampled (float64 round-off aside): prefixes are grouped by their longest common suffix
    m (`_PrefixTrie.suffix_levels`); a pair with common suffix m collides iff its two parents are within
    tau = epsilon / alpha^m. While tau <= 1 a pair is only possible if the parents hold each other's last
    word with weight > 1 - tau, which `_heavy_candidates` turns into a 2-D grid join; for tau > 1 (a long
    shared suffix: alpha^m < epsilon) every cross pair in the group is checked. All candidates are
    verified with the exact sparse max-norm distance of the two prefix codes. alpha = 1 (codes = word
    counts, so a collision is the same bag of words) is handled by hashing codes, for epsilon <= 1.
    Cost is dominated by the checked pairs: fine for the paper's alpha >= 0.55 (PTB: seconds per
    alpha), but a small alpha makes every pair sharing a short suffix collide, which is quadratic.

    Returns per alpha: colliding pairs, distinct prefixes involved, corpus positions involved (prefixes
    weighted by how often they occur), a few example pairs (as id lists) and the seconds taken.
    """
    if not all(0.0 < a <= 1.0 for a in alphas):
        raise ValueError(f"corpus_collisions needs 0 < alpha <= 1, got {list(alphas)}")
    if max_prefixes is not None:
        kept, total = [], 0
        for s in sentences:
            if total >= max_prefixes:
                break
            kept.append(np.asarray(s, dtype=np.int64)[: max_prefixes - total])
            total += len(kept[-1])
        sentences = kept
    t0 = time.perf_counter()
    trie = _PrefixTrie([np.asarray(s, dtype=np.int64) for s in sentences], vocab_size)
    levels = trie.suffix_levels()
    setup = time.perf_counter() - t0
    results = []
    for alpha in alphas:
        t1 = time.perf_counter()
        alpha = float(alpha)
        data = trie.codes(alpha)
        if alpha == 1.0:
            ha, hb = _equal_code_pairs(trie, data, epsilon)
        else:
            found_a, found_b = [], []
            for m, (h, g, p) in enumerate(levels):
                tau = epsilon / alpha**m if alpha**m > 0 else np.inf
                if tau < 1.0 - 1e-9:  # (at tau = 1 an empty parent is a boundary case: check all)
                    ca, cb = _heavy_candidates(trie, data, h, g, p, tau)
                else:
                    ca, cb = _cross_pairs(trie, h, g, p)
                close = _max_diff(trie.indptr, trie.indices, data, ca, cb) < epsilon
                found_a.append(ca[close])
                found_b.append(cb[close])
            ha, hb = np.concatenate(found_a), np.concatenate(found_b)
        involved = np.unique(np.concatenate([ha, hb]))
        results.append(
            {
                "alpha": alpha,
                "collision_pairs": int(len(ha)),
                "prefixes_involved": int(len(involved)),
                "positions_involved": int(trie.mult[involved].sum()),
                "examples": [[trie.words(int(x)), trie.words(int(y))] for x, y in zip(ha, hb[:max_examples])],
                "seconds": round(time.perf_counter() - t1, 3),
            }
        )
    return {
        "epsilon": float(epsilon),
        "n_sentences": len(sentences),
        "n_prefixes": int(trie.mult[1:].sum()),
        "n_distinct_prefixes": trie.n_nodes - 1,
        "setup_seconds": round(setup, 3),
        "results": results,
    }


def _equal_code_pairs(trie: _PrefixTrie, data: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """alpha = 1: codes are integer word counts, so for epsilon <= 1 collisions are exactly equal codes."""
    if epsilon > 1.0:
        raise ValueError("alpha = 1 is supported for epsilon <= 1 only (codes are integer counts)")
    rng = np.random.default_rng(0)
    counts = np.rint(data).astype(np.uint64)
    hashes = []
    for _ in range(2):  # two independent 64-bit linear hashes of each count vector (wrapping uint64)
        r = rng.integers(1, 2**63, size=trie.V, dtype=np.uint64)
        hashes.append(np.add.reduceat(counts * r[trie.indices], trie.indptr[1:-1]))  # rows 1.., non-empty
    order = np.lexsort(hashes[::-1])
    h1, h2 = hashes[0][order], hashes[1][order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1])
    i, j = _pairs_within(np.cumsum(new))
    a, b = order[i] + 1, order[j] + 1  # node ids (row 0, the empty prefix, was left out)
    close = _max_diff(trie.indptr, trie.indices, data, a, b) < epsilon  # hash hits are verified too
    return a[close], b[close]


# -----------------------------------------------------------------------------
# plot and entry point


def plot(result: dict, path: str | Path) -> None:
    """PNG of collisions vs alpha, one line per epsilon, log y (zero counts leave gaps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = result.get("simulation", result)
    corpus = result.get("corpus")
    fig, axes = plt.subplots(1, 2 if corpus else 1, figsize=(11 if corpus else 6, 4.2), squeeze=False)
    ax = axes[0, 0]
    for eps, ys in sim["collisions"].items():
        y = np.array(ys, dtype=float)
        y[y <= 0] = np.nan
        ax.plot(sim["alphas"], y, marker="o", ms=3, label=f"eps = {eps}")
    ax.set_yscale("log")
    ax.set_xlabel("forgetting factor alpha")
    ax.set_ylabel("colliding sequences")
    T, lengths = sim["max_len"], sim["lengths"]
    ax.set_title(f"all {sim['n_sequences']} sequences, vocab {sim['vocab']}, T = {T} ({lengths})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if corpus:
        ax = axes[0, 1]
        al = [r["alpha"] for r in corpus["results"]]
        y = np.array([r["prefixes_involved"] for r in corpus["results"]], dtype=float)
        y[y <= 0] = np.nan
        ax.plot(al, y, marker="o", ms=3, label=f"eps = {corpus['epsilon']}")
        ax.set_yscale("log")
        ax.set_xlabel("forgetting factor alpha")
        ax.set_ylabel("colliding prefixes")
        ax.set_title(f"corpus: {corpus['n_prefixes']} prefixes (gaps = 0)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def read_corpus(path: str | Path) -> tuple[list[np.ndarray], list[str]]:
    """Whitespace-tokenised sentences, one per line, each closed by </s> (as the LMs read them)."""
    stoi: dict[str, int] = {"</s>": 0}
    sentences = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            toks = line.split()
            if toks:
                ids = [stoi.setdefault(w, len(stoi)) for w in toks] + [0]
                sentences.append(np.array(ids, dtype=np.int64))
    return sentences, list(stoi)


def run(
    alphas: Sequence[float] | None = None,
    epsilons: Sequence[float] | None = None,
    max_len: int = 20,
    corpus_path: str | Path | None = None,
    out_json: str | Path | None = None,
    out_png: str | Path | None = None,
    corpus_alphas: Sequence[float] | None = None,
    corpus_epsilon: float = 0.01,
    max_prefixes: int | None = None,
    force: bool = False,
) -> dict:
    """`seqlm fofe-collisions`: the simulation (and, given a corpus, the real-text check); JSON-ready.

    Corpus prefixes end at every token including each sentence's </s>, one prefix per corpus token.
    The outputs replace an earlier run's (they have default names), any other file only with `force`.
    """
    claim_output(out_json, force, "--out-json", ours=_our_json, inputs=[corpus_path])
    claim_output(out_png, force, "--out-png", ours=made_by_matplotlib, inputs=[corpus_path])
    alphas = DEFAULT_ALPHAS if alphas is None else alphas
    epsilons = DEFAULT_EPSILONS if epsilons is None else epsilons
    corpus_alphas = CORPUS_ALPHAS if corpus_alphas is None else corpus_alphas
    result: dict = {"simulation": simulate(alphas, epsilons, max_len)}
    if corpus_path is not None:
        sentences, itos = read_corpus(corpus_path)
        corpus = corpus_collisions(sentences, len(itos), corpus_alphas, corpus_epsilon, max_prefixes)
        for r in corpus["results"]:
            r["examples"] = [[" ".join(itos[i] for i in e) for e in pair] for pair in r["examples"]]
        corpus["path"] = str(corpus_path)
        result["corpus"] = corpus
    if out_json is not None:
        atomic_write_text(out_json, json.dumps(result, indent=2) + "\n")
    if out_png is not None:
        plot(result, out_png)
    return result


def _our_json(path: Path) -> bool:
    """The JSON an earlier run wrote: an object with its "simulation" counts."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(result, dict) and isinstance(result.get("simulation"), dict)
