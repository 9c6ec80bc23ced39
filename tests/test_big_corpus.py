"""bench/big_corpus.py: the sampled corpus is a function of its recipe, and its words come from the model.

References: a second build of the same recipe (bytes), the model's own next-word distribution
(seqlm.eval.distribution, an independent vectorised path) for the sampler's draws, and the model's
listed n-grams for what lands in the text.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np

from conftest import ROOT, write_chain_corpus

sys.path.insert(0, str(ROOT / "bench"))

import big_corpus as bc  # noqa: E402
from seqlm.eval.distribution import next_distribution  # noqa: E402


def _recipe(src, seed=0):
    return bc.recipe(3000, order=3, seed=seed, streams=48, max_len=12, burn_in_steps=3, source=src,
                     heldout_tokens=300)


def _md5s(d):
    return {n: hashlib.md5((d / f"{n}.txt").read_bytes()).hexdigest() for n in ("train", "valid", "test")}


def test_same_recipe_same_bytes_and_the_splits_hold_their_sizes(tmp_path):
    src = write_chain_corpus(tmp_path / "src") / "train.txt"
    a = bc.build(_recipe(src), tmp_path / "a")
    bc.build(_recipe(src), tmp_path / "b")
    other = bc.build(_recipe(src, seed=1), tmp_path / "c")
    assert _md5s(tmp_path / "a") == _md5s(tmp_path / "b")
    assert _md5s(tmp_path / "a")["train"] != _md5s(tmp_path / "c")["train"]
    for info, d in ((a, tmp_path / "a"), (other, tmp_path / "c")):
        for split, want in (("valid", 300), ("test", 300), ("train", 3000)):
            lines = (d / f"{split}.txt").read_text().splitlines()
            tokens = sum(len(s.split()) + 1 for s in lines)
            assert tokens == info["split_tokens"][split]
            assert want <= tokens < want + 13  # one sentence (at most max_len + 1 tokens) past the target
            assert all(line.strip() and len(line.split()) <= 12 for line in lines)


def test_the_texts_bigram_statistics_are_the_models(tmp_path):
    src = write_chain_corpus(tmp_path / "src") / "train.txt"
    r = bc.recipe(40_000, order=2, seed=0, streams=64, max_len=30, burn_in_steps=3, source=src, heldout_tokens=10)
    bc.build(r, tmp_path / "a")
    model = bc.source_model(src, 2)
    vocab = model.vocab
    V = len(vocab)
    counts = np.zeros((V, V))  # (V, V) bigram counts of the written text, <s> and </s> included
    for line in (tmp_path / "a" / "train.txt").read_text().splitlines():
        ids = [vocab.bos_id, *(vocab.stoi[w] for w in line.split()), vocab.eos_id]
        np.add.at(counts, (ids[:-1], ids[1:]), 1)
    p = 10.0 ** next_distribution(model, [[w] for w in range(V)])  # (V, V) p(w | previous word)
    assert (p[counts > 0] > 0).all()  # every sampled bigram has nonzero probability under the model
    for w in ("the", "cat", "mat", "red"):  # frequent contexts: their empirical next-word distribution
        row = counts[vocab.stoi[w]]
        q = p[vocab.stoi[w]].copy()
        q[[vocab.unk_id, vocab.bos_id]] = 0.0
        assert row.sum() > 1500
        assert 0.5 * np.abs(row / row.sum() - q / q.sum()).sum() < 0.05, w  # noise ~ sqrt(V / n) / 2


def test_draws_follow_the_models_next_word_distribution(tmp_path):
    src = write_chain_corpus(tmp_path / "src") / "train.txt"
    model = bc.source_model(src, 3)
    vocab = model.vocab
    rng = np.random.Generator(np.random.PCG64(0))
    sampler = bc.Sampler(model, rng, banned=(vocab.unk_id, vocab.bos_id))
    n = 60_000
    for history in ([], [vocab.stoi["the"]], [vocab.stoi["cat"], vocab.stoi["dog"]], [vocab.stoi["red"]] * 2):
        ctx = sampler.start(n)
        for w in history:
            ctx = sampler.advance(ctx, np.full(n, w))
        got = np.bincount(sampler.draw(ctx), minlength=len(vocab)) / n
        p = 10.0 ** next_distribution(model, [history])[0]  # (V,) the model's own distribution
        p[[vocab.unk_id, vocab.bos_id]] = 0.0
        p /= p.sum()
        assert 0.5 * np.abs(got - p).sum() < 0.015, history  # total variation; sampling noise is ~0.005
