"""--resume: an interrupted run (epoch boundary, --max-minutes cut, SIGTERM) ends exactly where an
uninterrupted one ends, dropout's random numbers included; changed flags are applied or refused."""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import seqlm
from seqlm.cli import main
from seqlm.data.corpus import build_vocab_and_encode, encode_file
from seqlm.errors import SeqlmError
from seqlm.models.rnn import RNNConfig
from seqlm.registry import FAMILIES
from seqlm.train import loop

from conftest import TINY, cli_env, write_corpus

RNN = ["--model", "rnn", "--batch-size", "4", "--seq-len", "10", "--dropout", "0.5", "--lr", "0.01", *TINY]


def _train(corpus, out, *extra: str) -> int:
    return main(["train", "--data", str(corpus), "--out", str(out), *RNN, *extra])


def _rows(out) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(out) -> dict[str, torch.Tensor]:
    return seqlm.load(out).state_dict()


def _same_run(a, b) -> None:
    full = [r for r in _rows(a) if not r.get("partial")]
    ref = _rows(b)
    assert [(r["epoch"], r["lr"], r["train_ppl"], r["valid_ppl"]) for r in full] == \
        [(r["epoch"], r["lr"], r["train_ppl"], r["valid_ppl"]) for r in ref]
    wa, wb = _weights(a), _weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wb)


@pytest.fixture
def whole(tmp_path):
    """The uninterrupted reference: 3 epochs of an RNN with dropout (random numbers every batch)."""
    corpus = write_corpus(tmp_path / "corpus")
    assert _train(corpus, tmp_path / "whole", "--max-epochs", "3") == 0
    return corpus, tmp_path / "whole"


def test_resume_at_an_epoch_boundary_ends_like_the_uninterrupted_run(whole, tmp_path):
    corpus, ref = whole
    out = tmp_path / "split"
    assert _train(corpus, out, "--max-epochs", "1") == 0
    assert _train(corpus, out, "--max-epochs", "3", "--resume") == 0
    _same_run(out, ref)


def test_an_epoch_cut_short_is_partial_and_resume_finishes_it(whole, tmp_path, capsys):
    corpus, ref = whole
    out = tmp_path / "cut"
    assert _train(corpus, out, "--max-epochs", "3", "--max-minutes", "1e-9") == 0  # stops after one batch
    (row,) = _rows(out)
    assert row["partial"] and row["batches"] == 1 and row["of"] > 1 and not row["lr_halved"]
    assert "(cut short: partial)" in capsys.readouterr().err
    # --max-minutes bounds one invocation: the resumed run is not stopped by the first one's limit
    assert _train(corpus, out, "--resume") == 0
    _same_run(out, ref)


def _tiny_fit(tmp_path, out_name: str, step, resume: bool = False):
    corpus = tmp_path / "corpus"
    vocab, train = build_vocab_and_encode(corpus / "train.txt")
    valid = encode_file(corpus / "valid.txt", vocab)
    cfg = RNNConfig(hidden=16, embed=8, dropout=0.5)
    cfg.train.batch_size, cfg.train.seq_len, cfg.train.max_epochs, cfg.train.threads = 4, 10, 2, 1
    torch.manual_seed(cfg.train.seed)
    model = FAMILIES["rnn"].build(cfg, vocab)
    out = tmp_path / out_name
    out.mkdir(exist_ok=True)
    history = loop.fit(model, step, FAMILIES["rnn"].batches(cfg, vocab), train, valid, cfg.train, out,
                       lambda m: None, resume)
    return history, model


def test_sigterm_saves_says_where_resume_continues_and_resume_matches(tmp_path, capsys):
    write_corpus(tmp_path / "corpus")
    calls = {"n": 0}

    def signalled(net, batch, state):
        calls["n"] += 1
        if calls["n"] == 5:
            signal.raise_signal(signal.SIGTERM)  # as a cluster pre-empting the job
        return FAMILIES["rnn"].step(net, batch, state)

    with pytest.raises(SystemExit) as stop:
        _tiny_fit(tmp_path, "stopped", signalled)
    assert stop.value.code == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert "stopped by SIGTERM in epoch 1 after batch 5 of" in err and "--resume` continues epoch 1" in err
    resumed, m1 = _tiny_fit(tmp_path, "stopped", FAMILIES["rnn"].step, resume=True)
    whole, m2 = _tiny_fit(tmp_path, "whole", FAMILIES["rnn"].step)
    assert [h["valid_ppl"] for h in resumed] == [h["valid_ppl"] for h in whole]
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values(), strict=True))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back


def test_sigterm_through_the_command_line(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", n_train=3000)
    out = tmp_path / "m"
    cmd = [sys.executable, "-m", "seqlm", "train", "--data", str(corpus), "--out", str(out), *RNN,
           "--max-epochs", "50"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    deadline = time.time() + 60
    while not (out / "metrics.jsonl").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    lines = [x for x in err.splitlines() if "stopped by SIGTERM" in x]
    assert len(lines) == 1 and "--resume` continues epoch" in lines[0] and "Traceback" not in err


def test_changed_schedule_flags_apply_and_are_logged(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "m"
    assert _train(corpus, out, "--max-epochs", "1") == 0
    capsys.readouterr()
    assert _train(corpus, out, "--max-epochs", "2", "--resume", "--lr", "0.05", "--halving-epochs", "2",
                  "--min-improvement", "0.5") == 0
    err = capsys.readouterr().err
    assert "--resume with changed settings: lr 0.01 -> 0.05" in err
    assert "min_improvement 1 -> 0.5" in err and "halving_epochs 6 -> 2" in err
    rows = _rows(out)
    assert [r["lr"] for r in rows] == [0.01, 0.05]


@pytest.mark.parametrize("flag, value", [("--hidden", "32"), ("--activation", "tanh"), ("--max-vocab", "5"),
                                         ("--optimizer", "sgd"), ("--seq-len", "7")])
def test_changed_architecture_or_state_flags_are_one_line_errors(tmp_path, capsys, flag, value):
    corpus = write_corpus(tmp_path / "corpus", n_train=60, n_eval=10)
    out = tmp_path / "m"
    assert _train(corpus, out, "--max-epochs", "1") == 0
    capsys.readouterr()
    assert _train(corpus, out, "--max-epochs", "2", "--resume", flag, value) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} cannot change on --resume" in err and "Traceback" not in err
    assert len(_rows(out)) == 1


def test_resume_with_nothing_to_do_says_so(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", n_train=60, n_eval=10)
    out = tmp_path / "m"
    assert _train(corpus, out, "--max-epochs", "2") == 0
    capsys.readouterr()
    assert _train(corpus, out, "--resume") == 0
    assert "nothing to resume: all --max-epochs 2 epochs ran" in capsys.readouterr().err
    assert len(_rows(out)) == 2


def _stop_in_first_epoch(corpus, out, monkeypatch) -> None:
    """Train until SIGTERM arrives at the third batch of epoch 1, before any epoch ends."""
    step, calls = FAMILIES["rnn"].step, {"n": 0}

    def signalled(net, batch, state):
        calls["n"] += 1
        if calls["n"] == 3:
            signal.raise_signal(signal.SIGTERM)
        return step(net, batch, state)

    monkeypatch.setitem(FAMILIES, "rnn", dataclasses.replace(FAMILIES["rnn"], step=signalled))
    with pytest.raises(SystemExit) as stop:
        _train(corpus, out, "--max-epochs", "3")
    monkeypatch.undo()
    assert stop.value.code == 128 + signal.SIGTERM and not (out / "metrics.jsonl").exists()


def test_a_run_stopped_inside_its_first_epoch_resumes_from_the_command_line(whole, tmp_path, monkeypatch):
    corpus, ref = whole
    out = tmp_path / "early"
    _stop_in_first_epoch(corpus, out, monkeypatch)
    assert (out / "config.json").exists()  # the settings --resume needs are there before the first epoch ends
    assert _train(corpus, out, "--resume") == 0
    _same_run(out, ref)


def test_resume_of_a_run_stopped_before_any_state_starts_it_again(whole, tmp_path, monkeypatch, capsys):
    corpus, ref = whole
    out = tmp_path / "early"
    _stop_in_first_epoch(corpus, out, monkeypatch)
    shutil.rmtree(out / "resume")  # as if stopped before the first state was written
    capsys.readouterr()
    assert _train(corpus, out, "--resume") == 0
    assert "Traceback" not in capsys.readouterr().err
    _same_run(out, ref)


def test_a_run_that_fails_before_its_first_state_leaves_the_directory_as_found(tmp_path, monkeypatch, capsys):
    corpus = write_corpus(tmp_path / "corpus", n_train=60, n_eval=10)
    out = tmp_path / "m"
    out.mkdir()
    (out / "notes.txt").write_text("mine")

    def refused(net, batch, state):
        raise SeqlmError("this machine cannot train that")  # as a precision refused at the first batch

    monkeypatch.setitem(FAMILIES, "rnn", dataclasses.replace(FAMILIES["rnn"], step=refused))
    assert _train(corpus, out, "--max-epochs", "1") == 2
    assert "cannot train that" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]  # nothing of the failed run, the user's file kept
    monkeypatch.undo()
    assert _train(corpus, out, "--max-epochs", "1") == 0  # the same command again, without --resume


def _files(d) -> dict:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.rglob("*")) if p.is_file()}


def test_resume_refuses_a_model_without_its_state_and_changes_nothing(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", n_train=60, n_eval=10)
    out, saved = tmp_path / "m", tmp_path / "saved"
    assert _train(corpus, out, "--max-epochs", "1") == 0
    (out / "resume" / "state.safetensors").unlink()  # deleted, or the directory copied without it
    seqlm.save(seqlm.load(out), saved)  # a model written by seqlm.save has no state either
    for d in (out, saved):
        before = _files(d)
        capsys.readouterr()
        assert _train(corpus, d, "--max-epochs", "2", "--resume") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "training state" in err and f"--init-from {d}" in err, err
        assert _files(d) == before
    assert len(_rows(out)) == 1
    assert _train(corpus, tmp_path / "on", "--max-epochs", "1", "--init-from", str(out)) == 0  # the way it names


def test_resume_with_another_family_changes_nothing(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", n_train=60, n_eval=10)
    out = tmp_path / "m"
    assert _train(corpus, out, "--max-epochs", "1") == 0
    before = _files(out)
    capsys.readouterr()
    argv = ["train", "--model", "fnn", "--data", str(corpus), "--out", str(out), "--resume", "--max-epochs", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--model rnn" in err, err
    assert _files(out) == before
