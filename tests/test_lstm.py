"""The `lstm` family: batched scoring against step-by-step references, stream and sentence modes, tied and
compressed variants saved and loaded, and a tiny run through the real CLI."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import torch

import seqlm
from seqlm.cli import main
from seqlm.data.corpus import encode_sentences
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.eval.perplexity import score_tokens
from seqlm.models.lstm import LSTMConfig, build_lstm
from seqlm.nn.softmax import VocabLayerConfig, parameters_by_layer
from seqlm.protocol import Batch
from seqlm.train.precision import cpu_bf16_runs

SENTS = [["a", "b", "c"], ["b", "b"], ["c", "a", "d", "a", "b"], ["d"]]


def _model(**kw) -> tuple:
    vocab = Vocab(["</s>", "<unk>", "a", "b", "c", "d"], [4, 0, 4, 4, 2, 2])
    torch.manual_seed(0)
    model = build_lstm(LSTMConfig(hidden=8, layers=2, **kw), vocab).double().eval()
    with torch.no_grad():  # larger weights than the initialisation, so that the history visibly matters
        for p in model.lstm.parameters():
            p.normal_()
    return model, vocab


@torch.no_grad()
def _reference(model, vocab, stream: bool) -> np.ndarray:
    """ln p of every token by `step`, one token at a time; state carried across sentences iff `stream`."""
    out, state = [], model.initial_state(1)
    for s in SENTS:
        if not stream:
            state = model.initial_state(1)
        prev = vocab.bos_id
        for w in [*vocab.encode(s), vocab.eos_id]:
            logp, state = model.step(torch.tensor([prev]), state)
            out.append(float(logp[0, w]))
            prev = w
    return np.array(out)


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": True}, {"output": "class", "classes": 2},
                                {"output": "adaptive", "cutoffs": "2,4", "div_value": 2.0},
                                {"output": "adaptive", "cutoffs": "2,4", "div_value": 2.0, "tail_bias": True},
                                {"vocab_layers": VocabLayerConfig(objective="nce", normaliser="regression")}])
def test_batched_sentence_scores_equal_step_by_step(kw):
    model, vocab = _model(**kw)
    stream = encode_sentences(SENTS, vocab)
    got = score_tokens(model, stream).logp
    assert np.allclose(got, _reference(model, vocab, stream=False), atol=1e-9)


@pytest.mark.parametrize("kw", [{}, {"output": "class", "classes": 2},
                                {"output": "adaptive", "cutoffs": "2,4", "div_value": 2.0},
                                {"vocab_layers": VocabLayerConfig(objective="nce", normaliser="regression")}])
def test_every_output_layer_trains_under_bf16_autocast(kw):
    """--precision bf16 trains every output layer (torch's adaptive softmax once failed under autocast)."""
    if not cpu_bf16_runs(torch.nn.LSTM):
        pytest.skip("this CPU cannot run torch's LSTM in bf16")
    vocab = Vocab(["</s>", "<unk>", "a", "b", "c", "d"], [4, 0, 4, 4, 2, 2])
    torch.manual_seed(0)
    model = build_lstm(LSTMConfig(hidden=8, layers=2, **kw), vocab).train()
    ids = torch.as_tensor(encode_sentences(SENTS, vocab).ids[:13]).view(1, 13)  # (1, 13)
    b = Batch(ids[:, :-1], ids[:, 1:], torch.ones(1, 12, dtype=torch.bool), torch.zeros(1, 12, dtype=torch.bool))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, _, loss = model(b, None)  # (1, 12)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and all(torch.isfinite(p.grad).all() for p in model.parameters()
                                              if p.grad is not None)


def test_stream_mode_carries_state_and_equals_step_by_step():
    model, vocab = _model()
    stream = encode_sentences(SENTS, vocab)
    got = score_tokens(model, stream, stream_mode=True, max_tokens=3).logp  # chunks of 3: state crosses chunks
    assert np.allclose(got, _reference(model, vocab, stream=True), atol=1e-9)
    assert not np.allclose(got, _reference(model, vocab, stream=False), atol=1e-3)  # the history matters


def test_sentence_independent_model_resets_in_stream_mode():
    model, vocab = _model(sentence_independent=True)
    stream = encode_sentences(SENTS, vocab)
    got = score_tokens(model, stream, stream_mode=True, max_tokens=4).logp
    assert np.allclose(got, _reference(model, vocab, stream=False), atol=1e-9)


def test_step_distribution_sums_to_one_and_tied_weights_are_one_tensor():
    model, vocab = _model(tie_embeddings=True)
    assert model.embedding(torch.tensor([3])).data_ptr() != 0
    assert torch.equal(model.embedding(torch.tensor([3]))[0], model.out.proj.weight[3])
    layers = parameters_by_layer(model)
    assert "embedding" not in layers and layers["out"] == 6 * 8 + 6  # the shared matrix counted once
    logp, _ = model.step(torch.tensor([0, 2]), model.initial_state(2))
    assert torch.allclose(logp.exp().sum(-1), torch.ones(2, dtype=torch.float64))


def _corpus(tmp_path):
    """A text with strong bigram structure: each word mostly predicts the next one."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(12)]
    for split, n in (("train", 600), ("valid", 60), ("test", 60)):
        lines = []
        for _ in range(n):
            k = int(rng.integers(0, 12))
            sent = []
            for _ in range(int(rng.integers(3, 9))):
                sent.append(words[k])
                k = (k + 1) % 12 if rng.random() < 0.9 else int(rng.integers(0, 12))
            lines.append(" ".join(sent))
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def _unigram_ppl(corpus) -> float:
    """Perplexity of the add-nothing unigram model of train (</s> included) on test: the bar to beat."""
    def tokens(split):
        return [w for line in (corpus / f"{split}.txt").read_text().splitlines() for w in [*line.split(), "</s>"]]

    counts = Counter(tokens("train"))
    total = sum(counts.values())
    test = tokens("test")
    return math.exp(-sum(math.log(counts[w] / total) for w in test) / len(test))


@pytest.mark.parametrize("extra", [[], ["--objective", "nce", "--noise-samples", "8", "--normaliser", "regression"],
                                   ["--tied"]])
def test_cli_train_eval_info_beats_unigram(tmp_path, capsys, extra):
    corpus = _corpus(tmp_path / "c") if (tmp_path / "c").mkdir() is None else None
    out = tmp_path / "m"
    assert main(["train", "--model", "lstm", "--data", str(corpus), "--out", str(out), "--hidden", "24",
                 "--layers", "1", "--max-epochs", "4", "--batch-size", "8", "--lr", "0.01", "--threads", "1",
                 *extra]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["test_ppl"] < 0.6 * _unigram_ppl(corpus)  # the unigram is ~13 here; bigram structure ~2
    assert main(["eval", str(out), "--data", str(corpus), "--split", "test", "--stream"]) == 0
    stream = json.loads(capsys.readouterr().out)
    assert stream["mode"] == "stream" and stream["tokens"] == result["test_tokens"]
    assert main(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == "lstm" and info["parameters_by_layer"]["lstm"] == 4 * 24 * (24 + 24 + 2)
    again = seqlm.load(out)  # loads exactly what was saved
    assert again.config.hidden == 24


def test_bad_lstm_options_are_one_line_errors(tmp_path, capsys):
    corpus = _corpus(tmp_path)
    assert main(["train", "--model", "lstm", "--data", str(corpus), "--out", str(tmp_path / "m"), "--tied",
                 "--embed", "7"]) == 2
    assert main(["train", "--model", "lstm", "--data", str(corpus), "--out", str(tmp_path / "m"),
                 "--objective", "nce", "--output", "class"]) == 2
    assert main(["train", "--model", "lstm", "--data", str(corpus), "--out", str(tmp_path / "m"),
                 "--codes", str(tmp_path / "missing.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("seqlm: error:") for line in err)


def test_corpus_under_seqlm_data_by_name(tmp_path, monkeypatch, capsys):
    """`--data NAME` finds $SEQLM_DATA/NAME (how `--data gcide` works), with .gz splits."""
    import gzip

    corpus = _corpus(tmp_path / "data" / "mycorpus" if (tmp_path / "data" / "mycorpus").mkdir(parents=True) is None
                     else None)
    for split in ("train", "valid", "test"):
        text = (corpus / f"{split}.txt").read_bytes()
        (corpus / f"{split}.txt").unlink()
        with gzip.open(corpus / f"{split}.txt.gz", "wb") as f:
            f.write(text)
    monkeypatch.setenv("SEQLM_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--model", "lstm", "--data", "mycorpus", "--out", str(tmp_path / "m"), "--hidden", "8",
                 "--layers", "1", "--max-epochs", "1", "--threads", "1"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["test_tokens"] > 0


def test_div_value_sets_the_adaptive_tail_projections():
    vocab = Vocab(["</s>", "<unk>", "a", "b", "c", "d"], [4, 0, 4, 4, 2, 2])
    for div, widths in ((2.0, [4, 2]), (1.5, [5, 3])):
        model = build_lstm(LSTMConfig(hidden=8, output="adaptive", cutoffs="2,4", div_value=div), vocab)
        assert [t[0].out_features for t in model.out.asm.tail] == widths  # hidden // div^i, i = 1, 2
    with pytest.raises(SeqlmError, match="under one dimension"):  # 8 / 4^2: torch would make a width-0 layer
        build_lstm(LSTMConfig(hidden=8, output="adaptive", cutoffs="2,4", div_value=4.0), vocab)
    with pytest.raises(SeqlmError):
        LSTMConfig(output="adaptive", div_value=0.0)
    with pytest.raises(SeqlmError, match="adaptive output layer only"):
        LSTMConfig(output="full", tail_bias=True)
