"""nn/lstm_step.py: the LSTM's inference step (an input table for the first layer, one product for the others)
against torch's own LSTM on the same weights, and its tables following the weights when they change."""

from __future__ import annotations

import pytest
import torch

from seqlm.data.vocab import Vocab
from seqlm.models.lstm import LSTMConfig, build_lstm
from seqlm.nn import lstm_step
from seqlm.protocol import Batch

VOCAB = Vocab(["</s>", "<unk>", "a", "b", "c", "d", "e"], [4, 0, 4, 4, 2, 2, 1])


def _model(layers: int = 2, **kw):
    torch.manual_seed(0)
    model = build_lstm(LSTMConfig(**{"hidden": 8, "embed": 5, "layers": layers, **kw}), VOCAB).eval()
    with torch.no_grad():  # larger than the initialisation, so that every term shows
        for p in model.parameters():
            p.normal_()
    return model


def _torch_step(model, tokens, state):
    return model.lstm(model.embedding(tokens).unsqueeze(1), state)[1]  # torch's LSTM: the reference


def _state(model, rows: int):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(model.lstm.num_layers, rows, model.lstm.hidden_size, generator=g)
    return h, torch.randn(h.shape, generator=g)


@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("layers,tied", [(1, False), (2, False), (3, True)])
def test_the_inference_step_equals_torchs_lstm(monkeypatch, table, layers, tied):
    if not table:
        monkeypatch.setattr(lstm_step, "TABLE_BYTES", 0)
    model = _model(layers, **({"tie_embeddings": True, "embed": 8} if tied else {}))
    tokens, state = torch.tensor([2, 6, 0, 2, 3]), _state(model, 5)
    with torch.no_grad():
        got = model.recur(tokens, state)
        assert (model._step._table is not None) == table  # the path asked for served
        want = _torch_step(model, tokens, state)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_tables_follow_the_weights():
    """An optimizer step (in place) and load_state_dict change the weights: the next step sees them."""
    model = _model()
    tokens, state = torch.tensor([2, 3, 4]), _state(model, 3)
    with torch.no_grad():
        model.recur(tokens, state)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    model(_batch(), None)[2].sum().backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model.recur(tokens, state), _torch_step(model, tokens, state))
        other = _model()
        for p in other.parameters():
            p.mul_(-0.5)
        model.load_state_dict(other.state_dict())
        torch.testing.assert_close(model.recur(tokens, state), _torch_step(other, tokens, state))


def _batch() -> Batch:
    inputs, targets = torch.tensor([[0, 2, 3], [0, 4, 5]]), torch.tensor([[2, 3, 0], [4, 5, 0]])  # (B, T)
    return Batch(inputs, targets, torch.ones(2, 3, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool))


def test_training_and_autograd_keep_torchs_lstm():
    """With gradients on, or in training mode (dropout between layers), the step is torch's, gradients and all."""
    model = _model(dropout=0.5)
    tokens, state = torch.tensor([2, 3]), _state(model, 2)
    assert model._step.step(model.lstm, model.embedding, len(VOCAB), tokens, state, model.parameters()) is None
    h, _ = model.recur(tokens, state)
    assert h.requires_grad
    model.train()
    with torch.no_grad():
        assert model._step.step(model.lstm, model.embedding, len(VOCAB), tokens, state, model.parameters()) is None


def test_autocast_keeps_torchs_lstm():
    """Under the CPU's autocast (bf16) the step is torch's, whose products autocast chooses."""
    model = _model()
    tokens, state = torch.tensor([2, 3]), _state(model, 2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model._step.step(model.lstm, model.embedding, len(VOCAB), tokens, state, model.parameters()) is None
