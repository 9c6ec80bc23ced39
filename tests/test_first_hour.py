"""What a new user meets in the first hour: finding the data, the Python API, file permissions, CI.

Each test drives the real entry point (the CLI or `seqlm.*`) on a corpus it makes itself.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.request
import warnings
from pathlib import Path

import pytest

import seqlm
from seqlm.data.corpus import cache_dir
from seqlm.data.datasets import resolve_corpus
from seqlm.errors import SeqlmError

from conftest import ROOT, SEQ_LEN, TINY, cli_env, write_corpus
from conftest import run_cli as run


def train_kn(capsys, out: Path, data: str = "ptb") -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # default discounts on a tiny corpus
        code, stdout, err = run(capsys, "train", "--model", "kn", "--order", "2", "--data", data, "--out", out)
    assert code == 0, err
    return json.loads(stdout)


@pytest.fixture
def offline(monkeypatch):
    """No network: a download attempt fails the way it does on an offline machine."""
    def refuse(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlretrieve", refuse)


def test_a_corpus_found_through_seqlm_data_is_found_later_without_it(tmp_path, monkeypatch, capsys, offline):
    data = tmp_path / "data"
    write_corpus(data / "ptb")
    monkeypatch.setenv("SEQLM_DATA", str(data))
    first = train_kn(capsys, tmp_path / "kn-a")
    cached = cache_dir() / "datasets" / "ptb"
    assert cached.is_symlink() and cached.resolve() == (data / "ptb").resolve()
    monkeypatch.delenv("SEQLM_DATA")  # a new shell, without the Makefile's variable
    assert resolve_corpus("ptb") == cached
    again = train_kn(capsys, tmp_path / "kn-b")
    assert again["valid_ppl"] == first["valid_ppl"] and again["test_tokens"] == first["test_tokens"]


def test_a_vanished_copy_is_forgotten_and_the_error_names_both_places(tmp_path, monkeypatch, capsys, offline):
    data = tmp_path / "data"
    write_corpus(data / "ptb")
    monkeypatch.setenv("SEQLM_DATA", str(data))
    resolve_corpus("ptb")
    (data / "ptb").rename(tmp_path / "moved")  # the linked copy goes away
    monkeypatch.delenv("SEQLM_DATA")
    code, out, err = run(capsys, "train", "--model", "kn", "--data", "ptb", "--out", tmp_path / "m")
    cached = cache_dir() / "datasets" / "ptb"
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "$SEQLM_DATA/ptb" in err and "SEQLM_DATA is not set" in err and str(cached) in err, err
    assert not (tmp_path / "m").exists()


def test_a_copy_in_the_cache_needs_no_variable(tmp_path, monkeypatch, capsys, offline):
    monkeypatch.delenv("SEQLM_DATA", raising=False)
    corpus = write_corpus(cache_dir() / "datasets" / "ptb")
    lines = (corpus / "test.txt").read_text().splitlines()
    assert train_kn(capsys, tmp_path / "kn")["test_tokens"] == sum(len(x.split()) + 1 for x in lines)  # + </s>


def test_score_text_takes_strings_as_whitespace_separated_words(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c")
    train_kn(capsys, tmp_path / "kn", data=str(corpus))
    lm = seqlm.load(tmp_path / "kn")
    as_words = seqlm.score_text(lm, [["the", "cat", "sat"], ["a", "dog"]])
    assert seqlm.score_text(lm, ["the cat sat", " a\tdog "]) == as_words  # not one "sentence" per character
    assert len(as_words[0]) == 4 and seqlm.score_sentence(lm, "the cat sat") == pytest.approx(sum(as_words[0]))
    with pytest.raises(SeqlmError, match="one string"):
        seqlm.score_text(lm, "the cat sat")
    with pytest.raises(SeqlmError, match="sentence 1"):
        seqlm.score_text(lm, [["the"], [1, 2]])


def _modes(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): stat.S_IMODE(p.stat().st_mode) for p in sorted(d.rglob("*")) if p.is_file()}


def test_every_file_a_model_directory_gets_follows_the_umask(tmp_path):
    """Model files, metrics, results and the resume state: 0666 less the user's umask (0640 for 027: neither
    mkstemp's 0600 nor the usual 0644), all alike."""
    umask = 0o027
    corpus = write_corpus(tmp_path / "c", n_train=40, n_eval=8)
    code = ("import os, sys\nos.umask(int(sys.argv[1], 8))\nfrom seqlm.cli import main\n"
            "sys.exit(main(sys.argv[2:]))\n")
    args = ["train", "--model", "fnn", "--data", str(corpus), "--out", str(tmp_path / "m"), "--max-epochs", "1",
            SEQ_LEN, "20", *TINY]
    r = subprocess.run([sys.executable, "-c", code, oct(umask), *args], capture_output=True, text=True,
                       env=cli_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    modes = _modes(tmp_path / "m")
    assert {"config.json", "vocab.txt", "weights.safetensors", "metrics.jsonl"} <= set(modes)
    assert set(modes.values()) == {0o666 & ~umask}, modes


def _pytest_ptb_test(extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run one test that needs the shared PTB copy, in a fresh pytest, with SEQLM_DATA pointing nowhere."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update({"SEQLM_DATA": str(ROOT / "no-such-data-dir"), **extra_env})
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_data.py::test_ptb_token_counts"], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=120)


def test_missing_shared_data_is_a_skip_locally_and_a_failure_under_ci():
    local = _pytest_ptb_test({})
    assert local.returncode == 0 and "1 skipped" in local.stdout, local.stdout
    ci = _pytest_ptb_test({"CI": "true"})
    assert ci.returncode == 1 and "1 failed" in ci.stdout and "CI=true" in ci.stdout, ci.stdout
