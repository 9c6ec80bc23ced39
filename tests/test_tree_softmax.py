"""nn/tree_softmax.py: the Huffman tree, and the hierarchical softmax on it against a product over each path
computed by hand from the raw parameters."""

from __future__ import annotations

import math

import pytest
import torch

from seqlm.nn.tree_softmax import TreeSoftmax, huffman_paths

COUNTS = [50, 30, 10, 5, 5, 1, 1, 1, 0]


def test_huffman_paths_form_a_full_binary_tree_that_favours_frequent_words():
    path, sign, length = huffman_paths(COUNTS)  # (V, D), (V, D), (V,)
    V = len(COUNTS)
    assert math.isclose(sum(2.0 ** -int(n) for n in length), 1.0)  # Kraft: every inner node has two children
    codes = {tuple(sign[w, : length[w]].tolist()[::-1]) for w in range(V)}  # root first
    assert len(codes) == V  # no two words share a code
    assert not any(a != b and b[: len(a)] == a for a in codes for b in codes)  # none is a prefix of another
    for w in range(V):
        nodes = path[w, : length[w]].tolist()
        assert nodes[-1] == V - 2 and len(set(nodes)) == len(nodes)  # up to the root, each node once
        assert (sign[w, length[w]:] == 0).all() and (path[w, length[w]:] == 0).all()
    for a in range(V):  # Huffman: a more frequent word's code is never longer
        for b in range(V):
            if max(COUNTS[a], 1) > max(COUNTS[b], 1):
                assert length[a] <= length[b]
    assert torch.equal(huffman_paths(COUNTS)[0], path)  # the same counts, the same tree


def by_hand(layer: TreeSoftmax, h: torch.Tensor) -> torch.Tensor:
    """(N, V) log P from the raw parameters: a product of sigmoids along each word's path, a word at a time."""
    out = torch.zeros(len(h), layer.vocab_size, dtype=torch.float64)
    for w in range(layer.vocab_size):
        for d in range(int(layer.length[w])):
            n, turn = int(layer.path[w, d]), float(layer.sign[w, d])
            out[:, w] += torch.log(torch.sigmoid(turn * (h @ layer.weight[n] + layer.bias[n])))
    return out


def random_layer(dtype: torch.dtype = torch.float64) -> TreeSoftmax:
    layer = TreeSoftmax(6, COUNTS).to(dtype)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g))
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=g))
    return layer


def test_the_tree_softmax_is_exact_and_normalised():
    layer = random_layer()
    h = torch.randn(5, 6, dtype=torch.float64)
    want = by_hand(layer, h)  # (N, V)
    torch.testing.assert_close(layer.log_probs(h), want, atol=1e-12, rtol=0)
    torch.testing.assert_close(want.exp().sum(1), torch.ones(5, dtype=torch.float64), atol=1e-12, rtol=0)
    targets = torch.tensor([0, 3, 8, 8, 5])
    torch.testing.assert_close(layer.target_log_probs(h, targets), want[torch.arange(5), targets], atol=1e-12,
                               rtol=0)
    rows = torch.tensor([4, 4, 0, 2])
    torch.testing.assert_close(layer.pair_log_probs(h, rows, targets[:4]), want[rows, targets[:4]], atol=1e-12,
                               rtol=0)


def test_a_fresh_tree_softmax_is_the_codes_unigram_model():
    """Zero weights: every turn is 1/2, so P(w) = 2^-length(w) whatever h."""
    layer = TreeSoftmax(6, COUNTS)
    lp = layer.log_probs(torch.randn(3, 6))  # (N, V)
    torch.testing.assert_close(lp, -layer.length.float().expand(3, -1) * math.log(2.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tree_softmax_gradients_equal_autograd_through_the_hand_product(dtype):
    """The loss's gradients (float32: the compiled gather-dot; float64: its twin) equal autograd's through the
    hand-made product, to the dtype's rounding."""
    layer = random_layer(dtype)
    h = torch.randn(7, 6, dtype=dtype, requires_grad=True)
    targets = torch.tensor([0, 1, 8, 8, 6, 3, 2])
    weights = torch.randn(7, dtype=dtype)
    params = [h, layer.weight, layer.bias]
    got = torch.autograd.grad((layer.loss(h, targets) * weights).sum(), params)
    ref = random_layer(torch.float64)
    h64 = h.detach().double().requires_grad_()
    want = torch.autograd.grad((-by_hand(ref, h64)[torch.arange(7), targets] * weights.double()).sum(),
                               [h64, ref.weight, ref.bias])
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, atol=tol, rtol=tol)


def test_inference_word_scores_in_one_compiled_pass_equal_the_hand_product():
    """float32 without gradients: target_log_probs and pair_log_probs go through the compiled tree_pairs (the
    decoder's path); they equal the float64 hand product, and the gradient path's own float32 numbers."""
    layer = random_layer(torch.float32)
    h = torch.randn(5, 6)
    want = by_hand(random_layer(torch.float64), h.double())  # (N, V)
    targets, rows = torch.tensor([0, 3, 8, 8, 5]), torch.tensor([4, 4, 0, 2, 1])
    with torch.no_grad():
        got_t, got_p = layer.target_log_probs(h, targets), layer.pair_log_probs(h, rows, targets)
        assert layer._fused(h, rows, targets) is not None  # the compiled pass served them
        with pytest.raises(ValueError, match="out of range"):
            layer.pair_log_probs(h, torch.tensor([5]), targets[:1])
    torch.testing.assert_close(got_t.double(), want[torch.arange(5), targets], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_p.double(), want[rows, targets], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_p, layer.pair_log_probs(h, rows, targets).detach(), atol=1e-6, rtol=1e-6)


def test_inference_word_scores_stay_exact_at_extreme_scores():
    """The compiled pass multiplies 1 + e^-x along a path and takes one log: a deep path of scores at -29
    (28 of them: e^812, past a double's range without its 1e200 flush) and scores past -30 (the stable form)
    give the hand product's numbers."""
    counts = [2**k for k in range(30)]  # a path of 28 nodes for the rarest word
    layer = TreeSoftmax(6, counts)
    rare = 0
    with torch.no_grad():
        layer.bias[layer.path[rare, : layer.length[rare]]] = -29.0 * layer.sign[rare, : layer.length[rare]]
        layer.weight[layer.path[1, 0]] = 40.0  # one node of another word's path: scores far past -30 or +30
    h = torch.randn(3, 6)
    want = by_hand(layer.double(), h.double())  # (N, V)
    layer.float()
    targets, rows = torch.tensor([rare, 1, 1, 5]), torch.tensor([0, 0, 1, 2])
    with torch.no_grad():
        got = layer.pair_log_probs(h, rows, targets)
    assert want[0, rare] < -710  # past exp's range in double: the flush ran
    torch.testing.assert_close(got.double(), want[rows, targets], atol=1e-4, rtol=1e-5)
