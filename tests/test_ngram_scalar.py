"""The per-call scorer (seqlm.ngram.scalar): compiled and Python loops against NGramModel.score_word.

References: score_word (the readable walk) on the KenLM oracle's models, pruned ones included (their
n-grams need not have every suffix listed), loaded from ARPA (slot tables built by the scorer) and from
the binary format (its own int32 slot tables); every (context, word) a random walk reaches, plus
contexts with unlisted (-1) entries. The compiled scorer must build here (a C++ compiler and ninja);
outside CI a machine without them skips those cases, the Python loop is still checked.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from seqlm.ngram import NGramModel
from seqlm.ngram.binary import read_binary, write_binary
from seqlm.ngram.native import extension
from seqlm.ngram.query import NGramQuery, compiled_stream, score_stream
from seqlm.ngram.scalar import ScalarScorer, scalar_scorer
from test_kn import ORACLE, needs_oracle

MODELS = ["kn3", "kn5", "kn3-prune01", "kn5-prune00112"]


class State:
    __slots__ = ("words",)

    def __init__(self, words: tuple[int, ...] = ()):
        self.words = words


def _scorers(model: NGramModel) -> list:
    stoi, unk = model.vocab.stoi, model.vocab.unk_id
    out = [ScalarScorer(model, stoi, unk)]
    if extension() is not None:
        out.append(scalar_scorer(model, stoi, unk))
    elif os.environ.get("CI"):
        raise AssertionError("the compiled scorer did not build")
    return out


def _walk(model: NGramModel, rng: random.Random, n: int) -> tuple[list[tuple[int, ...]], list[int]]:
    """(context, word) pairs of a walk over the oracle's training text, so that long n-grams match and
    miss at every order, with some random words and contexts with entries knocked out to -1."""
    text = (ORACLE / "train.txt").read_text().split()
    start = rng.randrange(len(text) - n)
    words = [model.vocab.stoi.get(w, model.vocab.unk_id) for w in text[start:start + n]]
    contexts, context = [], (model.vocab.bos_id,)
    for i, w in enumerate(words):
        if rng.random() < 0.1:
            words[i] = w = rng.randrange(len(model.vocab))
        if rng.random() < 0.1 and len(context) > 1:
            context = tuple(-1 if rng.random() < 0.5 else c for c in context)
        contexts.append(context)
        _, _, context = model.score_word(context, w)
    return contexts + [()], words + [model.vocab.eos_id]


@needs_oracle
@pytest.mark.parametrize("source", ["arpa", "binary"])
@pytest.mark.parametrize("name", MODELS)
def test_scorers_equal_score_word(name: str, source: str, tmp_path) -> None:
    model = NGramModel.from_arpa(ORACLE / f"{name}.arpa.gz")
    if source == "binary":
        write_binary(model, tmp_path / "m.bin")
        model = read_binary(tmp_path / "m.bin")
    contexts, words = _walk(model, random.Random(0), 1000)
    for scorer in _scorers(model):
        for context, w in zip(contexts, words, strict=True):
            assert scorer.score(context, w) == model.score_word(context, w), (type(scorer), context, w)
        probs, lengths, after = scorer.walk((model.vocab.bos_id,), words)  # a whole sentence at once
        context = (model.vocab.bos_id,)
        for w, p, n in zip(words, probs, lengths, strict=True):
            logp, length, context = model.score_word(context, w)
            assert (p, n) == (logp, length)
        assert after == context


@needs_oracle
def test_base_score_sets_the_state_and_refuses_non_strings() -> None:
    model = NGramModel.from_arpa(ORACLE / "kn3.arpa.gz")
    word = model.vocab.itos[10]
    for scorer in _scorers(model):
        start, out = State((model.vocab.bos_id,)), State()
        assert scorer.base_score(start, word, out) == model.score_word(start.words, 10)[0]
        assert out.words == model.score_word(start.words, 10)[2]
        assert scorer.base_score(out, "no-such-word", out) == model.score_word(
            model.score_word(start.words, 10)[2], model.vocab.unk_id)[0]  # unknown: <unk>, in place
        with pytest.raises(TypeError, match="expected str"):
            scorer.base_score(start, 3, out)
        with pytest.raises(IndexError):
            scorer.score((), len(model.vocab))


@needs_oracle
@pytest.mark.parametrize("name", ["kn5", "kn5-prune00112"])
def test_stream_equals_the_array_walk(name: str) -> None:
    """score_corpus's compiled walk (several sentences side by side) against NGramModel.walk, exactly."""
    model = NGramModel.from_arpa(ORACLE / f"{name}.arpa.gz")
    rng = random.Random(1)
    lengths = [rng.choice([0, 1, 2, 5, 9, 30]) for _ in range(150)]  # empty sentences too
    ids = np.array(_walk(model, rng, sum(lengths))[1][:-1], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    expected = score_stream(model, ids, starts)
    for scorer in _scorers(model):
        got = compiled_stream(scorer, ids, starts, model.vocab.bos_id)
        assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]), type(scorer)


@needs_oracle
def test_stream_refuses_starts_out_of_order_or_range() -> None:
    model = NGramModel.from_arpa(ORACLE / "kn3.arpa.gz")
    ids = np.zeros(4, dtype=np.int64)
    for starts in ([0, 3, 2, 4], [0, 2, 5], [-1, 4]):
        for scorer in _scorers(model):
            with pytest.raises(ValueError, match="starts"):
                compiled_stream(scorer, ids, np.array(starts), model.vocab.bos_id)


@needs_oracle
def test_full_scores_equal_the_id_walk() -> None:
    model = NGramModel.from_arpa(ORACLE / "kn5.arpa.gz")
    words = (ORACLE / "query.txt").read_text().split()[:300] + ["<unk>", "no-such-word"]
    ids = [model.vocab.stoi.get(w, model.vocab.unk_id) for w in words]
    for scorer in _scorers(model):
        for bos, eos in ((True, True), (False, False)):
            context = (model.vocab.bos_id,) if bos else ()
            probs, lengths, _ = scorer.walk(context, ids + [model.vocab.eos_id] * eos)
            oov = [w == model.vocab.unk_id for w in ids] + [False] * eos
            want = list(zip(probs, lengths, oov, strict=True))
            assert scorer.full_scores(context, words, model.vocab.eos_id if eos else -1) == want
            assert want[-1 - eos][2] and want[-2 - eos][2]  # both unknowns flagged


@needs_oracle
def test_sentence_score_is_kenlms_float32_sum() -> None:
    """sentence_score against the float32 running sum of full_scores' log10 p (what kenlm.Model.score does)."""
    model = NGramModel.from_arpa(ORACLE / "kn5.arpa.gz")
    lines = (ORACLE / "query.txt").read_text().splitlines()[:60] + ["", "no-such-word <unk>"]
    for scorer in _scorers(model):
        for line in lines:
            for context, eos in (((model.vocab.bos_id,), model.vocab.eos_id), ((), -1)):
                probs = [p for p, _, _ in scorer.full_scores(context, line.split(), eos)]
                total = np.float32(0)
                for p in probs:
                    total = np.float32(total + np.float32(p))
                assert scorer.sentence_score(context, line.split(), eos) == float(total)


@needs_oracle
def test_score_corpus_on_text_equals_sentence_by_sentence() -> None:
    """score_corpus on text (split and looked up in C; word lists by Python) against the Python scorer one
    sentence at a time: odd white space, unknown and non-ASCII words, blank sentences, a newline inside one."""
    query = NGramQuery(ORACLE / "kn5.arpa.gz")
    v = query.vocab
    reference = ScalarScorer(query.model, v.stoi, v.unk_id)  # str.split() and a dict lookup per word
    lines = (ORACLE / "query.txt").read_text().splitlines()[:80]
    odd = [" the\u3000 cat\tsat\x0b ", "no-such-word <unk> \u00a0the", "\u00e9t\u00e9 \u2028 mi\u00df",
           "the \ud800 cat"]  # lone surrogate: no UTF-8, so Python's split amid the compiled lookups
    for sentences in (lines + odd, lines + ["", "  "], lines + ["a\nb"], [ln.split() for ln in lines[:5]],
                      lines[:3] + [lines[3].split()],  # text, then a word list: all in Python
                      iter(lines[:7]), []):
        sentences = list(sentences)
        got = query.score_corpus(iter(sentences))
        want = [x for s in sentences
                for x in reference.full_scores((v.bos_id,), s.split() if isinstance(s, str) else s, v.eos_id)]
        assert got.log10_prob.tolist() == [p for p, _, _ in want]
        assert got.length.tolist() == [n for _, n, _ in want] and got.oov.tolist() == [o for _, _, o in want]
        assert len(got.starts) == len(sentences) + 1


def test_entry_table_runs_past_the_home_slots(tmp_path) -> None:
    """Bigrams chosen so that most are homed in the entry table's last slots (its hash, entry_home in
    _scorer.h, computed here): their run overflows the 64-slot tail, the table is built again with a longer
    one, and every listed and unlisted pair still scores as score_word (probes stop early on a run in home
    order)."""
    if extension() is None:
        pytest.skip("the compiled scorer did not build")
    words = [f"w{i}" for i in range(60)]
    V, n = len(words) + 3, 100  # <unk> <s> </s> come first (ids 0-2), as listed
    homes = 1 + n + n // 2  # the home slots of n bigrams

    def home(key: int) -> int:
        return ((key * 0x9E3779B97F4A7C15) % 2**64) * homes >> 64

    pairs = [(c, w) for c in range(3, V) for w in range(3, V)]
    late = [p for p in pairs if home(p[0] * V + p[1]) >= homes - 10][:90]
    chosen = late + [p for p in pairs if p not in late][: n - len(late)]
    assert len(late) == 90
    unigrams = ["-1.5\t<unk>\t0", "-99\t<s>\t-0.3", "-1.2\t</s>\t0"] + [f"-1.6\t{w}\t-0.2" for w in words]
    bigrams = [f"-0.5\tw{c - 3} w{w - 3}" for c, w in chosen]
    (tmp_path / "m.arpa").write_text(f"\\data\\\nngram 1={len(unigrams)}\nngram 2={n}\n\n\\1-grams:\n"
                                     + "\n".join(unigrams) + "\n\n\\2-grams:\n" + "\n".join(bigrams) + "\n\n\\end\\\n")
    model = NGramModel.from_arpa(tmp_path / "m.arpa")
    assert model.vocab.itos[3] == "w0" and len(model.keys[1]) == n
    scorer = scalar_scorer(model, model.vocab.stoi, model.vocab.unk_id)
    assert scorer.entry_bytes() == 16 * (homes + 4 * 64) + 4 * V  # the tail grown once (x4), the back-offs
    for c in range(V):
        for w in range(V):
            assert scorer.score((c,), w) == model.score_word((c,), w)
