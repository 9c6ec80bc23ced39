"""seqlm.kenlm against the real kenlm module: the same calls on the same ARPA give the same numbers.

The reference is KenLM's own Python module (`pip install -e '.[kenlm]'`; it compiles from source). Without it
these tests are skipped, except under CI=true, where its absence is a failure (conftest.require_module). The models:
a KN trigram trained by `seqlm train` on a corpus the test writes (kenlm reads its model.arpa, seqlm its
model directory, i.e. the binary), and the PTB KN5 of the KenLM oracle when $SEQLM_DATA has it.
"""

from __future__ import annotations

import copy
import gzip
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqlm.kenlm as ours
from seqlm.cli import main
from seqlm.errors import SeqlmError
from test_kn import ORACLE, needs_oracle

from conftest import WORDS, require_module, write_chain_corpus, write_corpus

kenlm = require_module("kenlm", "the kenlm Python module is not installed (pip install -e '.[kenlm]')")

SPECIALS = ["<s>", "</s>", "<unk>", "zebra", "CAT"]  # context-only, end, unknown, OOV, OOV by case


@pytest.fixture(scope="module")
def kn_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kn")
    corpus = write_corpus(root / "corpus", n_train=200)
    out = root / "kn3"
    assert main(["train", "--model", "kn", "--order", "3", "--data", str(corpus), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def pair(kn_dir) -> tuple:
    """(kenlm on model.arpa, seqlm.kenlm on the model directory)."""
    return kenlm.Model(str(kn_dir / "model.arpa")), ours.Model(str(kn_dir))


def _sentences(draw_words: list[str]) -> str:
    return " ".join(draw_words)


words = st.lists(st.sampled_from(WORDS + SPECIALS), max_size=12)


def _assert_same_scores(theirs, mine, sentence: str) -> None:
    for bos in (True, False):
        for eos in (True, False):
            a, b = list(theirs.full_scores(sentence, bos, eos)), list(mine.full_scores(sentence, bos, eos))
            np.testing.assert_allclose([x[0] for x in b], [x[0] for x in a], atol=1e-4)
            assert [x[1:] for x in b] == [tuple(x[1:]) for x in a]
            assert mine.score(sentence, bos, eos) == pytest.approx(theirs.score(sentence, bos, eos), abs=1e-4)
    assert mine.perplexity(sentence) == pytest.approx(theirs.perplexity(sentence), rel=1e-4)


@settings(max_examples=60, deadline=None)
@given(sentence=words)
def test_sentence_calls_match_kenlm(pair, sentence):
    _assert_same_scores(*pair, _sentences(sentence))


@settings(max_examples=60, deadline=None)
@given(walk=st.lists(st.tuples(st.integers(0, 20), st.sampled_from(WORDS + SPECIALS)), min_size=1, max_size=25),
       start=st.sampled_from(["begin", "null"]))
def test_random_state_walks_match_kenlm(pair, walk, start):
    """A pool of states grows as words are scored from any state in it (as a beam decoder does); every
    BaseFullScore and BaseScore agrees, and equal kenlm states are equal seqlm states."""
    theirs, mine = pair
    pools = []
    for mod, model in ((kenlm, theirs), (ours, mine)):
        s = mod.State()
        (model.BeginSentenceWrite if start == "begin" else model.NullContextWrite)(s)
        pools.append([s])
    for pick, word in walk:
        results = []
        for (mod, model), pool in zip(((kenlm, theirs), (ours, mine)), pools, strict=True):
            src, out, out2 = pool[pick % len(pool)], mod.State(), mod.State()
            full = model.BaseFullScore(src, word, out)
            results.append((full.log_prob, full.ngram_length, full.oov, model.BaseScore(src, word, out2)))
            assert out == out2 and hash(out) == hash(out2)
            pool.append(out)
        (a_p, a_len, a_oov, a_base), (b_p, b_len, b_oov, b_base) = results
        assert b_p == pytest.approx(a_p, abs=1e-4) and b_base == pytest.approx(a_base, abs=1e-4)
        assert (b_len, b_oov) == (a_len, a_oov)


def test_model_attributes_vocabulary_and_states(pair, kn_dir):
    theirs, mine = pair
    assert mine.order == theirs.order == 3
    assert isinstance(mine.path, bytes) and mine.path == os.path.abspath(os.fsencode(str(kn_dir)))
    assert repr(mine) == "<Model from b'kn3'>" and repr(theirs) == "<Model from b'model.arpa'>"
    for w in WORDS + SPECIALS:
        assert (w in mine) == (w in theirs), w
    assert kenlm.LanguageModel is not kenlm.Model and issubclass(ours.LanguageModel, ours.Model)
    assert ours.LanguageModel(str(kn_dir)).score("the cat") == mine.score("the cat")
    for name in ("LAZY", "POPULATE_OR_LAZY", "POPULATE_OR_READ", "READ", "PARALLEL_READ"):
        assert getattr(ours.LoadMethod, name) == getattr(kenlm.LoadMethod, name)
    for name in ("ALL", "EXPENSIVE", "NONE"):
        assert getattr(ours.ARPALoadComplain, name) == getattr(kenlm.ARPALoadComplain, name)
    a, b = kenlm.Config(), ours.Config()
    assert (a.load_method, a.show_progress, a.arpa_complain) == (b.load_method, b.show_progress, b.arpa_complain)
    s, t = ours.State(), ours.State()
    mine.BeginSentenceWrite(s)
    r = mine.BaseFullScore(s, "the", t)
    assert repr(r) == f"FullScoreReturn({r.log_prob!r}, {r.ngram_length!r}, {r.oov!r})"
    assert copy.copy(t) == t and copy.deepcopy(t) == t and t != s
    assert pickle.loads(pickle.dumps(mine)).score("the cat sat") == mine.score("the cat sat")
    assert mine.score(b"the cat") == mine.score("the cat")
    for model in (theirs, mine):
        with pytest.raises(TypeError):
            model.BaseScore(s, 5, t)


def test_every_file_kind_loads_and_bad_paths_fail_as_kenlm(kn_dir, tmp_path):
    """The ARPA under another name, gzipped, the binary alone, the directory: one model. Missing files
    raise kenlm's OSError with its message start."""
    shutil.copy(kn_dir / "model.arpa", tmp_path / "lm.txt")
    (tmp_path / "lm.arpa.gz").write_bytes(gzip.compress((kn_dir / "model.arpa").read_bytes()))
    text = "the cat sat on a red mat"
    want = ours.Model(kn_dir).score(text)
    for path in (tmp_path / "lm.txt", tmp_path / "lm.arpa.gz", kn_dir / "model.bin", kn_dir / "model.arpa"):
        assert ours.Model(str(path)).score(text) == pytest.approx(want, abs=1e-5), path
    missing = str(tmp_path / "nope.arpa")
    with pytest.raises(OSError) as theirs:
        kenlm.Model(missing)
    with pytest.raises(OSError) as mine:
        ours.Model(missing)
    prefix = f"Cannot read model '{missing}' ("
    assert str(theirs.value).startswith(prefix) and str(mine.value).startswith(prefix)
    assert "No such file or directory" in str(theirs.value) and "No such file or directory" in str(mine.value)
    (tmp_path / "bad.arpa").write_text("not an arpa file\n")
    with pytest.raises(OSError, match=r"^Cannot read model '.*bad\.arpa' \(.*no \\data\\"):
        ours.Model(str(tmp_path / "bad.arpa"))
    (tmp_path / "lm.binary").write_bytes(b"mmap lm http://kheafield.com/code format version 5\n\0" + bytes(64))
    with pytest.raises(OSError, match="KenLM binary file"):
        ours.Model(str(tmp_path / "lm.binary"))


@needs_oracle
def test_ptb_kn5_matches_kenlm():
    theirs, mine = kenlm.Model(str(ORACLE / "kn5.arpa.gz")), ours.Model(str(ORACLE / "kn5.arpa.gz"))
    ptb_test = ORACLE.parent / "ptb" / "test.txt"
    lines = (ptb_test if ptb_test.is_file() else ORACLE / "query.txt").read_text().splitlines()[:300]
    for line in lines:
        _assert_same_scores(theirs, mine, line)
    s, t = ours.State(), ours.State()
    a, b = kenlm.State(), kenlm.State()
    mine.BeginSentenceWrite(s)
    theirs.BeginSentenceWrite(a)
    for word in " ".join(lines[:20]).split():  # one long walk across sentences, as a streaming decoder
        x, y = mine.BaseFullScore(s, word, t), theirs.BaseFullScore(a, word, b)
        assert (x.log_prob, x.ngram_length, x.oov) == (pytest.approx(y.log_prob, abs=1e-4), y.ngram_length, y.oov)
        s, t, a, b = t, s, b, a


# ---- neural models through the same API ---------------------------------------------------------------


@pytest.fixture(scope="module")
def lstm_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lstm")
    corpus = write_chain_corpus(root / "corpus", n_train=120, n_eval=10)
    out = root / "lstm"
    assert main(["train", "--model", "lstm", "--data", str(corpus), "--out", str(out), "--hidden", "16",
                 "--layers", "2", "--max-epochs", "1", "--batch-size", "8", "--threads", "1"]) == 0
    return out


def test_neural_state_walk_equals_the_sentence_score(lstm_dir):
    """BaseFullScore word by word (batched steps behind it) gives what one forward pass gives."""
    m = ours.Model(str(lstm_dir))
    text = "the cat zebra sat on the mat"
    s, t = ours.State(), ours.State()
    m.BeginSentenceWrite(s)
    walk = []
    for w in text.split() + ["</s>"]:
        r = m.BaseFullScore(s, w, t)
        walk.append((r.log_prob, r.ngram_length, r.oov))
        s, t = t, s
    full = list(m.full_scores(text))
    np.testing.assert_allclose([x[0] for x in walk], [x[0] for x in full], atol=1e-4)
    assert [x[1:] for x in walk] == [x[1:] for x in full]
    assert [x[2] for x in full] == [False, False, True, False, False, False, False, False]
    assert m.score(text) == pytest.approx(sum(x[0] for x in full), abs=1e-4) and m.order == 0
    # equal histories are equal states, whichever State objects hold them
    a, b, c, d = ours.State(), ours.State(), ours.State(), ours.State()
    m.BeginSentenceWrite(a)
    m.BeginSentenceWrite(b)
    m.BaseScore(a, "the", c)
    m.BaseScore(b, "the", d)
    assert c == d and hash(c) == hash(d) and c != a


def test_neural_model_refuses_what_it_cannot_do(lstm_dir):
    m = ours.Model(str(lstm_dir))
    s, t = ours.State(), ours.State()
    with pytest.raises(SeqlmError, match="no null context"):
        m.NullContextWrite(s)
    with pytest.raises(SeqlmError, match="no null context"):
        m.score("the cat", bos=False)
    with pytest.raises(SeqlmError, match="BeginSentenceWrite"):
        m.BaseScore(s, "the", t)
