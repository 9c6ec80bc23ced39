"""--rollback: an epoch after which validation stalls is undone (weights, optimizer state, random state,
position) and run again at the halved rate, as the FOFE authors' trainer does (iNCML-DNNLM,
source/trainer.cpp); off by default, where training is unchanged."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from seqlm.errors import SeqlmError
from seqlm.train.resume import RESUME, run_status
from seqlm.train.run import train_from_cli
from seqlm.train.schedule import NewBob

from conftest import write_corpus

# dropout (random numbers every batch) and momentum (optimizer state) so that both must be restored
FLAGS = ["--hidden", "16", "--embed", "8", "--threads", "1", "--batch-size", "8", "--seq-len", "50",
         "--dropout", "0.3", "--momentum", "0.9", "--lr", "0.05"]


def reference_trainer(ppls: list[float], lr: float, max_iter: int = 16) -> list[tuple[int, float]]:
    """(epoch, rate) of every epoch run, by the control flow of iNCML-DNNLM's source/trainer.cpp,
    written out independently: halve and reload the epoch's starting weights the first time valid
    ppl improves by less than 1, run that epoch again, 6 epochs after it in all, halving after each."""
    runs, prev, decay, epoch, it = [], float("inf"), False, 0, iter(ppls)
    while epoch < max_iter:
        runs.append((epoch + 1, lr))
        ppl = next(it)
        if not decay:
            if ppl + 1.0 > prev:
                lr, max_iter, decay = lr * 0.5, epoch + 6, True
                epoch -= 1  # the same epoch again
            prev = ppl
        else:
            lr *= 0.5
        epoch += 1
    return runs


def test_newbob_with_rollback_runs_the_epochs_the_reference_trainer_runs():
    ppls = [300, 200, 150, 149.5, 148, 147, 146, 145, 144, 143]
    s, epoch, runs = NewBob(lr=0.4, min_improvement=1.0, halving_epochs=6, rollback=True), 1, []
    for ppl in ppls:
        if s.done:
            break
        runs.append((epoch, s.lr))
        s.update(ppl)
        epoch += 0 if s.rerun else 1
    assert runs == reference_trainer(ppls, 0.4)
    assert runs[3:5] == [(4, 0.4), (4, 0.2)]  # epoch 4 stalled, undone, run again at half the rate


def _train(corpus, out, *extra: str, session_minutes: float = 0.0, resume: bool = False) -> list[dict]:
    train_from_cli("fnn", str(corpus), str(out), None, [*FLAGS, *extra], resume=resume,
                   session_minutes=session_minutes)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _state(out) -> dict[str, torch.Tensor]:
    return load_file(str(out / RESUME / "state.safetensors"))


def test_a_stalled_epoch_leaves_weights_optimizer_and_rng_as_they_were_before_it(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    # the first epoch always improves (on infinity); the second cannot improve by 1e9: undone, and with
    # no halving epochs left the run ends there
    rows = _train(corpus, tmp_path / "a", "--rollback", "true", "--min-improvement", "1e9", "--halving-epochs", "0",
                  "--max-epochs", "5")
    rng_a = torch.get_rng_state()  # the live random state, as the run left it
    assert [(r["epoch"], r.get("rolled_back", False)) for r in rows] == [(1, False), (2, True)]
    assert rows[1]["valid_ppl"] != rows[0]["valid_ppl"]  # epoch 2 did change the model before it was undone
    once = _train(corpus, tmp_path / "b", "--max-epochs", "1")  # the reference: the state after epoch 1
    assert once[0]["valid_ppl"] == rows[0]["valid_ppl"]
    assert torch.equal(torch.get_rng_state(), rng_a)
    a, b = _state(tmp_path / "a"), _state(tmp_path / "b")
    assert sorted(a) == sorted(b)
    assert any(k.startswith("opt.") for k in a) and "rng.torch" in a  # momentum buffers and the random state
    for k in b:
        assert torch.equal(a[k], b[k]), k


def _until_done(corpus, out, *extra: str, **kw) -> list[dict]:
    rows = []
    for _ in range(200):
        rows = _train(corpus, out, *extra, resume=(out / RESUME).exists(), **kw)
        if run_status(out)["done"]:
            return rows
    raise AssertionError("the run never finished")


def test_resume_after_and_inside_a_rolled_back_epoch_ends_like_the_uninterrupted_run(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    flags = ("--rollback", "true", "--min-improvement", "1e9", "--halving-epochs", "2", "--max-epochs", "8")
    whole = _train(corpus, tmp_path / "whole", *flags)
    assert [(r["epoch"], r["lr"], r.get("rolled_back", False)) for r in whole] == \
        [(1, 0.05, False), (2, 0.05, True), (2, 0.025, False), (3, 0.0125, False)]
    # one epoch per invocation: a run resumed right after the rollback
    by_epoch = _until_done(corpus, tmp_path / "epochs", *flags, session_minutes=1e-9)
    # one batch per invocation: the rollback reads the epoch's start back from disk
    by_batch = [r for r in _until_done(corpus, tmp_path / "batches", *flags, "--max-minutes", "1e-9")
                if not r.get("partial")]
    ref = _state(tmp_path / "whole")
    for rows, out in ((by_epoch, "epochs"), (by_batch, "batches")):
        assert [(r["epoch"], r["lr"], r["valid_ppl"]) for r in rows] == [(r["epoch"], r["lr"], r["valid_ppl"])
                                                                        for r in whole]
        state = _state(tmp_path / out)
        assert all(torch.equal(state[k], ref[k]) for k in ref if k.startswith("model."))


def test_rollback_off_or_never_triggered_changes_nothing(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    plain = _train(corpus, tmp_path / "plain", "--max-epochs", "3", "--min-improvement", "0")
    unused = _train(corpus, tmp_path / "unused", "--max-epochs", "3", "--min-improvement", "0", "--rollback", "true")
    assert not any(r["lr_halved"] for r in unused)
    assert [r["valid_ppl"] for r in plain] == [r["valid_ppl"] for r in unused]
    a, b = _state(tmp_path / "plain"), _state(tmp_path / "unused")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_rollback_needs_the_newbob_schedule(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    with pytest.raises(SeqlmError, match="--rollback needs --schedule newbob"):
        _train(corpus, tmp_path / "x", "--rollback", "true", "--schedule", "warmup-cosine")
