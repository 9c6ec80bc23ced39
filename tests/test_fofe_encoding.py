"""FOFE encoding (fofe-fnnlm.txt Sec. 2-3) and the collision checks of Sec. 2.1."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqlm.eval.fofe_collisions import all_codes, colliding, corpus_collisions, plot, run, simulate
from seqlm.nn.fofe import decode, encode, encode_all, fofe_codes, fofe_codes_reference, fofe_matrix

A, B, C = 0, 1, 2

# -----------------------------------------------------------------------------
# the encoding


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.7, 1.0])
def test_paper_worked_example(alpha: float) -> None:
    a = alpha
    np.testing.assert_allclose(encode([A, B, C], 3, a), [a**2, a, 1])
    np.testing.assert_allclose(encode([A, B, C, B, C], 3, a), [a**4, a + a**3, 1 + a**2])
    # every prefix, and the torch path on one-hot rows, agree with it
    prefixes = encode_all([A, B, C, B, C], 3, a)
    np.testing.assert_allclose(prefixes[2], [a**2, a, 1])
    onehot = torch.eye(3, dtype=torch.float64)[[A, B, C, B, C]][None]  # (1, 5, 3)
    np.testing.assert_allclose(fofe_codes(onehot, None, a)[0].numpy(), prefixes)


def _random_case(seed: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 37, 5, generator=g, dtype=dtype)
    resets = torch.rand(3, 37, generator=g) < 0.15
    return x, resets


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7, 0.95, 1.0])
@pytest.mark.parametrize("chunk", [512, 8])  # one block, and the chunked path carrying z across blocks
def test_parallel_matches_recursion(alpha: float, chunk: int) -> None:
    x, resets = _random_case(0)
    want = fofe_codes_reference(x, resets, alpha)
    torch.testing.assert_close(fofe_codes(x, resets, alpha, chunk=chunk), want, atol=1e-5, rtol=0)
    z32 = fofe_codes(x.float(), resets, alpha, chunk=chunk)
    torch.testing.assert_close(z32, want.float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(fofe_codes(x, None, alpha, chunk=chunk), fofe_codes_reference(x, None, alpha))


def test_gradients_match_recursion() -> None:
    x, resets = _random_case(1)
    w = torch.randn(3, 37, 5, dtype=torch.float64)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    (fofe_codes(x1, resets, 0.6, chunk=10).tanh() * w).sum().backward()
    (fofe_codes_reference(x2, resets, 0.6).tanh() * w).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    small = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True)
    small_resets = torch.tensor([[0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 1, 0]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda v: fofe_codes(v, small_resets, 0.7, chunk=4), (small,))


def test_alpha_zero_is_identity() -> None:
    x, resets = _random_case(2)
    torch.testing.assert_close(fofe_codes(x, resets, 0.0), x)
    eye = torch.eye(6).expand(2, 6, 6)
    torch.testing.assert_close(fofe_matrix(torch.zeros(2, 6, dtype=torch.bool), 0.0), eye)


def test_fofe_matrix_is_block_lower_triangular() -> None:
    resets = torch.tensor([[False, False, True, False]])
    a = 0.5
    want = torch.tensor([[1, 0, 0, 0], [a, 1, 0, 0], [0, 0, 1, 0], [0, 0, a, 1]])
    torch.testing.assert_close(fofe_matrix(resets, a)[0], want)
    # resets[:, 0] is redundant: position 0 always starts a segment
    explicit = torch.tensor([[True, False, True, False]])
    torch.testing.assert_close(fofe_matrix(explicit, a), fofe_matrix(resets, a))


def test_reset_forgets_everything_before() -> None:
    x, _ = _random_case(3)
    resets = torch.zeros(3, 37, dtype=torch.bool)
    resets[:, 20] = True
    y = x.clone()
    y[:, :20] = torch.randn(3, 20, 5, dtype=torch.float64)  # change everything before the reset
    for chunk in (512, 7):
        zx, zy = fofe_codes(x, resets, 0.9, chunk=chunk), fofe_codes(y, resets, 0.9, chunk=chunk)
        torch.testing.assert_close(zx[:, 20:], zy[:, 20:])
        torch.testing.assert_close(zx[:, 20:], fofe_codes(x[:, 20:], None, 0.9))  # a fresh start at 20
        assert not torch.allclose(zx[:, :20], zy[:, :20])


def test_autocast_bfloat16() -> None:
    x, resets = _random_case(4, torch.float32)
    x.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = fofe_codes(x, resets, 0.7)
    assert z.dtype == torch.bfloat16
    want = fofe_codes_reference(x.detach().double(), resets, 0.7)
    assert (z.double() - want).abs().max() < 0.05 * want.abs().max()
    z.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    x, resets = _random_case(5, torch.float32)
    z = fofe_codes(x.cuda(), resets.cuda(), 0.7, chunk=16)
    assert z.is_cuda
    torch.testing.assert_close(z.cpu(), fofe_codes(x, resets, 0.7, chunk=16), atol=1e-5, rtol=0)


# -----------------------------------------------------------------------------
# exact decoding for alpha <= 0.5 (Sec. 2.1)


@st.composite
def _alpha_and_sequence(draw: st.DrawFn) -> tuple[float, list[int], int]:
    alpha = draw(st.floats(0.05, 0.5))
    vocab = draw(st.integers(1, 5))
    # float64 holds a code to ~1e-16 and decode's tol is 1e-9: keep the oldest weight alpha^(L-1) above
    # 1e-8 (for alpha = 0.05 that is 7 symbols; for alpha >= 0.19 the full 12).
    longest = min(12, 1 + int(math.log(1e-8) / math.log(alpha)))
    seq = draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=longest))
    return alpha, seq, vocab


@settings(max_examples=100, deadline=None)
@given(_alpha_and_sequence())
def test_decode_inverts_encode(case: tuple[float, list[int], int]) -> None:
    alpha, seq, vocab = case
    assert decode(encode(seq, vocab, alpha), alpha) == seq


def test_decode_rejects_non_unique_alpha_and_non_codes() -> None:
    with pytest.raises(ValueError, match="not unique"):
        decode(encode([A, B], 2, 0.7), 0.7)
    with pytest.raises(ValueError):
        decode(np.array([0.8, 0.0]), 0.5)  # 0.8 is neither 1 nor a sum of distinct powers fitting
    with pytest.raises(ValueError):
        decode(np.array([1.0, -0.3]), 0.5)
    assert decode(np.zeros(4), 0.5) == []
    # alpha = 0.5, the edge of uniqueness: all 64 binary sequences of length 6 come back
    for seq in itertools.product(range(2), repeat=6):
        assert decode(encode(seq, 2, 0.5), 0.5) == list(seq)


# -----------------------------------------------------------------------------
# collision simulation (Figure 2)


def _brute_force_colliding(codes: np.ndarray, eps: float) -> int:
    d = np.abs(codes[:, None, :] - codes[None, :, :]).max(axis=-1)  # (N, N) max-norm distances
    np.fill_diagonal(d, np.inf)
    return int((d < eps).any(axis=1).sum())


@pytest.mark.parametrize(
    "alpha, eps, vocab, max_len, lengths",
    [
        (0.5, 0.01, 2, 8, "exact"),
        (0.5, 0.007, 2, 8, "exact"),
        (0.7, 0.013, 2, 8, "exact"),
        (0.9, 0.0031, 2, 8, "all"),
        (0.35, 0.02, 3, 5, "exact"),
        (0.8, 0.05, 3, 5, "all"),
    ],
)
def test_colliding_matches_brute_force(
    alpha: float, eps: float, vocab: int, max_len: int, lengths: str
) -> None:
    codes = all_codes(max_len, alpha, vocab, lengths)
    assert colliding(codes, eps).sum() == _brute_force_colliding(codes, eps)


def test_simulation_known_counts() -> None:
    res = simulate(alphas=[0.25, 0.5, 1.0], epsilons=[0.01, 0.007, 1e-5], max_len=8)
    assert res["n_sequences"] == 2**8
    # alpha = 0.5: codes are 8-bit binary fractions, 2^-7 = 0.0078 apart: all collide at 0.01, none below
    assert res["collisions"]["0.01"][1] == 256
    assert res["collisions"]["0.007"][1] == 0
    # alpha <= 0.5: codes are unique; first differing at distance d < 8, they are >= alpha^7 / 3 apart
    assert res["collisions"]["1e-05"][:2] == [0, 0]
    # alpha = 1: codes are symbol counts, unique only for AAAAAAAA and BBBBBBBB
    assert [res["collisions"][e][2] for e in ("0.01", "0.007", "1e-05")] == [254, 254, 254]


# -----------------------------------------------------------------------------
# collisions among corpus prefixes


def _brute_force_corpus(sentences: list[np.ndarray], vocab: int, alpha: float, eps: float) -> tuple[int, int]:
    prefixes = sorted({tuple(int(w) for w in s[:t]) for s in sentences for t in range(1, len(s) + 1)})
    codes = np.stack([encode(p, vocab, alpha) for p in prefixes])
    d = np.abs(codes[:, None, :] - codes[None, :, :]).max(axis=-1)
    close = np.triu(d < eps, k=1)
    return int(close.sum()), int((close | close.T).any(axis=1).sum())


def test_corpus_planted_collisions() -> None:
    shared = np.arange(10, 22)  # 12 words no other part uses
    alpha, eps = 0.6, 0.01  # 0.6^9 = 0.0101 > eps > 0.6^10
    sentences = [
        np.r_[1, shared],  # and [2, shared] below: one word apart at distance k = 10, 11, 12 -> 3 pairs
        np.r_[1, shared],  # the same history again: not a collision, only more positions
        np.r_[2, shared],
        np.r_[3, shared[:9]],  # apart at distance 9 from the [1 ...] and [2 ...] prefixes: 0.0101, no
        np.r_[4, 5, shared[:8]],  # and the swap [5 4] below: alpha^8 (1 - alpha) = 0.0067 < eps at k = 8
        np.r_[5, 4, shared[:8]],
    ]
    res = corpus_collisions(sentences, 22, [alpha], eps, max_examples=100)["results"][0]
    pairs = {tuple(sorted(map(tuple, p))) for p in res["examples"]}
    planted = {tuple(sorted([(1, *shared[:k]), (2, *shared[:k])])) for k in (10, 11, 12)}
    planted.add(((4, 5, *shared[:8]), (5, 4, *shared[:8])))
    assert pairs == planted
    assert res["collision_pairs"] == 4
    assert res["prefixes_involved"] == 8
    assert res["positions_involved"] == 11  # the three [1, ...] prefixes occur twice
    want = _brute_force_corpus(sentences, 22, alpha, eps)
    assert (res["collision_pairs"], res["prefixes_involved"]) == want
    # alpha = 0.5, at most 13 words: codes are multiples of 0.5^12, so distinct ones are >= 2.4e-4 apart
    assert corpus_collisions(sentences, 22, [0.5], 2e-4)["results"][0]["collision_pairs"] == 0


@pytest.mark.parametrize("seed", range(4))
def test_corpus_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    vocab = 3 + seed  # few words, so prefixes repeat words and share suffixes
    sentences = [rng.integers(0, vocab, size=rng.integers(1, 12)) for _ in range(25)]
    for alpha, eps in [(0.3, 0.05), (0.55, 0.0123), (0.8, 0.0567), (0.95, 0.2011), (1.0, 0.5)]:
        res = corpus_collisions(sentences, vocab, [alpha], eps)["results"][0]
        want = _brute_force_corpus(sentences, vocab, alpha, eps)
        assert (res["collision_pairs"], res["prefixes_involved"]) == want, (alpha, eps)


def test_run_writes_json_and_png(tmp_path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a b c d\nb a c d\na b c d\n")
    out_json, out_png = tmp_path / "fofe.json", tmp_path / "fofe.png"
    res = run(
        alphas=[0.5, 0.9],
        epsilons=[0.01, 0.001],
        max_len=6,
        corpus_path=corpus,
        out_json=out_json,
        out_png=out_png,
        corpus_alphas=[0.6, 1.0],
    )
    assert out_json.exists() and out_png.stat().st_size > 0
    assert res["corpus"]["n_prefixes"] == 15  # 3 sentences of 4 words + </s>
    alpha1 = res["corpus"]["results"][1]
    # alpha = 1 codes are bags of words: "a b" ~ "b a", and so on with + c, + d, + </s>
    assert alpha1["alpha"] == 1.0 and alpha1["collision_pairs"] == 4
    plot(res["simulation"], tmp_path / "sim.png")
