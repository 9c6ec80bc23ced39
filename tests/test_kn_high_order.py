"""Kneser-Ney at order 20 (issue #41): a character model on a tiny corpus, checked against interpolated modified
Kneser-Ney written out by its definition (`BruteKN`, below) through every path that scores text: the model
in memory, `seqlm eval` and `seqlm score` on the saved directory, `seqlm query` with the compiled loops and with
their Python twins. Also eval's `ppl_per_word`, by hand, for a character and a word model of the same text.
"""

from __future__ import annotations

import io
import json
import math
import random
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

import seqlm
from seqlm.cli import main
from seqlm.config import DataConfig
from seqlm.data.corpus import build_vocab, encode_file
from seqlm.errors import SeqlmError
from seqlm.models.kn import KNConfig, estimate_kn
from seqlm.ngram.native import extension

from conftest import require_env

FALLBACK = (0.5, 1.0, 1.5)
SPECIALS = ("<s>", "</s>", "<unk>")


class BruteKN:
    """Interpolated modified Kneser-Ney by its definition (Chen & Goodman 1998, eq. 26 discounts) with lmplz's
    conventions, over dicts of n-gram tuples: no arrays, no tries, no back-off form.

    - sentences are `<s> w1 .. wn </s>`; an n-gram's adjusted count is its count at the highest order or when
      it starts with `<s>`, else the number of distinct words seen before it; `<s>` alone counts 0;
    - D1, D2, D3+ per order from n1..n4 of the adjusted counts; where one of n1..n3 is 0 or a discount falls
      outside [0, j], the fallback (lmplz's rule: n4 = 0 gives D3+ = 3);
    - p(w | h) = (a(hw) - D(a(hw))) / a(h.) + gamma(h) p(w | h minus its first word), gamma(h) the discounted
      mass over a(h.); a history never followed by anything passes to the shorter one; below the unigrams
      the uniform distribution over every word but `<s>`.

    `keep` (a word set) prunes as lmplz --limit_vocab_file: every word is counted as above, then an n-gram
    holding a word outside `keep` has no probability of its own (all its adjusted count goes to gamma), and
    the uniform floor covers the kept words only.
    """

    def __init__(self, sentences: list[list[str]], order: int, keep: set[str] | None = None):
        self.order = order
        padded = [["<s>", *s, "</s>"] for s in sentences]
        raw = Counter(tuple(p[i : i + k]) for p in padded for k in range(1, order + 1) for i in range(len(p) - k + 1))
        seen = {w for p in padded for w in p} | {"<unk>"}
        self.words = seen if keep is None else seen & (set(keep) | set(SPECIALS))  # what it predicts, and <s>
        before: dict[tuple, set] = defaultdict(set)
        for g in raw:
            before[g[1:]].add(g[0])
        adjusted = {g: c if len(g) == order or g[0] == "<s>" else len(before[g]) for g, c in raw.items()}
        adjusted[("<s>",)] = 0
        discount = {k: self.discounts([a for g, a in adjusted.items() if len(g) == k]) for k in range(1, order + 1)}
        self.total: dict[tuple, float] = defaultdict(float)  # a(h.)
        self.mass: dict[tuple, float] = defaultdict(float)  # what goes to the shorter history, before / a(h.)
        self.kept: dict[tuple, float] = {}  # a(hw) - D, for the n-grams that keep a probability of their own
        for g, a in adjusted.items():
            d = discount[len(g)][min(a, 3)]
            self.total[g[:-1]] += a
            if any(w not in self.words for w in g):
                self.mass[g[:-1]] += a
            else:
                self.mass[g[:-1]] += d
                self.kept[g] = a - d

    @staticmethod
    def discounts(adjusted: list[int]) -> tuple[float, ...]:
        n = [sum(1 for a in adjusted if a == j) for j in (1, 2, 3, 4)]
        if all(n[:3]):
            y = n[0] / (n[0] + 2 * n[1])
            d = [j - (j + 1) * y * n[j] / n[j - 1] for j in (1, 2, 3)]
            if all(0 <= dj <= j for j, dj in zip((1, 2, 3), d)):
                return (0.0, *d)
        return (0.0, *FALLBACK)

    def prob(self, word: str, history: tuple[str, ...]) -> float:
        history = history[max(len(history) - (self.order - 1), 0) :] if self.order > 1 else ()
        if history and not self.total.get(history):
            return self.prob(word, history[1:])
        lower = 1.0 / (len(self.words) - 1) if not history else self.prob(word, history[1:])
        t = self.total[history]
        return self.kept.get((*history, word), 0.0) / t + self.mass[history] / t * lower

    def sentence_log10(self, words: list[str]) -> list[float]:
        """log10 p of each word (one outside the vocabulary read as <unk>) and of </s>, from <s>."""
        ids = [w if w in self.words else "<unk>" for w in words] + ["</s>"]
        return [math.log10(self.prob(w, ("<s>", *ids[:i]))) for i, w in enumerate(ids)]


PHRASES = ["the cat sat on the mat", "a dog ran to the cat", "the dog sat", "on a mat", "cat and dog ran"]


def char_corpus(d: Path, seed: int = 0) -> tuple[Path, Path]:
    """Lines of a few phrases each: whole phrases repeat, so even 20-character n-grams recur and follow
    contexts seen before. The test lines hold a character never trained on (z)."""
    rng = random.Random(seed)
    d.mkdir(parents=True, exist_ok=True)
    lines = [" ".join(rng.choice(PHRASES) for _ in range(rng.randint(1, 3))) for _ in range(40)]
    test = [" ".join(rng.choice(PHRASES) for _ in range(rng.randint(1, 2))) for _ in range(6)]
    test += ["the zebra sat on the cat", "dog"]
    (d / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (d / "test.txt").write_text("\n".join(test) + "\n", encoding="utf-8")
    return d / "train.txt", d / "test.txt"


def chars(line: str) -> list[str]:
    return list("_".join(line.split()))


@pytest.fixture(scope="module")
def order20(tmp_path_factory):
    """The corpus, an order-20 character model trained through the CLI, and BruteKN on the same text."""
    d = tmp_path_factory.mktemp("kn20")
    train, test = char_corpus(d / "corpus")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the high orders have too few distinct counts: fallback discounts
        assert main(["train", "--model", "kn", "--order", "20", "--unit", "char", "--text", str(train),
                     "--out", str(d / "model")]) == 0
    brute = BruteKN([chars(x) for x in train.read_text().splitlines()], 20)
    expected = [brute.sentence_log10(chars(x)) for x in test.read_text().splitlines()]
    return train, test, d / "model", brute, expected


def test_the_reference_sums_to_one(order20):
    *_, brute, _ = order20
    for history in [("<s>",), ("<s>", *chars("the cat sat on the m")), tuple(chars("dog ran to the cat_")), ()]:
        total = sum(brute.prob(w, history) for w in brute.words - {"<s>"})
        assert total == pytest.approx(1.0, abs=1e-12)


def test_order_20_is_estimated_with_long_ngrams(order20, capsys):
    *_, model_dir, _, _ = order20
    capsys.readouterr()
    assert main(["info", str(model_dir)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["order"] == 20 and info["ngrams"]["20"] > 100  # phrases repeat: many distinct 20-grams


def test_model_in_memory_matches_brute_force(order20):
    train, test, _, _, expected = order20
    vocab = build_vocab(train, unit="char", use_cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = estimate_kn(KNConfig(order=20), encode_file(train, vocab, unit="char", use_cache=False), vocab)
    model.data_config = DataConfig(unit="char")
    got = seqlm.score_text(model, test.read_text().splitlines())
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=2e-5)
    # every next-character distribution still sums to one after a 30-character history
    state, token = model.initial_state(1), torch.tensor([model.vocab.bos_id])
    for c in chars("the cat sat on the mat a dog ran"):
        logp, state = model.step(token, state)
        assert logp.double().exp().sum().item() == pytest.approx(1.0, abs=1e-5)
        token = torch.tensor([model.vocab.stoi[c]])


def test_eval_and_score_of_the_saved_model_match_brute_force(order20, capsys):
    _, test, model_dir, _, expected = order20
    capsys.readouterr()
    assert main(["eval", str(model_dir), "--text", str(test)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tokens"] == sum(map(len, expected)) and r["oov"] == 2  # the z and the b of zebra
    assert r["log10prob"] == pytest.approx(sum(map(sum, expected)), abs=1e-4)
    assert main(["score", str(model_dir), "--text", str(test)]) == 0
    totals = [float(x) for x in capsys.readouterr().out.split()]
    np.testing.assert_allclose(totals, [sum(e) for e in expected], atol=1e-4)


@pytest.mark.parametrize("compiled", [True, False])
def test_query_matches_brute_force(order20, compiled, capsys, monkeypatch):
    """`seqlm query` reads whitespace-separated tokens: the characters are given so, `_` between words."""
    _, test, model_dir, _, expected = order20
    if compiled and extension() is None:
        require_env("the compiled n-gram loops (seqlm/ngram/_native.cpp) could not be built")
    if not compiled:
        monkeypatch.setitem(seqlm.data.native._MODULES, "_seqlm_native", False)  # the Python twins
    text = "".join(" ".join(chars(x)) + "\n" for x in test.read_text().splitlines())
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    capsys.readouterr()
    assert main(["query", str(model_dir), "-v", "sentence"]) == 0
    totals = [float(line.split()[1]) for line in capsys.readouterr().out.splitlines() if line.startswith("Total:")]
    np.testing.assert_allclose(totals, [sum(e) for e in expected], atol=1e-4)


def test_bounded_memory_estimation_writes_the_same_order_20_arpa(order20, tmp_path):
    train, _, model_dir, _, _ = order20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["train", "--model", "kn", "--order", "20", "--unit", "char", "--text", str(train),
                     "--memory", "1M", "--arpa", str(tmp_path / "m.arpa")]) == 0
    assert (tmp_path / "m.arpa").read_bytes() == (model_dir / "model.arpa").read_bytes()


def test_order_limits():
    assert KNConfig(order=64).order == 64  # what the binary format and the compiled scorer hold
    for bad in (0, 65):
        with pytest.raises(SeqlmError, match="--order must be between 1 and 64"):
            KNConfig(order=bad)


# ---- eval's ppl_per_word ---------------------------------------------------------------------------------


def test_ppl_per_word_counts_words_and_sentence_ends_for_any_unit(order20, tmp_path, capsys):
    """The same total log-probability over the text's words and </s>: a word model's ppl, and for a character
    model the count of words (not characters) in the text, counted here from the lines."""
    train, test, char_model, _, _ = order20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["train", "--model", "kn", "--order", "3", "--text", str(train), "--out", str(tmp_path / "w")]) == 0
    lines = [x for x in test.read_text().splitlines() if x.split()]
    words = sum(len(x.split()) for x in lines) + len(lines)  # every word and every </s>
    for model, unit in ((char_model, "char"), (tmp_path / "w", "word")):
        capsys.readouterr()
        assert main(["eval", str(model), "--text", str(test)]) == 0
        r = json.loads(capsys.readouterr().out)
        assert r["unit"] == unit and r["ppl_per_word"] == pytest.approx(10 ** (-r["log10prob"] / words), rel=1e-9)
        if unit == "word":
            assert r["tokens"] == words and r["ppl_per_word"] == r["ppl"]
        else:
            assert r["tokens"] > words and r["ppl_per_word"] > r["ppl"]
