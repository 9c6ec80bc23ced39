"""Discretisation bottlenecks and c(s) (discrete-autoencoders.txt, Sec. 2)."""

from __future__ import annotations

import pytest
import torch

from seqlm.nn.bottleneck import GumbelBottleneck, SemanticHashing, bits_to_symbols, saturating_sigmoid, symbols_to_bits
from seqlm.nn.compress import Compress


def test_saturating_sigmoid_is_the_papers_formula():
    x = torch.linspace(-6, 6, 101)
    ref = torch.tensor([max(0.0, min(1.0, 1.2 / (1 + torch.exp(-v).item()) - 0.1)) for v in x])
    assert torch.allclose(saturating_sigmoid(x), ref, atol=1e-6)
    assert saturating_sigmoid(torch.tensor(2.4)) == 1.0  # the paper: saturated above 2.4


def _grad_and_value(hard_fraction: float, noise: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    sh = SemanticHashing(d_model=8, bits=6, filter_size=16, noise_std=noise, hard_fraction=hard_fraction).train()
    w = torch.randn(4, 5, 8, requires_grad=True)
    upstream = torch.randn(4, 5, 6)
    torch.manual_seed(1)  # the same noise draw in both modes
    vd, v2 = sh.discretise(w)
    (vd * upstream).sum().backward()
    return w.grad, vd.detach(), v2


@pytest.mark.parametrize("noise", [0.0, 1.0])
def test_straight_through_gradient_equals_the_soft_path(noise):
    g_hard, v_hard, bits = _grad_and_value(1.0, noise)
    g_soft, v_soft, _ = _grad_and_value(0.0, noise)
    assert torch.equal(v_hard, bits)  # forward: the hard bits
    assert not torch.equal(v_soft, bits)  # the soft path really is different
    assert torch.allclose(g_hard, g_soft, atol=1e-6)  # backward: v1's gradient either way


def test_half_the_sequences_see_hard_bits():
    torch.manual_seed(0)
    sh = SemanticHashing(d_model=8, bits=16, filter_size=16, noise_std=1.0).train()
    vd, v2 = sh.discretise(torch.randn(2000, 3, 8))
    hard = (vd == v2).all(-1).all(-1)  # (rows,) a soft row almost never equals its bits exactly
    assert 0.45 < hard.float().mean() < 0.55
    assert int(sh.steps) == 1


def test_hard_share_ramps_up_over_the_warmup():
    torch.manual_seed(0)
    sh = SemanticHashing(d_model=8, bits=16, filter_size=16, noise_std=0.0, hard_fraction=1.0, hard_warmup=10).train()
    w = torch.randn(400, 3, 8)
    share = []
    for _ in range(12):
        vd, v2 = sh.discretise(w)
        share.append(float((vd == v2).all(-1).all(-1).float().mean()))
    assert share[0] == 0.0  # step 0: every row soft
    assert 0.3 < share[4] < 0.5  # step 4 of 10: 40% hard
    assert share[10] == share[11] == 1.0  # after the warm-up: the configured share (here all)


def test_balanced_bits_cannot_be_constant():
    """A projection whose bias pins every bit: plain semantic hashing emits one symbol, balanced bits fire for
    about half of the batch each (their batch mean is removed before the noise and the threshold)."""
    torch.manual_seed(0)
    plain = SemanticHashing(d_model=8, bits=16, filter_size=16, noise_std=0.0).train()
    balanced = SemanticHashing(d_model=8, bits=16, filter_size=16, noise_std=0.0, balance=True).train()
    balanced.proj.load_state_dict(plain.proj.state_dict())
    with torch.no_grad():
        for sh in (plain, balanced):
            sh.proj.bias.fill_(50.0)
    w = torch.randn(64, 4, 8)
    assert plain(w)[1].unique().numel() == 1
    _, v2 = balanced.discretise(w)
    assert torch.allclose(v2.mean((0, 1)), torch.full((16,), 0.5), atol=0.15)
    v = balanced.proj(w)
    ref = (v - v.mean((0, 1))) / torch.sqrt(v.var((0, 1), unbiased=False) + 1e-5) > 0  # by hand
    assert torch.equal(v2.bool(), ref)
    balanced.eval()  # evaluation: the running statistics, deterministic
    assert torch.equal(balanced(w)[1], balanced(w)[1])


def test_evaluation_is_deterministic_bits_without_noise():
    torch.manual_seed(0)
    sh = SemanticHashing(d_model=8, bits=16, filter_size=16, noise_std=1.5).eval()
    w = torch.randn(3, 4, 8)
    d1, s1 = sh(w)
    d2, s2 = sh(w)
    assert torch.equal(s1, s2) and torch.equal(d1, d2)
    assert torch.equal(s1, bits_to_symbols(sh.proj(w) > 0))
    assert torch.allclose(sh.embed_symbols(s1), d1, atol=1e-6)


def test_symbols_and_bits_round_trip():
    s = torch.tensor([0, 1, 5, 65535, 40000])
    assert torch.equal(bits_to_symbols(symbols_to_bits(s, 16)), s)
    assert symbols_to_bits(torch.tensor(6), 4).tolist() == [0.0, 1.0, 1.0, 0.0]


def test_gumbel_argmax_at_eval_and_annealed_mixture_in_training():
    torch.manual_seed(0)
    g = GumbelBottleneck(d_model=32, bits=4, tau_start=2.0, tau_min=0.5, anneal_rate=0.1)  # 16 symbols in 32-d
    w = torch.randn(2, 3, 32)
    dense, sym = g.eval()(w)
    assert torch.equal(sym, g.proj(w).argmax(-1)) and torch.equal(dense, g.embed(sym))
    g.train()
    assert g.temperature == 2.0
    out, _ = g(w)
    weights = torch.linalg.lstsq(g.embed.weight.t(), out.reshape(-1, 32).t()).solution  # (16, 6) mixture weights
    assert torch.allclose(weights.sum(0), torch.ones(6), atol=1e-4) and bool((weights > -1e-4).all())
    for _ in range(30):
        g(w)
    assert g.temperature == pytest.approx(max(0.5, 2.0 * torch.exp(torch.tensor(-3.1)).item()))


def _compress(local: bool, pretrain: int = 0) -> Compress:
    torch.manual_seed(0)
    return Compress(d_model=8, k=2, bottleneck=SemanticHashing(8, 16, 32), local=local, pretrain_steps=pretrain)


@pytest.mark.parametrize("local", [False, True])
def test_code_length_is_ceil_t_over_k_whatever_the_batch_padding(local):
    c = _compress(local).eval()
    s = torch.randn(1, 13, 8)
    alone, sym_alone, m_alone = c(s, torch.ones(1, 13, dtype=torch.bool))
    assert alone.shape[1] == 4 and m_alone.all()  # ceil(13 / 4)
    batch = torch.cat([torch.cat([s, torch.randn(1, 9, 8)], 1), torch.randn(1, 22, 8)])  # row 0 padded with junk
    mask = torch.ones(2, 22, dtype=torch.bool)
    mask[0, 13:] = False
    dense, sym, m = c(batch, mask)
    assert m[0].tolist() == [True] * 4 + [False] * 2 and m[1].all()
    assert torch.equal(sym[0, :4], sym_alone[0]) and torch.allclose(dense[0, :4], alone[0], atol=1e-5)
    assert (dense[0, 4:] == 0).all()


def test_local_symbol_depends_only_on_its_own_k_inputs():
    c = _compress(local=True).eval()
    s = torch.randn(1, 16, 8, requires_grad=True)
    short, _ = c.shorten(s, torch.ones(1, 16, dtype=torch.bool))  # (1, 4, 8)
    for j in range(4):
        (grad,) = torch.autograd.grad(short[0, j].sum(), s, retain_graph=True)
        touched = grad[0].abs().sum(-1) > 0  # (16,)
        assert touched.nonzero().flatten().tolist() == list(range(4 * j, 4 * j + 4))
    glob = _compress(local=False).eval()
    short, _ = glob.shorten(s, torch.ones(1, 16, dtype=torch.bool))
    (grad,) = torch.autograd.grad(short[0, 1].sum(), s)
    assert (grad[0].abs().sum(-1) > 0).sum() > 4  # the global c(s) sees beyond its own K inputs


def test_side_path_skips_the_bottleneck_for_the_first_steps():
    c = _compress(local=False, pretrain=2).train()
    s, mask = torch.randn(2, 8, 8), torch.ones(2, 8, dtype=torch.bool)
    for step in range(3):
        dense, _, _ = c(s, mask)
        short, _ = c.shorten(s, mask)
        assert torch.allclose(dense, short) == (step < 2)
