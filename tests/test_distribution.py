"""The whole next-word distribution (seqlm.eval.distribution, Model.next_distribution of seqlm.kenlm).

References: BaseScore word by word (one Python walk per word for n-grams; one unbatched step chain per
history for neural models) and the probability axioms (each row sums to 1). `<s>` is context only: its
column is -inf and it is left out of the comparisons.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import seqlm.kenlm as kenlm
from seqlm.cli import main
from seqlm.data.vocab import Vocab
from seqlm.eval.distribution import next_distribution
from seqlm.models.afp import AFPConfig
from seqlm.models.fnn import FNNConfig
from seqlm.models.fofe import FOFEConfig
from seqlm.models.lstm import LSTMConfig
from seqlm.models.rnn import RNNConfig
from seqlm.models.transformer import TransformerConfig
from seqlm.registry import new_model

from conftest import WORDS, write_corpus


@pytest.fixture(scope="module")
def kn(tmp_path_factory) -> kenlm.Model:
    root = tmp_path_factory.mktemp("kn")
    corpus = write_corpus(root / "corpus", n_train=200)
    assert main(["train", "--model", "kn", "--order", "4", "--data", str(corpus), "--out", str(root / "m")]) == 0
    return kenlm.Model(str(root / "m"))


def _walk_states(model: kenlm.Model, n: int, seed: int) -> list[kenlm.State]:
    """n states reached by random word walks from a sentence start (OOVs and </s> included)."""
    rng, states = random.Random(seed), []
    for _ in range(n):
        s = kenlm.State()
        model.BeginSentenceWrite(s)
        for _ in range(rng.randint(0, 6)):
            t = kenlm.State()
            model.BaseScore(s, rng.choice(WORDS + ["zebra", "</s>"]), t)
            s = t
        states.append(s)
    return states


def _check(model: kenlm.Model, states: list[kenlm.State], dist: np.ndarray) -> None:
    itos = model.vocab.itos
    keep = [w for w, tok in enumerate(itos) if tok != "<s>"]
    assert dist.shape == (len(states), len(itos))
    np.testing.assert_allclose((10.0 ** dist[:, keep]).sum(axis=1), 1.0, atol=1e-5)
    for row, s in zip(dist, states, strict=True):
        want = [model.BaseScore(s, itos[w], kenlm.State()) for w in keep]
        np.testing.assert_allclose(row[keep], want, atol=1e-6)
    if "<s>" in model.vocab.stoi:
        assert np.all(dist[:, model.vocab.stoi["<s>"]] == -np.inf)


def test_ngram_distribution_from_states_equals_base_score(kn):
    states = _walk_states(kn, 40, seed=1)
    _check(kn, states, kn.next_distribution(states))


def test_ngram_distribution_from_histories_equals_the_state_version(kn):
    """The protocol-level function (word-id histories) agrees with the decoder-state one."""
    rng = random.Random(2)
    vocab = kn.vocab
    histories = [[vocab.id(rng.choice(WORDS + ["zebra"])) for _ in range(rng.randint(0, 7))] for _ in range(30)]
    states = []
    for h in histories:
        s = kenlm.State()
        kn.BeginSentenceWrite(s)
        for w in h:
            t = kenlm.State()
            kn.BaseScore(s, vocab.itos[w], t)
            s = t
        states.append(s)
    np.testing.assert_allclose(next_distribution(kn.model, histories), kn.next_distribution(states), atol=1e-9)


NEURAL = {
    "lstm": LSTMConfig(hidden=8, layers=2),
    "rnn": RNNConfig(hidden=8),
    "transformer": TransformerConfig(layers=1, hidden=8, heads=2, d_ff=16, context=6, dropout=0.0),
    "fnn": FNNConfig(order=3, embed=4, hidden=8, layers=1),
    "fofe": FOFEConfig(embed=4, hidden=8, layers=1),
    "afp": AFPConfig(iterations=2, hidden=8),
}


@pytest.mark.parametrize("family", list(NEURAL))
def test_neural_distribution_batched_equals_one_history_at_a_time(family, tmp_path):
    """Histories of mixed lengths (the transformer's longer than its window) in one call; the reference
    is a plain step chain per history, and seqlm.kenlm's batched pending steps give the same rows."""
    torch.manual_seed(0)
    vocab = Vocab(["</s>", "<unk>", *WORDS])
    model = new_model(family, NEURAL[family], vocab).eval()
    rng = random.Random(3)
    histories = [[rng.randrange(len(vocab)) for _ in range(rng.randint(0, 9))] for _ in range(12)]
    got = next_distribution(model, histories)  # (N, V)
    for row, h in zip(got, histories, strict=True):
        state = model.initial_state(1)
        with torch.no_grad():
            for tok in [vocab.bos_id, *h]:
                logp, state = model.step(torch.tensor([tok]), state)
        np.testing.assert_allclose(row, logp[0].double().numpy() / np.log(10), atol=1e-5)
    np.testing.assert_allclose((10.0 ** got).sum(axis=1), 1.0, atol=1e-5)
    model.family, model.config = family, NEURAL[family]
    import seqlm

    seqlm.save(model, tmp_path / "m")
    lm = kenlm.Model(str(tmp_path / "m"))
    states = []
    for h in histories:
        s = kenlm.State()
        lm.BeginSentenceWrite(s)
        for w in h:
            t = kenlm.State()
            lm.BaseScore(s, vocab.itos[w], t)
            s = t
        states.append(s)
    np.testing.assert_allclose(lm.next_distribution(states), got, atol=1e-5)
    _check(lm, states[:3], lm.next_distribution(states[:3]))
