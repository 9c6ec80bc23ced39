"""The compiled State (seqlm/ngram/_state.cpp) against its Python twin (query.PyState), and the compiled
walk's early stop on tables that list every suffix against the walk that probes every order.

References: PyState (the readable class, what runs without the compiled loops) for every behaviour a State
has; NGramModel.score_word and the Python ScalarScorer on the KenLM oracle's models (pruned ones lack
suffixes until query.with_suffix_blanks lists them) for the scores; kenlm's own rules for the sentence calls'
errors. The compiled module must build here; outside CI a machine without a compiler skips.
"""

from __future__ import annotations

import copy
import os
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqlm.kenlm
import seqlm.ngram
from seqlm.ngram import NGramModel
from seqlm.ngram.native import extension
from seqlm.ngram.query import NGramQuery, PyState, with_suffix_blanks
from seqlm.ngram.scalar import ScalarScorer, scalar_scorer
from test_kn import ORACLE, needs_oracle


@pytest.fixture(scope="module")
def State():  # noqa: N802 (the class under test)
    ext = extension()
    if ext is None:
        if os.environ.get("CI"):
            raise AssertionError("the compiled n-gram loops did not build")
        pytest.skip("the compiled n-gram loops (seqlm/ngram/_native.cpp) could not be built")
    return ext.State


VALUES = [(), (3,), (1, 2, 3, 4), tuple(range(15)), tuple(range(16)), (2**62, -1), (True, 2), ("a", 1),
          [1, 2], None, 7.5]  # inline ids; too long; big and negative; not ids: held as the object


def test_the_compiled_state_is_the_one_exported(State):
    assert seqlm.kenlm.State is State and seqlm.ngram.State is State and seqlm.ngram.query.State is State
    with pytest.raises(AttributeError):
        seqlm.ngram.query.NoSuchName  # noqa: B018


@pytest.mark.parametrize("words", VALUES, ids=repr)
def test_words_behave_as_the_python_states(State, words):
    mine, twin = State(words), PyState(words)
    assert mine.words == twin.words and type(mine.words) is type(twin.words)
    assert repr(mine) == repr(twin) and _hash(mine) == _hash(twin)  # a list: unhashable in both
    for other in VALUES:
        assert (mine == State(other)) == (twin == PyState(other)), other
        assert (mine != State(other)) == (twin != PyState(other)), other
    for c in (copy.copy(mine), copy.deepcopy(mine), pickle.loads(pickle.dumps(mine))):
        assert type(c) is State and c == mine and c.words == twin.words
    later = State()
    later.words = words
    assert later == mine and State(words=words) == mine


def _hash(x) -> int | type:
    try:
        return hash(x)
    except TypeError as e:
        return type(e)


def test_states_key_dicts_and_refuse_what_python_states_refuse(State):
    seen = {State((1, 2)): "a", State(("node",)): "b"}
    assert seen[State((1, 2))] == "a" and seen[State(("node",))] == "b"
    assert State() != PyState() and State().words == ()  # a fresh State: no context, as kenlm's
    with pytest.raises(TypeError):
        del State().words
    with pytest.raises(TypeError):
        State((1,), (2,))

    class Mine(State):
        pass

    assert Mine((4,)) == State((4,)) and type(copy.copy(Mine((4,)))) is Mine


@needs_oracle
@pytest.mark.parametrize("name", ["kn5", "kn5-prune00112"])
def test_base_score_on_both_states_and_the_early_stop(State, name):
    """The compiled BaseScore reading and writing a State in place, and the same on PyStates (its generic
    path), against the Python scorer on the suffix-listed tables, along a random walk of shared states."""
    model = with_suffix_blanks(NGramModel.from_arpa(ORACLE / f"{name}.arpa.gz"))
    v = model.vocab
    closed = scalar_scorer(model, v.stoi, v.unk_id, v.bos_id, v.eos_id, closed=True)
    reference = ScalarScorer(model, v.stoi, v.unk_id)
    words = (ORACLE / "query.txt").read_text().split()[:400] + ["no-such-word", "<unk>", "</s>"]
    rng = random.Random(0)
    pools = {cls: [cls((v.bos_id,)), cls()] for cls in (State, PyState)}
    for i in range(1500):
        word = words[i % len(words)] if rng.random() < 0.8 else rng.choice(v.itos)
        pick, in_place = rng.randrange(len(pools[State])), rng.random() < 0.1  # in place now and then, as decoders
        after = PyState()
        want = (reference.base_score(PyState(pools[PyState][pick].words), word, after), after.words)
        for cls, pool in pools.items():
            out = pool[pick] if in_place else cls()
            assert (closed.base_score(pool[pick], word, out), out.words) == want, (cls, word, pick)
            pool.append(out)


@needs_oracle
def test_sentence_calls_take_text_and_refuse_what_kenlm_refuses(State):
    query = NGramQuery(ORACLE / "kn5.arpa.gz")
    score, full_scores = query.compiled_sentence_calls()
    line = (ORACLE / "query.txt").read_text().splitlines()[0] + " no-such-word"
    for bos in (True, False):
        for eos in (True, False):
            want = list(query.full_scores(line.split(), bos, eos))
            assert list(full_scores(line, bos, eos)) == want == list(full_scores(line.encode(), bos=bos, eos=eos))
            assert score(" \t" + line + "\n", eos=eos, bos=bos) == query.kenlm_score(line.split(), bos, eos)
    assert list(full_scores("")) == list(query.full_scores([]))
    with pytest.raises(TypeError, match="Cannot convert <class 'int'> to string"):
        score(5)
    with pytest.raises(UnicodeDecodeError):
        score(b"\xff")
    assert score(sentence=line, eos=False) == score(line, True, False) == score(line, 1, eos=0)
    assert list(full_scores(line, bos=False)) == list(full_scores(line, False, True))
    for bad_call in (lambda: full_scores(line, nonsense=True), lambda: score(), lambda: score(line, True, True, 1),
                     lambda: score(line, True, bos=True), lambda: score(bos=True)):
        with pytest.raises(TypeError):
            bad_call()


@needs_oracle
def test_a_model_past_the_size_limit_loads_without_entry_tables_unless_asked(monkeypatch):
    """By default the entry tables are built only where they take at most ENTRIES_AUTO_MAX bytes (24 an n-gram)."""
    if extension() is None:
        pytest.skip("the compiled scorer could not be built here")
    path = ORACLE / "kn5.arpa.gz"
    model = seqlm.kenlm.Model(path)
    assert model._scorer.entry_bytes() > 0  # well below 2 GB
    need = 24 * sum(model._scorer.model.sizes[1:])
    monkeypatch.setattr(seqlm.ngram.query, "ENTRIES_AUTO_MAX", need - 1)  # a byte short
    assert seqlm.kenlm.Model(path)._scorer.entry_bytes() == 0
    assert NGramQuery(model.model, entries=True).entry_bytes() > 0  # asked for: at any size
    monkeypatch.setattr(seqlm.ngram.query, "ENTRIES_AUTO_MAX", need)
    assert seqlm.kenlm.Model(path)._scorer.entry_bytes() > 0


@needs_oracle
def test_lazy_load_leaves_out_the_entry_tables_and_scores_the_same(State):
    """kenlm.Config's LoadMethod.LAZY: the model's own tables only (no private copy), the same numbers."""
    config = seqlm.kenlm.Config()
    config.load_method = seqlm.kenlm.LoadMethod.LAZY
    path = ORACLE / "kn5.arpa.gz"
    eager, lazy = seqlm.kenlm.Model(path), seqlm.kenlm.Model(path, config)
    ngrams = sum(len(k) for k in eager.model.keys[1:])
    backoffs = 4 * sum(len(b) for b in eager.model.log10_backoff[: eager.order - 1])  # copied beside the entries
    slots = sum(len(k) + len(k) // 2 + 1 + 64 for k in eager.model.keys[1:])  # home slots, a 64-slot tail each
    assert eager._scorer.entry_bytes() == 16 * slots + backoffs
    assert 24 * ngrams + backoffs <= eager._scorer.entry_bytes() < 25 * ngrams + backoffs + 100
    assert lazy._scorer.entry_bytes() == 0
    again = pickle.loads(pickle.dumps(lazy))
    assert again.config.load_method == seqlm.kenlm.LoadMethod.LAZY and again._scorer.entry_bytes() == 0
    states = {m: (State(), State()) for m in (eager, lazy)}
    for line in (ORACLE / "query.txt").read_text().splitlines()[:40]:
        assert list(eager.full_scores(line)) == list(lazy.full_scores(line)) and eager.score(line) == lazy.score(line)
        for m, (s, _) in states.items():
            m.BeginSentenceWrite(s)
        for w in line.split():
            a, b = (m.BaseScore(s, w, t) for m, (s, t) in states.items())
            assert a == b and states[eager][1] == states[lazy][1]
            states = {m: (t, s) for m, (s, t) in states.items()}


SPACES = [" ", "\t", "\x0b", "\x1c", "\u00a0", "\u2003", "\u3000", "\u2028", "\u0085", "  "]
UNICODE_WORDS = ["caf\u00e9", "na\u00efve", "\u65e5\u672c", "\U0001f600", "stra\u00dfe", "a", "b", "c"]


@pytest.fixture(scope="module")
def unicode_query(tmp_path_factory) -> NGramQuery:
    from seqlm.cli import main

    root = tmp_path_factory.mktemp("uni")
    rng = random.Random(3)
    lines = [" ".join(rng.choice(UNICODE_WORDS) for _ in range(rng.randint(1, 9))) for _ in range(300)]
    (root / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["train", "--model", "kn", "--order", "3", "--text", str(root / "train.txt"),
                 "--out", str(root / "kn")]) == 0
    return NGramQuery(root / "kn")


@settings(max_examples=150, deadline=None)
@given(words=st.lists(st.sampled_from(UNICODE_WORDS + ["\u00e9", "zz", "\ud800", "caf\u00e9\ud800", "<unk>"]),
                      max_size=10),
       gaps=st.lists(st.sampled_from(SPACES), min_size=11, max_size=11))
def test_words_are_found_by_their_bytes_as_by_the_dict(State, unicode_query, words, gaps):
    """The compiled calls split text as str.split() and find each word by its UTF-8 bytes; the reference is
    the dict lookup of every word of str.split() (query.full_scores on the list). Lone surrogates (no UTF-8)
    take the dict's path."""
    score, full_scores = unicode_query.compiled_sentence_calls()
    v = unicode_query.vocab
    reference = ScalarScorer(unicode_query.model, v.stoi, v.unk_id)  # stoi.get per word, score_word
    text = gaps[0] + "".join(w + g for w, g in zip(words, gaps[1:], strict=False))
    want = reference.full_scores((v.bos_id,), text.split(), v.eos_id)
    assert text.split() == words and list(full_scores(text)) == want
    assert list(unicode_query.full_scores(words)) == want  # the compiled scorer on the list of words
    assert score(text) == reference.sentence_score((v.bos_id,), words, v.eos_id)
    s, t = State(), State()
    unicode_query.BeginSentenceWrite(s)
    for w, (p, _, _) in zip(words, want, strict=False):
        assert unicode_query.BaseScore(s, w, t) == p
        s, t = t, s
