"""ARPA files with "blank" n-grams, against the real kenlm module: an n-gram listed while one of its
suffixes is not (SRILM pruning leaves such files; KenLM's own lm/test.arpa has them).

KenLM lists each missing suffix as a blank when it loads the file, and the n-gram length it reports for a
word counts blanks; seqlm.ngram adds the same blanks (query.with_suffix_blanks). The files are written here:
one by hand, shape by shape, and a pruned random one. Compared with kenlm: full_scores (scores, lengths,
OOV flags), BaseScore / BaseFullScore along random state walks, and the states' lengths.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

import seqlm.kenlm as ours
from seqlm.ngram.model import NGramModel
from seqlm.ngram.query import with_suffix_blanks

from conftest import require_module

kenlm = require_module("kenlm", "the kenlm Python module is not installed (pip install -e '.[kenlm]')")

ORDER = 4
UNK_CHAIN = [  # <unk> after <unk> extends up to the longest context, so that states of known length exist
    ("<unk> <unk>", -1.5, -0.5), ("<unk> <unk> <unk>", -1.25, -0.25), ("<unk> <unk> <unk> <unk>", -1.0, None)]
# Shape by shape (file order matters to kenlm: the context of an n-gram must be listed, or be a blank made
# by an n-gram above it in the same section):
HANDMADE = [
    # "a b c" without "b c": a blank bigram; p(c | b) falls back on c's unigram plus b's back-off
    ("a b", -0.6, -0.3), ("a b c", -0.2, -0.4),
    # "a b c d" without "b c d" nor "c d": two blanks, the first in the context of a blank ("b c")
    ("a b c d", -0.1, None),
    # "e f g h" without "f g h" but with "g h": one blank, estimated from a bigram and f g's back-off;
    # "e f g" without "f g"... which is listed here, with a back-off; "f" has none (zero back-off)
    ("e f", -0.7, -0.2), ("f g", -0.5, -0.35), ("g h", -0.4, 0.0), ("e f g", -0.3, -0.15), ("e f g h", -0.05, None),
    # "h a e" without "a e" makes the blank that "a e f" then uses as its context
    ("h a", -0.9, -0.1), ("h a e", -0.45, -0.2), ("a e f", -0.25, None),
    # blanks ending in </s> and starting after <s>
    ("d e", -0.8, -0.6), ("d e </s>", -0.15, None), ("<s> c", -1.1, -0.45), ("<s> c a", -0.35, None),
]
WORDS = "a b c d e f g h".split()
UNIGRAMS = {"<s>": (-99.0, -0.5), "</s>": (-1.2, None), "<unk>": (-2.0, -0.7), "a": (-1.0, -0.4),
            "b": (-1.1, -0.3), "c": (-1.3, -0.25), "d": (-1.4, -0.2), "e": (-1.2, -0.5), "f": (-1.5, 0.0),
            "g": (-1.6, -0.1), "h": (-1.7, -0.45)}


def write_arpa(path: Path, ngrams: list[tuple[str, float, float | None]]) -> Path:
    """An ARPA file of UNIGRAMS and `ngrams` (text, log10 p, log10 back-off or None), in the order given,
    padded with complete n-grams of other words: kenlm sizes its hash tables from the file's counts with
    a 1.5 multiplier, and the blanks it adds must fit in the slack (it cannot be raised from Python)."""
    by_order: dict[int, list[str]] = {}
    unigrams = [(w, p, b) for w, (p, b) in UNIGRAMS.items()] + [(w, -3.0, -0.1) for w in PAD_WORDS]
    for text, prob, backoff in unigrams + ngrams + padding(ngrams):
        by_order.setdefault(len(text.split()), []).append(
            f"{prob}\t{text}" + (f"\t{backoff}" if backoff is not None else ""))
    lines = ["\\data\\"] + [f"ngram {k}={len(by_order[k])}" for k in sorted(by_order)]
    for k in sorted(by_order):
        lines += ["", f"\\{k}-grams:", *by_order[k]]
    path.write_text("\n".join(lines + ["", "\\end\\", ""]))
    return path


PAD_WORDS = [f"pad{i}" for i in range(12)]


def padding(ngrams: list[tuple[str, float, float | None]]) -> list[tuple[str, float, float | None]]:
    """Every bigram of PAD_WORDS and enough of their trigrams (suffixes and contexts all listed) that twice the
    blanks fit in each middle order."""
    listed = {text for text, _, _ in ngrams}
    blanks: dict[int, set[str]] = {k: set() for k in range(1, ORDER + 1)}
    for k in range(ORDER, 2, -1):
        for g in [t for t in listed if len(t.split()) == k] + sorted(blanks[k]):
            suffix = " ".join(g.split()[1:])
            if suffix not in listed:
                blanks[k - 1].add(suffix)
    pads = [(f"{a} {b}", -1.0, -0.1) for a in PAD_WORDS for b in PAD_WORDS]
    n3 = 2 * len(blanks[3]) + 10
    pads += [(f"{a} {b} {c}", -0.5, -0.1) for a in PAD_WORDS for b in PAD_WORDS for c in PAD_WORDS][:n3]
    bigrams = sum(len(t.split()) == 2 for t in listed) + len(PAD_WORDS) ** 2
    assert 2 * len(blanks[2]) < bigrams, "more blank bigrams than kenlm's tables have room for"
    return pads


def random_pruned(rng: random.Random) -> list[tuple[str, float, float | None]]:
    """Random 2- to 4-grams with every context listed (kenlm requires it) and each suffix kept only by a coin
    toss, so that many n-grams lack a suffix; back-offs are zero now and then (no extension)."""
    listed: dict[int, dict[str, None]] = {k: {} for k in range(2, ORDER + 1)}  # insertion-ordered sets
    for _ in range(60):
        listed[ORDER][" ".join(rng.choice(WORDS) for _ in range(ORDER))] = None
    for k in range(ORDER, 2, -1):
        for gram in list(listed[k]):
            words = gram.split()
            listed[k - 1][" ".join(words[:-1])] = None
            if rng.random() < 0.4:
                listed[k - 1][" ".join(words[1:])] = None
        for _ in range(5):
            listed[k - 1][" ".join(rng.choice(WORDS) for _ in range(k - 1))] = None
    out = []
    for k in range(2, ORDER + 1):
        for g in listed[k]:
            backoff = None if k == ORDER else (0.0 if rng.random() < 0.25 else round(-rng.random(), 3))
            out.append((g, round(-0.1 - 2 * rng.random(), 3), backoff))
    return out


@pytest.fixture(scope="module", params=["handmade", "random"])
def models(request, tmp_path_factory):
    """(kenlm.Model, seqlm.kenlm.Model, the ARPA path) on one blank-laden file."""
    grams = HANDMADE if request.param == "handmade" else random_pruned(random.Random(7))
    path = write_arpa(tmp_path_factory.mktemp(request.param) / "lm.arpa", grams + UNK_CHAIN)
    return kenlm.Model(str(path)), ours.Model(str(path)), path


def test_the_files_have_blanks_and_seqlm_adds_them(models):
    """The check can fail: the plain tables lack suffixes, so their lengths differ from kenlm's somewhere."""
    theirs, mine, path = models
    plain = NGramModel.from_arpa(path)
    closed = mine.model
    assert sum(closed.sizes) > sum(plain.sizes) and with_suffix_blanks(closed) is closed
    differ = 0
    for sentence in sentences(random.Random(1), 300):
        want = [length for _, length, _ in theirs.full_scores(sentence, bos=False)]
        logp, length = plain.walk(*_rows(plain, sentence))
        differ += list(length[0]) != want
    assert differ >= 5


def _rows(model: NGramModel, sentence: str):
    """The (inputs, starts, targets) rows NGramModel.walk scores for a sentence read from no context."""
    ids = [model.vocab.stoi.get(w, model.vocab.unk_id) for w in sentence.split()] + [model.vocab.eos_id]
    inputs = np.array([[-1] + ids[:-1]])
    return inputs, np.zeros(inputs.shape, dtype=bool), np.array([ids])


def sentences(rng: random.Random, n: int) -> list[str]:
    pool = WORDS * 3 + ["<unk>", "</s>", "<s>", "zebra"]
    return [" ".join(rng.choice(pool) for _ in range(rng.randint(1, 9))) for _ in range(n)]


def test_full_scores_match_kenlm(models):
    theirs, mine, _ = models
    for sentence in sentences(random.Random(2), 400) + ["a b c d", "e f g h", "h a e f", "d e", "c a"]:
        for bos in (True, False):
            for eos in (True, False):
                a, b = list(theirs.full_scores(sentence, bos, eos)), list(mine.full_scores(sentence, bos, eos))
                np.testing.assert_allclose([x[0] for x in b], [x[0] for x in a], atol=1e-5, err_msg=sentence)
                assert [x[1:] for x in b] == [tuple(x[1:]) for x in a], (sentence, bos, eos)
        assert mine.score(sentence) == pytest.approx(theirs.score(sentence), abs=1e-4)


def test_handmade_shapes_report_kenlm_lengths(tmp_path):
    """The shapes by name: lengths count blanks, and a blank's score is the estimate it stands for."""
    path = write_arpa(tmp_path / "lm.arpa", HANDMADE + UNK_CHAIN)
    theirs, mine = kenlm.Model(str(path)), ours.Model(str(path))
    for sentence, lengths in [("b c", [1, 2]), ("a b c d", [1, 2, 3, 4]), ("c d", [1, 2]), ("f g h", [1, 2, 3]),
                              ("a e f", [1, 2, 3]), ("e </s>", [1, 2]), ("c a", [1, 2])]:
        a, b = list(theirs.full_scores(sentence, False, False)), list(mine.full_scores(sentence, False, False))
        assert [x[1] for x in a] == [x[1] for x in b] == lengths, sentence
        np.testing.assert_allclose([x[0] for x in b], [x[0] for x in a], atol=1e-5)
    u = dict(UNIGRAMS)
    b_c = list(mine.full_scores("b c", False, False))[1][0]
    assert b_c == pytest.approx(u["c"][0] + u["b"][1], abs=1e-6)  # p(c) + bo(b): the blank's estimate


def kenlm_length(state, references: list) -> int:
    """A kenlm State's length, which the module does not expose: States compare by length first, then by
    their words' bytes, and references[L] (L <unk>s, word id 0) is the least State of length L."""
    return max(n for n, r in enumerate(references) if not state < r)


def extends(model: NGramModel, k: int, ident: int) -> bool:
    """Whether KenLM keeps the order-k entry `ident` in a state: a non-zero back-off, or an entry (listed or
    blank) continues it."""
    if model.log10_backoff[k - 1][ident] != 0:
        return True
    keys, V = model.keys[k], len(model.vocab)
    at = np.searchsorted(keys, ident * V)
    return bool(at < len(keys) and keys[at] // V == ident)


def test_state_walks_match_kenlm(models):
    """States grow from any state of a pool, as in a beam decoder: BaseScore and BaseFullScore agree with
    kenlm; a seqlm state keeps the words of the n-gram matched (at most N-1), kenlm's only those that an entry
    continues (KenLM's state minimisation), and cut there they are equal exactly when kenlm's are."""
    theirs, mine, _ = models
    refs = [kenlm.State()]
    theirs.NullContextWrite(refs[0])
    for _ in range(ORDER - 1):
        refs.append(kenlm.State())
        theirs.BaseScore(refs[-2], "<unk>", refs[-1])
    assert [kenlm_length(r, refs) for r in refs] == list(range(ORDER))
    rng = random.Random(3)
    for _walk in range(40):
        pools = [(kenlm.State(), ours.State())]
        start = rng.choice(["begin", "null"])
        (theirs.BeginSentenceWrite if start == "begin" else theirs.NullContextWrite)(pools[0][0])
        (mine.BeginSentenceWrite if start == "begin" else mine.NullContextWrite)(pools[0][1])
        cut = []
        for _ in range(25):
            word = rng.choice(WORDS * 2 + ["</s>", "<unk>", "zebra"])
            (a_in, b_in) = rng.choice(pools[-6:])
            a_out, b_out, b_out2 = kenlm.State(), ours.State(), ours.State()
            x, y = theirs.BaseFullScore(a_in, word, a_out), mine.BaseFullScore(b_in, word, b_out)
            assert (y.ngram_length, y.oov) == (x.ngram_length, x.oov), word
            assert y.log_prob == pytest.approx(x.log_prob, abs=1e-5)
            assert mine.BaseScore(b_in, word, b_out2) == pytest.approx(theirs.BaseScore(a_in, word, kenlm.State()),
                                                                        abs=1e-5)
            assert b_out2 == b_out and len(b_out.words) == min(y.ngram_length, ORDER - 1)
            n = kenlm_length(a_out, refs)
            kept = [k for k, ident in enumerate(b_out.words, 1) if extends(mine.model, k, ident)]
            assert n == max(kept, default=0), (word, b_out)
            pools.append((a_out, b_out))
            cut.append((a_out, b_out.words[:n]))
        for i, a in enumerate(cut):
            for b in cut[i + 1 :]:
                assert (a[0] == b[0]) == (a[1] == b[1])
