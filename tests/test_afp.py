"""Approximate fixed-point Elman histories (seqlm.nn.fixed_point, family `afp`), against the sequential RNN."""

from __future__ import annotations

import json

import pytest
import torch
from tests.conftest import TINY, write_corpus

import seqlm
from seqlm.cli import main
from seqlm.data.vocab import Vocab
from seqlm.models.afp import AFPConfig, build_afp, with_iterations
from seqlm.models.rnn import RNNConfig, build_rnn
from seqlm.nn.elman import elman_reference
from seqlm.nn.fixed_point import fixed_point_iterations
from seqlm.protocol import Batch

H, IN = 6, 5


def _weights(scale: float = 1.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w_ih = torch.randn(H, IN, generator=g, dtype=torch.float64)
    w_hh = torch.randn(H, H, generator=g, dtype=torch.float64)
    w_hh = scale * w_hh / torch.linalg.matrix_norm(w_hh, ord=2)  # spectral norm = scale
    return w_ih, w_hh, torch.randn(H, generator=g, dtype=torch.float64)


def _afp(x, w_ih, w_hh, b, h0, k, activation):
    pre = x @ w_ih.T + b  # (B, T, H)
    resets = torch.zeros(x.shape[:2], dtype=torch.bool)
    return fixed_point_iterations(pre, w_hh, h0[0], h0, resets, k, activation)


@pytest.mark.parametrize("activation", ["sigmoid", "tanh"])
def test_k_at_least_t_is_the_sequential_rnn_and_first_k_positions_are_exact(activation):
    B, T = 3, 9
    w_ih, w_hh, b = _weights(scale=3.0)
    x = torch.randn(B, T, IN, dtype=torch.float64)
    h0 = torch.full((B, H), 0.1, dtype=torch.float64)
    exact, _ = elman_reference(x, w_ih, w_hh, b, h0, activation)  # (B, T, H)
    for k in (T, T + 3):
        assert torch.allclose(_afp(x, w_ih, w_hh, b, h0, k, activation), exact, atol=1e-6, rtol=0)
    for k in range(1, T):
        h = _afp(x, w_ih, w_hh, b, h0, k, activation)
        assert torch.allclose(h[:, :k], exact[:, :k], atol=1e-12, rtol=0)  # positions 1..k exact
        assert (h[:, k] - exact[:, k]).abs().max() > 1e-9  # position k+1 is not (yet)


def test_error_falls_with_k_on_contractive_weights():
    # tanh is 1-Lipschitz, so ||W|| = 0.5 makes f a contraction: Banach gives error <= 0.5^k * error_0
    w_ih, w_hh, b = _weights(scale=0.5, seed=3)
    x = torch.randn(2, 30, IN, dtype=torch.float64)
    h0 = torch.zeros(2, H, dtype=torch.float64)
    exact, _ = elman_reference(x, w_ih, w_hh, b, h0, "tanh")
    errors = [(_afp(x, w_ih, w_hh, b, h0, k, "tanh") - exact).norm(dim=-1).max().item() for k in range(0, 12)]
    assert all(e1 < e0 for e0, e1 in zip(errors, errors[1:], strict=False))
    for k, e in enumerate(errors):
        assert e <= 0.5**k * errors[0] + 1e-12


def test_gradcheck_through_the_iterations():
    B, T, Hs = 2, 4, 3
    pre = torch.randn(B, T, Hs, dtype=torch.float64, requires_grad=True)
    w = torch.randn(Hs, Hs, dtype=torch.float64, requires_grad=True)
    h_first = torch.rand(B, Hs, dtype=torch.float64, requires_grad=True)
    h0 = torch.full((Hs,), 0.1, dtype=torch.float64)
    resets = torch.tensor([[False, False, True, False], [False, False, False, False]])
    for act in ("sigmoid", "tanh"):
        assert torch.autograd.gradcheck(
            lambda p, w_, s, a=act: fixed_point_iterations(p, w_, h0, s, resets, 3, a), (pre, w, h_first))


def _vocab() -> Vocab:
    words = "a b c d e f g".split()
    return Vocab.build({w: 10 - i for i, w in enumerate(words)})


def _model(k: int | None, output: str = "class"):
    torch.manual_seed(0)
    model = build_afp(AFPConfig(iterations=k or 1, hidden=8, output=output), _vocab()).double().eval()
    return with_iterations(model, k) if k is None else model


def _batch(vocab: Vocab, sentences: list[list[str]]) -> Batch:
    from seqlm.data.batching import sentence_batches
    from seqlm.data.corpus import encode_sentences

    (rows,) = list(sentence_batches(encode_sentences(sentences, vocab), vocab.bos_id, max_tokens=10**6))
    return rows.batch


SENTS = [["a", "b", "c", "d", "e", "f", "g", "a"], ["c", "c"], ["g", "f", "e", "d", "a"]]


def test_a_word_more_than_k_back_changes_nothing():
    k = 3
    model = _model(k)
    base = model.score(_batch(model.vocab, [SENTS[0]]))[0]  # (T,)
    for j in range(len(SENTS[0])):  # change input word j (input j+1: <s> is input 0)
        other = list(SENTS[0])
        other[j] = "b" if other[j] != "b" else "c"
        diff = (model.score(_batch(model.vocab, [other]))[0] - base).abs()
        # target t reads inputs t-k+1..t; input j+1 is the word changed; target j is that word itself
        unaffected = [t for t in range(len(base)) if t < j or t >= j + 1 + k]
        affected = [t for t in range(j + 1, min(j + 1 + k, len(base)))]
        assert diff[unaffected].max() < 1e-12
        assert diff[affected].min() > 1e-9


@pytest.mark.parametrize("k", [1, 2, 4, None])
@pytest.mark.parametrize("output", ["class", "full"])
def test_batched_equals_one_sentence_at_a_time_and_step_by_step(k, output):
    model = _model(k, output)
    from seqlm.data.batching import sentence_batches
    from seqlm.data.corpus import encode_sentences

    vocab = model.vocab
    (rows,) = list(sentence_batches(encode_sentences(SENTS, vocab), vocab.bos_id, max_tokens=10**6))
    batch = model.score(rows.batch)  # (B, T) padded, rows sorted by length
    for b, sent in enumerate(SENTS):
        b = list(rows.sentence).index(b)
        sent = SENTS[rows.sentence[b]]
        alone = model.score(_batch(vocab, [sent]))[0]
        assert torch.allclose(batch[b, : len(sent) + 1], alone, atol=1e-10)
        state, tok, stepped = model.initial_state(1), torch.tensor([vocab.bos_id]), []
        for w in [*sent, "</s>"]:
            logp, state = model.step(tok, state)
            tok = torch.tensor([vocab.id(w)])
            stepped.append(logp[0, tok[0]])
        assert torch.allclose(torch.stack(stepped), alone, atol=1e-10)


def test_an_rnn_model_evaluated_with_k_iterations_and_exactly():
    torch.manual_seed(0)
    rnn = build_rnn(RNNConfig(hidden=8), _vocab()).double().eval()
    batch = _batch(rnn.vocab, SENTS)
    exact = rnn.score(batch)
    assert torch.allclose(with_iterations(rnn, None).score(batch), exact, atol=1e-12)
    assert torch.allclose(with_iterations(rnn, 9).score(batch), exact, atol=1e-10)  # K >= T: exact
    assert not torch.allclose(with_iterations(rnn, 2).score(batch), exact, atol=1e-6)
    assert with_iterations(rnn, 2).capabilities().context_order == 3
    assert with_iterations(rnn, None).capabilities().context_order is None


def test_cli_trains_an_afp_model_and_evaluates_it_at_other_k(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c", n_train=120, n_eval=20)
    out = tmp_path / "afp"
    assert main(["train", "--model", "afp", "--iterations", "3", "--data", str(corpus), "--out", str(out),
                 "--max-epochs", "2", "--bptt", "10", "--batch-size", "8", *TINY]) == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == "afp" and "K=3" in info["history"]
    res = {}
    for it in (None, "3", "exact", "40"):
        assert main(["eval", str(out), "--data", str(corpus), *(["--iterations", it] if it else [])]) == 0
        res[it] = json.loads(capsys.readouterr().out)["ppl"]
    assert res[None] == pytest.approx(res["3"], rel=1e-9)  # the model's own rule is K = 3
    assert res["exact"] == pytest.approx(res["40"], rel=1e-5)  # sentences are shorter than 40
    assert res["exact"] != pytest.approx(res["3"], rel=1e-4)
    model = seqlm.load(out)
    assert model.capabilities().context_order == 4
    assert main(["eval", str(out), "--data", str(corpus), "--iterations", "0"]) == 2


def test_cli_eval_iterations_on_an_rnn_model_and_refused_for_others(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c", n_train=80, n_eval=20)
    rnn, kn = tmp_path / "rnn", tmp_path / "kn"
    assert main(["train", "--model", "rnn", "--data", str(corpus), "--out", str(rnn), "--max-epochs", "1", *TINY]) == 0
    assert main(["train", "--model", "kn", "--order", "2", "--data", str(corpus), "--out", str(kn)]) == 0
    capsys.readouterr()
    res = {}
    for it in (None, "exact", "40", "2"):
        assert main(["eval", str(rnn), "--data", str(corpus), *(["--iterations", it] if it else [])]) == 0
        res[it] = json.loads(capsys.readouterr().out)["ppl"]
    assert res["exact"] == pytest.approx(res[None], rel=1e-9) and res["40"] == pytest.approx(res[None], rel=1e-5)
    assert res["2"] != pytest.approx(res[None], rel=1e-4)
    assert main(["eval", str(kn), "--data", str(corpus), "--iterations", "2"]) == 2
    assert "Elman" in capsys.readouterr().err


def test_cli_init_from_starts_an_afp_run_from_an_rnn_model(tmp_path, capsys):
    """`--init-from`: an afp run that starts from a trained rnn model's weights (the same network)."""
    corpus = write_corpus(tmp_path / "c", n_train=80, n_eval=20)
    other = write_corpus(tmp_path / "o", n_train=30, n_eval=5, seed=7)
    rnn, afp = tmp_path / "rnn", tmp_path / "afp"
    assert main(["train", "--model", "rnn", "--data", str(corpus), "--out", str(rnn), "--max-epochs", "1", *TINY]) == 0
    # lr 1e-12: one epoch leaves the copied weights as they were, so the afp model evaluated exactly is the rnn
    assert main(["train", "--model", "afp", "--iterations", "2", "--data", str(corpus), "--out", str(afp),
                 "--init-from", str(rnn), "--max-epochs", "1", "--lr", "1e-12", *TINY]) == 0
    capsys.readouterr()
    ppl = {}
    for name, extra in (("rnn", []), ("afp", ["--iterations", "exact"])):
        assert main(["eval", str(tmp_path / name), "--data", str(corpus), *extra]) == 0
        ppl[name] = json.loads(capsys.readouterr().out)["ppl"]
    assert ppl["afp"] == pytest.approx(ppl["rnn"], rel=1e-6)
    a, r = seqlm.load(afp), seqlm.load(rnn)
    assert torch.allclose(a.rnn.weight_hh, r.rnn.weight_hh, atol=1e-9) and a.iterations == 2
    # refused, one line each: another network size, another vocabulary, with --resume
    for extra, corp, msg in ((["--hidden", "7"], corpus, "networks differ"), ([], other, "vocabulary differs"),
                             (["--resume"], corpus, "drop it with --resume")):
        out = tmp_path / f"bad{len(msg)}"
        args = ["train", "--model", "afp", "--data", str(corp), "--out", str(afp if "--resume" in extra else out),
                "--init-from", str(rnn), "--max-epochs", "1", *TINY, *extra]
        assert main(args) == 2
        assert msg in capsys.readouterr().err
