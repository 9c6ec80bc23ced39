"""The one training loop: schedule, determinism, precision, limits, metrics."""

from __future__ import annotations

import json

import pytest

import seqlm
from seqlm.cli import main
from seqlm.train.schedule import NewBob

from conftest import TINY, write_corpus


def test_newbob_keeps_then_halves_for_a_fixed_number_of_epochs():
    s = NewBob(lr=0.4, min_improvement=1.0, halving_epochs=3)
    lrs = []
    for ppl in [300, 200, 150, 149.5, 149, 148, 147.9, 150]:
        if s.done:
            break
        s.update(ppl)
        lrs.append(s.lr)
    # improves by >= 1 until 150 -> 149.5, then three halvings and stop
    assert lrs == [0.4, 0.4, 0.4, 0.2, 0.1, 0.05, 0.025] and s.done


def _train(tmp_path, name: str, *extra: str) -> list[dict]:
    corpus = tmp_path / "corpus"
    if not corpus.exists():
        write_corpus(corpus)
    out = tmp_path / name
    assert main(["train", "--model", "fnn", "--data", str(corpus), "--out", str(out), "--bptt", "20",
                 "--max-epochs", "2", *TINY, *extra]) == 0
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_same_seed_same_run_other_seed_other_run(tmp_path):
    a = _train(tmp_path, "a", "--seed", "3")
    b = _train(tmp_path, "b", "--seed", "3")
    c = _train(tmp_path, "c", "--seed", "4")
    assert [r["valid_ppl"] for r in a] == [r["valid_ppl"] for r in b]
    assert [r["valid_ppl"] for r in a] != [r["valid_ppl"] for r in c]


def test_training_lowers_perplexity_and_logs_every_epoch(tmp_path):
    rows = _train(tmp_path, "m", "--max-epochs", "4", "--lr", "0.3")
    assert len(rows) == 4 and rows[-1]["valid_ppl"] < rows[0]["valid_ppl"]
    for key in ("epoch", "lr", "train_ppl", "valid_ppl", "train_tokens_per_s", "wall_seconds", "lr_halved"):
        assert key in rows[0]


@pytest.mark.parametrize("extra", [("--precision", "bf16"), ("--optimizer", "adam", "--lr", "0.01"),
                                   ("--clip", "0.5", "--momentum", "0.9")])
def test_options_train(tmp_path, extra):
    rows = _train(tmp_path, "m", *extra)
    assert rows[-1]["valid_ppl"] < 1e3 and rows[0]["precision"] == ("bf16" if "bf16" in extra else "fp32")


def test_max_minutes_stops_early(tmp_path):
    rows = _train(tmp_path, "m", "--max-epochs", "50", "--max-minutes", "0.0001")
    assert len(rows) == 1  # the epoch in progress is cut short, evaluated and saved; no more start


@pytest.mark.parametrize("family", ["fofe", "rnn"])
def test_each_neural_family_trains_through_the_loop(tmp_path, family):
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / family
    extra = ["--batch-size", "4"] if family == "rnn" else []
    assert main(["train", "--model", family, "--data", str(corpus), "--out", str(out), "--bptt", "10",
                 "--max-epochs", "2", *TINY, *extra]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[-1]["valid_ppl"] < 30  # a uniform guess over this vocabulary is ~14


@pytest.mark.parametrize("family", ["fnn", "fofe", "rnn"])
def test_dropout_trains_and_is_off_when_scoring(tmp_path, family):
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / family
    extra = ["--batch-size", "4"] if family == "rnn" else []
    assert main(["train", "--model", family, "--data", str(corpus), "--out", str(out), "--bptt", "10",
                 "--max-epochs", "2", "--dropout", "0.5", *TINY, *extra]) == 0
    model = seqlm.load(out)
    text = [line.split() for line in (corpus / "test.txt").read_text().splitlines()]
    first, again = seqlm.score_text(model, text), seqlm.score_text(model, text)
    assert first == again  # a loaded model scores deterministically: no dropout at inference
