"""Tests for seqlm.nn: FullSoftmax, ClassSoftmax (+ frequency_classes) and the Elman layer."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from seqlm.errors import SeqlmError
from seqlm.nn.class_softmax import ClassSoftmax, frequency_classes
from seqlm.nn.elman import Elman, elman_reference
from seqlm.nn.softmax import AdaptiveSoftmax, FullSoftmax, adaptive_cutoffs


def zipf_counts(vocab_size: int, seed: int = 0) -> list[int]:
    """Zipf-like counts in shuffled id order (so id order != frequency order), with some ties."""
    g = torch.Generator().manual_seed(seed)
    counts = [max(1, 1000 // (r + 1)) for r in range(vocab_size)]
    perm = torch.randperm(vocab_size, generator=g).tolist()
    return [counts[p] for p in perm]


# --------------------------------------------------------------------------- frequency_classes


@pytest.mark.parametrize(
    ("counts", "num_classes", "expected"),
    [
        # total 20, C=3: cum after word 0 is 10/20 > 1/3 -> advance; after word 1 15/20 > 2/3 -> advance
        ([10, 5, 3, 1, 1], 3, [0, 1, 2, 2, 2]),
        # same counts shuffled: sort by count desc, ties by id -> order 2, 1, 4, 0, 3
        ([1, 5, 10, 1, 3], 3, [2, 1, 0, 2, 2]),
        # one word jumps over two boundaries, but the class advances one step per word only
        ([100, 1, 1, 1], 3, [0, 1, 2, 2]),
        # strict '>': cum 2/4 does not exceed 1/2, so word 2 still joins class 0
        ([1, 1, 1, 1], 2, [0, 0, 0, 1]),
        # uniform counts with C = V: the toolkit rule alone would put everything in class 0 (cum = (k+1)/C
        # never *exceeds* a boundary); the no-empty-class guarantee forces one word per class
        ([1, 1, 1], 3, [0, 1, 2]),
        ([7, 7, 7, 7], 1, [0, 0, 0, 0]),
    ],
)
def test_frequency_classes_hand_examples(counts: list[int], num_classes: int, expected: list[int]) -> None:
    assert frequency_classes(counts, num_classes).tolist() == expected
    assert frequency_classes(torch.tensor(counts), num_classes).tolist() == expected


@pytest.mark.parametrize("num_classes", [1, 2, 7, 30, 100, 200])
def test_frequency_classes_invariants(num_classes: int) -> None:
    counts = zipf_counts(200)
    classes = frequency_classes(counts, num_classes)  # (V,)
    c = torch.tensor(counts)
    assert classes.dtype == torch.long and classes.shape == (200,)
    # every class is used
    assert torch.bincount(classes, minlength=num_classes).min() >= 1
    assert classes.max() == num_classes - 1
    # counts are non-increasing across classes: every word of class k is at least as frequent as any
    # word of class k+1
    for k in range(num_classes - 1):
        assert c[classes == k].min() >= c[classes == k + 1].max()


def test_frequency_classes_rejects_bad_num_classes() -> None:
    with pytest.raises(ValueError):
        frequency_classes([3, 2, 1], 4)
    with pytest.raises(ValueError):
        frequency_classes([3, 2, 1], 0)


# --------------------------------------------------------------------------- output layers


def make_class_softmax(hidden: int = 16, vocab_size: int = 60, num_classes: int = 7) -> ClassSoftmax:
    torch.manual_seed(0)
    return ClassSoftmax(hidden, zipf_counts(vocab_size), num_classes)


@pytest.mark.parametrize("num_classes", [1, 7, 60])
def test_class_softmax_normalised_and_targets(num_classes: int) -> None:
    layer = make_class_softmax(num_classes=num_classes)
    h = torch.randn(40, 16) * 3  # (N, H)
    targets = torch.randint(0, 60, (40,))  # (N,)
    lp = layer.log_probs(h)  # (N, V)
    assert lp.shape == (40, 60) and lp.dtype == torch.float32
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(40), atol=1e-5, rtol=0)
    tlp = layer.target_log_probs(h, targets)  # (N,)
    assert tlp.shape == (40,)
    torch.testing.assert_close(tlp, lp.gather(1, targets[:, None]).squeeze(1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_classes", [1, 7, 60])
def test_class_softmax_pair_log_probs_are_the_tables_entries(num_classes: int) -> None:
    """A decoder's (row, word) pairs, rows and classes repeated, one-word classes among them (60 classes of 60
    words): each entry equals the class-by-class softmax of the raw parameters, in float64 to rounding."""
    layer = make_class_softmax(num_classes=num_classes).double()
    h = torch.randn(9, 16, dtype=torch.float64) * 3  # (B, H)
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, 9, (50,), generator=g)  # (N,) some rows never asked, others many times
    targets = torch.cat([torch.randint(0, 60, (45,), generator=g), torch.tensor([0, 0, 1, 59, 59])])  # (N,)
    got = layer.pair_log_probs(h, rows, targets)  # (N,)
    torch.testing.assert_close(got, class_by_class(layer, h)[rows, targets], atol=1e-12, rtol=0)


def test_class_softmax_pair_log_probs_keep_their_normalisers_in_a_memo() -> None:
    """With a memo (a decoder's pool keeps one for its rows), each (row, class) normaliser is computed once and
    read back by later calls, the table grown as rows come: every call still equals the class-by-class softmax,
    and a value planted in the table shows in the entries of that (row, class) (what was read, not recomputed)."""
    layer = make_class_softmax(num_classes=7).double()
    h = torch.randn(9, 16, dtype=torch.float64) * 3  # (B, H): the first 5 rows read, then 4 more
    g = torch.Generator().manual_seed(2)
    memo: dict = {}
    word = 59  # the rarest word: in the last class, of many words
    for b in (5, 9, 9):
        rows, targets = torch.randint(0, b, (30,), generator=g), torch.randint(0, 60, (30,), generator=g)  # (N,)
        rows, targets = torch.cat([rows, torch.tensor([3])]), torch.cat([targets, torch.tensor([word])])
        got = layer.pair_log_probs(h[:b], rows, targets, memo)  # (N,)
        torch.testing.assert_close(got, class_by_class(layer, h[:b])[rows, targets], atol=1e-12, rtol=0)
    table = memo["class_norms"]  # (>= 9, C)
    assert table.shape[0] >= 9 and table.shape[1] == 7
    c = int(layer.word_class[word])
    assert not table[3, c].isnan()  # (3, word) asked above
    table[3, c] += 1.0
    got = layer.pair_log_probs(h, torch.tensor([3, 4]), torch.tensor([word, word]), memo)  # (2,)
    want = class_by_class(layer, h)[[3, 4], word]
    torch.testing.assert_close(got, want - torch.tensor([1.0, 0.0], dtype=torch.float64), atol=1e-12, rtol=0)


def class_by_class(layer: ClassSoftmax, h: torch.Tensor) -> torch.Tensor:
    """(N, V) log P(c(w)|h) + log softmax over c(w)'s words, a class at a time, from the raw parameters."""
    class_lp = torch.log_softmax(layer.class_proj(h), -1)  # (N, C)
    row_logits = layer.word_proj(h)  # (N, V) in row order
    word_logits = row_logits[:, layer.word_to_row]  # (N, V) in word-id order
    expected = torch.empty(len(h), len(layer.word_class), dtype=h.dtype)
    for c in range(layer.num_classes):
        members = (layer.word_class == c).nonzero().squeeze(1)
        expected[:, members] = class_lp[:, c : c + 1] + torch.log_softmax(word_logits[:, members], -1)
    return expected


def test_class_softmax_log_probs_is_class_factorised() -> None:
    """log P(w|h) = log P(c(w)|h) + log P(w|c(w),h), checked from the raw parameters in word-id order."""
    layer = make_class_softmax().double()
    h = torch.randn(5, 16, dtype=torch.float64)
    torch.testing.assert_close(layer.log_probs(h), class_by_class(layer, h), atol=1e-10, rtol=0)


@pytest.mark.parametrize("num_classes", [1, 7, 60])
def test_class_softmax_gradients_match_full_distribution(num_classes: int) -> None:
    layer = make_class_softmax(num_classes=num_classes).double()
    h = torch.randn(30, 16, dtype=torch.float64, requires_grad=True)
    # targets from a few words only, so most classes get no target in this batch
    targets = torch.tensor([0, 3, 3, 17, 42, 59] * 5)
    weights = torch.randn(30, dtype=torch.float64)  # a non-uniform loss exercises the scatter-back

    params = [h, *layer.parameters()]
    loss_a = (layer.target_log_probs(h, targets) * weights).sum()
    # with C = V every class has one word, so the word head gets no gradient at all (None)
    grads_a = torch.autograd.grad(loss_a, params, allow_unused=True)
    loss_b = (layer.log_probs(h).gather(1, targets[:, None]).squeeze(1) * weights).sum()
    grads_b = torch.autograd.grad(loss_b, params)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(torch.zeros_like(gb) if ga is None else ga, gb, atol=1e-10, rtol=1e-8)


def test_class_softmax_gradcheck_float64() -> None:
    """Exact float64 gradients of target_log_probs w.r.t. h (finite differences)."""
    torch.manual_seed(1)
    layer = ClassSoftmax(4, [9, 7, 5, 4, 3, 3, 2, 1, 1, 1], 3).double()
    targets = torch.tensor([0, 4, 9, 9, 2, 6])
    h = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: layer.target_log_probs(h, targets), (h,))


def test_class_softmax_targets_in_a_single_class() -> None:
    layer = make_class_softmax()
    big_class = int(layer.word_class.max())
    members = (layer.word_class == big_class).nonzero().squeeze(1)
    targets = members[torch.randint(0, len(members), (9,))]  # (N,) all in one class
    h = torch.randn(9, 16, requires_grad=True)
    tlp = layer.target_log_probs(h, targets)
    torch.testing.assert_close(tlp, layer.log_probs(h).gather(1, targets[:, None]).squeeze(1))
    tlp.sum().backward()
    assert torch.isfinite(h.grad).all()
    # the class head still gets a gradient; rows of words outside the class get none
    assert layer.class_proj.weight.grad.abs().sum() > 0
    other_rows = layer.word_to_row[layer.word_class != big_class]
    assert layer.word_proj.weight.grad[other_rows].abs().sum() == 0


def test_class_softmax_never_builds_n_by_v() -> None:
    """target_log_probs (forward and backward) creates no tensor as large as (N, V)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    n, vocab_size, hidden = 64, 1000, 8  # hidden < n, so the (V, H) weight gradient is smaller than N*V

    class LargestTensor(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, Tensor):
                    LargestTensor.largest = max(LargestTensor.largest, t.numel())
            return out

    torch.manual_seed(0)
    layer = ClassSoftmax(hidden, zipf_counts(vocab_size), 30)
    h = torch.randn(n, hidden, requires_grad=True)
    targets = torch.randint(0, vocab_size, (n,))
    with LargestTensor():
        layer.target_log_probs(h, targets).sum().backward()
    assert 0 < LargestTensor.largest < n * vocab_size


def test_full_softmax() -> None:
    torch.manual_seed(0)
    layer = FullSoftmax(16, 50)
    h = torch.randn(20, 16) * 3
    targets = torch.randint(0, 50, (20,))
    lp = layer.log_probs(h)
    assert lp.shape == (20, 50)
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(20), atol=1e-5, rtol=0)
    torch.testing.assert_close(layer.target_log_probs(h, targets), lp.gather(1, targets[:, None]).squeeze(1))


@pytest.mark.parametrize("kind", ["full", "class"])
def test_softmax_under_bf16_autocast(kind: str) -> None:
    torch.manual_seed(0)
    layer = FullSoftmax(16, 60) if kind == "full" else make_class_softmax()
    h = torch.randn(24, 16, requires_grad=True)
    targets = torch.randint(0, 60, (24,))
    ref = layer.target_log_probs(h, targets)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        tlp = layer.target_log_probs(h, targets)
        lp = layer.log_probs(h)
    assert tlp.dtype == torch.float32 and lp.dtype == torch.float32
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(24), atol=1e-5, rtol=0)
    torch.testing.assert_close(tlp, ref, atol=0.1, rtol=0.05)  # bf16 logits: loose
    tlp.sum().backward()
    assert h.grad is not None and torch.isfinite(h.grad).all()


# --------------------------------------------------------------------------- Elman


def elman_inputs(dtype: torch.dtype, batch: int = 3, steps: int = 7, inp: int = 5, hidden: int = 6):
    torch.manual_seed(0)
    x = torch.randn(batch, steps, inp, dtype=dtype)  # (B, T, I)
    h0 = torch.rand(batch, hidden, dtype=dtype)  # (B, H) a sigmoid-range state, also valid for tanh
    return x, h0


@pytest.mark.parametrize("impl", ["manual", "fused"])
@pytest.mark.parametrize("activation", ["sigmoid", "tanh"])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_elman_matches_reference(impl: str, activation: str, dtype: torch.dtype, tol: float) -> None:
    x, h0 = elman_inputs(dtype)
    layer = Elman(5, 6, activation=activation, impl=impl).to(dtype)
    args = (layer.weight_ih, layer.weight_hh, layer.bias)
    for start in (h0, None):
        out, h_last = layer(x, start)
        ref_start = layer.initial_state(3) if start is None else start
        ref_out, ref_last = elman_reference(x, *args, ref_start, activation)
        assert out.shape == (3, 7, 6) and h_last.shape == (3, 6) and out.dtype == dtype
        torch.testing.assert_close(out, ref_out, atol=tol, rtol=0)
        torch.testing.assert_close(h_last, ref_last, atol=tol, rtol=0)
        torch.testing.assert_close(h_last, out[:, -1], atol=tol, rtol=0)


@pytest.mark.parametrize("impl", ["manual", "fused"])
@pytest.mark.parametrize("activation", ["sigmoid", "tanh"])
def test_elman_gradients_match_reference(impl: str, activation: str) -> None:
    x, h0 = elman_inputs(torch.float64)
    x.requires_grad_()
    h0.requires_grad_()
    layer = Elman(5, 6, activation=activation, impl=impl).double()
    params = [layer.weight_ih, layer.weight_hh, layer.bias]
    w_out = torch.randn(3, 7, 6, dtype=torch.float64)
    w_last = torch.randn(3, 6, dtype=torch.float64)

    def loss(out: Tensor, h_last: Tensor) -> Tensor:
        return (out * w_out).sum() + (h_last * w_last).sum()

    grads = torch.autograd.grad(loss(*layer(x, h0)), [x, h0, *params])
    ref = torch.autograd.grad(loss(*elman_reference(x, *params, h0, activation)), [x, h0, *params])
    for g, r in zip(grads, ref, strict=True):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("activation", ["sigmoid", "tanh"])
def test_elman_manual_gradcheck(activation: str) -> None:
    x, h0 = elman_inputs(torch.float64, batch=2, steps=4, inp=3, hidden=4)
    layer = Elman(3, 4, activation=activation).double()
    inputs = (x.requires_grad_(), h0.requires_grad_(), layer.weight_ih, layer.weight_hh, layer.bias)

    def f(x: Tensor, h0: Tensor, w_ih: Tensor, w_hh: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        params = {"weight_ih": w_ih, "weight_hh": w_hh, "bias": b}
        return torch.func.functional_call(layer, params, (x, h0))

    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize("impl", ["manual", "fused", "reference"])
def test_elman_carry_state_across_halves(impl: str) -> None:
    x, h0 = elman_inputs(torch.float64)
    layer = Elman(5, 6, impl=impl).double()
    out, h_last = layer(x, h0)
    out1, h1 = layer(x[:, :3], h0)
    out2, h2 = layer(x[:, 3:], h1)
    torch.testing.assert_close(torch.cat([out1, out2], dim=1), out, atol=1e-12, rtol=0)
    torch.testing.assert_close(h2, h_last, atol=1e-12, rtol=0)


def last_step_grads(layer: Elman, x: Tensor, chunk: int, detach: bool) -> list[Tensor]:
    """Gradient of a loss on the last step's output when the sequence is fed in chunks of ``chunk``
    steps, carrying the state; ``detach`` cuts the graph at chunk boundaries (truncated BPTT)."""
    layer.zero_grad(set_to_none=True)
    h = layer.initial_state(x.shape[0])
    for start in range(0, x.shape[1], chunk):
        if detach:
            h = h.detach()
        out, h = layer(x[:, start : start + chunk], h)
    (out[:, -1] ** 2).sum().backward()
    return [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("impl", ["manual", "fused"])
def test_elman_truncated_bptt_with_long_chunk_equals_full_backprop(impl: str) -> None:
    x, _ = elman_inputs(torch.float64, steps=8)
    layer = Elman(5, 6, impl=impl).double()
    full = last_step_grads(layer, x, chunk=8, detach=False)
    # no detaching, several chunks: the gradient flows through the carried state (grad of h0)
    for g, f in zip(last_step_grads(layer, x, chunk=3, detach=False), full, strict=True):
        torch.testing.assert_close(g, f, atol=1e-12, rtol=0)
    for tau in (8, 11):  # detaching only at chunk boundaries with tau >= T: nothing is cut
        for g, f in zip(last_step_grads(layer, x, chunk=tau, detach=True), full, strict=True):
            torch.testing.assert_close(g, f, atol=1e-12, rtol=0)
    # sanity: with tau < T the truncation really changes the recurrent gradient
    short = last_step_grads(layer, x, chunk=3, detach=True)
    assert not torch.allclose(short[1], full[1])


def test_elman_initial_state_and_registration() -> None:
    sig, tanh = Elman(4, 5), Elman(4, 5, activation="tanh")
    assert torch.equal(sig.initial_state(2), torch.full((2, 5), 0.1))
    assert torch.equal(tanh.initial_state(2), torch.zeros(2, 5))
    # only the sigmoid-space parameters are registered (the fused path's nn.RNN is a template)
    assert set(sig.state_dict()) == {"weight_ih", "weight_hh", "bias"}
    with pytest.raises(ValueError):
        Elman(4, 5, activation="relu")
    with pytest.raises(ValueError):
        Elman(4, 5, impl="cuda")


@pytest.mark.parametrize("activation", ["sigmoid", "tanh"])
@pytest.mark.parametrize("tau", [None, 3])
def test_elman_under_bf16_autocast(activation: str, tau: int | None) -> None:
    """bf16 products, fp32 states and gradients: within bf16's rounding of the fp32 figures."""
    x, h0 = elman_inputs(torch.float32, hidden=32)
    layer = Elman(5, 32, activation=activation)
    ref, _ = layer(x, h0, tau=tau)
    ref.square().sum().backward()
    ref_grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = layer(x.bfloat16(), h0, tau=tau)
        assert out.dtype == torch.float32
        out.square().sum().backward()  # backward inside the autocast region must work too
    torch.testing.assert_close(out, ref, atol=0.02, rtol=0)
    assert not torch.equal(out, ref)  # the products did run in bf16
    for p, want in zip(layer.parameters(), ref_grads, strict=True):
        assert p.grad.dtype == torch.float32
        assert (p.grad - want).norm() < 0.02 * want.norm()


def test_class_softmax_state_dict_round_trip() -> None:
    layer = make_class_softmax()
    other = ClassSoftmax(16, [1] * 60, 7)  # different counts, so different classes until loaded
    other.load_state_dict(layer.state_dict())
    h, targets = torch.randn(10, 16), torch.randint(0, 60, (10,))
    torch.testing.assert_close(other.target_log_probs(h, targets), layer.target_log_probs(h, targets))


def test_elman_without_input_projection_matches_reference_paths():
    """input_size 0: the input already is W_x x(t) (an embedding of size H), as the paper's U lookup."""
    torch.manual_seed(0)
    x = torch.randn(3, 6, 5, dtype=torch.float64)
    outs = []
    for impl in ("manual", "fused", "reference"):
        torch.manual_seed(1)
        layer = Elman(0, 5, "sigmoid", impl=impl).double()
        outs.append(layer(x)[0])
        assert layer.weight_ih is None and "weight_ih" not in layer.state_dict()
    torch.testing.assert_close(outs[0], outs[2])
    torch.testing.assert_close(outs[1], outs[2])


@pytest.mark.parametrize("tail_bias", [False, True])
def test_adaptive_softmax_equals_a_hand_computation_over_frequency_ranks(tail_bias):
    torch.manual_seed(0)
    counts = [3, 50, 7, 1, 20, 9, 2, 40, 5, 4]  # word ids not in frequency order
    layer = AdaptiveSoftmax(6, counts, [2, 5], div_value=2.0, tail_bias=tail_bias).double()
    if tail_bias:
        torch.nn.init.normal_(layer.asm.tail[1][1].bias)
    h = torch.randn(4, 6, dtype=torch.float64)
    rank = {w: r for r, w in enumerate(sorted(range(10), key=lambda w: -counts[w]))}
    head = torch.log_softmax(layer.asm.head(h), -1)  # (N, 2 + 2 clusters)
    tails = [torch.log_softmax(t(h), -1) for t in layer.asm.tail]
    want = torch.empty(4, 10, dtype=torch.float64)
    for w, r in rank.items():  # head word: its own head entry; tail word: cluster entry + within-cluster
        c = 0 if r < 2 else 1 if r < 5 else 2
        want[:, w] = head[:, r] if c == 0 else head[:, 1 + c] + tails[c - 1][:, r - (2 if c == 1 else 5)]
    assert torch.allclose(layer.log_probs(h), want, atol=1e-12)
    targets = torch.tensor([1, 3, 9, 0])
    assert torch.allclose(layer.target_log_probs(h, targets), want[torch.arange(4), targets], atol=1e-12)
    assert torch.allclose(layer.log_probs(h).exp().sum(-1), torch.ones(4, dtype=torch.float64))


@pytest.mark.parametrize("tail_bias", [False, True])
def test_adaptive_softmax_starts_from_the_unigram_model(tail_bias):
    counts = torch.tensor([3, 50, 7, 1, 20, 9, 2, 40, 5, 4])
    layer = AdaptiveSoftmax(6, counts, [2, 5], div_value=2.0, unigram=True, tail_bias=tail_bias)
    got = layer.log_probs(torch.zeros(1, 6))[0]  # (V,) a zero state: the biases alone
    want = torch.log(counts / counts.sum())  # word-id order
    head = counts >= 40  # the two most frequent words
    torch.testing.assert_close(got[head], want[head])
    for cluster in ([20, 9, 7], [5, 4, 3, 2, 1]):  # each cluster's mass, ranks 2-4 and 5-9
        members = torch.isin(counts, torch.tensor(cluster))
        torch.testing.assert_close(torch.logsumexp(got[members], 0), torch.logsumexp(want[members], 0))
        if tail_bias:  # each tail word its own share; without a bias the cluster is uniform
            torch.testing.assert_close(got[members], want[members])
        else:
            torch.testing.assert_close(got[members], got[members][:1].expand(len(cluster)))


def test_adaptive_cutoffs_default_and_refusals():
    assert adaptive_cutoffs(60990) == [2000, 10000, 50000] and adaptive_cutoffs(10000) == [2000]
    assert adaptive_cutoffs(100, "10,50") == [10, 50]
    for bad in ("50,10", "0,5", "10,100", "x"):
        with pytest.raises(SeqlmError):
            adaptive_cutoffs(100, bad)


# --------------------------------------------------------------------------- ByteDropout
@pytest.mark.parametrize("p", [0.25, 0.3, 0.5])
def test_byte_dropout_drops_p_rounded_to_a_byte_and_keeps_the_expectation(p):
    """Training: the share dropped is p rounded to a multiple of 1/256 (within sampling error over 2M elements),
    the kept elements scaled so the mean is the input's, the gradient the same mask and scale; evaluation: the
    input itself."""
    from seqlm.nn.dropout import ByteDropout

    torch.manual_seed(0)
    layer = ByteDropout(p)
    x = torch.full((512, 20, 200), 2.0, requires_grad=True)
    y = layer(x)
    kept = y != 0
    q = 1 - round((1 - p) * 256) / 256  # the p it drops
    assert abs(1 - kept.float().mean().item() - q) < 0.002  # sd of the share: sqrt(q (1 - q) / 2M) < 0.0004
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 2.0 / (1 - q)))
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, kept.float() / (1 - q))
    assert abs(y.mean().item() - 2.0) < 0.01
    torch.manual_seed(0)
    assert torch.equal(layer(x), y)  # the seed decides the mask
    layer.eval()
    assert layer(x) is x


def test_byte_dropout_compiled_in_float32_equals_its_tensor_twin():
    """float32 goes through the compiled mask (byte_mask_mul), float64 through tensors: the same seed gives the
    same mask, and both the outputs and the gradients of a random upstream gradient agree to float32 rounding."""
    from seqlm.nn.dropout import ByteDropout

    x = torch.randn(7, 33, 5)
    upstream = torch.randn(7, 33, 5)
    got = []
    for dtype in (torch.float32, torch.float64):
        xi = x.to(dtype).requires_grad_()
        torch.manual_seed(3)
        y = ByteDropout(0.3)(xi)
        (g,) = torch.autograd.grad(y, xi, upstream.to(dtype))
        got.append((y.detach().double(), g.double()))
    (y32, g32), (y64, g64) = got
    assert torch.equal(y32 == 0, y64 == 0) and 0 < int((y64 == 0).sum()) < x.numel()
    torch.testing.assert_close(y32, y64, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(g32, g64, atol=1e-6, rtol=1e-6)


def test_byte_dropouts_random_bytes_are_uniform_and_follow_the_seed():
    """The compiled splitmix64 bytes: every value near 1/256 of 2^20 draws (4,096 expected; 5 sd ~ 320), the
    ragged tail filled, and torch's seed deciding the stream."""
    from seqlm.nn.dropout import _random_bytes

    torch.manual_seed(0)
    a = _random_bytes(2**20 + 3)
    counts = torch.bincount(a.long(), minlength=256)
    assert int(counts.min()) > 4096 - 320 and int(counts.max()) < 4096 + 320
    assert a[-3:].ne(0).any()
    torch.manual_seed(0)
    assert torch.equal(_random_bytes(2**20 + 3), a)
    assert not torch.equal(_random_bytes(2**20 + 3), a)
