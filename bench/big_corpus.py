"""A large synthetic corpus with real n-gram statistics: text sampled from a KN model of GCIDE.

Usage: python bench/big_corpus.py [--tokens 100000000] [--order 5] [--seed 0] [--streams 65536]
       (prints the corpus folder and its recipe; builds it when missing)

Recipe (recorded in OUT/recipe.json and in every bench row that uses the corpus):
- the model: seqlm's interpolated modified Kneser-Ney of order `order` (no pruning) on GCIDE's train
  split (/work/shared/data/gcide/train.txt.gz, 3.57M tokens, 114k words);
- `streams` sentences are sampled side by side, one numpy step per word for all of them: every step
  draws each stream's next word exactly from p(w | its last order-1 words) (see Sampler), a stream
  that draws </s> starts a new sentence from <s>. numpy's PCG64(seed) draws every random number, so
  the same recipe gives the same bytes;
- sentences completed in the first `burn_in_steps` steps are discarded: all streams start together,
  so the first sentences to complete are the short ones (without it valid.txt held 3.4-word sentences
  against train's 8.5); after the burn-in the streams' phases are mixed;
- <unk> is never drawn (a rejected draw, as the back-off exclusions) and empty sentences are dropped;
  a sentence reaching `max_len` words is closed there (counted in the recipe);
- sentences go, in the order they are completed (step, then stream), to valid.txt until it holds
  `heldout_tokens` tokens, then to test.txt, then to train.txt until it holds `tokens`. Tokens count
  words plus </s> (seqlm's and KenLM's perplexity convention). valid and test do not depend on
  `tokens`, and a smaller train.txt is a prefix of a larger one.
Cached in ~/.cache/seqlm/big-corpus/<recipe hash>/ ($SEQLM_CACHE/big-corpus when set), never committed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

GCIDE = Path(os.environ.get("SEQLM_DATA", "/work/shared/data")) / "gcide" / "train.txt.gz"
HELDOUT_TOKENS = 100_000  # valid and test, each
VERSION = 1  # bump when the sampling changes what a recipe produces


class Sampler:
    """Exact ancestral sampling from a back-off n-gram model, vectorised over many streams.

    p(w | h) = p_listed(h w) if h w is listed, else bo(h) p(w | h'), h' = h minus its first word. So:
    draw u ~ U(0, 1); if u falls in the listed mass S(h) of h's continuations, the word is the listed
    one that u lands on; otherwise draw from p(. | h') restricted to words NOT listed after h, by
    rejection (draw from h', redraw while the word is listed after h). Words listed after h are listed
    after h' too (KN keeps suffixes of seen n-grams), so a draw that falls through to shorter contexts
    satisfies every longer exclusion and only the exclusion one level up needs checking. bo(h) is never
    used: for a normalised model it equals (1 - S(h)) / (mass of h' on words not listed after h).
    """

    def __init__(self, model, rng: np.random.Generator, banned: tuple[int, ...]):
        self.m, self.rng, self.V, self.N = model, rng, len(model.vocab), model.order
        self.banned = np.array(banned, dtype=np.int64)
        uni = 10.0 ** model.log10_prob[0].astype(np.float64)
        uni[self.banned] = 0.0
        self.cum = [np.concatenate([[0.0], np.cumsum(uni)])]  # cum[k]: (M_k + 1,) running mass of order k+1
        self.first = [None]  # first[k]: (M_k + 1,) where each order-k context's continuations start
        for k in range(1, self.N):
            keys = model.keys[k]
            self.cum.append(np.concatenate([[0.0], np.cumsum(10.0 ** model.log10_prob[k].astype(np.float64))]))
            ctx = np.arange(len(model.keys[k - 1]) + 1, dtype=np.int64)
            self.first.append(np.searchsorted(keys, ctx * self.V))

    def start(self, B: int) -> np.ndarray:
        """(B, N-1) contexts at a sentence start: <s> at order 1, nothing longer."""
        ctx = np.full((B, self.N - 1), -1, dtype=np.int64)
        ctx[:, 0] = self.m.vocab.bos_id
        return ctx

    def draw(self, ctx: np.ndarray) -> np.ndarray:
        """(B,) next words for contexts ctx (B, N-1): ctx[:, k-1] the order-k id of the last k words."""
        B = len(ctx)
        word = np.full(B, -1, dtype=np.int64)
        excl = np.full(B, -1, dtype=np.int64)  # order-(k+1) context whose listed words are excluded at k
        here = np.arange(B)  # streams drawing at context length k
        for k in range(self.N - 1, -1, -1):
            fell = []
            while len(here):
                here, down = self._level(k, ctx, here, excl, word)
                fell.append(down)
            here = np.sort(np.concatenate(fell)) if fell else here
            if k > 0:
                excl[here] = ctx[here, k - 1]
        return word

    def _level(self, k: int, ctx: np.ndarray, todo: np.ndarray, excl: np.ndarray, word: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """One draw at context length k for streams `todo`: (streams to redraw here, streams falling to k-1)."""
        cum = self.cum[k]
        u = self.rng.random(len(todo))  # (T,)
        if k == 0:
            lo = np.zeros(len(todo), dtype=np.int64)
            hi = np.full(len(todo), len(cum) - 1)
            u *= cum[-1]
        else:
            c = ctx[todo, k - 1]  # (T,) order-k context ids, -1 = not listed
            lo = np.where(c >= 0, self.first[k][np.maximum(c, 0)], 0)
            hi = np.where(c >= 0, self.first[k][np.maximum(c, 0) + 1], 0)
        mass = cum[hi] - cum[lo]  # (T,) listed mass S(h)
        inside = u < mass
        at = np.searchsorted(cum, cum[lo[inside]] + u[inside], side="right") - 1  # (I,) entry drawn
        at = np.clip(at, lo[inside], hi[inside] - 1)
        w = self.m.keys[k][at] % self.V if k > 0 else at
        s = todo[inside]
        bad = np.isin(w, self.banned)
        if k + 1 < self.N:  # excluded: listed after the longer context this stream fell from
            e = excl[s]
            bad |= (e >= 0) & (self.m.find(k + 2, e, w) >= 0)
        word[s[~bad]] = w[~bad]
        return s[bad], todo[~inside]

    def advance(self, ctx: np.ndarray, word: np.ndarray) -> np.ndarray:
        """Contexts after each stream's word: order 1 is the word, order k+1 extends order k's id."""
        new = np.empty_like(ctx)
        new[:, 0] = word
        for k in range(1, self.N - 1):
            new[:, k] = self.m.find(k + 1, ctx[:, k - 1], word)
        return new


def source_model(path: Path, order: int):
    """seqlm's KN model of the source text (GCIDE train: in memory, ~10 s), the model sampled from."""
    from seqlm.data.corpus import build_vocab, encode_file
    from seqlm.models.kn import KNConfig, estimate_kn

    vocab = build_vocab(path)
    return estimate_kn(KNConfig(order=order), encode_file(path, vocab), vocab)


class Writer:
    """Completed sentences (ids, </s> excluded) to valid.txt, test.txt, then train.txt, as text."""

    def __init__(self, out: Path, itos: list[str], tokens: int, heldout: int):
        self.words = np.array([w + " " for w in itos] + ["\n"], dtype=object)  # last entry: sentence end
        self.eos = len(itos)
        self.plan = [("valid", heldout), ("test", heldout), ("train", tokens)]
        self.out, self.counts = out, {}
        self.file, self.left = None, 0

    def write(self, flat: np.ndarray, lengths: np.ndarray) -> bool:
        """Append sentences (their words laid end to end in flat); False once train.txt is full."""
        starts = np.concatenate([[0], np.cumsum(lengths)])  # (S+1,) into flat
        i = 0
        while i < len(lengths):
            if self.left <= 0 and not self._next_file():
                return False
            need = np.cumsum(lengths[i:] + 1)  # tokens with </s> from sentence i on
            j = i + min(int(np.searchsorted(need, self.left)) + 1, len(lengths) - i)  # i..j-1 fill this file
            seg = flat[starts[i] : starts[j]].astype(np.int64)
            marks = np.insert(seg, starts[i + 1 : j + 1] - starts[i], self.eos)  # </s> after each sentence
            self.file.write("".join(self.words[marks].tolist()).replace(" \n", "\n"))
            n = int(need[j - i - 1])
            self.left -= n
            self.counts[self.name] = self.counts.get(self.name, 0) + n
            i = j
        return self.left > 0 or bool(self.plan)

    def _next_file(self) -> bool:
        if self.file:
            self.file.close()
        if not self.plan:
            self.file = None
            return False
        self.name, self.left = self.plan.pop(0)
        self.file = open(self.out / f"{self.name}.txt", "w", encoding="utf-8")
        return True

    def close(self) -> None:
        if self.file:
            self.file.close()


def sample(model, writer: Writer, seed: int, streams: int, max_len: int, burn_in: int) -> dict:
    """Run the streams until the writer is full; counts of what happened on the way."""
    rng = np.random.Generator(np.random.PCG64(seed))
    vocab = model.vocab
    sampler = Sampler(model, rng, banned=(vocab.unk_id, vocab.bos_id))
    ctx = sampler.start(streams)  # (B, N-1)
    buf = np.zeros((streams, max_len), dtype=np.int32)  # (B, L) words of each stream's open sentence
    pos = np.zeros(streams, dtype=np.int64)  # (B,)
    steps = capped = empty = 0
    while True:
        word = sampler.draw(ctx)  # (B,)
        steps += 1
        ends = word == vocab.eos_id
        buf[np.flatnonzero(~ends), pos[~ends]] = word[~ends]
        pos[~ends] += 1
        full = pos >= max_len
        capped += int(np.count_nonzero(full & ~ends))
        closed = np.flatnonzero(ends | full)  # (C,) streams whose sentence is complete
        empty += int(np.count_nonzero(pos[closed] == 0))
        closed = closed[pos[closed] > 0]
        lengths = pos[closed]
        flat = buf[closed][np.arange(max_len)[None, :] < lengths[:, None]]  # (sum lengths,) row by row
        if steps > burn_in and len(closed) and not writer.write(flat, lengths):
            break
        reset = ends | full
        ctx = sampler.advance(ctx, word)
        ctx[reset] = sampler.start(int(reset.sum()))
        pos[reset] = 0
    return {"steps": steps, "draws": steps * streams, "capped_sentences": capped, "empty_sentences_dropped": empty}


def recipe(tokens: int, order: int = 5, seed: int = 0, streams: int = 65536, max_len: int = 256,
           burn_in_steps: int = 64, source: Path = GCIDE, heldout_tokens: int = HELDOUT_TOKENS) -> dict:
    return {"source": "seqlm KN (modified, interpolated, unpruned) on the source file", "source_file": str(source),
            "order": order, "seed": seed, "rng": "numpy PCG64", "streams": streams, "max_len": max_len,
            "burn_in_steps": burn_in_steps,
            "tokens": tokens, "heldout_tokens": heldout_tokens, "banned": ["<unk>", "<s>"], "version": VERSION}


def projected(r: dict, tokens: int, draws_per_s: float) -> float:
    """Sampling seconds for a `tokens` build at this rate: burn-in, held-out and train draws, and one
    more sentence per stream (~10 words) left unfinished at the end."""
    draws = r["burn_in_steps"] * r["streams"] + 2 * r["heldout_tokens"] + tokens + 10 * r["streams"]
    return draws / draws_per_s


def corpus_dir(r: dict) -> Path:
    cache = Path(os.environ.get("SEQLM_CACHE", Path.home() / ".cache" / "seqlm"))
    key = hashlib.sha1(json.dumps(r, sort_keys=True).encode()).hexdigest()[:12]
    return cache / "big-corpus" / f"{r['tokens']}-kn{r['order']}-{key}"


def build(r: dict, out: Path) -> dict:
    """Sample the corpus into out (a fresh folder); the recipe with its build figures."""
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    model = source_model(Path(r["source_file"]), r["order"])
    t1 = time.perf_counter()
    writer = Writer(out, model.vocab.itos, r["tokens"], r["heldout_tokens"])
    try:
        info = sample(model, writer, r["seed"], r["streams"], r["max_len"], r["burn_in_steps"])
    finally:
        writer.close()
    t2 = time.perf_counter()
    return {**r, **info, "split_tokens": writer.counts, "model_ngrams": model.sizes,
            "model_seconds": t1 - t0, "sample_seconds": t2 - t1, "build_seconds": t2 - t0,
            "sample_tokens_per_s": sum(writer.counts.values()) / (t2 - t1),
            "draws_per_s": info["draws"] / (t2 - t1),  # words drawn, burn-in and unfinished sentences included
            "projected_100m_sample_seconds": projected(r, 100_000_000, info["draws"] / (t2 - t1)),
            "bytes": {n: (out / f"{n}.txt").stat().st_size for n in writer.counts}}


def ensure(tokens: int, **kw) -> tuple[Path, dict]:
    """The corpus folder for this recipe (built when missing) and its recipe.json."""
    r = recipe(tokens, **kw)
    out = corpus_dir(r)
    meta = out / "recipe.json"
    if not meta.is_file():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        info = build(r, tmp)
        (tmp / "recipe.json").write_text(json.dumps(info, indent=1) + "\n")
        try:
            os.replace(tmp, out)  # whole or absent: a crashed build leaves only a .tmp folder
        except OSError:  # another process finished the same recipe first: same bytes, keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    return out, json.loads(meta.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=float, default=100e6, help="training tokens (words + </s>)")
    p.add_argument("--order", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--streams", type=int, default=65536, help="sentences sampled side by side")
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--burn-in-steps", type=int, default=64)
    a = p.parse_args()
    out, info = ensure(int(a.tokens), order=a.order, seed=a.seed, streams=a.streams, max_len=a.max_len,
                       burn_in_steps=a.burn_in_steps)
    print(out)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
