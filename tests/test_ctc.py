"""seqlm models inside pyctcdecode's CTC beam search (seqlm.kenlm.ctc), with the real pyctcdecode.

References: pyctcdecode's own kenlm-backed decoder on the same ARPA (the same beams, scores within 1e-4),
and for a neural model the sentence score of one forward pass (seqlm.kenlm full_scores), which the
decoder's LM part of the best beam must equal. Skipped when pyctcdecode is not installed
(`pip install -e '.[ctc]'`).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import seqlm.kenlm as kenlm
from seqlm.cli import main

from conftest import require_module, write_chain_corpus, write_corpus

require_module("pyctcdecode", "pyctcdecode is not installed (pip install -e '.[ctc]')")
from seqlm.kenlm.ctc import SeqlmLanguageModel, build_ctcdecoder  # noqa: E402

ALPHA, BETA = 0.6, 1.0


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


def test_kn_beams_equal_pyctcdecode_with_the_kenlm_module(kn_dir):
    require_module("kenlm", "the kenlm Python module is not installed")
    import pyctcdecode

    out, corpus = kn_dir
    vocab = [w for w in kenlm.Model(str(out)).vocab.itos if not w.startswith("<")]
    labels = labels_for(vocab)
    theirs = pyctcdecode.build_ctcdecoder(labels, str(out / "model.arpa"), unigrams=vocab, alpha=ALPHA, beta=BETA)
    ours = build_ctcdecoder(labels, str(out), unigrams=vocab, alpha=ALPHA, beta=BETA)
    rng = np.random.default_rng(0)
    lines = (corpus / "test.txt").read_text().splitlines()[:8]
    several = 0
    for line in lines:
        logits = simulate_logits(line, labels, rng, noise=1.5)
        a, b = theirs.decode_beams(logits, beam_width=16, beam_prune_logp=-30.0), \
            ours.decode_beams(logits, beam_width=16, beam_prune_logp=-30.0)
        assert [x[0] for x in b] == [x[0] for x in a]
        np.testing.assert_allclose([x[-1] for x in b], [x[-1] for x in a], atol=1e-4)  # combined scores
        np.testing.assert_allclose([x[-2] for x in b], [x[-2] for x in a], atol=1e-9)  # acoustic scores
        several += len(a) > 1
    assert several >= len(lines) // 2  # several beams survive: the LM's ranking of them is compared


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


def test_neural_model_decodes_end_to_end_with_batched_steps(tmp_path):
    corpus = write_chain_corpus(tmp_path / "corpus", n_train=200, n_eval=10)
    out = tmp_path / "lstm"
    assert main(["train", "--model", "lstm", "--data", str(corpus), "--out", str(out), "--hidden", "16",
                 "--layers", "1", "--max-epochs", "2", "--batch-size", "8", "--threads", "1"]) == 0
    model = kenlm.Model(str(out))
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
    text, _, _, logit_score, combined = beams[0]
    words = text.split()
    assert words and all(w in vocab for w in words)
    lm.step = step
    want = ALPHA * math.log(10) * model.score(text) + BETA * len(words)  # one forward pass, no decoder
    assert combined - logit_score == pytest.approx(want, abs=1e-4)
    assert calls["steps"] < calls["rows"]  # rows were batched: fewer calls than rows stepped
