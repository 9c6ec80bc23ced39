"""NCE with Z_h = 1 and ZRegression (seqlm.nn.nce): its gradient against the exact softmax gradient, exact
normalisation of NCE-trained models, ZRegression against the true log-normaliser, metrics and plot."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from seqlm.cli import main
from seqlm.data.vocab import Vocab
from seqlm.nn.nce import NCE, GatherDot
from seqlm.nn.softmax import VocabLayerConfig, build_embedding, build_output
from seqlm.nn.sparse_code import CodeBook


@pytest.mark.parametrize("sharing", ["batch", "token"])
def test_nce_gradient_points_the_way_of_the_softmax_gradient(sharing):
    """For a self-normalised model (Z_h = 1) and many noise words, the expected NCE gradient approaches the
    maximum-likelihood gradient (Gutmann & Hyvarinen 2012): the NCE weights k P_n / (p + k P_n) tend to 1.
    One context, its scores made log-normalised through the bias, targets drawn from another distribution."""
    torch.manual_seed(0)
    V, H, N = 20, 6, 64
    proj = nn.Linear(H, V).double()
    h = torch.randn(1, H, dtype=torch.float64).expand(N, H)
    with torch.no_grad():
        proj.bias.sub_(torch.logsumexp(proj(h[:1]), -1))  # now sum_w exp(s(w, h)) = 1: Z_h = 1 holds
    targets = torch.multinomial(F.softmax(torch.randn(V), -1), N, replacement=True)
    nce = NCE(H, torch.randint(1, 50, (V,)), k=500, power=1.0, sharing=sharing, normaliser="one").double()

    def grad(loss_fn) -> torch.Tensor:
        proj.zero_grad()
        loss_fn().backward()
        return torch.cat([proj.weight.grad.flatten(), proj.bias.grad.flatten()])

    exact = grad(lambda: F.cross_entropy(proj(h), targets, reduction="sum"))
    approx = grad(lambda: torch.stack([nce.loss(proj, h, targets).sum() for _ in range(20)]).mean())
    assert F.cosine_similarity(exact, approx, dim=0) > 0.95
    assert F.cosine_similarity(exact, torch.randn_like(exact), dim=0).abs() < 0.5  # a random one is not


def test_gather_dot_equals_autograds_gather_and_bmm(monkeypatch):
    """The blockwise gather-dot that per-token NCE scores with: values and the gradients of h, W and b equal the
    gathered rows' bmm through autograd, in float64, with repeated ids (the (V, H) gradient sums them) and a last
    block shorter than the others."""
    monkeypatch.setattr(GatherDot, "BLOCK", 4)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(10, 6, dtype=torch.float64, generator=g, requires_grad=True)  # (N, H)
    w = torch.randn(9, 6, dtype=torch.float64, generator=g, requires_grad=True)  # (V, H)
    b = torch.randn(9, dtype=torch.float64, generator=g, requires_grad=True)  # (V,)
    ids = torch.randint(0, 9, (10, 7), generator=g)  # (N, m): V = 9, so ids repeat
    upstream = torch.randn(10, 7, dtype=torch.float64, generator=g)
    got = GatherDot.apply(h, w, b, ids)
    grads = torch.autograd.grad((got * upstream).sum(), (h, w, b))
    want = torch.bmm(w[ids], h.unsqueeze(2)).squeeze(2) + b[ids]  # (N, m)
    want_grads = torch.autograd.grad((want * upstream).sum(), (h, w, b))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for a, e in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-12)


@pytest.mark.parametrize("with_lengths", [False, True])
def test_the_compiled_gather_dot_equals_the_twin(monkeypatch, with_lengths):
    """float32 on the CPU runs _gather_dot.cpp; its values and gradients equal the blockwise twin's in float64
    (to float32 rounding), with repeated ids and, with lengths, entries past each row's length 0 and without
    gradient (the tree softmax's padded paths)."""
    from seqlm.nn.kernels import compiled_for

    if os.environ.get("SEQLM_NATIVE", "1") == "0":
        pytest.skip("SEQLM_NATIVE=0: the twin alone runs")
    assert compiled_for(torch.zeros(1)) is not None  # built at install (setup.py) or on first use
    g = torch.Generator().manual_seed(3)
    h = torch.randn(37, 40, dtype=torch.float64, generator=g)  # (N, H): H not a multiple of 16
    w, b = torch.randn(11, 40, dtype=torch.float64, generator=g), torch.randn(11, dtype=torch.float64, generator=g)
    ids = torch.randint(0, 11, (37, 6), generator=g)  # (N, m)
    lengths = torch.randint(0, 7, (37,), generator=g) if with_lengths else None
    upstream = torch.randn(37, 6, dtype=torch.float64, generator=g)
    results = []
    for dtype in (torch.float32, torch.float64):
        leaves = [x.to(dtype).requires_grad_() for x in (h, w, b)]
        s = GatherDot.apply(*leaves, ids, lengths)  # (N, m)
        results.append([s, *torch.autograd.grad((s * upstream.to(dtype)).sum(), leaves)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    if with_lengths:
        past = torch.arange(6) >= lengths[:, None]  # (N, m)
        assert (results[0][0][past] == 0).all() and (results[1][0][past] == 0).all()
        no_grad = (torch.arange(6) >= lengths[:, None]).all(1)  # rows whose every entry is past their length
        assert (results[0][1][no_grad] == 0).all()


def test_exact_distribution_of_nce_trained_model_sums_to_one():
    torch.manual_seed(0)
    vocab = Vocab(["</s>", "<unk>"] + [f"w{i}" for i in range(30)], [50, 1] + list(range(60, 0, -2)))
    cfg = VocabLayerConfig(objective="nce", noise_samples=10, normaliser="one")
    out = build_output(cfg, vocab, 8, build_embedding(cfg, vocab, 8))
    opt = torch.optim.Adam(out.parameters(), lr=0.05)
    h = torch.randn(200, 8)
    y = torch.randint(0, len(vocab), (200,))
    for _ in range(50):
        opt.zero_grad()
        out.loss(h, y).mean().backward()
        opt.step()
    out.eval()
    logp = out.log_probs(h)  # (N, V)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(200), atol=1e-5)
    assert torch.allclose(out.target_log_probs(h, y), logp.gather(1, y[:, None]).squeeze(1), atol=1e-5)
    assert (torch.logsumexp(out.proj(h), -1) - 0).abs().max() > 1e-3  # its own scores were not normalised


def test_zregression_tracks_the_true_log_normaliser():
    """Fixed scores whose true log Z_h varies strongly with h, data drawn from the normalised model: NCE trains
    the ZRegression layer alone, and its log Z_h = w_Z . h + b_Z must land on log sum_w exp s(w, h)."""
    torch.manual_seed(0)
    V, H, N = 40, 10, 2000
    proj = nn.Linear(H, V)
    with torch.no_grad():
        proj.weight.copy_(torch.randn(H) + 0.3 * torch.randn(V, H))  # a part common to all words
    proj.requires_grad_(False)
    h = torch.randn(N, H)
    y = torch.multinomial(F.softmax(proj(h), -1), 1).squeeze(1)
    nce = NCE(H, torch.bincount(y, minlength=V), 25, 1.0, "batch", "regression")
    opt = torch.optim.Adam(nce.parameters(), lr=0.05)
    for _ in range(300):
        opt.zero_grad()
        nce.loss(proj, h, y).mean().backward()
        opt.step()
    with torch.no_grad():
        true = torch.logsumexp(proj(h), -1)  # (N,)
        pred = nce.log_z(h)
    assert true.std() > 1.0  # far from the constant Z_h = 1 assumes
    assert (pred - true).pow(2).mean().sqrt() < 0.15 * true.std()
    assert torch.corrcoef(torch.stack([pred, true]))[0, 1] > 0.98


def test_compressed_bias_starts_from_base_words_unigram():
    vocab = Vocab(["</s>", "<unk>", "a", "b", "c"], [4, 1, 8, 4, 2])
    book = CodeBook(["a", "b"], {"a": [(0, 1.0)], "b": [(1, 1.0)], "c": [(0, 0.5), (1, 0.5)]})
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        book.write(f"{d}/c.txt")
        cfg = VocabLayerConfig(objective="nce", codes=f"{d}/c.txt")
        out = build_output(cfg, vocab, 4, build_embedding(cfg, vocab, 4))
    log_p = torch.log(torch.tensor([4, 1, 8, 4, 2.0]) / 19)
    assert torch.allclose(out.proj.bias, log_p[[2, 3, 0, 1]])  # c_j = log p(base word j)


def _corpus(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    for split, n in (("train", 300), ("valid", 40), ("test", 40)):
        starts = rng.integers(0, 40, n)
        lines = [" ".join(f"w{(s + i + int(rng.integers(0, 3))) % 40}" for i in range(int(rng.integers(3, 9))))
                 for s in starts]
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_cli_nce_logs_log_z_and_plot_draws_it(tmp_path, capsys):
    corpus = _corpus(tmp_path)
    runs = []
    for norm in ("one", "regression"):
        out = tmp_path / f"m-{norm}"
        assert main(["train", "--model", "lstm", "--data", str(corpus), "--out", str(out), "--hidden", "16",
                     "--layers", "1", "--max-epochs", "2", "--objective", "nce", "--noise-samples", "5",
                     "--normaliser", norm, "--threads", "1", "--noise-sharing", "token"]) == 0
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == 2 and all("log_z_mean" in r and r["log_z_std"] >= 0 for r in rows)
        assert ("log_z_pred_mean" in rows[0]) == (norm == "regression")
        runs.append(str(out))
    capsys.readouterr()
    assert main(["plot", *runs, "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("fam", ["fnn", "fofe", "rnn", "lstm"])
def test_every_family_takes_nce_and_codes_through_the_shared_builder(tmp_path, capsys, fam):
    corpus = _corpus(tmp_path)
    words = [f"w{i}" for i in range(40)]
    book = CodeBook(words[:10], {w: [(i, 1.0)] for i, w in enumerate(words[:10])})
    book.codes.update({w: [(i % 10, 0.7), ((i + 3) % 10, 0.3)] for i, w in enumerate(words[10:], 10)})
    book.write(tmp_path / "codes.txt")
    sizes = ["--hidden", "16"] + (["--embed", "16", "--order", "2"] if fam in ("fnn", "fofe") else [])
    sizes += ["--output", "full"] if fam == "rnn" else []
    for name, extra in (("nce", ["--objective", "nce", "--noise-samples", "4"]),
                        ("codes", ["--codes", str(tmp_path / "codes.txt")]),
                        ("codes-prior", ["--codes", str(tmp_path / "codes.txt"), "--objective", "nce",
                                         "--noise-samples", "4", "--code-bias-prior", "true"])):
        out = tmp_path / f"{fam}-{name}"
        assert main(["train", "--model", fam, "--data", str(corpus), "--out", str(out), "--max-epochs", "1",
                     "--threads", "1", *sizes, *extra]) == 0
        model = __import__("seqlm").load(out)
        logp, _ = model.step(torch.tensor([0, 3]), model.initial_state(2))
        assert torch.allclose(logp.exp().sum(-1), torch.ones(2), atol=1e-5)
        if name.startswith("codes"):  # nothing trainable grows with V (42 words): B = 12 base rows (10, </s>, <unk>)
            assert len(model.vocab) == 42 and model.config.vocab_layers.code_base == 12
            assert all(len(model.vocab) not in p.shape for p in model.parameters())
    capsys.readouterr()
