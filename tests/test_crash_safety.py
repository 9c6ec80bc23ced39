"""Crash safety: kill -9 then --resume, failed writes, and recovery from a non-finite loss."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch

from seqlm import checkpoint as ckpt
from seqlm.cli import main
from seqlm.config import TrainConfig
from seqlm.data.corpus import build_vocab_and_encode, encode_file
from seqlm.errors import SeqlmError
from seqlm.models.fnn import FNNConfig
from seqlm.registry import FAMILIES
from seqlm.train import loop

from conftest import SEQ_KEY, SEQ_LEN, TINY, cli_env, write_corpus

ARGS = ["--model", "fnn", SEQ_LEN, "20", "--max-epochs", "4", "--lr", "0.3", "--seed", "7", *TINY]


def test_kill_9_then_resume_ends_like_an_uninterrupted_run(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", n_train=600)
    # The run to be killed, in a subprocess: SIGKILL as soon as the first epoch's checkpoint exists.
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "seqlm", "train", "--data", str(corpus), "--out", str(out), *ARGS]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cli_env())
    state = out / loop.RESUME / "state.safetensors"
    deadline = time.time() + 300  # a loaded machine can take a minute to start the process and run an epoch
    while not state.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not (out / "results.json").exists(), "the run finished before it could be killed; make it longer"
    done = len((out / "metrics.jsonl").read_text().splitlines())
    assert 1 <= done < 4

    assert main(["train", "--data", str(corpus), "--out", str(out), "--resume", *ARGS]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert main(["train", "--data", str(corpus), "--out", str(tmp_path / "whole"), *ARGS]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert resumed["valid_ppl"] == whole["valid_ppl"] and resumed["test_ppl"] == whole["test_ppl"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [r["epoch"] for r in ref]  # no epoch lost or repeated
    assert [r["valid_ppl"] for r in rows] == [r["valid_ppl"] for r in ref]


def _tensors(v: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((64, 64), v)}


def test_a_failed_save_leaves_the_old_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "weights.safetensors"
    ckpt.save_tensors(path, _tensors(1.0))
    before = path.read_bytes()

    def half_then_fail(tensors, filename, metadata=None):  # the disk fills up half way through
        Path(filename).write_bytes(safetensors.torch.save(tensors)[:1000])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "save_file", half_then_fail)
    with pytest.raises(SeqlmError, match="previous version is intact"):
        ckpt.save_tensors(path, _tensors(2.0))
    assert path.read_bytes() == before
    assert torch.equal(ckpt.load_tensors(path)["w"], _tensors(1.0)["w"])
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_a_crash_during_save_leaves_the_old_checkpoint_intact(tmp_path):
    """A process killed mid-write (simulated: it exits inside the write) leaves the good file in place."""
    path = tmp_path / "config.json"
    ckpt.write_json(path, {"good": True})
    code = (
        "import os, sys\n"
        "from seqlm import checkpoint as ckpt\n"
        "with ckpt.atomic_path(sys.argv[1]) as tmp:\n"
        "    tmp.write_text('{\"trunc')\n"
        "    os._exit(9)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(path)], env=cli_env(), timeout=60)
    assert r.returncode == 9
    assert ckpt.read_json(path) == {"good": True}


def _tiny_fit(tmp_path: Path, step, lr: float = 0.3, retries: int = 3):
    corpus = write_corpus(tmp_path / "corpus", n_train=60, n_eval=10)
    vocab, train = build_vocab_and_encode(corpus / "train.txt")
    valid = encode_file(corpus / "valid.txt", vocab)
    cfg = FNNConfig(hidden=16, embed=8, train=TrainConfig(lr=lr, **{SEQ_KEY: 20}, max_epochs=2, threads=1,
                                                          max_nan_retries=retries))
    model = FAMILIES["fnn"].build(cfg, vocab)
    out = tmp_path / "out"
    out.mkdir()
    batches = FAMILIES["fnn"].batches(cfg, vocab)
    return loop.fit(model, step, batches, train, valid, cfg.train, out, lambda m: None)


def test_a_nan_loss_restores_halves_the_rate_logs_and_continues(tmp_path, capsys):
    calls = {"n": 0}
    real = FAMILIES["fnn"].step

    def nan_once(net, batch, state):
        calls["n"] += 1
        loss, state, n = real(net, batch, state)
        return (loss * math.nan if calls["n"] == 2 else loss), state, n

    history = _tiny_fit(tmp_path, nan_once)
    assert [h["epoch"] for h in history] == [1, 2]
    assert history[0]["lr"] == pytest.approx(0.15)  # 0.3 halved once
    assert all(math.isfinite(h["valid_ppl"]) for h in history)
    assert "non-finite loss in epoch 1; restored the last good state, lr -> 0.15" in capsys.readouterr().err


def test_a_nan_loss_every_time_gives_up_after_bounded_retries(tmp_path):
    calls = {"n": 0}

    def always_nan(net, batch, state):
        calls["n"] += 1
        loss, state, n = FAMILIES["fnn"].step(net, batch, state)
        return loss * math.inf, state, n

    with pytest.raises(SeqlmError, match=r"NaN/inf 3 times in epoch 1.*lower --lr"):
        _tiny_fit(tmp_path, always_nan, retries=2)
    assert calls["n"] == 3  # each try stops at its first bad step


def test_absurd_lr_through_the_cli_is_a_clear_error(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", n_train=60, n_eval=10)
    r = subprocess.run([sys.executable, "-m", "seqlm", "train", "--model", "fnn", "--data", str(corpus), "--out",
                        str(tmp_path / "m"), "--lr", "1e30", SEQ_LEN, "20", *TINY], capture_output=True, text=True,
                       env=cli_env(), timeout=120)
    assert r.returncode == 2
    err = [x for x in r.stderr.splitlines() if x.startswith("seqlm: error:")]
    assert len(err) == 1 and "NaN/inf" in err[0] and "--lr" in err[0]
    assert "Traceback" not in r.stderr
    assert r.stderr.count("restored the last good state") == 3  # the default --max-nan-retries


def test_sigterm_outside_the_training_loop_is_one_line_and_keeps_the_model(tmp_path):
    """SIGTERM while a KN model is being estimated (no training loop to catch it): one line, exit 143, and the
    model the folder held before (its ARPA file) untouched. The signal is sent from inside the estimator, so
    it lands there on every machine, however fast."""
    data = write_corpus(tmp_path / "c")
    out = tmp_path / "kn"
    first = subprocess.run([sys.executable, "-m", "seqlm", "train", "--model", "kn", "--order", "3", "--data",
                            str(data), "--out", str(out)], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert first.returncode == 0, first.stderr
    before = (out / "model.arpa").read_bytes()
    script = (
        "import os, signal, sys\n"
        "import seqlm.ngram.kneser_ney as kn\n"
        "real = kn.adjust_counts\n"
        "def adjust(counts):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(counts)\n"
        "kn.adjust_counts = adjust\n"
        "from seqlm.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    again = subprocess.run([sys.executable, "-c", script, "train", "--model", "kn", "--order", "3", "--data", str(data),
                            "--out", str(tmp_path / "kn2")], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert again.returncode == 128 + signal.SIGTERM
    assert again.stderr.strip().count("\n") == 0 and "terminated" in again.stderr, again.stderr
    assert (out / "model.arpa").read_bytes() == before
    assert not (tmp_path / "kn2" / "model.arpa").exists()  # nothing half-written left behind
