"""seqlm models inside pyctcdecode's CTC beam search (seqlm.kenlm.ctc), with the real pyctcdecode.

References: pyctcdecode's own kenlm-backed decoder on the same ARPA (the same beams, scores within 1e-4),
and for a neural model the sentence score of one forward pass (seqlm.kenlm full_scores), which the
decoder's LM part of the best beam must equal; both with and without lm_score_boundary, one logit matrix at
a time and in batch (decode_beams_batch). Skipped when pyctcdecode is not installed (`pip install -e '.[ctc]'`).

pyctcdecode 0.5.0 has no AbstractLMState (its main branch wraps states in one); where the installed release
lacks it, the test of seqlm's wrapping runs against a stand-in declaring only what that class declares (an
ABC whose get_mp_safe_state gives None): it checks seqlm's side of that contract, not the newer decoder.
"""

from __future__ import annotations

import abc
import importlib
import math
import multiprocessing
import pickle

import numpy as np
import pytest

import seqlm.kenlm as kenlm
from seqlm.cli import main

from conftest import require_module, write_chain_corpus, write_corpus

require_module("pyctcdecode", "pyctcdecode is not installed (pip install -e '.[ctc]')")
from pyctcdecode.alphabet import Alphabet  # noqa: E402
from pyctcdecode.constants import DEFAULT_UNK_LOGP_OFFSET  # noqa: E402
from pyctcdecode.decoder import BeamSearchDecoderCTC  # noqa: E402
from pyctcdecode.language_model import AbstractLanguageModel  # noqa: E402

import seqlm.kenlm.ctc as ctc  # noqa: E402
from seqlm.kenlm.ctc import SeqlmLanguageModel, build_ctcdecoder  # noqa: E402

ALPHA, BETA = 0.6, 1.0


def fields(beam) -> tuple[str, float, float]:
    """(text, acoustic score, combined score) of an output beam: a tuple in pyctcdecode 0.5.0 (with the LM
    state, or without from decode_beams_batch), an OutputBeam after."""
    if isinstance(beam, tuple):
        return beam[0], beam[-2], beam[-1]
    return beam.text, beam.logit_score, beam.lm_score


def labels_for(words: list[str]) -> list[str]:
    return ["", " ", *sorted({c for w in words for c in w})]


def simulate_logits(text: str, labels: list[str], rng: np.random.Generator, noise: float) -> np.ndarray:
    """(frames, len(labels)) CTC logits for `text`: 1-2 frames per character, a blank after each (so
    repeated letters survive), peak 4 over Gaussian noise of scale `noise`."""
    index = {c: i for i, c in enumerate(labels)}
    frames = []
    for c in text:
        frames += [index[c]] * int(rng.integers(1, 3)) + [index[""]]
    logits = rng.normal(0.0, noise, (len(frames), len(labels)))  # (F, C)
    logits[np.arange(len(frames)), frames] += 4.0
    return logits


@pytest.fixture(scope="module")
def kn_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("kn")
    corpus = write_corpus(root / "corpus", n_train=200)
    out = root / "kn3"
    assert main(["train", "--model", "kn", "--order", "3", "--data", str(corpus), "--out", str(out)]) == 0
    return out, corpus


def assert_same_beams(a: list, b: list) -> None:
    (ta, la, ca), (tb, lb, cb) = zip(*map(fields, a), strict=True), zip(*map(fields, b), strict=True)
    assert tb == ta
    np.testing.assert_allclose(cb, ca, atol=1e-4)  # combined scores
    np.testing.assert_allclose(lb, la, atol=1e-9)  # acoustic scores


@pytest.mark.parametrize("boundary", [True, False])
def test_kn_beams_equal_pyctcdecode_with_the_kenlm_module(kn_dir, boundary):
    require_module("kenlm", "the kenlm Python module is not installed")
    import pyctcdecode

    out, corpus = kn_dir
    vocab = [w for w in kenlm.Model(str(out)).vocab.itos if not w.startswith("<")]
    labels = labels_for(vocab)
    theirs = pyctcdecode.build_ctcdecoder(labels, str(out / "model.arpa"), unigrams=vocab, alpha=ALPHA, beta=BETA,
                                          lm_score_boundary=boundary)
    ours = build_ctcdecoder(labels, str(out), unigrams=vocab, alpha=ALPHA, beta=BETA, lm_score_boundary=boundary)
    rng = np.random.default_rng(0)
    lines = (corpus / "test.txt").read_text().splitlines()[:8]
    several, logits_list = 0, []
    for line in lines:
        logits = simulate_logits(line, labels, rng, noise=1.5)
        a = theirs.decode_beams(logits, beam_width=16, beam_prune_logp=-30.0)
        assert_same_beams(a, ours.decode_beams(logits, beam_width=16, beam_prune_logp=-30.0))
        several += len(a) > 1
        logits_list.append(logits)
    assert several >= len(lines) // 2  # several beams survive: the LM's ranking of them is compared
    # in batch, in this process and in a pool of forked ones (where states must survive pickling)
    want = theirs.decode_beams_batch(None, logits_list[:3], beam_width=16, beam_prune_logp=-30.0)
    for a, b in zip(want, ours.decode_beams_batch(None, logits_list[:3], beam_width=16, beam_prune_logp=-30.0),
                    strict=True):
        assert_same_beams(a, b)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        got = ours.decode_beams_batch(pool, logits_list[:3], beam_width=16, beam_prune_logp=-30.0)
    for a, b in zip(want, got, strict=True):
        assert_same_beams(a, b)


def test_partial_words_and_params_follow_pyctcdecode(kn_dir):
    out, _ = kn_dir
    model = kenlm.Model(str(out))
    lm = SeqlmLanguageModel(model, ["cat", "dog", "zebra"], unk_score_offset=-10.0)
    assert lm.score_partial_token("ca") == 0.0 and lm.score_partial_token("cat") == 0.0
    assert lm.score_partial_token("catx") == -10.0
    assert lm.score_partial_token("zeb") == -10.0  # zebra is not in the model: dropped from the unigrams
    assert lm.score_partial_token("xxxxxxxxx") == pytest.approx(-10.0 * 9 / 6)  # longer than 6: scaled
    assert SeqlmLanguageModel(model).score_partial_token("ca") == -10.0  # no unigrams: every part is unknown
    lm.reset_params(alpha=0.3, score_boundary=False)
    assert (lm.alpha, lm.score_boundary) == (0.3, False)
    with pytest.raises(ValueError):
        lm.reset_params(alpha=1)
    score, _ = lm.score(lm.get_start_state(), "cat")
    assert score == pytest.approx(0.3 * math.log(10) * model.score("cat", bos=False, eos=False) + lm.beta)


def test_word_and_partial_scores_equal_pyctcdecode_kenlm_language_model(kn_dir):
    real_kenlm = require_module("kenlm", "the kenlm Python module is not installed")
    from pyctcdecode.language_model import LanguageModel

    out, _ = kn_dir
    unigrams = ["the", "cat", "dog", "sat", "zebra"]
    for boundary in (True, False):
        theirs = LanguageModel(real_kenlm.Model(str(out / "model.arpa")), unigrams, alpha=ALPHA, beta=BETA,
                               score_boundary=boundary)
        ours = SeqlmLanguageModel(str(out), unigrams, alpha=ALPHA, beta=BETA, score_boundary=boundary)
        for part in ["t", "th", "thx", "do", "zeb", "catcatcat", ""]:
            assert ours.score_partial_token(part) == theirs.score_partial_token(part)
        a, b = theirs.get_start_state(), ours.get_start_state()
        for i, word in enumerate(["the", "cat", "zebra", "ran", "dog", "sat"]):
            (x, a), (y, b) = theirs.score(a, word, i == 5), ours.score(b, word, i == 5)
            assert y == pytest.approx(x, abs=1e-4)
        assert ours.order == theirs.order == 3


@pytest.fixture(scope="module")
def lstm(tmp_path_factory):
    """(seqlm.kenlm.Model of a tiny LSTM trained on a chain corpus, the corpus)."""
    root = tmp_path_factory.mktemp("lstm")
    corpus = write_chain_corpus(root / "corpus", n_train=200, n_eval=10)
    out = root / "lstm"
    assert main(["train", "--model", "lstm", "--data", str(corpus), "--out", str(out), "--hidden", "16",
                 "--layers", "1", "--max-epochs", "2", "--batch-size", "8", "--threads", "1"]) == 0
    return kenlm.Model(str(out)), corpus


def test_neural_model_decodes_end_to_end_with_batched_steps(lstm):
    model, corpus = lstm
    vocab = [w for w in model.vocab.itos if not w.startswith("<")]
    labels = labels_for(vocab)
    decoder = build_ctcdecoder(labels, model, alpha=ALPHA, beta=BETA)
    lm = model.model
    calls = {"steps": 0, "rows": 0}
    step = lm.step

    def counted(tokens, state):
        calls["steps"] += 1
        calls["rows"] += len(tokens)
        return step(tokens, state)

    lm.step = counted
    rng = np.random.default_rng(1)
    line = (corpus / "test.txt").read_text().splitlines()[0]
    beams = decoder.decode_beams(simulate_logits(line, labels, rng, noise=1.0), beam_width=8)
    text, logit_score, combined = fields(beams[0])
    words = text.split()
    assert words and all(w in vocab for w in words)
    lm.step = step
    want = ALPHA * math.log(10) * model.score(text) + BETA * len(words)  # one forward pass, no decoder
    assert combined - logit_score == pytest.approx(want, abs=1e-4)
    assert calls["steps"] < calls["rows"]  # rows were batched: fewer calls than rows stepped


class SentenceScoringLM(AbstractLanguageModel):
    """The reference for a neural model: pyctcdecode's language model calls answered without states, each
    word's score the difference of two whole-sentence scores (one forward pass each, seqlm.kenlm's score)."""

    def __init__(self, model: kenlm.Model, vocab: list[str], boundary: bool):
        self.model, self.vocab, self.boundary = model, set(vocab), boundary
        self.partial = SeqlmLanguageModel(model, vocab)  # partial words: not what is compared here

    @property
    def order(self) -> int:
        return ctc.UNBOUNDED_ORDER

    def get_start_state(self) -> tuple[str, ...]:
        return ()

    def score_partial_token(self, partial_token: str) -> float:
        return self.partial.score_partial_token(partial_token)

    def score(self, prev_state, word, is_last_word=False):
        words = (*prev_state, word or "<unk>")  # kenlm reads "" (pyctcdecode's word at a final space) as unknown
        log10 = self.model.score(" ".join(words), eos=is_last_word and self.boundary) - \
            self.model.score(" ".join(prev_state), eos=False)
        offset = DEFAULT_UNK_LOGP_OFFSET if word not in self.vocab else 0.0  # added to log10 p, as pyctcdecode
        return ALPHA * (log10 + offset) * math.log(10) + BETA, words


def test_neural_model_without_score_boundary_and_in_batch(lstm):
    """lm_score_boundary=False: a neural model has no null context, so the beam is still read from <s>, but
    no </s> is scored after it; the beams are those of the stateless reference, and decode_beams_batch gives
    what decode_beams gives, matrix by matrix."""
    model, corpus = lstm
    vocab = [w for w in model.vocab.itos if not w.startswith("<")]
    labels = labels_for(vocab)
    decoder = build_ctcdecoder(labels, model, alpha=ALPHA, beta=BETA, lm_score_boundary=False)
    reference = BeamSearchDecoderCTC(Alphabet.build_alphabet(labels), SentenceScoringLM(model, vocab, False))
    rng = np.random.default_rng(2)
    logits_list = [simulate_logits(line, labels, rng, noise=1.0)
                   for line in (corpus / "test.txt").read_text().splitlines()[:3]]
    for logits, batched in zip(logits_list, decoder.decode_beams_batch(None, logits_list, beam_width=8),
                               strict=True):
        beams = decoder.decode_beams(logits, beam_width=8)
        assert_same_beams(reference.decode_beams(logits, beam_width=8), beams)
        assert_same_beams(beams, batched)
        words = fields(beams[0])[0].split()
        assert words and all(w in vocab for w in words)


class StandInLMState(abc.ABC):  # noqa: B024 (abstract without abstract methods, as the class it stands for)
    """What pyctcdecode's main branch declares of AbstractLMState: an ABC whose get_mp_safe_state gives None."""

    def get_mp_safe_state(self):
        return None


@pytest.fixture
def with_lm_state_class(monkeypatch):
    """seqlm.kenlm.ctc re-imported where pyctcdecode has AbstractLMState: the real class if the installed
    release has it, else the stand-in; re-imported as it was afterwards."""
    import pyctcdecode.language_model as language_model

    base = getattr(language_model, "AbstractLMState", None)
    if base is None:
        base = StandInLMState
        monkeypatch.setattr(language_model, "AbstractLMState", base, raising=False)
    importlib.reload(ctc)
    yield base
    monkeypatch.undo()
    importlib.reload(ctc)


def test_states_are_wrapped_where_pyctcdecode_has_an_lm_state_class(with_lm_state_class, kn_dir, lstm):
    base = with_lm_state_class
    assert issubclass(ctc.SeqlmLMState, base)
    out, _ = kn_dir
    for boundary in (True, False):
        lm = ctc.SeqlmLanguageModel(str(out), ["the", "cat", "sat"], alpha=ALPHA, beta=BETA, score_boundary=boundary)
        start = lm.get_start_state()
        assert isinstance(start, base)
        score, after = lm.score(start, "the")
        assert isinstance(after, base) and isinstance(after.state, kenlm.State)
        bare = kenlm.State()
        (lm.model.BeginSentenceWrite if boundary else lm.model.NullContextWrite)(bare)
        assert lm.score(bare, "the") == (score, after)  # a caller's own bare start state is taken too
        copied = pickle.loads(pickle.dumps(after.get_mp_safe_state()))  # n-gram states cross processes
        assert copied == after and lm.score(copied, "cat", True)[0] == lm.score(after, "cat", True)[0]
    neural = ctc.SeqlmLanguageModel(lstm[0], alpha=ALPHA, beta=BETA, score_boundary=False)
    _, after = neural.score(neural.get_start_state(), "the")
    assert isinstance(after, base) and after.get_mp_safe_state() is None  # a node of this process's tree
