"""Options that would change nothing are refused with one line naming them, never silently ignored; a
preset (`--size`) never overrides an option given with it (issue #39, item 8)."""

from __future__ import annotations

import json

import pytest

from seqlm.cli import main
from seqlm.config import DataConfig, apply_overrides, from_dict, to_dict
from seqlm.models.transformer import TransformerConfig

from conftest import TINY, write_corpus
from conftest import run_cli as run


def refused(capsys, *argv, match: str) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "", (code, out, err)
    line = err.strip()
    assert "\n" not in line and match in line, line
    return line


@pytest.fixture(scope="module")
def kn(tmp_path_factory):
    """Two small n-gram models of a tiny corpus (estimated in well under a second)."""
    root = tmp_path_factory.mktemp("kn")
    corpus = write_corpus(root / "corpus")
    for order in (2, 3):
        assert main(["train", "--model", "kn", "--order", str(order), "--data", str(corpus),
                     "--out", str(root / f"kn{order}")]) == 0
    return root


def test_beam_search_refuses_temperature_and_seed_it_would_ignore(kn, capsys):
    model = kn / "kn3"
    line = refused(capsys, "generate", model, "--beam", "3", "--temperature", "0.5", match="--temperature 0.5")
    assert "--beam" in line
    refused(capsys, "generate", model, "--beam", "3", "--seed", "4", match="--seed 4")
    code, out, _ = run(capsys, "generate", model, "--beam", "3", "--num", "2")
    assert code == 0 and len(out.splitlines()) == 2
    # sampling reads both: the same seed at another temperature draws other sentences
    hot = run(capsys, "generate", model, "--seed", "4", "--num", "8", "--temperature", "3")[1]
    cold = run(capsys, "generate", model, "--seed", "4", "--num", "8", "--temperature", "0.2")[1]
    assert hot != cold


def test_latent_is_refused_for_a_model_without_one(kn, capsys):
    line = refused(capsys, "generate", kn / "kn3", "--latent", "1,2", match="--latent")
    assert "kn" in line and "dae" in line


@pytest.mark.parametrize("argv, match", [
    (["--model", "fnn", "--optimizer", "adam", "--momentum", "0.9"], "--momentum 0.9 has no effect under "
                                                                     "--optimizer adam"),
    (["--model", "rnn", "--momentum", "0.5"], "--optimizer adam"),  # adam is the rnn family's own default
    (["--model", "fnn", "--beta1", "0.8"], "--beta1 0.8 has no effect under --optimizer sgd"),
    (["--model", "fnn", "--eps", "1e-6"], "--eps"),
    (["--model", "fnn", "--warmup-steps", "10"], "--warmup-steps 10 has no effect under --schedule newbob"),
    (["--model", "fnn", "--min-lr", "0.01"], "--min-lr"),
    (["--model", "transformer", "--min-improvement", "0"], "--min-improvement 0.0 has no effect under "
                                                            "--schedule warmup-cosine"),
    (["--model", "transformer", "--halving-epochs", "2"], "--halving-epochs"),
    (["--model", "transformer", "--schedule", "newbob", "--warmup-steps", "7"], "--warmup-steps 7"),
])
def test_optimiser_and_schedule_options_that_would_be_ignored_are_refused(tmp_path, capsys, argv, match):
    corpus = write_corpus(tmp_path / "corpus", n_train=20, n_eval=5)
    refused(capsys, "train", *argv, "--data", corpus, "--out", tmp_path / "m", match=match)
    assert not (tmp_path / "m").exists()  # refused before any work


def test_an_option_given_its_own_value_under_another_optimiser_is_harmless(tmp_path, capsys):
    """Only a value that would change something is refused: the transformer's own warm-up of 100 steps
    given again under newbob, or momentum 0 under adam, would not."""
    corpus = write_corpus(tmp_path / "corpus", n_train=30, n_eval=5)
    code, _, err = run(capsys, "train", "--model", "fnn", "--data", corpus, "--out", tmp_path / "m", *TINY,
                       "--optimizer", "adam", "--lr", "0.01", "--momentum", "0", "--warmup-steps", "0",
                       "--max-epochs", "1", "--seq-len", "16")
    assert code == 0, err
    cfg = TransformerConfig()
    apply_overrides([cfg, DataConfig()], {"schedule": "newbob", "warmup-steps": "100", "min-lr": "1e-5"})
    assert cfg.train.schedule == "newbob"


def test_explicit_sizes_win_over_the_size_preset(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", n_train=40, n_eval=5)
    out = tmp_path / "m"
    code, _, err = run(capsys, "train", "--model", "transformer", "--data", corpus, "--out", out,
                       "--size", "small", "--layers", "1", "--heads", "2", "--context", "8", "--seq-len", "8",
                       "--batch-size", "8", "--max-epochs", "1", "--threads", "1", "--precision", "fp32")
    assert code == 0, err
    model = json.loads((out / "config.json").read_text())["model"]
    # layers and heads as given; hidden and d_ff from the preset; the size no longer names what was trained
    assert (model["layers"], model["heads"], model["hidden"], model["d_ff"]) == (1, 2, 384, 2048)
    assert model["size"] == ""


@pytest.mark.parametrize("order", [["size", "layers", "heads"], ["layers", "heads", "size"]])
def test_the_preset_goes_first_whatever_the_order_given(order):
    values = {"size": "small", "layers": "8", "heads": "2"}
    cfg = TransformerConfig()
    apply_overrides([cfg, DataConfig()], {k: values[k] for k in order})
    assert (cfg.layers, cfg.heads, cfg.hidden, cfg.d_ff, cfg.size) == (8, 2, 384, 2048, "")
    again = from_dict(TransformerConfig, to_dict(cfg))  # as loaded from config.json: nothing re-applied
    assert (again.layers, again.heads, again.size) == (8, 2, "")


def test_a_size_alone_or_repeated_keeps_its_name_and_values():
    cfg = TransformerConfig()
    apply_overrides([cfg, DataConfig()], {"size": "base", "layers": "6"})  # the preset's own value
    assert (cfg.size, cfg.layers, cfg.hidden, cfg.d_ff, cfg.heads) == ("base", 6, 512, 4096, 8)
    resumed = from_dict(TransformerConfig, to_dict(cfg))
    apply_overrides([resumed, DataConfig()], {"layers": "2"})  # a later change to a field the size set
    assert (resumed.layers, resumed.size) == (2, "")


def test_interpolate_refuses_stream_and_raw_without_held_out_text(kn, capsys, tmp_path):
    models = [kn / "kn2", kn / "kn3"]
    for flag in ("--stream", "--raw"):
        line = refused(capsys, "interpolate", *models, "--out", tmp_path / "mix", flag, match=flag)
        assert "held-out text" in line
    assert not (tmp_path / "mix").exists()
    code, out, _ = run(capsys, "interpolate", *models, "--out", tmp_path / "mix", "--stream",
                       "--text", kn / "corpus" / "valid.txt")
    assert code == 0 and json.loads(out)["weights_from"] == "em"
