"""The real entry points, end to end, on a tiny corpus: train, eval, score, generate, info, plot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from seqlm.cli import main

from conftest import SEQ_KEY, SEQ_LEN, TINY, unigram_ppl, write_chain_corpus, write_corpus


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny FNN trained through the CLI on a corpus with a bigram structure, shared by the tests below."""
    d = tmp_path_factory.mktemp("trained")
    corpus = write_chain_corpus(d / "corpus")
    out = d / "model"
    code = main(["train", "--model", "fnn", "--data", str(corpus), "--out", str(out), "--max-epochs", "2",
                 SEQ_LEN, "20", *TINY])
    assert code == 0
    return corpus, out


def test_train_writes_a_complete_model_dir(trained, capsys):
    corpus, out = trained
    for name in ("config.json", "vocab.txt", "weights.safetensors", "metrics.jsonl", "results.json"):
        assert (out / name).is_file(), name
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    uniform = len((out / "vocab.txt").read_text().splitlines())  # the perplexity of guessing
    assert [r["epoch"] for r in rows] == [1, 2] and all(r["valid_ppl"] < uniform for r in rows)
    # the structure is learnt: well below the add-one unigram perplexity computed by hand (about 12.8)
    assert min(r["valid_ppl"] for r in rows) < 0.6 * unigram_ppl(corpus, "valid")
    _, ev, _ = run(capsys, "eval", out, "--data", corpus, "--split", "valid")  # the saved model is the best epoch
    assert json.loads(ev)["ppl"] == pytest.approx(min(r["valid_ppl"] for r in rows), rel=1e-6)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["family"] == "fnn" and cfg["model"]["hidden"] == 16 and cfg["model"]["train"]["max_epochs"] == 2


def test_eval_prints_the_protocol_json(trained, capsys):
    corpus, out = trained
    code, stdout, _ = run(capsys, "eval", out, "--text", corpus / "test.txt")
    r = json.loads(stdout)
    assert code == 0 and set(r) == {"ppl", "tokens", "sentences", "oov", "ppl_excl_oov", "log10prob", "mode", "unit",
                                  "ppl_per_word"}
    lines = (corpus / "test.txt").read_text().split("\n")
    assert r["sentences"] == len([x for x in lines if x.strip()]) and r["mode"] == "sentence"
    assert r["ppl"] == pytest.approx(10 ** (-r["log10prob"] / r["tokens"]))
    results = json.loads((out / "results.json").read_text())
    assert results["test_ppl"] == pytest.approx(r["ppl"])


def test_score_matches_eval_and_per_token(trained, capsys):
    corpus, out = trained
    _, stdout, _ = run(capsys, "score", out, "--text", corpus / "test.txt")
    per_sentence = [float(x) for x in stdout.split()]
    _, ev, _ = run(capsys, "eval", out, "--text", corpus / "test.txt")
    assert sum(per_sentence) == pytest.approx(json.loads(ev)["log10prob"], abs=1e-3)
    _, tok, _ = run(capsys, "score", out, "--text", corpus / "test.txt", "--per-token")
    first = tok.splitlines()[0].split("\t")
    assert first[-2].startswith("</s> ") and float(first[-1].split()[1]) == pytest.approx(per_sentence[0], abs=1e-5)


def test_generate_info_plot(trained, capsys, tmp_path):
    corpus, out = trained
    code, stdout, _ = run(capsys, "generate", out, "--num", "3", "--seed", "7")
    assert code == 0 and len(stdout.splitlines()) == 3
    assert run(capsys, "generate", out, "--num", "3", "--seed", "7")[1] == stdout  # seeded
    info = json.loads(run(capsys, "info", out)[1])
    V, E, H = info["vocab_size"], 8, 16  # embedding, 2 hidden layers (order 3: 2 context words), softmax
    assert info["family"] == "fnn" and info["parameters"] == V * E + (2 * E * H + H) + (H * H + H) + (H * V + V)
    png = tmp_path / "curves.png"
    assert run(capsys, "plot", out, out, "--out", png)[0] == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_python_api(trained):
    import seqlm

    corpus, out = trained
    lm = seqlm.load(out)
    s = seqlm.score_sentence(lm, "the cat sat on the mat")
    full = seqlm.score_text(lm, [["the", "cat", "sat", "on", "the", "mat"]])[0]
    assert len(full) == 7 and s == pytest.approx(sum(full)) and s < 0
    assert len(seqlm.generate(lm, num=2, seed=1)) == 2


def test_resume_continues_and_refuses_to_overwrite(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c")
    out = tmp_path / "m"
    base = ["train", "--model", "fofe", "--data", corpus, "--out", out, SEQ_LEN, "20", *TINY]
    assert run(capsys, *base, "--max-epochs", "1")[0] == 0
    code, _, err = run(capsys, *base, "--max-epochs", "1")
    assert code == 2 and "already holds a model" in err and len(err.strip().splitlines()) == 1
    assert run(capsys, *base, "--max-epochs", "2", "--resume")[0] == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]


def test_train_defaults_and_yaml_config(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"hidden: 8\ntrain:\n  max_epochs: 1\n  {SEQ_KEY}: 30\ndata:\n  max_vocab: 8\n")
    code, stdout, _ = run(capsys, "train", "--data", corpus, "--out", tmp_path / "m", "--config", cfg,
                          "--threads", "1")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    printed = json.loads(stdout)
    _, ev, _ = run(capsys, "eval", tmp_path / "m", "--data", corpus, "--split", "valid")
    assert code == 0 and printed["valid_ppl"] == pytest.approx(json.loads(ev)["ppl"], rel=1e-9)
    assert printed["valid_ppl"] < 8  # 8 words in the vocabulary: better than guessing
    assert saved["model"]["hidden"] == 8 and saved["model"]["train"][SEQ_KEY] == 30 and saved["data"]["max_vocab"] == 8
    assert len((tmp_path / "m" / "vocab.txt").read_text().splitlines()) == 8


@pytest.mark.parametrize("case", ["unknown-model", "no-train", "empty", "bad-utf8", "max-vocab-0", "no-weights",
                                  "bad-weights", "unknown-flag", "bad-value"])
def test_bad_input_is_one_line_and_status_2(case, tmp_path, capsys, trained):
    corpus = write_corpus(tmp_path / "c")
    out = tmp_path / "m"
    args = ["train", "--model", "fnn", "--data", corpus, "--out", out, "--max-epochs", "1", *TINY]
    if case == "unknown-model":
        args[2] = "transformerxl"
    elif case == "no-train":
        (corpus / "train.txt").unlink()
    elif case == "empty":
        (corpus / "train.txt").write_text("")
    elif case == "bad-utf8":
        (corpus / "train.txt").write_bytes(b"ok line\n\xc3\x28 broken\n")
    elif case == "max-vocab-0":
        args += ["--max-vocab", "0"]
    elif case == "unknown-flag":
        args += ["--hiden", "3"]
    elif case == "bad-value":
        args += ["--hidden", "-4"]
    elif case in ("no-weights", "bad-weights"):
        import shutil

        model = tmp_path / "copy"
        shutil.copytree(trained[1], model)
        w = model / "weights.safetensors"
        w.unlink() if case == "no-weights" else w.write_bytes(w.read_bytes()[:100])
        args = ["eval", model, "--text", corpus / "test.txt"]
    code, _, err = run(capsys, *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and err.startswith("seqlm: error:")


def test_console_entry_point_runs_as_a_module(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "seqlm", "eval", str(tmp_path / "nope"), "--text", "x"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no such model directory" in proc.stderr


def test_help_config_lists_every_option_with_its_default(capsys):
    code, out, _ = run(capsys, "train", "--model", "fofe", "--help-config")
    assert code == 0 and "--alpha" in out and "0.7" in out and "--max-vocab" in out and "--lr" in out


def test_every_option_of_every_subcommand_has_a_one_line_help():
    import argparse

    from seqlm.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, sub in [("seqlm", parser), *commands.items()]:
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            what = f"seqlm {name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and "\n" not in action.help, f"{what} has no one-line help"


def test_version_and_train_help_without_mix():
    import re
    from importlib.metadata import version

    import torch

    import seqlm

    proc = subprocess.run([sys.executable, "-m", "seqlm", "--version"], capture_output=True, text=True)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and lines[0] == f"seqlm {version('seqlm')}" == f"seqlm {seqlm.__version__}"
    assert lines[1].startswith(f"torch {torch.__version__}, python ")
    ngram = r"compiled \((installed with the package|built on first use)\)|not built yet .*|python fallback .*"
    assert re.fullmatch(rf"compiled loops: ngram ({ngram}), tokenizer .*", lines[2])
    proc = subprocess.run([sys.executable, "-m", "seqlm", "train", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "{kn,fnn,fofe,rnn" in proc.stdout and "mix" not in proc.stdout
