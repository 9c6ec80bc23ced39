"""The FOFE authors' recipe as options of the fnn and fofe families (iNCML-DNNLM, read for facts):
`--param-init incml` (uniform +-sqrt(6 / (fan_in + fan_out)) for weights and biases, the embedding
+-sqrt(6 / (embed + V))) and fofe's `--start-pad bos` (every code from a copy of the sentence padded
with <s>, as source/batch-constructor.cpp lays the context out)."""

from __future__ import annotations

import math

import pytest
import torch

from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.models.fnn import FNNConfig, build_fnn
from seqlm.models.fofe import FOFEConfig, build_fofe
from seqlm.nn.fofe import fofe_codes
from seqlm.nn.softmax import VocabLayerConfig
from seqlm.protocol import Batch

VOCAB = Vocab(["</s>", "<unk>"] + [f"w{i}" for i in range(30)])


def _model(family: str, **kw):
    torch.manual_seed(0)
    if family == "fnn":
        return build_fnn(FNNConfig(order=3, embed=8, hidden=16, **kw), VOCAB)
    return build_fofe(FOFEConfig(order=3, embed=8, hidden=16, **kw), VOCAB)


@pytest.mark.parametrize("family", ["fnn", "fofe"])
def test_incml_init_draws_weights_and_biases_from_the_reference_ranges(family):
    m = _model(family, param_init="incml")
    layers = [*m.head.hidden, m.head.softmax.proj]
    assert [(lin.in_features, lin.out_features) for lin in layers][-1] == (16, len(VOCAB))
    for lin in layers:
        bound = math.sqrt(6.0 / (lin.in_features + lin.out_features))
        for p in (lin.weight, lin.bias):
            assert p.abs().max() <= bound and p.abs().max() > 0.8 * bound  # fills the range, not zero
    bound = math.sqrt(6.0 / (8 + len(VOCAB)))
    w = m.embedding.weight
    assert w.abs().max() <= bound and w.abs().max() > 0.8 * bound
    default = _model(family)  # seqlm's own: Glorot weights, zero hidden biases (unchanged)
    assert all(torch.count_nonzero(lin.bias) == 0 for lin in default.head.hidden)


def test_incml_init_and_start_pad_are_refused_where_they_cannot_hold():
    with pytest.raises(SeqlmError, match="--param-init must be one of"):
        FNNConfig(param_init="kaiming")
    with pytest.raises(SeqlmError, match="--start-pad must be one of"):
        FOFEConfig(start_pad="eos")
    with pytest.raises(SeqlmError, match="--param-init incml needs the plain embedding and softmax"):
        _model("fofe", param_init="incml", vocab_layers=VocabLayerConfig(objective="nce"))


def _reference_codes(model, sentence: list[int]) -> torch.Tensor:
    """(L+1, order, E): the codes iNCML-DNNLM's FOFE layer computes for a sentence w_1..w_L, written out
    from its source: row j predicts s[j] (s = w_1..w_L </s>); the lag-k context column holds <s> for
    j < k and s[j-k] after; each column is FOFE-encoded down the rows (z_j = alpha z_{j-1} + e)."""
    s = sentence + [VOCAB.eos_id]
    emb, a = model.embedding.weight.detach(), model.alpha
    out = torch.zeros(len(s), model.order, emb.shape[1], dtype=emb.dtype)
    for k in range(1, model.order + 1):
        z = torch.zeros(emb.shape[1], dtype=emb.dtype)
        for j in range(len(s)):
            z = a * z + emb[VOCAB.bos_id if j < k else s[j - k]]
            out[j, k - 1] = z
    return out


def _packed(sentences: list[list[int]]) -> Batch:
    """One row, sentences end to end, as seqlm's batches lay them out (inputs start with <s>)."""
    inputs, targets, resets = [], [], []
    for s in sentences:
        inputs += [VOCAB.bos_id, *s]
        targets += [*s, VOCAB.eos_id]
        resets += [True] + [False] * len(s)
    t = (torch.tensor([inputs]), torch.tensor([targets]), torch.ones(1, len(inputs), dtype=torch.bool),
         torch.tensor([resets]))
    return Batch(*t)


@pytest.mark.parametrize("alpha", [0.7, 0.0])
def test_start_pad_bos_gives_the_reference_codes(alpha):
    torch.manual_seed(1)
    m = build_fofe(FOFEConfig(order=3, alpha=alpha, embed=4, hidden=8, start_pad="bos"), VOCAB).double()
    sentences = [[5, 9, 2, 7, 7], [3], [4, 8]]  # one row: the codes restart at each sentence
    batch = _packed(sentences)
    with torch.no_grad():
        z = fofe_codes(m.embedding(batch.inputs), batch.resets, m.alpha)  # (T, E)
        feats = m._features(z, batch.resets)[0]  # (T, order*E)
    ref = torch.cat([_reference_codes(m, s) for s in sentences])  # (T, order, E)
    torch.testing.assert_close(feats.view(-1, 3, 4), ref)
    zero = build_fofe(FOFEConfig(order=3, alpha=alpha, embed=4, hidden=8), VOCAB).double()
    zero.load_state_dict(m.state_dict())
    with torch.no_grad():
        plain = zero._features(fofe_codes(zero.embedding(batch.inputs), batch.resets, alpha), batch.resets)[0]
    assert torch.equal(plain.view(-1, 3, 4)[:, 0], feats.view(-1, 3, 4)[:, 0])  # z_t itself is the same
    assert not torch.allclose(plain, feats)  # the older codes are not


def test_start_pad_bos_step_by_step_equals_the_whole_sentence():
    torch.manual_seed(2)
    m = build_fofe(FOFEConfig(order=3, embed=4, hidden=8, start_pad="bos"), VOCAB).double().eval()
    sentence = [5, 9, 2, 7, 7, 11]
    batch = _packed([sentence])
    with torch.no_grad():
        whole = m.score(batch)[0]  # (T,)
        state, steps = m.initial_state(1), []
        for tok, tgt in zip(batch.inputs[0], batch.targets[0], strict=True):
            logp, state = m.step(tok.view(1), state)  # (1, V)
            steps.append(logp[0, tgt])
    torch.testing.assert_close(torch.stack(steps), whole)
