"""Dynamic evaluation (seqlm.eval.dynamic): every token scored before the update that sees it, lr 0 equal
to static evaluation, the model on disk untouched, refusals for models it does not apply to. And stream
mixtures of every kind of component, one of them kept sentence by sentence (`sentence_only`)."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import seqlm
from seqlm.data.batching import stream_batches
from seqlm.data.corpus import encode_file
from seqlm.errors import SeqlmError
from seqlm.eval.dynamic import Dynamic, dynamic_logp
from seqlm.eval.interpolate import interpolate
from seqlm.eval.perplexity import evaluate, score_tokens, text_logp
from seqlm.models.mixture import MixtureModel, mix_logp

from conftest import SEQ_LEN, TINY, train_families
from conftest import run_cli as run

TRANSFORMER = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--context", "16",
               SEQ_LEN, "16", "--batch-size", "8", "--threads", "1"]
RUNS = {
    "rnn": ["--max-epochs", "1", SEQ_LEN, "10", "--batch-size", "8", *TINY],
    "lstm": ["--max-epochs", "1", SEQ_LEN, "10", "--batch-size", "8", *TINY],
    "transformer": ["--max-epochs", "1", "--cross-sentence", "true", *TRANSFORMER],  # a model for stream mode
    "fnn": ["--max-epochs", "1", *TINY],
    "kn": ["--order", "2"],
    "cache": ["--window", "20"],
}
NEURAL = ["rnn", "lstm", "transformer"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("dynamic")
    return train_families(d, RUNS, n_train=120, n_eval=20)


def text_of(models, model):
    return encode_file(models["corpus"] / "test.txt", model.vocab)


@pytest.mark.parametrize("name", NEURAL)
def test_lr_zero_is_static_evaluation(models, name):
    model = seqlm.load(models[name])
    text = text_of(models, model)
    # stream mode: the same chunks as static evaluation with chunks of the segment size, bit for bit
    assert np.array_equal(dynamic_logp(model, text, True, 0.0, segment=7),
                          score_tokens(model, text, True, max_tokens=7).logp)
    # sentence mode: the sentences batched otherwise than static evaluation's length-sorted rows
    assert dynamic_logp(model, text, False, 0.0, segment=7) == pytest.approx(score_tokens(model, text).logp,
                                                                             rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("name", NEURAL)
def test_each_segment_is_scored_before_the_update_that_sees_it(models, name):
    """The first segment scores as the saved model; the second as the model after one SGD step on the
    first (computed here by hand); the later ones differ from static scores, so the updates happened."""
    model = seqlm.load(models[name])
    text = text_of(models, model)
    lr, seg = 0.5, 9
    got = dynamic_logp(model, text, True, lr, segment=seg)
    static = score_tokens(model, text, True, max_tokens=seg).logp
    assert np.array_equal(got[:seg], static[:seg])
    assert not np.allclose(got[seg:], static[seg:])
    net = copy.deepcopy(model)
    first, second = list(stream_batches(text, model.vocab.bos_id, 1, seg))[:2]
    logp, state = net.score_stream(first, None)
    loss = -logp.sum() / first.num_tokens
    loss.backward()
    with torch.no_grad():
        for p in net.parameters():
            if p.grad is not None:
                p -= lr * p.grad
        after, _ = net.score_stream(second, state)
    assert got[seg : 2 * seg] == pytest.approx(after[0].double().numpy(), abs=1e-5)
    # sentence mode: the first segment is the first whole sentences holding at least `seg` tokens
    got = dynamic_logp(model, text, False, lr, segment=seg)
    static = score_tokens(model, text).logp
    n = int(text.starts[np.searchsorted(text.starts, seg)])
    assert got[:n] == pytest.approx(static[:n], abs=1e-6) and not np.allclose(got[n:], static[n:])


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.mark.parametrize("name", ["rnn", "transformer"])
def test_cli_dynamic_eval_leaves_the_model_as_it_was(models, name, capsys):
    before = _digest(models[name])
    code, out, err = run(capsys, "eval", models[name], "--data", models["corpus"], "--stream")
    static = json.loads(out)
    code, out, err = run(capsys, "eval", models[name], "--data", models["corpus"], "--stream",
                         "--dynamic-lr", "0", "--dynamic-segment", "4096")
    assert code == 0, err
    assert json.loads(out)["ppl"] == static["ppl"]  # the static chunking: exactly the static figure
    code, out, err = run(capsys, "eval", models[name], "--data", models["corpus"], "--stream", "--dynamic-lr", "0.3")
    res = json.loads(out)
    assert code == 0 and res["mode"] == "stream" and res["dynamic_lr"] == 0.3 and res["dynamic_segment"] == 20
    assert res["ppl"] != static["ppl"]
    assert _digest(models[name]) == before
    model = seqlm.load(models[name])  # the Python API: the model object passed in is not changed either
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    Dynamic(model, 0.3).score_text(text_of(models, model), True, 4096, text_logp)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


def test_a_mixture_updates_its_neural_components_each_on_its_own(models, tmp_path, capsys):
    code, out, err = run(capsys, "interpolate", models["rnn"], models["kn"], models["cache"], "--valid",
                         models["corpus"] / "valid.txt", "--stream", "--out", tmp_path / "mix")
    assert code == 0, err
    weights = json.loads(out)["weights"]
    code, out, err = run(capsys, "eval", tmp_path / "mix", "--data", models["corpus"], "--stream",
                         "--dynamic-lr", "0.2", "--dynamic-segment", "5")
    assert code == 0, err
    rnn, kn, cache = (seqlm.load(models[n]) for n in ("rnn", "kn", "cache"))
    per = np.stack([dynamic_logp(rnn, text_of(models, rnn), True, 0.2, 5),
                    score_tokens(kn, text_of(models, kn)).logp,  # n-grams: sentence by sentence
                    score_tokens(cache, text_of(models, cache), True).logp])
    assert json.loads(out)["ppl"] == pytest.approx(float(np.exp(-mix_logp(per, weights).mean())), rel=1e-9)
    mix = MixtureModel([kn, cache], [0.5, 0.5], [models["kn"], models["cache"]])
    with pytest.raises(SeqlmError, match="dynamic"):
        Dynamic(mix, 0.1)


@pytest.mark.parametrize("name, flags", [
    ("kn", ["--dynamic-lr", "0.1"]), ("fnn", ["--dynamic-lr", "0.1"]), ("cache", ["--dynamic-lr", "0.1"]),
    ("rnn", ["--dynamic-segment", "5"]), ("rnn", ["--dynamic-lr", "-1"]), ("rnn", ["--dynamic-lr", "nan"]),
    ("rnn", ["--dynamic-lr", "0.1", "--dynamic-segment", "0"]),
])
def test_refusals_are_one_line_and_status_2(models, name, flags, capsys):
    code, out, err = run(capsys, "eval", models[name], "--data", models["corpus"], *flags)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "dynamic" in err


def test_a_stream_mixture_can_keep_a_component_sentence_by_sentence(models, tmp_path):
    """Every kind of component in one stream mixture, the Transformer scored sentence by sentence (equal
    weights: EM may give the tiny Transformer almost none, and then its mode would not show)."""
    names = ["kn", "fnn", "rnn", "lstm", "transformer", "cache"]
    info = interpolate([models[n] for n in names], tmp_path / "mix", models["corpus"] / "valid.txt",
                       weights="1,1,1,1,1,1", stream=True, sentence_only=[4])
    assert info["mode"] == "stream" and info["weights_from"] == "given"
    assert json.loads((tmp_path / "mix" / "config.json").read_text())["model"]["sentence_only"] == [4]
    comps = [seqlm.load(models[n]) for n in names]
    streams = [False, False, True, True, False, True]  # n-gram and feed-forward cannot; the Transformer is told not to
    per = np.stack([score_tokens(c, text_of(models, c), s).logp for c, s in zip(comps, streams, strict=True)])
    want = float(np.exp(-mix_logp(per, info["weights"]).mean()))
    mix = seqlm.load(tmp_path / "mix")
    assert evaluate(mix, text_of(models, mix), stream_mode=True)["ppl"] == pytest.approx(want, rel=1e-9)
    with pytest.raises(SeqlmError, match="sentence_only"):
        MixtureModel(comps[:2], [0.5, 0.5], [models["kn"], models["fnn"]], sentence_only=[2])
