"""BPTT(tau) as the RNNLM paper means it: the error of every position flows back through tau steps.

Checked against a brute-force autograd reference (float64, tiny sizes): one short Elman run per source
position u, started from the state before u-tau+1 held constant, so autograd itself decides what each
position's loss reaches.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from seqlm.cli import main
from seqlm.data.vocab import Vocab
from seqlm.models.rnn import RNNLM
from seqlm.nn.elman import Elman, elman_reference
from seqlm.protocol import Batch
from seqlm.train.steps import tbptt_step

from conftest import TINY, write_corpus

B, T, N_IN, H = 2, 7, 3, 4


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, N_IN, generator=g, dtype=torch.float64)
    h0 = torch.rand(B, H, generator=g, dtype=torch.float64)
    c = torch.randn(B, T, H, generator=g, dtype=torch.float64)  # loss = sum_u <c[:, u], s(u)>
    return x, h0, c


def _layer(activation: str) -> Elman:
    torch.manual_seed(3)
    return Elman(N_IN, H, activation).double()


def _grads(layer: Elman, x: torch.Tensor, h0: torch.Tensor, loss_fn) -> list[torch.Tensor]:
    layer.zero_grad(set_to_none=True)
    x, h0 = x.clone().requires_grad_(), h0.clone().requires_grad_()
    loss_fn(x, h0).backward()
    # a tensor the loss does not reach has no gradient (None): zeros, for comparing
    return [torch.zeros_like(t) if t.grad is None else t.grad for t in (x, h0, *layer.parameters())]


def _brute_force(layer: Elman, tau: int, c: torch.Tensor):
    """sum_u <c_u, s(u)>, where s(u) is recomputed from s(u-tau), a constant (h0 itself if u-tau+1 < 0)."""
    w = (layer.weight_ih, layer.weight_hh, layer.bias)

    def loss(x, h0):
        states, _ = elman_reference(x, *w, h0, layer.activation)  # (B, T, H)
        total = 0.0
        for u in range(T):
            a = u - tau + 1  # the first step source u flows back through
            start = h0 if a < 0 else (h0.detach() if a == 0 else states[:, a - 1].detach())
            s_u = elman_reference(x[:, max(a, 0) : u + 1], *w, start, layer.activation)[1]  # (B, H)
            total = total + (c[:, u] * s_u).sum()
        return total

    return loss


@pytest.mark.parametrize("activation", ["sigmoid", "tanh"])
@pytest.mark.parametrize("tau", [1, 2, 3, 6, 7, 10])
def test_bptt_tau_equals_the_brute_force_reference(tau: int, activation: str) -> None:
    x, h0, c = _inputs()
    layer = _layer(activation)
    got = _grads(layer, x, h0, lambda x, h0: (layer(x, h0, tau=tau)[0] * c).sum())
    ref = _grads(layer, x, h0, _brute_force(layer, tau, c))
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("tau", [1, 2, 4])
def test_a_positions_loss_reaches_exactly_tau_inputs(tau: int) -> None:
    x, h0, c = _inputs(1)
    layer = _layer("sigmoid")
    for u in range(T):
        grads = _grads(layer, x, h0, lambda x, h0, u=u: (layer(x, h0, tau=tau)[0][:, u] * c[:, u]).sum())
        reached = [t for t in range(T) if grads[0][:, t].abs().max() > 0]
        assert reached == list(range(max(0, u - tau + 1), u + 1))
        assert (grads[1].abs().max() > 0) == (u <= tau - 2)  # h0 only when s(-1) is inside the reach


def test_tau_one_is_plain_backpropagation_and_long_tau_is_full_bptt() -> None:
    x, h0, c = _inputs(2)
    layer = _layer("sigmoid")
    w = (layer.weight_ih, layer.weight_hh, layer.bias)

    def plain(x, h0):  # every step's previous state a constant
        s, total = h0, 0.0
        for t in range(T):
            s = elman_reference(x[:, t : t + 1], *w, s.detach(), "sigmoid")[1]
            total = total + (c[:, t] * s).sum()
        return total

    for got, ref in zip(_grads(layer, x, h0, lambda x, h0: (layer(x, h0, tau=1)[0] * c).sum()),
                        _grads(layer, x, h0, plain), strict=True):
        torch.testing.assert_close(got, ref, atol=1e-12, rtol=1e-10)
    full = _grads(layer, x, h0, lambda x, h0: (layer(x, h0)[0] * c).sum())
    for got, ref in zip(_grads(layer, x, h0, lambda x, h0: (layer(x, h0, tau=T + 1)[0] * c).sum()), full, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-12, rtol=1e-12)


def _model(tau: int, truncation: str = "exact") -> RNNLM:
    vocab = Vocab.build(Counter({f"w{i}": 30 - i for i in range(22)}))  # with </s> and <unk>: 24 words
    torch.manual_seed(0)
    return RNNLM(vocab, hidden=5, embed=0, activation="sigmoid", output="full", classes=0, tau=tau,
                 sentence_independent=False, truncation=truncation).double()


def _batch(inputs: torch.Tensor, mask: torch.Tensor, first: bool) -> Batch:
    resets = torch.zeros_like(mask)
    resets[:, 0] = first
    return Batch(inputs, (inputs + 1) % 24, mask, resets)


@pytest.mark.parametrize("tau", [1, 3, 5])
def test_rnnlm_reaches_tau_steps_back_across_a_chunk_edge(tau: int) -> None:
    """Chunk 2's first positions reach into chunk 1 (its last tau-1 inputs are re-run), and the gradient
    equals that of one pass over the whole text with the same positions scored."""
    stream = torch.arange(2, 20).view(1, 18).repeat(2, 1)  # distinct tokens: an embedding row per position
    model = _model(tau)
    for k in range(6):  # score only position k of the second chunk (text position 9 + k)
        mask1, mask2 = torch.zeros(2, 9, dtype=torch.bool), torch.zeros(2, 9, dtype=torch.bool)
        mask2[:, k] = True
        model.zero_grad(set_to_none=True)
        _, state, _ = tbptt_step(model, _batch(stream[:, :9], mask1 | True, True), None)
        loss, _, _ = tbptt_step(model, _batch(stream[:, 9:], mask2, False), state)
        loss.backward()
        rows = (model.embedding.weight.grad.abs().sum(1) > 0).nonzero().flatten().tolist()
        assert rows == [int(t) for t in stream[0, max(0, 9 + k - tau + 1) : 10 + k]]
        chunked = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        whole_mask = torch.cat([mask1, mask2], dim=1)
        loss, _, _ = tbptt_step(model, _batch(stream, whole_mask, True), None)
        loss.backward()
        for g, w in zip(chunked, (p.grad for p in model.parameters()), strict=True):
            torch.testing.assert_close(g, w, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("tau", [1, 3, 5])
def test_block_bptt_runs_the_chunk_and_its_context_back_together(tau: int) -> None:
    """--truncation block: chunk 2's errors flow back through all of chunk 2 and the tau-1 re-run inputs before it
    (rnnlm's -bptt-block), and the gradient equals the textbook autograd loop (impl "reference") run over
    those inputs from the state before them, held constant."""
    stream = torch.arange(2, 20).view(1, 18).repeat(2, 1)
    model = _model(tau, "block")
    mask1, mask2 = torch.ones(2, 9, dtype=torch.bool), torch.zeros(2, 9, dtype=torch.bool)
    mask2[:, 1::3] = True
    model.zero_grad(set_to_none=True)
    _, state, _ = tbptt_step(model, _batch(stream[:, :9], mask1, True), None)
    loss, _, _ = tbptt_step(model, _batch(stream[:, 9:], mask2, False), state)
    loss.backward()
    rows = (model.embedding.weight.grad.abs().sum(1) > 0).nonzero().flatten().tolist()
    start = 9 - (tau - 1)  # the first re-run input
    assert rows == [int(t) for t in stream[0, start:17]]  # the last scored position is 16
    block = [p.grad.clone() for p in model.parameters()]

    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        model.eval()
        _, before = model(_batch(stream[:, :start], mask1[:, :start] | True, True), None)  # (B, H)
        model.train()
    model.rnn.impl = "reference"
    window_mask = torch.cat([torch.zeros(2, tau - 1, dtype=torch.bool), mask2], dim=1)
    loss, _, _ = tbptt_step(model, _batch(stream[:, start:], window_mask, False), before)
    loss.backward()
    for g, w in zip(block, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=1e-10)


def test_truncation_through_the_cli_is_saved_and_bptt_still_means_seq_len(tmp_path, capsys) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "rnn"
    assert main(["train", "--model", "rnn", "--data", str(corpus), "--out", str(out), "--max-epochs", "1",
                 "--truncation", "block", "--bptt", "7", *TINY]) == 0
    model = json.loads((out / "config.json").read_text())["model"]
    assert (model["truncation"], model["train"]["seq_len"]) == ("block", 7)
    assert main(["train", "--model", "rnn", "--data", str(corpus), "--out", str(tmp_path / "bad"),
                 "--truncation", "chunk", *TINY]) == 2
    assert "--truncation must be one of exact, block" in capsys.readouterr().err
