"""The fused output-layer cross-entropy (seqlm.nn.cross_entropy) against autograd's linear + cross_entropy."""

import pytest
import torch
import torch.nn.functional as F

from seqlm.nn import FullSoftmax
from seqlm.nn.cross_entropy import BLOCK, linear_cross_entropy


def _case(n=2 * BLOCK + 7, hidden=8, vocab=53, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=g, dtype=torch.float64)  # float64: the reference is exact to ~1e-15
    w = torch.randn(vocab, hidden, generator=g, dtype=torch.float64)
    b = torch.randn(vocab, generator=g, dtype=torch.float64) if bias else None
    t = torch.randint(0, vocab, (n,), generator=g)
    up = torch.rand(n, generator=g, dtype=torch.float64)  # a gradient that differs per row
    return h, w, b, t, up


def _grads(fn, h, w, b, t, up, dtype):
    leaves = [x.detach().to(dtype).clone().requires_grad_() if x is not None else None for x in (h, w, b)]
    loss = fn(*leaves, t)
    (loss.double() * up).sum().backward()
    return loss.detach().double(), [x.grad.double() if x is not None else None for x in leaves]


def _reference(h, w, b, t):
    return F.cross_entropy(F.linear(h, w, b), t, reduction="none")


@pytest.mark.parametrize("bias", [True, False])
def test_losses_and_gradients_equal_autograd(bias):
    case = _case(bias=bias)
    ref_loss, ref_grads = _grads(_reference, *case, torch.float64)
    loss, grads = _grads(linear_cross_entropy, *case, torch.float32)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads, strict=True):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_float64_layers_stay_float64():
    case = _case()
    ref_loss, ref_grads = _grads(_reference, *case, torch.float64)
    loss, grads = _grads(linear_cross_entropy, *case, torch.float64)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_bf16_autocast_is_close_to_fp32():
    case = _case(n=3 * BLOCK, hidden=32, vocab=301, seed=1)
    ref_loss, ref_grads = _grads(_reference, *case, torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, grads = _grads(linear_cross_entropy, *case, torch.float32)
    assert loss.dtype == torch.float64 and grads[1].shape == ref_grads[1].shape
    assert (loss - ref_loss).abs().max() < 0.1 * ref_loss.abs().mean()  # bf16 has 8 mantissa bits
    for got, want in zip(grads, ref_grads, strict=True):
        assert (got - want).norm() < 0.05 * want.norm()


def test_backward_twice_is_refused():
    h, w, b, t, _ = _case()
    loss = linear_cross_entropy(h.float().requires_grad_(), w.float(), b.float(), t).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace operation"):  # the logits became their gradient
        loss.backward()


def test_full_softmax_trains_with_it_and_evaluates_exactly():
    torch.manual_seed(0)
    layer = FullSoftmax(hidden=6, vocab_size=40)
    h, t = torch.randn(50, 6), torch.randint(0, 40, (50,))
    loss = layer.loss(h, t)
    assert loss.grad_fn is not None and "LinearCrossEntropy" in type(loss.grad_fn).__name__
    torch.testing.assert_close(loss, -layer.target_log_probs(h, t), rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # evaluation takes autograd's path and gives the same figure
        torch.testing.assert_close(layer.loss(h, t), loss.detach(), rtol=1e-5, atol=1e-5)


def _class_layer(vocab=61, hidden=8, classes=9, seed=2):
    from seqlm.nn.class_softmax import ClassSoftmax

    torch.manual_seed(seed)
    counts = [1000 // (i + 1) + 1 for i in range(vocab)]  # Zipf-like: frequent words get one-word classes
    return ClassSoftmax(hidden, counts, classes).double()


def _class_grads(layer, h, t, up, fused: bool):
    layer.zero_grad(set_to_none=True)
    h = h.detach().clone().requires_grad_()
    loss = layer.loss(h, t) if fused else -layer.target_log_probs(h, t)  # target_log_probs: autograd's path
    (loss.double() * up).sum().backward()
    return loss.detach().double(), [h.grad.double()] + [p.grad.double().clone() for p in layer.parameters()]


@pytest.mark.parametrize("pad", [1, 8, 128])  # 128: a padded group longer than the batch
def test_class_loss_equals_autograd_path(pad, monkeypatch):
    from seqlm.nn.cross_entropy import ClassCrossEntropy

    monkeypatch.setattr(ClassCrossEntropy, "group_pad", staticmethod(lambda mm, acc: pad))  # bf16's padding
    layer = _class_layer()
    assert 1 in layer._class_sizes  # the one-word classes' P(w|c) = 1 is covered
    g = torch.Generator().manual_seed(3)
    h = torch.randn(97, 8, generator=g, dtype=torch.float64)
    t = torch.randint(0, 61, (97,), generator=g)
    t[t == 60] = 59  # leave the last class without targets: its gradient must be zero
    up = torch.rand(97, generator=g, dtype=torch.float64)
    ref_loss, ref_grads = _class_grads(layer, h, t, up, fused=False)
    loss, grads = _class_grads(layer, h, t, up, fused=True)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # without gradients the plain path runs: same figures
        torch.testing.assert_close(layer.loss(h, t), ref_loss, rtol=1e-12, atol=1e-12)


def test_class_loss_bf16_autocast_is_close():
    layer = _class_layer(hidden=32).float()
    g = torch.Generator().manual_seed(4)
    h = torch.randn(200, 32, generator=g)
    t = torch.randint(0, 61, (200,), generator=g)
    up = torch.ones(200, dtype=torch.float64)
    ref_loss, ref_grads = _class_grads(layer, h, t, up, fused=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, grads = _class_grads(layer, h, t, up, fused=True)
    assert loss.dtype == torch.float64 and all(p.dtype == torch.float32 for p in layer.parameters())
    assert (loss - ref_loss).abs().max() < 0.05 * ref_loss.abs().mean()  # bf16 has 8 mantissa bits
    for got, want in zip(grads, ref_grads, strict=True):
        assert (got - want).norm() < 0.05 * want.norm()
