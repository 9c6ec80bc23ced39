"""Sparse codes (sparse-word-representations.txt, objective (5)), `seqlm embed`, `seqlm sparse-codes`, and the
compressed layers built from codes: checked against hand-built combinations and dense reference products."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from seqlm.cli import main
from seqlm.codes.embed import load_vectors
from seqlm.codes.sparse_codes import CodeOptions, solve_codes
from seqlm.data.vocab import Vocab
from seqlm.nn.sparse_code import CodeBook, CodedEmbedding, CodedLinear, SparseCodes, codes_for_vocab


def _true_codes() -> torch.Tensor:
    x = torch.zeros(4, 30, dtype=torch.float64)
    x[0, [3, 7]] = torch.tensor([0.6, 0.4], dtype=torch.float64)
    x[1, 1] = 1.0
    x[2, [2, 5, 9]] = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    x[3, [4, 20, 25]] = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    return x


def test_sparse_nonnegative_combination_is_recovered():
    torch.manual_seed(0)
    U = torch.randn(30, 20, dtype=torch.float64)  # 30 base vectors in 20 dimensions
    true = _true_codes()
    idx, vals, single = solve_codes(U, true @ U, CodeOptions(base=30, candidates=0, steps=300))
    assert not single[[0, 2, 3]].any()  # the optimised codes fit better than any single base word
    x = torch.zeros_like(true).scatter_(1, idx, vals)
    assert (x >= 0).all()
    assert torch.equal(x > 0, true > 0)  # exactly the words it was built from
    assert (x - true).abs().max() < 0.02


def _write_vectors(path, words, vecs):
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{len(words)} {vecs.shape[1]}\n")
        for w, v in zip(words, vecs, strict=True):
            f.write(w + " " + " ".join(f"{x:.6f}" for x in v) + "\n")


def test_cli_codes_base_one_hot_rare_nonnegative(tmp_path, capsys):
    rng = np.random.default_rng(0)
    base = rng.normal(size=(12, 8))
    rare = np.stack([0.7 * base[2] + 0.3 * base[5], base[0] + 0.1 * rng.normal(size=8), rng.normal(size=8)])
    words = [f"b{i}" for i in range(12)] + ["r0", "r1", "r2"]
    _write_vectors(tmp_path / "v.txt", words, np.concatenate([base, rare]))
    assert main(["sparse-codes", str(tmp_path / "v.txt"), "--base", "12", "--out", str(tmp_path / "c.txt"),
                 "--candidates", "0", "--show", "r0"]) == 0
    assert "r0: b2" in capsys.readouterr().out  # the report names the main base word of the sample word
    book = CodeBook.read(tmp_path / "c.txt")
    assert book.base == words[:12]
    for i, w in enumerate(words[:12]):
        assert book.codes[w] == [(i, 1.0)]
    for w in ("r0", "r1", "r2"):
        assert book.codes[w] and all(v > 0 for _, v in book.codes[w])
    assert dict(book.codes["r0"]).keys() == {2, 5}
    report = json.loads((tmp_path / "c.txt.report.json").read_text())
    assert report["rare_words"] == 3 and report["nonzeros_per_word"]["min"] >= 1


def test_embed_cli_writes_word2vec_and_binary_loads(tmp_path):
    text = tmp_path / "t.txt"
    rng = np.random.default_rng(1)
    text.write_text("".join(" ".join(f"w{rng.integers(0, 30)}" for _ in range(8)) + "\n" for _ in range(300)))
    assert main(["embed", str(text), "--out", str(tmp_path / "v.txt"), "--dim", "16", "--epochs", "1"]) == 0
    words, vecs = load_vectors(tmp_path / "v.txt")
    assert vecs.shape == (30, 16) and set(words) == {f"w{i}" for i in range(30)}
    from gensim.models import KeyedVectors

    kv = KeyedVectors.load_word2vec_format(str(tmp_path / "v.txt"))
    kv.save_word2vec_format(str(tmp_path / "v.bin"), binary=True)
    words_b, vecs_b = load_vectors(tmp_path / "v.bin")
    assert words_b == words and np.allclose(vecs_b, vecs, atol=1e-5)


def test_bad_vectors_file_is_one_line_error(tmp_path, capsys):
    (tmp_path / "bad.txt").write_text("not a vectors file\nfoo\n")
    assert main(["sparse-codes", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "c")]) == 2
    assert main(["sparse-codes", str(tmp_path / "bad.txt"), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("seqlm: error:") for line in err)


def _codes_fixture():
    vocab = Vocab(["</s>", "<unk>", "a", "b", "c", "d"], [5, 1, 4, 3, 2, 1])
    book = CodeBook(["a", "b"], {"a": [(0, 1.0)], "b": [(1, 1.0)], "c": [(0, 0.25), (1, 0.75)], "d": [(1, 0.5)]})
    indptr, index, value, nb = codes_for_vocab(book, vocab)
    codes = SparseCodes(torch.from_numpy(indptr), torch.from_numpy(index), torch.from_numpy(value), nb)
    dense = torch.zeros(len(vocab), nb)  # the reference only: the layers never build it
    for i in range(len(vocab)):
        for k in range(indptr[i], indptr[i + 1]):
            dense[i, index[k]] = float(value[k])
    return vocab, codes, dense


def test_codes_for_vocab_gives_uncoded_words_their_own_base_row():
    vocab, codes, dense = _codes_fixture()
    assert codes.num_base == 4  # a, b, then </s> and <unk> as one-hot extras
    assert dense[0].tolist() == [0, 0, 1, 0] and dense[1].tolist() == [0, 0, 0, 1]
    assert dense[4].tolist() == [0.25, 0.75, 0, 0]


@pytest.mark.parametrize("free_bias", [False, True])
def test_coded_layers_equal_dense_products(free_bias):
    torch.manual_seed(0)
    vocab, codes, X = _codes_fixture()
    emb, out = CodedEmbedding(codes, 3), CodedLinear(codes, 3, free_bias)
    with torch.no_grad():
        out.bias.normal_()
    ids = torch.tensor([[4, 0, 5], [2, 3, 1]])
    assert torch.allclose(emb(ids), X[ids] @ emb.base, atol=1e-6)  # U x
    h = torch.randn(5, 3)
    bias = out.bias if free_bias else X @ out.bias  # per word, or c^T x
    assert torch.allclose(out(h), h @ (X @ out.base).T + bias, atol=1e-6)  # D x_i . h + b_i
    w, b = out.rows(torch.tensor([4, 5]))
    assert torch.allclose(w, (X @ out.base)[[4, 5]], atol=1e-6) and torch.allclose(b, bias[[4, 5]], atol=1e-6)


@pytest.mark.parametrize("free_bias", [False, True])
def test_coded_output_trains_through_the_fused_cross_entropy(free_bias):
    """FullSoftmax.loss on a CodedLinear takes seqlm.nn.cross_entropy; its gradients reach D and the biases
    as autograd's linear + cross_entropy on the same layer would send them."""
    from seqlm.nn import FullSoftmax

    torch.manual_seed(0)
    vocab, codes, _ = _codes_fixture()
    layer = FullSoftmax(3, len(vocab), CodedLinear(codes, 3, free_bias))
    with torch.no_grad():
        layer.proj.bias.normal_()
    h, t = torch.randn(7, 3), torch.tensor([4, 0, 5, 2, 3, 1, 4])
    grads = []
    autograd = lambda: torch.nn.functional.cross_entropy(layer.proj(h), t, reduction="none")  # noqa: E731
    for loss in (lambda: layer.loss(h, t), autograd):
        layer.zero_grad()
        value = loss()
        (value * torch.arange(1.0, 8.0)).sum().backward()
        grads.append((value.detach(), layer.proj.base.grad.clone(), layer.proj.bias.grad.clone()))
    assert "LinearCrossEntropy" in type(layer.loss(h, t).grad_fn).__name__
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_compressed_bias_with_prior_is_code_bias_plus_fixed_log_unigram(tmp_path):
    """--code-bias-prior: b_i = c^T x_i + log u_i with log u_i a buffer (not trained, V-independent parameters);
    through build_output with NCE every word starts at its own unigram log-probability (c = 0), where the
    plain compressed bias gives a rare word its base words' values."""
    from seqlm.nn.softmax import VocabLayerConfig, build_embedding, build_output

    vocab, _, X = _codes_fixture()
    book = CodeBook(["a", "b"], {"a": [(0, 1.0)], "b": [(1, 1.0)], "c": [(0, 0.25), (1, 0.75)], "d": [(1, 0.5)]})
    book.write(tmp_path / "codes.txt")
    log_u = torch.log(torch.tensor(vocab.counts, dtype=torch.float64) / sum(vocab.counts)).float()
    h = torch.zeros(1, 3)
    for prior in (False, True):
        cfg = VocabLayerConfig(codes=str(tmp_path / "codes.txt"), objective="nce", noise_samples=2,
                               code_bias_prior=prior)
        emb = build_embedding(cfg, vocab, 3)
        layer = build_output(cfg, vocab, 3, emb)
        trainable = {n for n, p in layer.named_parameters() if p.requires_grad}
        assert not any("prior" in n for n in trainable)
        start = layer.proj(h)[0]  # (V,) the biases alone
        if prior:
            assert torch.allclose(start, log_u, atol=1e-6)
            with torch.no_grad():
                layer.proj.bias.normal_()
            w, b = layer.proj.rows(torch.tensor([4, 5]))
            assert torch.allclose(b, (X @ layer.proj.bias + log_u)[[4, 5]], atol=1e-6)
            assert "prior" in layer.proj.state_dict()  # saved with the model
        else:  # word c (id 4) = 0.25 a + 0.75 b: its start is its base words' mix, not its own count
            assert torch.allclose(start[4], 0.25 * log_u[2] + 0.75 * log_u[3], atol=1e-6)
