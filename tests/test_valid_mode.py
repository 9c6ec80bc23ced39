"""--valid-mode: each epoch is validated in the mode the model trains in (auto), or as asked; the mode is
in every metrics.jsonl row, and old runs (config.json without the field) go on as they started."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import seqlm

from conftest import run_cli as run
from conftest import write_corpus

COMMON = ["--threads", "1", "--max-epochs", "1"]
FAMILIES = {  # tiny models: a second or two an epoch
    "rnn": ["--hidden", "16", "--batch-size", "4", "--seq-len", "8"],
    "afp": ["--iterations", "2", "--hidden", "16", "--batch-size", "4", "--seq-len", "8"],
    "lstm": ["--hidden", "16", "--layers", "1", "--batch-size", "4", "--seq-len", "8"],
    "fnn": ["--order", "3", "--embed", "8", "--hidden", "16", "--layers", "1", "--batch-size", "4", "--seq-len", "16"],
    "transformer": ["--layers", "1", "--hidden", "16", "--heads", "2", "--d-ff", "32", "--context", "6",
                    "--batch-size", "4", "--seq-len", "12", "--precision", "fp32"],
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("valid_mode") / "corpus", n_train=120, n_eval=20)


def train(capsys, corpus, out, family: str, *extra: str) -> list[dict]:
    code, _, err = run(capsys, "train", "--model", family, "--data", corpus, "--out", out, *FAMILIES[family],
                       *COMMON, *extra)
    assert code == 0, err
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def eval_valid(capsys, corpus, out, *flags: str) -> dict:
    code, stdout, err = run(capsys, "eval", out, "--data", corpus, "--split", "valid", *flags)
    assert code == 0, err
    return json.loads(stdout)


@pytest.mark.parametrize("family, extra, mode", [
    ("rnn", [], "stream"), ("afp", [], "stream"), ("lstm", [], "stream"),  # trained on carried streams
    ("rnn", ["--valid-mode", "sentence"], "sentence"),
    ("rnn", ["--sentence-independent", "true"], "sentence"),  # trained sentence by sentence
    ("fnn", [], "sentence"), ("transformer", [], "sentence"),
])
def test_each_epoch_is_validated_in_the_mode_the_model_is_trained_in(capsys, tmp_path, corpus, family, extra,
                                                                     mode):
    rows = train(capsys, corpus, tmp_path / "m", family, *extra)
    assert [r["valid_mode"] for r in rows] == [mode]
    # the figure the schedule saw is `seqlm eval`'s in that mode, on the model saved after that epoch
    result = eval_valid(capsys, corpus, tmp_path / "m", *(["--stream"] if mode == "stream" else []))
    assert result["mode"] == mode
    assert rows[0]["valid_ppl"] == pytest.approx(result["ppl"], rel=1e-6)


@pytest.mark.parametrize("family, extra", [("fnn", []), ("rnn", ["--sentence-independent", "true"])])
def test_a_model_that_cannot_stream_refuses_stream_validation(capsys, tmp_path, corpus, family, extra):
    code, out, err = run(capsys, "train", "--model", family, "--data", corpus, "--out", tmp_path / "m",
                         *FAMILIES[family], *COMMON, *extra, "--valid-mode", "stream")
    assert code == 2 and out == ""
    assert "--valid-mode stream" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m" / "config.json").exists()


def test_an_unknown_mode_is_refused(capsys, tmp_path, corpus):
    code, _, err = run(capsys, "train", "--model", "rnn", "--data", corpus, "--out", tmp_path / "m",
                       "--valid-mode", "streams")
    assert code == 2 and "--valid-mode must be one of sentence, stream, auto" in err


def _make_old(out) -> None:
    """Make a run look written before --valid-mode: no field in config.json, no mode in any metrics row."""
    meta = json.loads((out / "config.json").read_text())
    del meta["model"]["train"]["valid_mode"]
    (out / "config.json").write_text(json.dumps(meta))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    (out / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "valid_mode"}) + "\n"
                                               for r in rows))
    state = out / "resume" / "state.safetensors"
    with safe_open(str(state), "pt") as f:
        saved = json.loads(f.metadata()["seqlm"])
    saved["history"] = [{k: v for k, v in r.items() if k != "valid_mode"} for r in saved["history"]]
    save_file(load_file(str(state)), str(state), metadata={"seqlm": json.dumps(saved)})


def test_an_old_stream_trained_run_loads_and_resumes_validated_by_sentence(capsys, tmp_path, corpus):
    out = tmp_path / "old"
    first = train(capsys, corpus, out, "rnn", "--valid-mode", "sentence")
    assert (out / "resume" / "state.safetensors").exists()
    _make_old(out)
    assert seqlm.load(out).config.train.valid_mode == "sentence"  # what such a run was validated by
    rows = train(capsys, corpus, out, "rnn", "--resume", "--max-epochs", "2")
    assert [r.get("valid_mode") for r in rows] == [None, "sentence"]
    assert rows[0]["valid_ppl"] == first[0]["valid_ppl"]
    code, _, err = run(capsys, "train", "--model", "rnn", "--data", corpus, "--out", out, *FAMILIES["rnn"],
                       "--threads", "1", "--resume", "--max-epochs", "3", "--valid-mode", "stream")
    assert code == 2 and "validated by sentence" in err and "--valid-mode sentence" in err


def test_help_config_describes_valid_mode(capsys):
    code, out, _ = run(capsys, "train", "--model", "rnn", "--help-config")
    line = next(x for x in out.splitlines() if x.split()[0] == "--valid-mode")
    assert "'auto'" in line and "stream" in line and "sentence" in line
