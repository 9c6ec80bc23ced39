"""KenLM's `lmplz -o N < text > lm.arpa` as `seqlm train --model kn`: one text file or standard input in, ARPA
or binary out (a path or standard output), no default corpus, valid/test optional (issue 25, items 3 and 5).

The reference for every ARPA written here is the model directory trained from a corpus directory holding the
same train.txt (tests/test_kn.py checks that one against KenLM and a brute-force estimator).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env, write_corpus


def seqlm(*argv, stdin: Path | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real command line; standard input is the file given, else /dev/null (never the test runner's)."""
    with open(stdin or "/dev/null", "rb") as f:
        return subprocess.run([sys.executable, "-m", "seqlm", *map(str, argv)], stdin=f, capture_output=True,
                              env=cli_env(), timeout=120, cwd=cwd)


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, r.stderr.decode()
    return r


def refused(r: subprocess.CompletedProcess, *words: str) -> str:
    err = r.stderr.decode()
    assert r.returncode == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    return err


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    """A corpus directory and the order-3 model trained from it (train, valid and test)."""
    root = tmp_path_factory.mktemp("lmplz")
    corpus = write_corpus(root / "corpus", n_train=200)
    result = json.loads(ok(seqlm("train", "--model", "kn", "--order", "3", "--data", corpus, "--out", root / "dir"))
                        .stdout)
    assert result["evaluated"] == ["valid", "test"] and result["valid_ppl"] > 1
    return corpus, root / "dir"


def test_no_default_corpus(tmp_path):
    """Without --data, --text or text on standard input: one line, status 2, and nothing trained (no runs/)."""
    err = refused(seqlm("train", "--model", "kn", "--order", "2", cwd=tmp_path), "--data", "--text",
                  "standard input")
    assert "ptb" in err and not (tmp_path / "runs").exists()


def test_arpa_on_stdout_from_stdin_is_the_directory_models_arpa(reference):
    corpus, model = reference
    r = ok(seqlm("train", "--model", "kn", "--order", "3", "--arpa", "-", stdin=corpus / "train.txt"))
    assert r.stdout == (model / "model.arpa").read_bytes()
    report = json.loads(r.stderr.decode().strip().splitlines()[-1])  # the report goes to stderr, as lmplz's
    assert report["evaluated"] == [] and "valid_ppl" not in report and report["out"] is None


def test_one_text_file_to_arpa_gz_and_binary_paths(reference, tmp_path):
    corpus, model = reference
    r = ok(seqlm("train", "--model", "kn", "--order", "3", "--text", corpus / "train.txt",
                 "--arpa", tmp_path / "lm.arpa.gz", "--binary", tmp_path / "lm.bin", cwd=tmp_path))
    report = json.loads(r.stdout)
    assert report["out"] is None and not (tmp_path / "runs").exists()  # no model directory was asked for
    assert gzip.decompress((tmp_path / "lm.arpa.gz").read_bytes()) == (model / "model.arpa").read_bytes()
    by_binary = ok(seqlm("score", tmp_path / "lm.bin", stdin=corpus / "test.txt")).stdout
    assert by_binary == ok(seqlm("score", model, "--text", corpus / "test.txt")).stdout


def test_data_may_be_one_file_or_a_folder_with_only_train_txt(reference, tmp_path):
    corpus, model = reference
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "train.txt").write_bytes((corpus / "train.txt").read_bytes())
    for data, out in ((corpus / "train.txt", tmp_path / "a"), (tmp_path / "only", tmp_path / "b")):
        report = json.loads(ok(seqlm("train", "--model", "kn", "--order", "3", "--data", data, "--out", out)).stdout)
        assert report["evaluated"] == [] and "test_ppl" not in report and report["out"] == str(out)
        assert (out / "model.arpa").read_bytes() == (model / "model.arpa").read_bytes()


def test_a_test_split_alone_is_evaluated_and_said(reference, tmp_path):
    corpus, model = reference
    (tmp_path / "c").mkdir()
    for split in ("train", "test"):
        (tmp_path / "c" / f"{split}.txt").write_bytes((corpus / f"{split}.txt").read_bytes())
    report = json.loads(ok(seqlm("train", "--model", "kn", "--order", "3", "--data", tmp_path / "c",
                                 "--out", tmp_path / "m")).stdout)
    assert report["evaluated"] == ["test"] and "valid_ppl" not in report
    by_eval = json.loads(ok(seqlm("eval", model, "--text", corpus / "test.txt")).stdout)
    assert report["test_ppl"] == pytest.approx(by_eval["ppl"], rel=1e-9)
    assert report["test_tokens"] == by_eval["tokens"]


def test_score_and_eval_read_standard_input(reference):
    corpus, model = reference
    by_file = ok(seqlm("score", model, "--text", corpus / "test.txt")).stdout
    assert ok(seqlm("score", model, stdin=corpus / "test.txt")).stdout == by_file
    assert ok(seqlm("score", model, "--text", "-", stdin=corpus / "test.txt")).stdout == by_file
    assert len(by_file.splitlines()) == len((corpus / "test.txt").read_text().splitlines())
    assert ok(seqlm("eval", model, stdin=corpus / "test.txt")).stdout == \
        ok(seqlm("eval", model, "--text", corpus / "test.txt")).stdout
    refused(seqlm("score", model), "--text", "standard input")


def test_what_a_mode_cannot_honour_is_refused(reference, tmp_path):
    corpus, _ = reference
    refused(seqlm("train", "--model", "fofe", "--data", corpus / "train.txt", "--out", tmp_path / "f"),
            "valid.txt", "kn needs train text only")
    refused(seqlm("train", "--model", "fofe", "--data", corpus, "--arpa", tmp_path / "x.arpa"), "only --model kn")
    refused(seqlm("train", "--model", "kn", "--arpa", "-", "--binary", "-", stdin=corpus / "train.txt"),
            "standard output")
    refused(seqlm("train", "--model", "kn", "--data", corpus, "--text", corpus / "train.txt"), "not both")
    assert not (tmp_path / "f").exists()


def test_an_existing_output_file_is_kept_unless_forced(reference, tmp_path):
    corpus, model = reference
    mine = tmp_path / "notes.arpa"
    mine.write_text("my notes\n")
    refused(seqlm("train", "--model", "kn", "--order", "3", "--text", corpus / "train.txt", "--arpa", mine),
            "exists", "--force")
    assert mine.read_text() == "my notes\n"
    ok(seqlm("train", "--model", "kn", "--order", "3", "--text", corpus / "train.txt", "--arpa", mine, "--force"))
    assert mine.read_bytes() == (model / "model.arpa").read_bytes()
