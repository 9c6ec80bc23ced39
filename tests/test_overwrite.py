"""No command replaces an output it did not write unless --force; --force replaces it whole (issue #39)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import seqlm
from seqlm.cli import main

from conftest import TINY, seqlm_cli, write_corpus
from conftest import run_cli as run

FNN = ["--model", "fnn", "--max-epochs", "1", "--seq-len", "8", *TINY]


def refused(capsys, *argv, match: str) -> str:
    """Status 2 and one stderr line that names the problem."""
    code, _, err = run(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert match in err, err
    return err


def state(d: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `d` (or `d` itself): its bytes and modification time."""
    files = [d] if d.is_file() else sorted(p for p in d.rglob("*") if p.is_file())
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in files}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A corpus, a trained fnn directory (metrics, results, resume state) and a kn one."""
    d = tmp_path_factory.mktemp("overwrite")
    corpus = write_corpus(d / "corpus", n_train=60, n_eval=10)
    assert main(["train", "--data", str(corpus), "--out", str(d / "fnn"), *FNN]) == 0
    assert main(["train", "--model", "kn", "--order", "2", "--data", str(corpus), "--out", str(d / "kn")]) == 0
    return {"corpus": corpus, "fnn": d / "fnn", "kn": d / "kn"}


def _copy(src: Path, dst: Path, notes: bool = True) -> Path:
    shutil.copytree(src, dst)
    if notes:
        (dst / "notes.txt").write_text("mine\n")
    return dst


def test_quantize_keeps_a_model_unless_forced_and_then_replaces_it_whole(made, tmp_path, capsys):
    out = _copy(made["fnn"], tmp_path / "taken")
    before = state(out)
    refused(capsys, "quantize", made["fnn"], "--out", out, match="already holds a model")
    assert state(out) == before
    assert run(capsys, "quantize", made["fnn"], "--out", out, "--force")[0] == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["config.json", "notes.txt", "vocab.txt", "weights.safetensors"]  # nothing of the old run
    assert "quantization" in json.loads((out / "config.json").read_text())
    assert seqlm.score_text(seqlm.load(out), ["the cat sat"])
    refused(capsys, "quantize", made["fnn"], "--out", made["fnn"], "--force", match="also an input")
    loose = tmp_path / "loose"  # a directory without a model is a place to write into
    loose.mkdir()
    (loose / "notes.txt").write_text("mine\n")
    assert run(capsys, "quantize", made["fnn"], "--out", loose)[0] == 0 and (loose / "notes.txt").exists()


def test_interpolate_keeps_a_model_unless_forced_and_never_replaces_a_component(made, tmp_path, capsys):
    out = _copy(made["kn"], tmp_path / "taken")
    before = state(out)
    args = ["interpolate", made["fnn"], made["kn"], "--weights", "1,1"]
    refused(capsys, *args, "--out", out, match="already holds a model")
    assert state(out) == before
    assert run(capsys, *args, "--out", out, "--force")[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "notes.txt", "vocab.txt"]
    assert json.loads((out / "config.json").read_text())["family"] == "mix"
    kn = state(made["kn"])
    refused(capsys, *args, "--out", made["kn"], "--force", match="also an input")
    assert state(made["kn"]) == kn


def test_train_force_replaces_another_family_whole(made, tmp_path, capsys):
    out = _copy(made["kn"], tmp_path / "taken")
    refused(capsys, "train", "--data", made["corpus"], "--out", out, *FNN, match="already holds a model")
    refused(capsys, "train", "--data", made["corpus"], "--out", out, *FNN, "--force", "--resume",
            match="give one of them")
    assert run(capsys, "train", "--data", made["corpus"], "--out", out, *FNN, "--force")[0] == 0
    assert not (out / "model.arpa").exists() and not (out / "model.bin").exists()
    assert (out / "notes.txt").read_text() == "mine\n"
    assert seqlm.load(out).family == "fnn"


def test_embed_and_sparse_codes_keep_existing_files_unless_forced(made, tmp_path, capsys):
    vectors, codes = tmp_path / "vectors.txt", tmp_path / "codes.txt"
    embed = ["embed", made["corpus"], "--out", vectors, "--dim", "4", "--min-count", "1", "--epochs", "1"]
    vectors.write_text("my vectors\n")
    refused(capsys, *embed, match="--force")
    assert vectors.read_text() == "my vectors\n"
    assert run(capsys, *embed, "--force")[0] == 0
    assert vectors.read_text().split("\n")[0].split()[1] == "4"  # word2vec's header: count and dimension
    sparse = ["sparse-codes", vectors, "--out", codes, "--base", "4", "--steps", "3", "--threads", "1"]
    report = Path(f"{codes}.report.json")
    report.write_text("my report\n")  # the second output alone is enough to refuse before any work
    refused(capsys, *sparse, match="report.json exists")
    assert report.read_text() == "my report\n" and not codes.exists()
    assert run(capsys, *sparse, "--force")[0] == 0
    mine = state(codes)
    refused(capsys, *sparse, match="--force")  # its own earlier codes are kept too: solving them took work
    assert state(codes) == mine
    refused(capsys, "sparse-codes", vectors, "--out", vectors, "--base", "4", "--force", match="also an input")


def test_fofe_collisions_replaces_its_own_results_but_not_another_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["fofe-collisions", "--alphas", "0.5", "--epsilons", "0.01", "--max-len", "4"]
    for _ in range(2):  # default names in the working directory: the second run replaces the first one's
        assert run(capsys, *args)[0] == 0
    assert json.loads(Path("fofe_collisions.json").read_text())["simulation"]["max_len"] == 4
    Path("notes.json").write_text("mine\n")
    refused(capsys, *args, "--out-json", "notes.json", match="--force")
    Path("notes.png").write_text("mine\n")
    refused(capsys, *args, "--out-png", "notes.png", match="--force")
    assert Path("notes.json").read_text() == "mine\n" == Path("notes.png").read_text()
    assert run(capsys, *args, "--out-json", "notes.json", "--out-png", "notes.png", "--force")[0] == 0
    assert Path("notes.png").read_bytes()[:4] == b"\x89PNG"


def test_rescore_replaces_its_results_only_with_force_never_an_input_and_convert_keeps_files(made, tmp_path, capsys):
    tsv = tmp_path / "nbest.tsv"
    tsv.write_text("key\tacoustic\tlm\ttext\nu1-1\t-1.0\t-2.0\tthe cat\nu1-2\t-1.5\t-2.5\ta dog\n")
    table, best = tmp_path / "scores.tsv", tmp_path / "best.txt"
    rescore = ["rescore", made["kn"], "--tsv", tsv, "--out", table, "--best", best]
    assert run(capsys, *rescore, "--lm-scale", "1")[0] == 0
    first = state(best)
    refused(capsys, *rescore, "--lm-scale", "2", match="--force")  # one rule for every writing command
    assert state(best) == first
    assert run(capsys, *rescore, "--lm-scale", "2", "--force")[0] == 0  # a sweep over the scales says so
    assert best.read_text().startswith("u1 ") and table.read_text().startswith("key\t")
    mine = state(tsv)
    refused(capsys, "rescore", made["kn"], "--tsv", tsv, "--best", tsv, match="also an input")
    refused(capsys, "rescore", made["kn"], "--tsv", tsv, "--out", tmp_path, match="is a directory")
    assert state(tsv) == mine
    arpa = made["kn"] / "model.arpa"
    refused(capsys, "convert", arpa, arpa, "--force", match="also an input")
    kept = tmp_path / "model.bin"
    kept.write_text("mine\n")
    refused(capsys, "convert", arpa, kept, match="--force")
    assert kept.read_text() == "mine\n"


def test_train_refuses_a_model_directory_through_the_real_command_line(made, tmp_path):
    out = _copy(made["fnn"], tmp_path / "taken", notes=False)
    before = state(out)
    r = seqlm_cli("train", "--data", made["corpus"], "--out", out, *FNN)
    assert r.returncode == 2 and "already holds a model" in r.stderr and "--force" in r.stderr, r.stderr
    assert state(out) == before
