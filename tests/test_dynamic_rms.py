"""Dynamic evaluation with Krause et al.'s (2018) RMS rule (seqlm.eval.dynamic_rms): lr 0 is static evaluation,
the rule equals a plain loop written here from the paper's equations, the decay pulls the weights back toward the
trained ones without overshooting, and the CLI runs it and refuses what a rule cannot honour."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import seqlm
from seqlm.data.batching import stream_batches
from seqlm.data.corpus import encode_file
from seqlm.eval.dynamic import dynamic_logp
from seqlm.eval.dynamic_rms import EPSILON, RmsRule, decay_rates, gradient_rms, rms_step
from seqlm.eval.perplexity import score_tokens
from seqlm.models.mixture import mix_logp

from conftest import SEQ_LEN, TINY, train_families
from conftest import run_cli as run

TRANSFORMER = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--context", "16",
               SEQ_LEN, "16", "--batch-size", "8", "--threads", "1", "--cross-sentence", "true"]
RUNS = {
    "rnn": ["--max-epochs", "1", SEQ_LEN, "10", "--batch-size", "8", *TINY],
    "lstm": ["--max-epochs", "1", SEQ_LEN, "10", "--batch-size", "8", *TINY],
    "transformer": ["--max-epochs", "1", *TRANSFORMER],
    "kn": ["--order", "2"],
}
NEURAL = ["rnn", "lstm", "transformer"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("dynamic_rms")
    trained = train_families(d, RUNS, n_train=60, n_eval=15)
    return {**trained, "train": trained["corpus"] / "train.txt"}


def text_of(models, model):
    return encode_file(models["corpus"] / "test.txt", model.vocab)


@pytest.mark.parametrize("name", NEURAL)
def test_lr_zero_is_static_evaluation_whatever_the_decay(models, name):
    model = seqlm.load(models[name])
    text = text_of(models, model)
    static = score_tokens(model, text, True, max_tokens=7).logp
    for decay in (0.0, 0.002, 1.0):  # the weights never leave the trained ones: nothing to pull back
        rule = RmsRule(models["train"], decay=decay)
        assert np.array_equal(dynamic_logp(model, text, True, 0.0, segment=7, rule=rule), static)
    got = dynamic_logp(model, text, False, 0.0, segment=7, rule=RmsRule(models["train"], decay=0.0))
    assert got == pytest.approx(score_tokens(model, text).logp, rel=1e-6, abs=1e-6)


def reference_logp(model, train, text, lr: float, decay: float, seg: int) -> np.ndarray:
    """Krause et al. (2018) section 5, written out plainly, parameter by parameter, with .backward(): MS_g of
    each parameter over the training segments at the trained weights, then after each scored segment
    theta -= lr * grad / (sqrt(MS_g) + eps) and theta += decay * min(sqrt(MS_g) / avg, 1 / decay) * (theta_g - theta),
    avg the mean over the parameters of their mean sqrt(MS_g) (the authors' dynamiceval.py)."""
    net = copy.deepcopy(model)
    net.eval()
    named = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
    bos = model.vocab.bos_id

    def loss_backward(batch, state):
        net.zero_grad()
        logp, _ = net.score_stream(batch, state)
        (-logp.sum() / batch.num_tokens).backward()

    squares, count, state = {n: torch.zeros_like(p) for n, p in named}, 0, None
    for batch in stream_batches(train, bos, 1, seg):
        loss_backward(batch, state)
        for n, p in named:
            if p.grad is not None:
                squares[n] += p.grad ** 2
        count += 1
        with torch.no_grad():
            state = net.score_stream(batch, state)[1]
    rms = {n: torch.sqrt(squares[n] / count) for n, _ in named}
    avg = sum(rms[n].mean().item() for n, _ in named) / len(named)
    rate = {n: torch.clamp(rms[n] / avg, max=1 / decay) for n, _ in named}
    trained = {n: p.detach().clone() for n, p in named}
    out, state = [], None
    for batch in stream_batches(text, bos, 1, seg):
        with torch.no_grad():
            logp, next_state = net.score_stream(batch, state)
        out.append(logp[batch.mask].double().numpy())
        loss_backward(batch, state)
        with torch.no_grad():
            for n, p in named:
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                p += decay * rate[n] * (trained[n] - p) - lr * grad / (rms[n] + EPSILON)
        state = next_state
    return np.concatenate(out)


@pytest.mark.parametrize("name", NEURAL)
def test_the_rule_equals_a_plain_loop_of_the_papers_equations(models, name):
    model = seqlm.load(models[name])
    text = text_of(models, model)
    train = encode_file(models["train"], model.vocab)
    lr, decay, seg = 0.003, 0.05, 6
    got = dynamic_logp(model, text, True, lr, segment=seg, rule=RmsRule(models["train"], decay=decay))
    want = reference_logp(model, train, text, lr, decay, seg)
    assert got == pytest.approx(want, rel=1e-6, abs=1e-6)  # float32 rounding of the same sums
    static = score_tokens(model, text, True, max_tokens=seg).logp
    assert np.array_equal(got[:seg], static[:seg]) and np.abs(got[seg:] - static[seg:]).max() > 1e-3


def test_the_statistics_use_the_first_sentences_holding_the_tokens_asked_for(models):
    model = seqlm.load(models["lstm"])
    train = encode_file(models["train"], model.vocab)
    rule = RmsRule(models["train"], stats_tokens=30)
    dynamic_logp(model, text_of(models, model), True, 0.001, segment=5, rule=rule)
    used = rule.settings()["dynamic_stats_tokens_used"]
    assert used >= 30 and used in train.starts.tolist() and used - 30 < train.lengths().max()


def test_the_decay_pulls_each_weight_back_without_overshooting(models):
    """With no gradient, one step maps theta - theta_g to (1 - decay * RMS_norm) (theta - theta_g), RMS_norm
    clipped at 1 / decay: a weight whose rate is clipped is back at theta_g after one step, none crosses it."""
    model = seqlm.load(models["lstm"])
    net = copy.deepcopy(model)
    params = [p for p in net.parameters() if p.requires_grad]
    rms = gradient_rms(net, params, encode_file(models["train"], model.vocab), True, 8)
    trained = [p.detach().clone() for p in params]
    for decay in (0.3, 1.0):
        step = rms_step(params, rms, lr=0.5, decay=decay)  # lr has nothing to act on: no gradient
        gen = torch.Generator().manual_seed(0)
        deltas = [0.01 * torch.randn(p.shape, generator=gen) for p in params]
        with torch.no_grad():
            for p, p0, d in zip(params, trained, deltas, strict=True):
                p.copy_(p0 + d)
            for _ in range(3):
                step((None,) * len(params))
        rates = decay_rates(rms, decay)
        assert max(float(r.max()) for r in rates) == pytest.approx(1 / decay)  # some rates are clipped
        for p, p0, d, r in zip(params, trained, deltas, rates, strict=True):
            left = p.detach() - p0
            assert left == pytest.approx((d * (1 - decay * r) ** 3).numpy(), abs=1e-6)
            assert bool((left * d >= 0).all())  # never past theta_g
            if decay == 1.0:
                assert bool((left[r >= 1] == 0).all())  # full pull back
        with torch.no_grad():
            for p, p0 in zip(params, trained, strict=True):
                p.copy_(p0)


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.mark.parametrize("name", ["lstm", "transformer"])
def test_cli_rms_prints_its_perplexity_and_settings(models, name, capsys):
    before = _digest(models[name])
    code, out, err = run(capsys, "eval", models[name], "--data", models["corpus"], "--stream", "--dynamic-rule",
                         "rms", "--dynamic-lr", "0.002", "--dynamic-decay", "0.01", "--dynamic-segment", "5",
                         "--dynamic-stats", models["train"], "--dynamic-stats-tokens", "100000")
    assert code == 0, err
    res = json.loads(out)
    assert res["mode"] == "stream" and res["dynamic_rule"] == "rms" and res["dynamic_decay"] == 0.01
    assert res["dynamic_lr"] == 0.002 and res["dynamic_stats"] == str(models["train"])
    assert res["dynamic_epsilon"] == EPSILON and res["dynamic_stats_tokens_used"] > 0
    model = seqlm.load(models[name])
    logp = dynamic_logp(model, text_of(models, model), True, 0.002, 5, RmsRule(models["train"], decay=0.01))
    assert res["ppl"] == pytest.approx(math.exp(-logp.mean()), rel=1e-9)
    assert _digest(models[name]) == before
    code, out, err = run(capsys, "eval", models[name], "--data", models["corpus"], "--dynamic-lr", "0.1")
    assert code == 0 and json.loads(out)["dynamic_rule"] == "sgd" and "dynamic_decay" not in json.loads(out)


@pytest.mark.parametrize("name, flags", [
    ("rnn", ["--dynamic-lr", "0.1", "--dynamic-decay", "0.1"]),  # options of rms with plain SGD
    ("rnn", ["--dynamic-lr", "0.1", "--dynamic-stats", "TRAIN"]),
    ("rnn", ["--dynamic-lr", "0.1", "--dynamic-rule", "sgd", "--dynamic-stats-tokens", "5"]),
    ("rnn", ["--dynamic-lr", "0.1", "--dynamic-rule", "rms"]),  # no statistics
    ("rnn", ["--dynamic-lr", "0.1", "--dynamic-rule", "rms", "--dynamic-stats", "/nonexistent/train.txt"]),
    ("rnn", ["--dynamic-lr", "0.1", "--dynamic-rule", "rms", "--dynamic-stats", "TRAIN", "--dynamic-decay", "-1"]),
    ("rnn", ["--dynamic-lr", "0.1", "--dynamic-rule", "rms", "--dynamic-stats", "TRAIN", "--dynamic-decay", "nan"]),
    ("rnn", ["--dynamic-lr", "0.1", "--dynamic-rule", "rms", "--dynamic-stats", "TRAIN",
             "--dynamic-stats-tokens", "0"]),
    ("rnn", ["--dynamic-rule", "rms", "--dynamic-stats", "TRAIN"]),  # no rate
    ("rnn", ["--dynamic-lr", "0.1", "--dynamic-rule", "adam"]),
    ("kn", ["--dynamic-lr", "0.1", "--dynamic-rule", "rms", "--dynamic-stats", "TRAIN"]),
])
def test_refusals_are_one_line_and_status_2(models, name, flags, capsys):
    flags = [models["train"] if f == "TRAIN" else f for f in flags]
    code, out, err = run(capsys, "eval", models[name], "--data", models["corpus"], *flags)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "dynamic" in err


def test_a_mixture_updates_its_neural_component_by_the_rule(models, tmp_path, capsys):
    """In a mixture the rnn learns by the RMS rule from its own scores (its statistics its own), the kn
    scores as usual and the weights stay fixed: the mixture of the two columns computed apart."""
    weights = [0.5, 0.5]  # given: EM on this tiny corpus gives the rnn almost nothing
    code, out, err = run(capsys, "interpolate", models["rnn"], models["kn"], "--weights", "0.5,0.5",
                         "--out", tmp_path / "mix")
    assert code == 0, err
    code, out, err = run(capsys, "eval", tmp_path / "mix", "--data", models["corpus"], "--stream", "--dynamic-rule",
                         "rms", "--dynamic-lr", "0.001", "--dynamic-segment", "5", "--dynamic-stats", models["train"])
    assert code == 0, err
    rnn, kn = seqlm.load(models["rnn"]), seqlm.load(models["kn"])
    per = np.stack([dynamic_logp(rnn, text_of(models, rnn), True, 0.001, 5, rule=RmsRule(models["train"])),
                    score_tokens(kn, text_of(models, kn)).logp])
    assert json.loads(out)["ppl"] == pytest.approx(float(np.exp(-mix_logp(per, weights).mean())), rel=1e-9)
    per[0] = score_tokens(rnn, text_of(models, rnn), True).logp  # the static mixture: another figure
    assert json.loads(out)["ppl"] != pytest.approx(float(np.exp(-mix_logp(per, weights).mean())), rel=1e-4)
