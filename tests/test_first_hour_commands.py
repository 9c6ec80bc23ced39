"""Issue 25, items 6-10, through the CLI: commands that say which family a model is, one name per flag,
no file overwritten that the command did not write, `seqlm info` that counts what a model holds, and a
second `make run` that shows the demo's results instead of training again."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import seqlm
from seqlm.cli import main

from conftest import write_corpus

TRANSFORMER = ["--layers", "1", "--heads", "2", "--d-ff", "32", "--context", "16", "--seq-len", "16",
               "--batch-size", "4", "--max-epochs", "1", "--threads", "1"]
LSTM = ["--hidden", "16", "--layers", "1", "--batch-size", "4", "--seq-len", "8", "--max-epochs", "1",
        "--threads", "1"]


def run(capsys, *argv) -> tuple[int, str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # default discounts on a tiny corpus
        code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *argv) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A corpus and three tiny models trained on it: kn (order 2), lstm (tied, by its old flag) and a tied
    transformer (its width given by the old flag --d-model)."""
    root = tmp_path_factory.mktemp("models")
    corpus = write_corpus(root / "corpus", n_train=60, n_eval=10)
    runs = {"kn": ["--order", "2"], "lstm": [*LSTM, "--tied"], "transformer": [*TRANSFORMER, "--d-model", "16"]}
    for fam, flags in runs.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(["train", "--model", fam, "--data", str(corpus), "--out", str(root / fam), *flags]) == 0
    return {"corpus": corpus, **{fam: root / fam for fam in runs}}


# -- item 6: which family, what the command takes -------------------------------------------------------------
def test_query_and_convert_on_a_neural_model_name_its_family(models, capsys, tmp_path):
    for command in (["query", models["lstm"]], ["convert", models["transformer"], tmp_path / "x.bin"]):
        err = refused(capsys, *command)
        fam = "lstm" if command[0] == "query" else "transformer"
        assert f"is a {fam} model directory" in err and "n-gram model" in err and "missing" not in err, err
    assert "seqlm score" in refused(capsys, "query", models["lstm"])
    assert not (tmp_path / "x.bin").exists()


def test_init_from_another_family_says_which(models, capsys, tmp_path):
    err = refused(capsys, "train", "--model", "transformer", "--data", models["corpus"], "--out", tmp_path / "t",
                  "--init-from", models["lstm"], *TRANSFORMER, "--hidden", "16")
    assert "a lstm model's weights cannot start a transformer model" in err, err
    err = refused(capsys, "train", "--model", "lstm", "--data", models["corpus"], "--out", tmp_path / "l",
                  "--init-from", models["kn"], *LSTM)
    assert "a kn model has no network weights" in err, err
    err = refused(capsys, "train", "--model", "kn", "--data", models["corpus"], "--out", tmp_path / "k",
                  "--init-from", models["lstm"])
    assert "estimated from counts" in err, err
    assert not any((tmp_path / d).exists() for d in ("t", "l", "k"))


# -- item 7: one name per concept -----------------------------------------------------------------------------
def test_hidden_and_tie_embeddings_are_the_names_the_old_ones_still_read(models, tmp_path):
    lstm, tr = seqlm.load(models["lstm"]), seqlm.load(models["transformer"])
    assert lstm.config.tie_embeddings and tr.config.hidden == 16 and tr.config.tie_embeddings
    for fam in ("lstm", "transformer"):  # a model directory written before the rename loads as before
        old = tmp_path / fam
        old.mkdir()
        for f in models[fam].iterdir():
            if f.is_file():
                (old / f.name).write_bytes(f.read_bytes())
        meta = json.loads((old / "config.json").read_text())
        new, was = ("tie_embeddings", "tied") if fam == "lstm" else ("hidden", "d_model")
        meta["model"][was] = meta["model"].pop(new)
        (old / "config.json").write_text(json.dumps(meta))
        sents = ["the cat sat on the mat", "a dog ran"]
        assert seqlm.score_text(seqlm.load(old), sents) == seqlm.score_text(seqlm.load(models[fam]), sents)


def test_interpolate_takes_text_or_data_split_and_valid_stays_an_alias(models, capsys, tmp_path):
    kn, corpus = models["kn"], models["corpus"]
    valid = corpus / "valid.txt"
    outs = [json.loads(run(capsys, "interpolate", kn, models["lstm"], *flags, "--out", tmp_path / str(i))[1])
            for i, flags in enumerate((["--text", valid], ["--data", corpus, "--split", "valid"], ["--valid", valid]))]
    for o in outs:
        assert o["weights_from"] == "em" and o["weights"] == outs[0]["weights"]
        assert o["valid_ppl"] == outs[0]["valid_ppl"] and o["valid_tokens"] == outs[0]["valid_tokens"]
    refused(capsys, "interpolate", kn, "--text", valid, "--data", corpus, "--out", tmp_path / "x")


# -- item 8: no file overwritten that the command did not write -----------------------------------------------
def test_convert_keeps_an_existing_file_unless_forced(models, capsys, tmp_path):
    mine = tmp_path / "model.bin"
    mine.write_text("my notes\n")
    assert "--force" in refused(capsys, "convert", models["kn"], mine)
    assert mine.read_text() == "my notes\n"
    assert run(capsys, "convert", models["kn"], mine, "--force")[0] == 0
    assert seqlm.score_text(seqlm.load(mine), ["the cat"]) == seqlm.score_text(seqlm.load(models["kn"]), ["the cat"])


def test_plot_replaces_its_own_plot_but_not_another_file(models, capsys, tmp_path):
    notes = tmp_path / "two.txt"
    notes.write_text("keep me\n")
    assert "--force" in refused(capsys, "plot", models["lstm"], "--out", notes)
    assert notes.read_text() == "keep me\n"
    png = tmp_path / "curves.png"
    for _ in range(2):  # the second run replaces the first one's plot
        assert run(capsys, "plot", models["lstm"], "--out", png)[0] == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert run(capsys, "plot", models["lstm"], "--out", notes, "--force")[0] == 0
    assert notes.read_bytes()[:4] == b"\x89PNG"


# -- item 9: seqlm info ---------------------------------------------------------------------------------------
def _arpa_counts(path: Path) -> list[int]:
    """The `ngram k=N` lines of an ARPA header, read by hand."""
    lines = path.read_text().split("\n\n")[0].splitlines()
    return [int(line.split("=")[1]) for line in lines if line.startswith("ngram ")]


def test_info_counts_ngrams_and_says_a_file_has_no_config(models, capsys):
    counts = _arpa_counts(models["kn"] / "model.arpa")
    code, out, _ = run(capsys, "info", models["kn"])
    assert code == 0 and len(out.strip().splitlines()) == 1  # one JSON line, like every other command
    info = json.loads(out)
    assert info["ngrams"] == {str(k): n for k, n in enumerate(counts, 1)}
    assert info["parameters"] == sum(counts) + sum(counts[:-1])  # probabilities + backoffs (none at the top)
    assert info["config"]["order"] == 2
    foreign = json.loads(run(capsys, "info", models["kn"] / "model.arpa")[1])
    assert foreign["config"] is None and foreign["source"].startswith("an ARPA file")
    assert "no config" in foreign["source"]
    assert foreign["ngrams"] == info["ngrams"]
    pretty = run(capsys, "info", models["kn"], "--pretty")[1]
    assert len(pretty.splitlines()) > 5 and json.loads(pretty) == info


def test_info_counts_a_tied_matrix_once(models, capsys):
    info = json.loads(run(capsys, "info", models["transformer"])[1])
    V, H = info["vocab_size"], 16
    assert info["tied"] is True and info["parameters_by_layer"]["embedding+output"] == V * H
    assert sum(v for k, v in info["parameters_by_layer"].items() if k != "embedding+output") == info["parameters"]
    lstm = json.loads(run(capsys, "info", models["lstm"])[1])
    assert lstm["tied"] is True and lstm["parameters_by_layer"]["embedding+output"] == V * 16 + V  # + output bias


# -- item 10: a second `make run` -----------------------------------------------------------------------------
def test_a_second_demo_run_shows_the_results_without_training(tmp_path, monkeypatch, capsys):
    from seqlm import demo

    data = tmp_path / "data"
    write_corpus(data / "ptb", n_train=60, n_eval=10)
    monkeypatch.setenv("SEQLM_DATA", str(data))
    monkeypatch.setattr(demo, "MINUTES", 0.01)
    monkeypatch.setattr(demo, "DEFAULT_FAMILY", "lstm")  # a tiny model of a family the test can shrink
    real = demo.train_from_cli
    monkeypatch.setattr(demo, "train_from_cli", lambda fam, data, out, cfg, opts, **kw:
                        real(fam, data, out, cfg, opts + (LSTM if fam == "lstm" else []), **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert demo.main(tmp_path / "runs") == 0
    first = capsys.readouterr().out

    def no_training(*args, **kwargs):
        raise AssertionError("the demo trained again")

    monkeypatch.setattr(demo, "train_from_cli", no_training)
    assert demo.main(tmp_path / "runs") == 0
    second = capsys.readouterr().out
    ppl = [line for line in first.splitlines() if "valid ppl" in line]
    assert len(ppl) == 2 and ppl == [line for line in second.splitlines() if "valid ppl" in line]
    assert "already trained" in second and str(tmp_path / "runs" / "demo-lstm") in second
    assert str(tmp_path / "runs" / "demo-kn5") in second


def test_bf16_is_refused_where_the_cpu_cannot_run_the_model_in_it(tmp_path, monkeypatch, capsys):
    from seqlm.train import precision

    write_corpus(tmp_path / "data", n_train=40, n_eval=8)
    monkeypatch.setattr(precision, "cpu_bf16_runs", lambda kind: False)  # an AVX2-only CPU, wherever the test runs
    err = refused(capsys, "train", "--model", "lstm", "--data", tmp_path / "data", "--out", tmp_path / "m",
                  "--precision", "bf16", *LSTM)
    assert "--precision fp32" in err and "LSTM" in err
    code, _, _ = run(capsys, "train", "--model", "lstm", "--data", tmp_path / "data", "--out", tmp_path / "m2",
                     "--precision", "fp32", *LSTM)
    assert code == 0


@pytest.mark.parametrize("native", [False, True])
def test_emulated_bf16_is_trained_with_a_warning(tmp_path, monkeypatch, capsys, native):
    from seqlm.train import precision

    write_corpus(tmp_path / "data", n_train=40, n_eval=8)
    monkeypatch.setattr(precision, "native_bf16", lambda: native)
    code, _, err = run(capsys, "train", "--model", "fnn", "--data", tmp_path / "data", "--out", tmp_path / "m",
                       "--precision", "bf16", "--order", "3", "--embed", "8", "--hidden", "16", "--max-epochs", "1",
                       "--threads", "1")
    assert code == 0 and (tmp_path / "m" / "config.json").is_file()
    assert ("bf16 is emulated here" in err) == (not native)


def test_the_bf16_probe_says_what_this_cpu_runs():
    import torch

    from seqlm.train import precision

    lstm = torch.nn.LSTM(8, 8, num_layers=2, batch_first=True)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = lstm(torch.randn(3, 5, 8))
        out.float().sum().backward()
        ran = True
    except RuntimeError:
        ran = False
    assert precision.cpu_bf16_runs(torch.nn.LSTM) == ran
    assert precision.cpu_bf16_runs(torch.nn.RNN) or not ran
