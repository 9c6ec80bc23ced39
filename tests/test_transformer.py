"""The Transformer family: causal, packed sentences kept apart, windows, key/value cache, the real CLI."""

from __future__ import annotations

import json

import pytest
import torch

from seqlm.cli import main
from seqlm.data.vocab import Vocab
from seqlm.models.transformer import TransformerConfig, build_transformer
from seqlm.nn.cross_entropy import linear_cross_entropy
from seqlm.protocol import Batch

from conftest import write_corpus


def _model(context: int = 8, stride: int = 0, positions: str = "learned", tie: bool = True, V: int = 13):
    torch.manual_seed(0)
    vocab = Vocab(["</s>", "<unk>"] + [f"w{i}" for i in range(V - 2)])
    cfg = TransformerConfig(layers=2, hidden=16, heads=2, d_ff=32, context=context, stride=stride,
                            positions=positions, tie_embeddings=tie, dropout=0.0)
    return build_transformer(cfg, vocab).eval()


def _batch(ids: list[int], resets: list[int] | None = None) -> Batch:
    """One row reading </s> then ids[:-1], predicting ids."""
    inputs = torch.tensor([[0] + ids[:-1]])
    rst = torch.zeros_like(inputs, dtype=torch.bool)
    rst[0, 0] = True
    for r in resets or []:
        rst[0, r] = True
        inputs[0, r] = 0
    return Batch(inputs, torch.tensor([ids]), torch.ones_like(inputs, dtype=torch.bool), rst)


def _step_logp(model, ids: list[int]) -> torch.Tensor:
    """ln p of ids read one token at a time through `step` (the key/value cache)."""
    state = model.initial_state(1)
    tok, out = torch.tensor([0]), []
    for w in ids:
        logp, state = model.step(tok, state)
        out.append(logp[0, w])
        tok = torch.tensor([w])
    return torch.stack(out)


@pytest.mark.parametrize("positions,tie", [("learned", True), ("sinusoidal", False)])
def test_step_with_cache_equals_full_forward(positions, tie):
    model = _model(context=16, positions=positions, tie=tie)
    ids = [3, 5, 2, 7, 7, 9, 4, 0]
    with torch.no_grad():
        full = model.score(_batch(ids))[0]
        assert torch.allclose(_step_logp(model, ids), full, atol=1e-5)



@pytest.mark.parametrize("tie", [True, False])
def test_training_loss_is_the_fused_cross_entropy_with_autograds_numbers(monkeypatch, tie):
    """With gradients on, the loss goes through nn/cross_entropy.py's fused linear cross-entropy: the same ln p
    and the same parameter gradients as log_softmax over the logits, the reference path, in float64."""
    import seqlm.models.transformer as family

    calls = []
    monkeypatch.setattr(family, "linear_cross_entropy", lambda *a: calls.append(1) or linear_cross_entropy(*a))
    model = _model(tie=tie).double().train()
    batch = _batch([3, 4, 5, 3, 7, 2])
    logp = model(batch)[0]  # (B, T) fused
    assert calls == [1]
    grads = torch.autograd.grad(logp.sum(), list(model.parameters()))
    h = model.windows(model.embed(batch.inputs), batch.resets)  # (B, T, D) what forward reads
    want = torch.log_softmax(model.logits(h), -1).gather(2, batch.targets[..., None]).squeeze(2)  # (B, T)
    ref = torch.autograd.grad(want.sum(), list(model.parameters()))
    torch.testing.assert_close(logp, want.float())  # the family returns float32 scores
    for a, b in zip(grads, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)

def test_future_tokens_change_nothing():
    model = _model(context=16)
    a, b = [3, 5, 2, 7, 7, 9], [3, 5, 2, 11, 4, 6]
    with torch.no_grad():
        la, lb = model.score(_batch(a))[0], model.score(_batch(b))[0]
    assert torch.allclose(la[:3], lb[:3], atol=1e-6)  # targets 0-2 and their contexts agree
    assert not torch.allclose(la[4:], lb[4:], atol=1e-3)


def test_packed_sentences_do_not_see_each_other():
    model = _model(context=16)
    s1, s2 = [3, 5, 2, 0], [7, 9, 4, 8, 0]
    with torch.no_grad():
        packed = model.score(_batch(s1 + s2, resets=[len(s1)]))[0]
        alone = torch.cat([model.score(_batch(s1))[0], model.score(_batch(s2))[0]])
    assert torch.allclose(packed, alone, atol=1e-5)


def test_cross_sentence_training_lets_packed_sentences_see_earlier_ones():
    torch.manual_seed(0)
    vocab = Vocab(["</s>", "<unk>"] + [f"w{i}" for i in range(11)])
    cfg = TransformerConfig(layers=1, hidden=16, heads=2, d_ff=32, context=16, dropout=0.0, cross_sentence=True)
    model = build_transformer(cfg, vocab)
    s1, s2 = [3, 5, 2, 0], [7, 9, 4, 8, 0]
    packed = _batch(s1 + s2, resets=[len(s1)])
    with torch.no_grad():
        train_mode = model.train()(packed)[0][0]
        alone = torch.cat([model.eval().score(_batch(s1))[0], model.score(_batch(s2))[0]])
        stream, _ = model.score_stream(_batch(s1 + s2), None)  # no reset: </s> then the next sentence
    assert torch.allclose(train_mode[:4], alone[:4], atol=1e-5)  # the first sentence: nothing before it
    assert not torch.allclose(train_mode[4:], alone[4:], atol=1e-3)  # the second one sees the first ...
    assert torch.allclose(train_mode, stream[0], atol=1e-5)  # ... exactly as stream mode shows it
    assert torch.allclose(model.score(packed)[0], alone, atol=1e-5)  # evaluation keeps sentences apart


def _window_reference(model, ids: list[int]) -> torch.Tensor:
    """Brute force: each target scored by running the network on its own window alone (module docstring)."""
    W, S = model.context, model.stride
    inputs = [0] + ids[:-1]
    out = []
    for i, w in enumerate(ids):
        start = 0 if i < W else S * ((i - W + S) // S)
        window = inputs[start : i + 1]
        logp = model.score(_batch(window[1:] + [w]) if start == 0 else _raw_batch(window, w))[0, -1]
        out.append(logp)
    return torch.stack(out)


def _raw_batch(window: list[int], target: int) -> Batch:
    inputs = torch.tensor([window])
    targets = torch.tensor([window[1:] + [target]])
    rst = torch.zeros_like(inputs, dtype=torch.bool)
    rst[0, 0] = True
    return Batch(inputs, targets, torch.ones_like(inputs, dtype=torch.bool), rst)


@pytest.mark.parametrize("stride", [0, 3])
def test_long_text_windows_match_brute_force_and_the_cache(stride):
    model = _model(context=8, stride=stride)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 13, (27,), generator=g).tolist()
    with torch.no_grad():
        windowed = model.score(_batch(ids))[0]
        assert torch.allclose(windowed, _window_reference(model, ids), atol=1e-5)
        assert torch.allclose(_step_logp(model, ids), windowed, atol=1e-5)


def test_stream_calls_carry_the_window():
    """Two stream calls give what one call over the same text gives when the split falls on a window edge."""
    model = _model(context=8)  # W 8, S 4: windows score 8, then 4, 4, ...
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(2, 13, (24,), generator=g).tolist()
    whole = _batch(ids)
    with torch.no_grad():
        one, _ = model.score_stream(whole, None)
        cut = 12
        a = Batch(*(t[:, :cut] for t in (whole.inputs, whole.targets, whole.mask, whole.resets)))
        b = Batch(*(t[:, cut:] for t in (whole.inputs, whole.targets, whole.mask, whole.resets)))
        la, state = model.score_stream(a, None)
        lb, _ = model.score_stream(b, state)
    assert torch.allclose(torch.cat([la, lb], dim=1), one, atol=1e-5)
    assert torch.allclose(one, model.score(whole), atol=1e-6)  # one sentence: stream = sentence mode


def test_paper_sizes_by_name():
    assert (TransformerConfig(size="small").layers, TransformerConfig(size="small").d_ff) == (3, 2048)
    base = TransformerConfig(size="base")
    assert (base.layers, base.d_model, base.d_ff) == (6, 512, 4096)


def test_cli_train_eval_stream_generate_resume(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c", n_train=200, n_eval=20)
    out = tmp_path / "m"
    tiny = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--context", "16",
            "--seq-len", "16", "--batch-size", "8", "--threads", "1", "--max-epochs", "2"]
    assert main(["train", "--model", "transformer", "--data", str(corpus), "--out", str(out), *tiny]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    vocab_size = len((out / "vocab.txt").read_text().splitlines())
    assert res["test_ppl"] < vocab_size  # learned something beyond the uniform distribution
    assert main(["eval", str(out), "--data", str(corpus), "--split", "test"]) == 0
    sent = json.loads(capsys.readouterr().out)
    assert main(["eval", str(out), "--data", str(corpus), "--split", "test", "--stream"]) == 0
    streamed = capsys.readouterr()  # trained on sentences: no stream mode, and it says so
    stream = json.loads(streamed.out)
    assert sent["mode"] == "sentence" and stream == sent and "sentence by sentence" in streamed.err
    assert sent["ppl"] == pytest.approx(res["test_ppl"], rel=1e-6)
    assert main(["generate", str(out), "--num", "2", "--max-len", "30"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
    assert main(["train", "--model", "transformer", "--data", str(corpus), "--out", str(out), "--resume",
                 "--max-epochs", "3"]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [1, 2, 3]


def test_bad_sizes_are_one_line_errors(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c", n_train=20, n_eval=5)
    assert main(["train", "--model", "transformer", "--data", str(corpus), "--out", str(tmp_path / "m"),
                 "--d-model", "10", "--heads", "3"]) == 2
    assert "multiple of --heads" in capsys.readouterr().err


@pytest.mark.parametrize("masked", [False, True])
def test_attention_with_dropout_written_out_equals_scaled_dot_product_attention(masked):
    """In training with dropout the attention is computed by hand (ByteDropout on its weights): with the dropouts
    made identities it equals torch's scaled_dot_product_attention, causal or under a segment mask, in float64;
    with them it drops about p of the weights."""
    from seqlm.nn.transformer import CausalSelfAttention, segment_layout

    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 4, dropout=0.25).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    mask = segment_layout(torch.tensor([[1, 0, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 1, 0]], dtype=torch.bool))[1] \
        if masked else None
    want = attn.eval()(x, mask)[0]  # scaled_dot_product_attention
    attn.train()
    attn.drop, attn.attn_drop = torch.nn.Identity(), torch.nn.Identity()
    got = attn(x, mask)[0]
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    dropped = CausalSelfAttention(16, 4, dropout=0.25).train().attn_drop(torch.ones(64, 64, 64))
    assert abs(float((dropped == 0).float().mean()) - 0.25) < 0.01
