"""`seqlm train --model kn --smoothing ...`: Witten-Bell, Katz, absolute discounting, additive, original and
back-off Kneser-Ney (seqlm.ngram.smoothing), each written as a back-off ARPA model.

References: NLTK's nltk.lm models fed the very n-grams seqlm counts (WittenBellInterpolated,
AbsoluteDiscountingInterpolated, KneserNeyInterpolated, Lidstone, Laplace), compared in float64 where the
conventions agree (the differences are measured below and in docs/ngram.md); Katz by hand on a six-sentence
corpus; lmplz's modified Kneser-Ney path of seqlm itself; brute-force sums over the vocabulary through
seqlm's query of each written file; the kenlm module reading each file.
"""

from __future__ import annotations

import itertools
import random
import warnings
from fractions import Fraction as F

import numpy as np
import pytest

from seqlm.data.corpus import TokenStream
from seqlm.data.vocab import BOS, Vocab
from seqlm.models.kn import KNConfig
from seqlm.ngram.kneser_ney import estimate_model
from seqlm.ngram.query import NGramQuery, State
from seqlm.ngram.smoothing import METHODS, estimate_smoothed, estimate_tables

from conftest import require_module
from conftest import run_cli as run

nltk_lm = require_module("nltk.lm", "NLTK is not installed (pip install -e '.[test]')")
kenlm = require_module("kenlm", "the kenlm Python module is not installed (pip install -e '.[kenlm]')")

WORDS = "a b c d e f g".split()


def sentences(n: int, seed: int) -> list[list[str]]:
    """Words alternate between a frequent group and all of WORDS, so counts of 1, 2, 3 and more all occur."""
    rng = random.Random(seed)
    return [[rng.choice(WORDS[:3]) if i % 2 else rng.choice(WORDS) for i in range(rng.randint(1, 6))]
            for _ in range(n)]


class Corpus:
    """One corpus as seqlm encodes it (<unk> in the vocabulary, never seen) and as NLTK counts it: every
    n-gram of orders 1..N of `<s> w1 .. wn </s>` that ends after <s> (the <s> unigram is only a context)."""

    def __init__(self, sents: list[list[str]]):
        self.sents = sents
        seen = sorted({w for s in sents for w in s})
        self.vocab = Vocab(["</s>", "<unk>", *seen], [0] * (len(seen) + 2))
        self.itos = self.vocab.itos + [BOS]  # the model's vocabulary
        ids = [[self.vocab.stoi[w] for w in s] + [self.vocab.eos_id] for s in sents]
        self.stream = TokenStream(np.array([i for s in ids for i in s], dtype=np.int32),
                                  np.cumsum([0] + [len(s) for s in ids]))

    def ngrams(self, order: int) -> list[list[tuple[str, ...]]]:
        padded = [["<s>", *s, "</s>"] for s in self.sents]
        return [[tuple(x[j - k + 1:j + 1]) for j in range(1, len(x)) for k in range(1, order + 1) if j >= k - 1]
                for x in padded]

    def nltk(self, cls, order: int, estimator=None, **kw):
        """An nltk.lm model over the words seqlm predicts (<unk> is NLTK's unknown label, <s> left out), with
        counts updated directly: fit() would map <s>, no vocabulary word, to <unk>."""
        vocab = nltk_lm.Vocabulary([w for w in self.itos if w not in (BOS, "<unk>")], unk_label="<unk>")
        lm = cls(order=order, vocabulary=vocab, **kw)
        lm.counts.update(self.ngrams(order))
        if estimator is not None:  # NLTK's own estimator (its discount, order), only unigram_score replaced
            lm.estimator.__class__ = estimator
        return lm

    def predicted(self) -> list[str]:
        return [w for w in self.itos if w != BOS]

    def contexts(self, order: int) -> list[tuple[str, ...]]:
        """Every context of 0..N-1 words a sentence can give: <s> only first, never </s>."""
        first = [w for w in self.itos if w != "</s>"]
        inner = [w for w in first if w != BOS]
        return [()] + [(h, *rest) for n in range(1, order) for h in first
                       for rest in itertools.product(inner, repeat=n - 1)]


class Float64:
    """The back-off rule over an estimate's float64 tables (no ARPA file, no float32): p(w | h) is the
    longest listed n-gram's p times the back-off weights of the contexts passed on the way down."""

    def __init__(self, corpus: Corpus, order: int, **options):
        cfg = KNConfig(order=order, **options)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sparse count-of-counts: the fallback is tested elsewhere
            t = estimate_tables(corpus.stream, len(corpus.itos), len(corpus.itos) - 1, order, cfg.spec,
                                cfg.thresholds)
        self.entries: dict[tuple[str, ...], tuple[float, float]] = {}
        V = len(corpus.itos)
        for k in range(1, order + 1):
            ids = np.arange(len(t.counts.keys[k - 1]))
            words = [ids]
            for j in range(k, 1, -1):
                key = t.counts.keys[j - 1][words[0]]
                words[0:1] = [key // V, key % V]
            bo = t.backoff[k - 1] if k < order else np.ones(len(ids))
            for row, p, b in zip(np.stack(words, axis=1), t.prob[k - 1], bo, strict=True):
                self.entries[tuple(corpus.itos[i] for i in row)] = (float(p), float(b))
        self.order = order

    def prob(self, word: str, context: tuple[str, ...]) -> float:
        context = context[max(0, len(context) - self.order + 1):] if self.order > 1 else ()
        weight = 1.0
        for start in range(len(context) + 1):
            if (*context[start:], word) in self.entries:
                return weight * self.entries[(*context[start:], word)][0]
            weight *= self.entries.get(context[start:], (0.0, 1.0))[1]
        raise AssertionError("every word is a unigram")


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus(sentences(60, 3))


# ---- NLTK, where the conventions agree ---------------------------------------------------------------------

class UniformBase:
    """C&G's recursion ends at the uniform distribution (seqlm, lmplz, SRILM); NLTK's ends at the maximum
    likelihood unigram (Witten-Bell, absolute) or at unsmoothed continuation counts (Kneser-Ney), which give
    an unseen word 0. This mixin replaces only NLTK's unigram_score by the interpolated unigram, computed
    here from NLTK's own counts; everything above the unigram level stays NLTK's."""

    def unigram_score(self, word):
        counts = self.unigram_counts()  # word -> count read (raw or continuation)
        total, types = sum(counts.values()), sum(1 for c in counts.values() if c > 0)
        alpha, mass = self.unigram_alpha(counts.get(word, 0), total, types)
        return alpha + mass / len(self.vocab)


class WittenBellUniform(UniformBase, nltk_lm.smoothing.WittenBell):
    def unigram_counts(self):
        return dict(self.counts.unigrams)

    def unigram_alpha(self, c, total, types):
        return c / (total + types), types / (total + types)


class AbsoluteUniform(UniformBase, nltk_lm.smoothing.AbsoluteDiscounting):
    def unigram_counts(self):
        return dict(self.counts.unigrams)

    def unigram_alpha(self, c, total, types):
        return max(c - self.discount, 0) / total, self.discount * types / total


class KneserNeyUniform(UniformBase, nltk_lm.smoothing.KneserNey):
    def unigram_counts(self):
        left = {}  # word -> distinct words seen before it (bigram types): its continuation count
        for _, followers in self.counts[2].items():
            for w, c in followers.items():
                left[w] = left.get(w, 0) + (c > 0)
        return left

    def unigram_alpha(self, c, total, types):
        return max(c - self.discount, 0) / total, self.discount * types / total


def compare(corpus: Corpus, ours: Float64, theirs, pairs) -> tuple[float, int]:
    worst = max(abs(ours.prob(w, h) - theirs.unmasked_score(w, h)) for w, h in pairs)
    return worst, len(pairs)


@pytest.mark.parametrize("order", [2, 3, 4])
def test_witten_bell_is_nltks_interpolated_witten_bell(corpus, order):
    """Raw counts at every order, <s> contexts included: every (word, context) pair agrees."""
    theirs = corpus.nltk(nltk_lm.WittenBellInterpolated, order, WittenBellUniform)
    ours = Float64(corpus, order, smoothing="witten-bell")
    pairs = [(w, h) for h in corpus.contexts(order) for w in corpus.predicted()]
    worst, n = compare(corpus, ours, theirs, pairs)
    assert worst < 1e-9 and n >= 90


@pytest.mark.parametrize("order", [2, 3])
def test_absolute_discounting_is_nltks_with_its_discount(corpus, order):
    theirs = corpus.nltk(nltk_lm.AbsoluteDiscountingInterpolated, order, AbsoluteUniform)  # NLTK's D = 0.75
    ours = Float64(corpus, order, smoothing="absolute", discount=0.75)
    pairs = [(w, h) for h in corpus.contexts(order) for w in corpus.predicted()]
    assert compare(corpus, ours, theirs, pairs)[0] < 1e-9


def kn_matchable(corpus: Corpus, order: int) -> list[tuple[str, tuple[str, ...]]]:
    """Contexts of N-1 words (raw counts at the top, in both), and shorter ones not starting with <s>: below
    the top, lmplz keeps the raw count of an n-gram starting with <s> (nothing can precede it), while NLTK
    takes its continuation count, which is 0 for the n-grams seqlm counts (and divides by zero)."""
    return [(w, h) for h in corpus.contexts(order) if len(h) == order - 1 or h[:1] != (BOS,)
            for w in corpus.predicted()]


@pytest.mark.parametrize("order, discount", [(2, 0.75), (3, 0.75), (3, 0.1), (4, 0.5)])
def test_kneser_ney_is_nltks_interpolated_kneser_ney(corpus, order, discount):
    """Original Kneser-Ney, one discount for all orders (NLTK's default is 0.1): continuation counts below
    the top order, the same discount at the unigram level (interpolated with the uniform distribution)."""
    theirs = corpus.nltk(nltk_lm.KneserNeyInterpolated, order, KneserNeyUniform, discount=discount)
    ours = Float64(corpus, order, smoothing="kn", discount=discount)
    worst, n = compare(corpus, ours, theirs, kn_matchable(corpus, order))
    assert worst < 1e-9 and n > 80


def test_the_conventions_that_differ_from_nltk_do(corpus):
    """What docs/ngram.md says of NLTK, measured: its own unigram level (no uniform share: an unseen word
    gets 0) and a trigram model's p(w | <s>) under NLTK's padding (N-1 <s>, so <s> <s> w is a trigram and
    <s> w gets continuation count 1; lmplz counts it raw)."""
    for smoothing, cls, kw in (("witten-bell", nltk_lm.WittenBellInterpolated, {}),
                               ("kn", nltk_lm.KneserNeyInterpolated, {"discount": 0.75})):
        plain = corpus.nltk(cls, 3, **kw)
        ours = Float64(corpus, 3, smoothing=smoothing, **kw)
        assert plain.unmasked_score("<unk>", ()) == 0 < ours.prob("<unk>", ())
    padded = corpus.nltk(nltk_lm.KneserNeyInterpolated, 3, KneserNeyUniform, discount=0.75)
    padded.counts.update([[(BOS, BOS, s[0]) for s in corpus.sents]])  # what NLTK's padding adds to <s> w
    ours = Float64(corpus, 3, smoothing="kn", discount=0.75)
    diff = max(abs(ours.prob(w, (BOS,)) - padded.unmasked_score(w, (BOS,))) for w in corpus.predicted())
    assert diff > 0.01


@pytest.mark.parametrize("order", [1, 2, 3])
@pytest.mark.parametrize("k", [1.0, 0.5])
def test_additive_is_nltks_lidstone_on_what_a_back_off_file_can_hold(corpus, order, k):
    """Lidstone (Laplace at k = 1) gives an unseen word k / (C(h) + k V'), the same after every context: no
    finite back-off file holds that for n > 1. seqlm's additive method gives each n-gram seen, and every
    unigram, Lidstone's probability exactly, and backs off for the rest."""
    cls = nltk_lm.Laplace if k == 1 else nltk_lm.Lidstone
    theirs = corpus.nltk(cls, order, **({} if k == 1 else {"gamma": k}))
    ours = Float64(corpus, order, smoothing="additive", add_k=k)
    seen = {(g[-1], g[:-1]) for s in corpus.ngrams(order) for g in s} | {(w, ()) for w in corpus.predicted()}
    assert compare(corpus, ours, theirs, seen)[0] < 1e-9
    unseen = [(w, ("a",)) for w in corpus.predicted() if (w, ("a",)) not in seen]
    assert order == 1 or compare(corpus, ours, theirs, unseen)[0] > 1e-3


# ---- Katz by hand ---------------------------------------------------------------------------------------

KATZ_TEXT = [["b", "c", "i", "a"], ["g"], ["g"], ["a"], ["e", "h"], ["i", "f", "g"]]


def test_katz_by_hand():
    """A bigram model, K = 2. Unigrams (18 predicted tokens): b c e f h once, a i twice, g three times, </s>
    six: n1..n3 = 5, 2, 1, so c = 3 n3 / n1 = 3/5, d1 = (2 n2 / n1 - c) / (1 - c) = 1/2,
    d2 = (3 n3 / (2 n2) - c) / (1 - c) = 3/8. Bigrams: 11 singletons, a </s> and <s> g twice, g </s> three
    times: c = 3/11, d1 = 1/8, d2 = 21/32."""
    corpus = Corpus(KATZ_TEXT)
    m = Float64(corpus, 2, smoothing="katz", katz_max=2)
    uni = {"b": F(1, 2) / 18, "a": F(3, 8) * 2 / 18, "g": F(3, 18), "</s>": F(6, 18)}
    uni["<unk>"] = 1 - (5 * uni["b"] + 2 * uni["a"] + uni["g"] + uni["</s>"])  # the one unseen word: 5/18
    assert uni["<unk>"] == F(5, 18)
    for w, p in uni.items():
        assert m.prob(w, ()) == pytest.approx(float(p), abs=1e-12), w
    # after <s> (6 times): b a e i once (d1 / 6 each), g twice (d2 * 2 / 6); the rest backs off with
    # bo = (1 - 4/48 - 7/32) / (1 - (b + a + e + i + g unigrams)) = (67/96) / (25/36)
    bo_s = (1 - 4 * F(1, 48) - F(7, 32)) / (1 - (2 * uni["b"] + 2 * uni["a"] + uni["g"]))
    assert bo_s == F(67, 96) / F(25, 36)
    assert m.prob("g", (BOS,)) == pytest.approx(7 / 32, abs=1e-12)
    assert m.prob("e", (BOS,)) == pytest.approx(1 / 48, abs=1e-12)
    assert m.prob("c", (BOS,)) == pytest.approx(float(bo_s * uni["b"]), abs=1e-12)
    assert m.prob("</s>", (BOS,)) == pytest.approx(float(bo_s * uni["</s>"]), abs=1e-12)
    # after a: a </s> twice (d2: 21/32), so bo = (11/32) / (1 - 1/3)
    assert m.prob("i", ("a",)) == pytest.approx(float(F(11, 32) / F(2, 3) * uni["a"]), abs=1e-12)
    # after g: g </s> three times, above K, kept whole: nothing is left for any other word after g
    assert m.prob("</s>", ("g",)) == 1.0 and m.prob("a", ("g",)) == 0.0


def test_absolute_discounting_estimates_its_discount_by_hand():
    """D = n1 / (n1 + 2 n2) per order on the same corpus: unigrams 5, 2 give D = 5/9, bigrams 11, 2 give
    11/15. Nine words seen of V' = 10 (<unk> never), 18 tokens; <s> is followed 6 times by 5 words."""
    m = Float64(Corpus(KATZ_TEXT), 2, smoothing="absolute")
    d1, d2 = F(5, 9), F(11, 15)
    once = (1 - d1) / 18 + d1 * 9 / 18 / 10  # a unigram seen once: e, c
    assert m.prob("<unk>", ()) == pytest.approx(float(d1 * 9 / 18 / 10), abs=1e-12)
    assert m.prob("e", ()) == pytest.approx(float(once), abs=1e-12)
    assert m.prob("e", (BOS,)) == pytest.approx(float((1 - d2) / 6 + d2 * F(5, 6) * once), abs=1e-12)
    assert m.prob("c", (BOS,)) == pytest.approx(float(d2 * F(5, 6) * once), abs=1e-12)


def test_katz_writes_probability_zero_as_kenlm_reads_it(tmp_path, capsys):
    """bo(g) = 0 is written -99 (SRILM's log10 of 0): KenLM refuses -inf. The kenlm module reads the file."""
    text = tmp_path / "katz.txt"
    text.write_text("\n".join(" ".join(s) for s in KATZ_TEXT) + "\n", encoding="utf-8")
    arpa = tmp_path / "katz.arpa"
    code, _, err = run(capsys, "train", "--model", "kn", "--order", 2, "--smoothing", "katz", "--katz-max", 2,
                       "--text", text, "--arpa", arpa)
    assert code == 0, err
    line = next(x for x in arpa.read_text().splitlines() if x.split("\t")[1:2] == ["g"])
    assert float(line.split("\t")[2]) == -99
    model = kenlm.Model(str(arpa))  # p(g) bo(g) p(a): a is seen twice, 3/8 2/18
    assert model.score("g a", bos=False, eos=False) == pytest.approx(np.log10(3 / 18 / 24) - 99, abs=1e-4)


def test_good_turing_counts_past_the_top_are_kept_and_sparse_orders_warn():
    corpus = Corpus(sentences(30, 1))
    with pytest.warns(UserWarning, match="no Good-Turing discounts"):
        estimate_smoothed(corpus.stream, corpus.vocab, 2, KNConfig(order=2, smoothing="katz", katz_max=1).spec,
                          (0,))


# ---- every method, both forms, through the written file ------------------------------------------------

FORMS = [(m, f) for m in METHODS for f in ("interpolated", "backoff")]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict:
    """Each method and form, order 3, trained by the command line into an ARPA file."""
    d = tmp_path_factory.mktemp("smoothing")
    text = d / "train.txt"
    text.write_text("\n".join(" ".join(s) for s in sentences(80, 7)) + "\n", encoding="utf-8")
    files: dict = {"sents": text}
    for (method, form), prune in itertools.product(FORMS, ("0", "0 1")):
        out = d / f"{method}-{form}-{prune.replace(' ', '')}.arpa"
        argv = ["train", "--model", "kn", "--order", "3", "--smoothing", method, "--form", form,
                "--prune", *prune.split(), "--text", str(text), "--arpa", str(out)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from seqlm.cli import main

            assert main(argv) == 0
        files[method, form, prune] = out
    return files


def next_log10(q: NGramQuery, context: tuple[str, ...], word: str) -> float:
    s = State()
    q.BeginSentenceWrite(s) if context[:1] == (BOS,) else q.NullContextWrite(s)
    for w in context[1:] if context[:1] == (BOS,) else context:
        t = State()
        q.BaseScore(s, w, t)
        s = t
    return q.BaseScore(s, word, State())


@pytest.mark.parametrize("method, form", FORMS)
@pytest.mark.parametrize("prune", ["0", "0 1"])
def test_every_context_sums_to_one(written, method, form, prune):
    q = NGramQuery(written[method, form, prune])
    words = [w for w in q.vocab.itos if w != BOS]
    firsts = [w for w in q.vocab.itos if w != "</s>"]
    contexts = [()] + [(h,) for h in firsts] + [(h, w) for h in firsts for w in words if w != "</s>"]
    for ctx in contexts:
        total = sum(10.0 ** next_log10(q, ctx, w) for w in words)
        assert total == pytest.approx(1.0, abs=1e-5), ctx


def test_entropy_pruning_keeps_any_method_normalised(written, tmp_path, capsys):
    """--prune-entropy works on the estimated back-off model, whichever method made it."""
    out = tmp_path / "wb.arpa"
    code, _, err = run(capsys, "train", "--model", "kn", "--order", 3, "--smoothing", "witten-bell",
                       "--prune-entropy", "1e-3", "--text", written["sents"], "--arpa", out)
    assert code == 0, err
    q = NGramQuery(out)
    assert sum(q.model.sizes[1:]) < sum(NGramQuery(written["witten-bell", "interpolated", "0"]).model.sizes[1:])
    words = [w for w in q.vocab.itos if w != BOS]
    for ctx in [(), (BOS,), ("a",), (BOS, "a"), ("b", "c")]:
        assert sum(10.0 ** next_log10(q, ctx, w) for w in words) == pytest.approx(1.0, abs=1e-5), ctx


@pytest.mark.parametrize("method, form", FORMS)
def test_kenlm_reads_each_file_and_scores_as_seqlm(written, method, form):
    path = written[method, form, "0 1"]
    theirs, ours = kenlm.Model(str(path)), NGramQuery(path)
    rng = random.Random(5)
    for _ in range(40):
        s = " ".join(rng.choice(WORDS + ["zebra"]) for _ in range(rng.randint(1, 8)))
        a, b = list(theirs.full_scores(s)), list(ours.full_scores(s))
        np.testing.assert_allclose([x[0] for x in b], [x[0] for x in a], atol=1e-5)
        assert [x[1] for x in b] == [x[1] for x in a]


@pytest.mark.parametrize("method", ["witten-bell", "katz"])
def test_the_written_file_holds_the_float64_estimate(written, method):
    """The same text estimated in memory: the file's scores are the float64 tables' to float32 precision."""
    corpus = Corpus([line.split() for line in written["sents"].read_text().splitlines()])
    ours = Float64(corpus, 3, smoothing=method, form="backoff")
    q = NGramQuery(written[method, "backoff", "0"])
    for h in [(), ("a",), (BOS, "b"), ("c", "a")]:
        for w in corpus.predicted():
            assert 10 ** next_log10(q, h, w) == pytest.approx(ours.prob(w, h), rel=1e-5), (h, w)


def test_generic_modified_kn_is_lmplzs_path_bit_for_bit():
    """modified-kn through smoothing.py equals kneser_ney.py's lmplz estimator, pruned or not."""
    corpus = Corpus(sentences(400, 11))
    for prune in ((0,), (0, 1, 1)):
        spec = KNConfig(order=4, smoothing="modified-kn", form="interpolated").spec
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = estimate_smoothed(corpus.stream, corpus.vocab, 4, spec, prune)
            b = estimate_model(corpus.stream, corpus.vocab, 4, spec.fallback, prune)
        for k in range(4):
            np.testing.assert_array_equal(a.keys[k], b.keys[k])
            np.testing.assert_array_equal(a.log10_prob[k], b.log10_prob[k])
        for k in range(3):
            np.testing.assert_array_equal(a.log10_backoff[k], b.log10_backoff[k])


# ---- the command line ---------------------------------------------------------------------------------

def test_config_json_keeps_the_method(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("\n".join(" ".join(s) for s in sentences(40, 2)) + "\n", encoding="utf-8")
    code, _, err = run(capsys, "train", "--model", "kn", "--order", 3, "--smoothing", "witten-bell", "--data", text,
                       "--out", tmp_path / "wb")
    assert code == 0, err
    code, out, _ = run(capsys, "info", tmp_path / "wb")
    assert code == 0 and '"smoothing": "witten-bell"' in out and '"form": "auto"' in out


@pytest.mark.parametrize("argv, match", [
    (["--smoothing", "witten-bell", "--add-k", "0.5"], "--add-k 0.5 has no effect under --smoothing witten-bell"),
    (["--smoothing", "katz", "--discount", "0.5"], "--discount 0.5 has no effect under --smoothing katz"),
    (["--smoothing", "additive", "--katz-max", "3"], "--katz-max 3"),
    (["--smoothing", "katz", "--memory", "1G"], "--memory 1G has no effect under --smoothing katz"),
    (["--form", "backoff", "--memory", "1G"], "--memory"),
    (["--smoothing", "good-turing"], "--smoothing must be one of"),
    (["--form", "both"], "--form must be one of"),
    (["--smoothing", "kn", "--discount", "1.5"], "--discount must lie in (0, 1]"),
    (["--smoothing", "additive", "--add-k", "0"], "--add-k must be positive"),
])
def test_options_a_method_does_not_read_are_refused(tmp_path, capsys, argv, match):
    text = tmp_path / "t.txt"
    text.write_text("a b\nb a\n", encoding="utf-8")
    code, out, err = run(capsys, "train", "--model", "kn", "--order", 2, *argv, "--text", text,
                         "--arpa", tmp_path / "x.arpa")
    assert code == 2 and out == "" and "\n" not in err.strip() and match in err, err


def test_a_vocab_file_is_refused_under_another_method(tmp_path, capsys):
    text, words = tmp_path / "t.txt", tmp_path / "w.txt"
    text.write_text("a b c\nb a\n", encoding="utf-8")
    words.write_text("a\nb\n", encoding="utf-8")
    code, _, err = run(capsys, "train", "--model", "kn", "--order", 2, "--smoothing", "witten-bell", "--vocab",
                       words, "--text", text, "--arpa", tmp_path / "x.arpa")
    assert code == 2 and "--vocab" in err and "--unk none" in err

