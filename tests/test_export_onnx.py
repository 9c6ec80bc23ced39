"""`seqlm export DIR --onnx OUT`: the exported step function under onnxruntime scores what seqlm scores.

Tiny models trained through the CLI; the reference is seqlm's own scoring (score_tokens, sentence and stream
mode) of the same text. The file is read through its metadata only (seqlm.export.runtime.OnnxLM), as a consumer
without the model directory would.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

import seqlm
from seqlm.cli import main
from seqlm.eval.perplexity import score_tokens
from seqlm.protocol import encode_text

from conftest import require_module, write_corpus
from conftest import run_cli as run

COMMON = ["--max-epochs", "1", "--threads", "1", "--batch-size", "8"]
MODELS = {
    "lstm": ["--model", "lstm", "--hidden", "16", "--layers", "2"],
    "rnn": ["--model", "rnn", "--hidden", "16"],  # sigmoid, class-factorised output, embedding = W_x
    "rnn-tanh": ["--model", "rnn", "--hidden", "16", "--embed", "8", "--activation", "tanh", "--output", "full"],
    # context 8: the corpus's sentences (3-10 words and </s>) are read in sliding windows too
    "transformer": ["--model", "transformer", "--layers", "2", "--hidden", "16", "--heads", "2", "--d-ff", "32",
                    "--context", "8", "--stride", "3", "--seq-len", "16", "--precision", "fp32", "--warmup-steps", "0",
                    "--lr", "0.01", "--max-epochs", "3"],
    "fnn": ["--model", "fnn", "--order", "4", "--embed", "8", "--hidden", "16", "--layers", "1", "--seq-len", "16"],
    "afp": ["--model", "afp", "--iterations", "3", "--hidden", "16"],
}
CARRIED = ["lstm", "rnn", "rnn-tanh", "fnn", "afp"]  # the families with a state input
TOL = 1e-4


def _needs_onnx() -> None:
    require_module("onnxruntime", "onnxruntime is not installed (pip install -e '.[onnx]')")
    require_module("onnxscript", "onnxscript is not installed (pip install -e '.[onnx]')")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("export") / "corpus", n_train=120, n_eval=30)


@pytest.fixture(scope="module")
def exported(corpus) -> dict[str, tuple[Path, Path, dict]]:
    """name -> (model directory, its ONNX file, the summary `seqlm export` printed), made once per name."""
    made: dict[str, tuple[Path, Path, dict]] = {}

    def get(name: str) -> tuple[Path, Path, dict]:
        if name not in made:
            d, onnx = corpus.parent / name, corpus.parent / f"{name}.onnx"
            assert main(["train", "--data", str(corpus), "--out", str(d), *COMMON, *MODELS[name]]) == 0
            with contextlib.redirect_stdout(io.StringIO()) as out:  # no capsys in a module fixture
                assert main(["export", str(d), "--onnx", str(onnx)]) == 0
            made[name] = d, onnx, json.loads(out.getvalue())
        return made[name]

    return get


@pytest.mark.parametrize("name", list(MODELS))
def test_exported_scores_equal_seqlm(exported, corpus, name):
    _needs_onnx()
    from seqlm.export.runtime import OnnxLM

    d, onnx, summary = exported(name)
    assert summary["check"]["max_abs_diff"] < TOL, summary  # the export's own probe
    model = seqlm.load(d)
    stream = encode_text(model, corpus / "test.txt")
    ours = score_tokens(model, stream).logp
    theirs = OnnxLM(onnx).score(stream, max_tokens=64)  # several calls of several padded rows
    assert np.abs(ours - theirs).max() < TOL
    assert math.exp(-theirs.mean()) == pytest.approx(math.exp(-ours.mean()), rel=TOL)
    assert math.exp(-ours.mean()) < len(model.vocab)  # trained: better than uniform, so the check can fail


@pytest.mark.parametrize("name", list(MODELS))
def test_metadata_and_signature(exported, name):
    _needs_onnx()
    import onnxruntime as ort

    d, onnx, summary = exported(name)
    model = seqlm.load(d)
    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    assert meta["family"] == model.family and int(meta["sos_id"]) == model.vocab.bos_id
    assert int(meta["eos_id"]) == model.vocab.eos_id and int(meta["vocab_size"]) == len(model.vocab)
    assert json.loads(meta["text"]) == asdict(model.text_spec())
    assert json.loads(meta["capabilities"]) == asdict(model.capabilities())
    inputs = {i.name: (i.type, i.shape) for i in session.get_inputs()}
    assert [i.name for i in session.get_inputs()] == summary["inputs"] == meta["inputs"].split(",")
    assert inputs["x"][0] == "tensor(int64)"
    for state in summary["inputs"][1:]:
        kind, shape = inputs[state]
        if "context_size" in meta:  # the last inputs of a finite-context model: (batch, K) ids
            assert kind == "tensor(int64)" and shape[1] == int(meta["context_size"]) == model.context_window()
        else:  # the RNN-LM layout: (num_layers, batch, hidden_size)
            assert kind == "tensor(float)" and shape[0] == int(meta["num_layers"])
            assert shape[2] == int(meta["hidden_size"])
    if model.family == "transformer":
        assert int(meta["context"]) == model.context and int(meta["stride"]) == model.stride


@pytest.mark.parametrize("name", CARRIED)
def test_state_carried_over_calls_equals_one_call_and_seqlm_step(exported, corpus, name):
    _needs_onnx()
    from seqlm.export.runtime import OnnxLM

    d, onnx, _ = exported(name)
    model, lm = seqlm.load(d), OnnxLM(onnx)
    stream = encode_text(model, corpus / "valid.txt")
    ids = np.asarray(stream.ids[:80], dtype=np.int64)
    x = np.concatenate([[lm.sos_id], ids[:-1]])[None]  # (1, 80): the text as one stream, </s> between sentences
    whole, end = lm.run(x)
    pieces, state, at = [], None, 0
    for size in (1, 2, 1, 3, 5, 8, 13, 47):  # calls of 1 token too: sherpa-onnx's shallow fusion makes those
        logp, state = lm.run(x[:, at : at + size], state)
        pieces.append(logp)
        at += size
    assert at == x.shape[1]
    assert np.abs(np.concatenate(pieces, axis=1) - whole).max() < 1e-5
    assert all(np.abs(a - b).max() < 1e-5 for a, b in zip(state, end, strict=True))
    state, steps = model.initial_state(1), []
    with torch.no_grad():
        for token in x[0]:  # seqlm's own step, one token at a time, the state carried: the reference
            logp, state = model.step(torch.tensor([int(token)]), state)  # (1, V)
            steps.append(logp[0].numpy())
    assert np.abs(whole[0] - np.stack(steps)).max() < TOL
    if model.capabilities().stream:  # and seqlm's stream mode, where the family has one
        ours = score_tokens(model, stream, stream_mode=True).logp[:80]
        assert np.abs(whole[0, np.arange(80), ids] - ours).max() < TOL


@pytest.mark.parametrize("name", ["lstm", "transformer", "afp"])
def test_rows_of_a_batch_are_independent(exported, name):
    _needs_onnx()
    from seqlm.export.runtime import OnnxLM

    _, onnx, _ = exported(name)
    lm = OnnxLM(onnx)
    x = np.random.default_rng(0).integers(0, int(lm.meta["vocab_size"]), size=(3, 7))
    together = lm.run(x)[0]
    alone = np.concatenate([lm.run(x[n : n + 1])[0] for n in range(3)])  # a batch of 1 as sherpa-onnx calls it
    assert np.abs(together - alone).max() < 1e-5


def test_long_line_in_windows_equals_seqlm(exported, tmp_path):
    """A 60-token line through a context-8 Transformer: seqlm's sliding windows, read by OnnxLM."""
    _needs_onnx()
    from seqlm.export.runtime import OnnxLM

    d, onnx, _ = exported("transformer")
    model = seqlm.load(d)
    line = tmp_path / "long.txt"
    line.write_text(" ".join(model.vocab.itos[2 + i % (len(model.vocab) - 2)] for i in range(60)) + "\n")
    stream = encode_text(model, line)
    ours, theirs = score_tokens(model, stream).logp, OnnxLM(onnx).score(stream)
    assert len(ours) == 61 and np.abs(ours - theirs).max() < TOL


def test_refusals_are_one_line(exported, corpus, tmp_path, capsys):
    kn = tmp_path / "kn"
    assert main(["train", "--model", "kn", "--order", "2", "--data", str(corpus), "--out", str(kn)]) == 0
    capsys.readouterr()
    code, _, err = run(capsys, "export", kn, "--onnx", tmp_path / "kn.onnx")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "rnn, lstm, transformer, afp, fnn" in err, err
    assert not (tmp_path / "kn.onnx").exists()
    code, _, err = run(capsys, "export", tmp_path / "nowhere", "--onnx", tmp_path / "x.onnx")
    assert code == 2 and len(err.strip().splitlines()) == 1, err

    _needs_onnx()
    d, onnx, _ = exported("lstm")
    before = onnx.read_bytes()
    code, out, err = run(capsys, "export", d, "--onnx", onnx)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--force" in err and out == "", err
    assert onnx.read_bytes() == before
    code, _, err = run(capsys, "export", d, "--onnx", d / "weights.safetensors", "--force")  # never an input
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert main(["quantize", str(d), "--out", str(tmp_path / "int8")]) == 0
    capsys.readouterr()
    code, _, err = run(capsys, "export", tmp_path / "int8", "--onnx", tmp_path / "int8.onnx")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "int8" in err, err
    code, out, _ = run(capsys, "export", d, "--onnx", onnx, "--force")
    assert code == 0 and json.loads(out)["check"]["max_abs_diff"] < TOL
