"""Hostile input, through the real command line.

Odd but valid input works: CRLF line ends, a one-word vocabulary, a single line of 10^6 tokens (in
bounded memory), a text of unseen words only, stray files in a model directory.
Broken input is refused: one line on stderr that names the problem (and the fix), exit status 2, no
traceback, and nothing the user had is changed. A short hypothesis run fuzzes the readers.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqlm import checkpoint as ckpt
from seqlm.cli import main
from seqlm.data.corpus import encode_sentences, read_sentences
from seqlm.data.vocab import BOS, EOS, UNK, Vocab
from seqlm.errors import SeqlmError
from seqlm.eval.perplexity import evaluate

from conftest import SEQ_LEN, TINY, cli_env, seqlm_cli, write_corpus
from conftest import run_cli as run

FNN = ["--model", "fnn", SEQ_LEN, "20", "--max-epochs", "1", *TINY]


def refused(capsys, *argv, match: str) -> str:
    """The command fails as a user error should: status 2, one line naming the problem, no traceback."""
    code, _, err = run(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("seqlm: error: "), err
    assert match.lower() in lines[0].lower(), lines[0]
    return lines[0]


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _quiet_main(*argv) -> None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main([str(a) for a in argv]) == 0


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny corpus, an FNN and a KN model trained on it once for the whole module (read-only)."""
    d = tmp_path_factory.mktemp("hostile")
    corpus = write_corpus(d / "corpus", n_train=100, n_eval=10)
    _quiet_main("train", "--data", corpus, "--out", d / "fnn", *FNN)
    _quiet_main("train", "--model", "kn", "--order", "3", "--data", corpus, "--out", d / "kn")
    return corpus, d / "fnn", d / "kn"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------- odd but valid input works


def test_crlf_line_ends_read_like_lf(tmp_path, capsys, models):
    corpus, fnn, _ = models
    crlf = tmp_path / "crlf"
    crlf.mkdir()
    for split in ("train", "valid", "test"):
        (crlf / f"{split}.txt").write_bytes((corpus / f"{split}.txt").read_bytes().replace(b"\n", b"\r\n"))
    assert run(capsys, "train", "--data", crlf, "--out", tmp_path / "m", *FNN)[0] == 0
    assert not [w for w in Vocab.load(tmp_path / "m" / "vocab.txt").itos if "\r" in w]
    lf = json.loads(run(capsys, "eval", fnn, "--text", corpus / "test.txt")[1])
    cr = json.loads(run(capsys, "eval", fnn, "--text", crlf / "test.txt")[1])
    assert cr == lf


@pytest.mark.parametrize("family", ["fnn", "rnn", "kn"])
def test_a_vocabulary_of_one_word(tmp_path, capsys, family):
    corpus = tmp_path / "one"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text("a a a\na\n\na a\n", encoding="utf-8")
    extra = ["--order", "2"] if family == "kn" else [SEQ_LEN, "4", "--max-epochs", "1", *TINY]
    code, out, err = run(capsys, "train", "--model", family, "--data", corpus, "--out", tmp_path / "m", *extra)
    assert code == 0, err
    assert set(Vocab.load(tmp_path / "m" / "vocab.txt").itos) - {BOS} == {EOS, UNK, "a"}  # kn adds <s>
    r = json.loads(run(capsys, "eval", tmp_path / "m", "--text", corpus / "test.txt")[1])
    assert math.isfinite(r["ppl"]) and r["tokens"] == 9


def test_a_text_of_unseen_words_only_is_all_unk(tmp_path, capsys, models):
    _, fnn, kn = models
    text = tmp_path / "alien.txt"
    text.write_text("zork blorp\nquux\n", encoding="utf-8")
    for model in (fnn, kn):
        r = json.loads(run(capsys, "eval", model, "--text", text)[1])
        assert r["tokens"] == 5 and r["oov"] == 3 and math.isfinite(r["ppl"])


def test_stray_files_in_a_model_directory_are_ignored(tmp_path, capsys, models):
    corpus, fnn, kn = models
    for model in (fnn, kn):
        d = _copy(model, tmp_path / model.name)
        (d / "README.md").write_text("my notes")
        (d / ".DS_Store").write_bytes(b"\x00\x01")
        (d / "weights.safetensors.bak").write_bytes(b"old")
        (d / "junk").mkdir()
        before = json.loads(run(capsys, "eval", model, "--text", corpus / "test.txt")[1])
        assert json.loads(run(capsys, "eval", d, "--text", corpus / "test.txt")[1]) == before


MEASURE = r"""
import json, resource, sys
from seqlm.cli import main

small, long_, model = sys.argv[1:4]
assert main(["eval", model, "--text", small]) == 0  # everything imported and warmed up
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert main(["eval", model, "--text", long_]) == 0
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_kb": before, "after_kb": after}), file=sys.stderr)
"""


def test_a_line_of_a_million_tokens_is_scored_in_pieces(tmp_path, models):
    corpus, fnn, _ = models
    words = "the cat dog sat on mat a ran fast slow big red".split()
    rng = np.random.default_rng(0)
    long_ = tmp_path / "long.txt"
    long_.write_text(" ".join(np.asarray(words)[rng.integers(0, len(words), 10**6)]) + "\n", encoding="utf-8")
    r = subprocess.run([sys.executable, "-c", MEASURE, str(corpus / "test.txt"), str(long_), str(fnn)],
                       capture_output=True, text=True, env=cli_env(), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout.splitlines()[-1])
    assert result["tokens"] == 10**6 + 1 and result["sentences"] == 1 and math.isfinite(result["ppl"])
    mem = json.loads(r.stderr.strip().splitlines()[-1])
    # The text itself (6 MB), its 10^6 token strings and ids take ~100 MB in Python; one batch of the
    # whole sentence would add ~10^6 x (hidden + vocab + history) floats on top. Pieces keep it flat.
    assert mem["after_kb"] - mem["before_kb"] < 250_000, mem


def test_evaluation_batches_stay_bounded_on_a_huge_sentence(models):
    """The mechanism behind the test above: no batch holds more than max_tokens positions."""
    import seqlm

    _, fnn, _ = models
    model = seqlm.load(fnn)
    seen: list[int] = []
    real_score = model.score

    def spy(batch):
        seen.append(batch.inputs.numel())
        return real_score(batch)

    model.score = spy
    stream = encode_sentences([["the", "cat"] * 20_000], model.vocab)
    r = evaluate(model, stream, max_tokens=4096)
    assert r["tokens"] == 40_001 and max(seen) <= 4096 and len(seen) > 10


# ---------------------------------------------------------------- broken input is refused


BAD_TEXT = {
    "empty": (b"", "no sentences"),
    "blank lines only": (b"\n  \n\t\r\n\n", "no sentences"),
    "invalid UTF-8": (b"the cat\nsat \xff\xfe on\n", "UTF-8"),
    "NUL bytes": (b"the cat\x00 sat\n", "NUL"),
}


@pytest.mark.parametrize("split", ["train", "valid", "test"])
@pytest.mark.parametrize("kind", list(BAD_TEXT))
def test_a_broken_corpus_is_refused_before_anything_is_written(tmp_path, capsys, models, kind, split):
    corpus = _copy(models[0], tmp_path / "corpus")
    content, match = BAD_TEXT[kind]
    (corpus / f"{split}.txt").write_bytes(content)
    line = refused(capsys, "train", "--data", corpus, "--out", tmp_path / "m", *FNN, match=match)
    assert f"{split}.txt" in line
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("kind", list(BAD_TEXT))
def test_a_broken_text_to_score_is_refused(tmp_path, capsys, models, kind):
    content, match = BAD_TEXT[kind]
    text = tmp_path / "t.txt"
    text.write_bytes(content)
    for cmd in ("eval", "score"):
        refused(capsys, cmd, models[1], "--text", text, match=match)


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 3])


def _garble_header(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[8:40] = b"#" * 32
    p.write_bytes(bytes(b))


def _set_json(key: str, value) -> callable:
    def edit(p: Path) -> None:
        meta = json.loads(p.read_text())
        meta[key] = value
        p.write_text(json.dumps(meta))

    return edit


def _arpa_count(p: Path) -> None:
    text = p.read_text()
    p.write_text(text.replace("ngram 2=", "ngram 2=1", 1))


def _arpa_bad_number(p: Path) -> None:
    lines = p.read_text().split("\n")
    i = lines.index("\\1-grams:") + 3
    lines[i] = "minus-one\t" + lines[i].split("\t", 1)[1]
    p.write_text("\n".join(lines))


BAD_MODEL_DIRS = {
    # name: (family, file, how to break it, what the error names)
    "weights missing": ("fnn", "weights.safetensors", Path.unlink, "missing"),
    "weights truncated": ("fnn", "weights.safetensors", _truncate, "corrupt or truncated"),
    "weights header garbled": ("fnn", "weights.safetensors", _garble_header, "corrupt"),
    "weights of another vocabulary": ("fnn", "vocab.txt", lambda p: p.write_text(p.read_text() + "zzz\t1\n"),
                                      "do not match"),
    "vocab shorter than the weights": ("fnn", "vocab.txt",
                                       lambda p: p.write_text("".join(p.read_text().splitlines(True)[:-1])),
                                       "do not match"),
    "vocab not a vocab": ("fnn", "vocab.txt", lambda p: p.write_bytes(b"\xff\xfe\x00garbage"), "vocab"),
    "vocab missing": ("fnn", "vocab.txt", Path.unlink, "missing"),
    "config not JSON": ("fnn", "config.json", lambda p: p.write_text("{family: fnn"), "not valid JSON"),
    "config missing": ("fnn", "config.json", Path.unlink, "missing"),
    "config names an unknown family": ("fnn", "config.json", _set_json("family", "transformerxl"),
                                       "unknown model family"),
    "config has an unknown key": ("fnn", "config.json", _set_json("model", {"hidden": 16, "wings": 2}), "unknown key"),
    "config asks for a huge model": ("fnn", "config.json", _set_json("model", {"hidden": 10**6}), "do not match"),
    "config not an object": ("fnn", "config.json", lambda p: p.write_text("[1, 2]"), "config"),
    "ARPA missing": ("kn", "model.arpa", Path.unlink, "missing"),
    "ARPA truncated": ("kn", "model.arpa", _truncate, "truncated"),
    "ARPA with wrong counts": ("kn", "model.arpa", _arpa_count, "ngram 2="),
    "ARPA with a bad number": ("kn", "model.arpa", _arpa_bad_number, "model.arpa"),
    "ARPA not an ARPA file": ("kn", "model.arpa", lambda p: p.write_bytes(b"PK\x03\x04 zip file"), "ARPA"),
}


@pytest.mark.parametrize("name", list(BAD_MODEL_DIRS))
def test_a_broken_model_directory_is_refused(tmp_path, capsys, models, name):
    corpus, fnn, kn = models
    family, file, breaker, match = BAD_MODEL_DIRS[name]
    d = _copy(fnn if family == "fnn" else kn, tmp_path / "model")
    if file == "model.arpa":  # the ARPA file is the model only when no binary copy sits beside it
        (d / "model.bin").unlink(missing_ok=True)
    breaker(d / file)
    before = snapshot(d)
    refused(capsys, "eval", d, "--text", corpus / "test.txt", match=match)
    refused(capsys, "info", d, match=match)
    assert snapshot(d) == before  # a refused command changes nothing


FLAG_ERRORS = {
    "unknown option": (["--wings", "2"], "unknown option --wings"),
    "misspelt option": (["--hiden", "16"], "unknown option --hiden"),
    "zero size": (["--hidden", "0"], "--hidden must be positive"),
    "negative size": (["--embed", "-8"], "--embed must be positive"),
    "zero seq-len": ([SEQ_LEN, "0"], f"{SEQ_LEN} must be positive"),
    "negative batch": (["--batch-size", "-2"], "--batch-size must be positive"),
    "zero epochs": (["--max-epochs", "0"], "--max-epochs must be positive"),
    "negative seed": (["--seed", "-1"], "--seed must not be negative"),
    "negative retries": (["--max-nan-retries", "-1"], "--max-nan-retries must not be negative"),
    "not a number": (["--lr", "fast"], "--lr expects float"),
    "bad choice": (["--optimizer", "rmsprop"], "--optimizer must be one of"),
    "zero processes": (["--nproc", "0"], "--nproc must be at least 1"),
    "processes not a number": (["--nproc", "two"], "--nproc"),
    "kn is not data-parallel": (["--model", "kn", "--nproc", "2"], "drop --nproc"),
    "max-vocab below 2": (["--max-vocab", "1"], "--max-vocab"),
    "dropout of 1": (["--dropout", "1"], "--dropout must be in [0, 1)"),
    "a model larger than memory": (["--hidden", "1000000"], "GiB of memory is available"),
    "layers beyond any allocation": (["--hidden", "3000000000"], "too large to allocate"),
}


@pytest.mark.parametrize("name", list(FLAG_ERRORS))
def test_bad_train_flags_are_refused_before_any_work(tmp_path, capsys, models, name):
    flags, match = FLAG_ERRORS[name]
    args = ["train", "--data", models[0], "--out", tmp_path / "m"]
    if "--model" not in flags:
        args += ["--model", "fnn"]
    refused(capsys, *args, *flags, match=match)
    assert not (tmp_path / "m").exists()


def test_contradictory_or_misdirected_commands_are_refused_and_change_nothing(tmp_path, capsys, models):
    corpus, fnn, _ = models
    d = _copy(fnn, tmp_path / "model")
    before = snapshot(d)
    refused(capsys, "train", "--data", corpus, "--out", d, *FNN, match="already holds a model; use --resume")
    refused(capsys, "train", "--model", "rnn", "--data", corpus, "--out", d, "--resume", match="--model fnn")
    refused(capsys, "eval", d, "--text", corpus / "test.txt", "--data", corpus, match="not both")
    refused(capsys, "eval", d, match="--text")
    refused(capsys, "generate", d, "--num", "0", match="--num")
    refused(capsys, "generate", d, "--temperature", "-1", match="--temperature")
    refused(capsys, "score", d, "--text", corpus / "test.txt", "--bogus", match="--bogus")
    refused(capsys, "frobnicate", match="invalid choice")
    assert snapshot(d) == before
    refused(capsys, "train", "--data", corpus, "--out", tmp_path / "nothing", "--resume", *FNN,
            match="nothing to resume")
    refused(capsys, "train", "--data", corpus, "--out", corpus / "train.txt", *FNN, match="is a file")
    refused(capsys, "train", "--data", tmp_path / "no-such-corpus", "--out", tmp_path / "m", *FNN,
            match="not a directory")
    refused(capsys, "eval", tmp_path / "no-such-model", "--text", corpus / "test.txt", match="no such model")


def test_refusals_in_a_real_process_are_one_line_and_status_2(tmp_path, models):
    """The same contract through `python -m seqlm`: exit status 2, one stderr line, no traceback."""
    corpus, fnn, _ = models
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\x00\n")
    for argv in (["eval", fnn, "--text", bad], ["train", "--data", corpus, "--out", tmp_path / "m", "--hidden", "-1"]):
        r = seqlm_cli(*argv)
        assert r.returncode == 2 and r.stdout == ""
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


# ---------------------------------------------------------------- fuzzing the readers

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_text_reader_returns_sentences_or_a_seqlm_error(data):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.txt"
        p.write_bytes(data)
        try:
            sents = list(read_sentences(p))
        except SeqlmError:
            return
        text = data.decode("utf-8")
        assert "\x00" not in text
        assert sents == [line.split() for line in text.split("\n") if line.split()]


@FUZZ
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                        max_size=20), max_size=8), st.sampled_from(["\n", "\r\n"]))
def test_fuzz_valid_text_reads_back_whatever_the_line_ends(lines, eol):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.txt"
        p.write_bytes(eol.join(lines).encode("utf-8"))
        try:
            sents = list(read_sentences(p))
        except SeqlmError as e:  # only ever an empty text... never anything else
            assert "no sentences" in str(e) or not any(x.split() for x in lines)
            return
        expected = [x.split() for x in eol.join(lines).split("\n") if x.split()]
        assert sents == expected


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_vocab_reader(data):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "vocab.txt"
        p.write_bytes(data)
        try:
            v = Vocab.load(p)
        except SeqlmError:
            return
        assert EOS in v.itos and UNK in v.itos


@pytest.fixture(scope="module")
def good_files(models):
    _, fnn, kn = models
    return {"arpa": (kn / "model.arpa").read_bytes(), "weights": (fnn / "weights.safetensors").read_bytes(),
            "config": (fnn / "config.json").read_bytes()}


def _mutate(data: bytes, cut: int, pos: int, junk: bytes) -> bytes:
    """Truncate, then overwrite a few bytes at a position: the ways files get damaged."""
    data = data[: max(1, len(data) - cut)]
    pos %= len(data)
    return data[:pos] + junk + data[pos + len(junk):]


@FUZZ
@given(cut=st.integers(0, 4000), pos=st.integers(0, 10**6), junk=st.binary(min_size=0, max_size=6))
def test_fuzz_damaged_model_files_load_or_are_refused(good_files, cut, pos, junk):
    import seqlm

    with tempfile.TemporaryDirectory() as d:
        arpa = Path(d) / "m.arpa"
        arpa.write_bytes(_mutate(good_files["arpa"], cut, pos, junk))
        with contextlib.suppress(SeqlmError):
            seqlm.load(arpa)
        weights = Path(d) / "w.safetensors"
        weights.write_bytes(_mutate(good_files["weights"], cut % 64, pos, junk))
        with contextlib.suppress(SeqlmError):
            ckpt.load_tensors(weights)
        config = Path(d) / "config.json"
        config.write_bytes(_mutate(good_files["config"], cut % 32, pos, junk))
        with contextlib.suppress(SeqlmError):
            ckpt.read_json(config)


# Integers stay small: a config asking for a 10^6-wide layer is "valid" and would just allocate it.
JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 40) | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=5)


@FUZZ
@given(where=st.sampled_from(["family", "model", "model.hidden", "model.order", "model.train", "model.train.lr",
                              "model.train.optimizer", "data", "data.max_vocab", "data.raw"]), value=JSON)
def test_fuzz_config_values_load_or_are_refused(models, where, value):
    """Whatever a damaged or hand-edited config.json holds, loading gives a model or a SeqlmError."""
    import seqlm

    with tempfile.TemporaryDirectory() as d:
        model = _copy(models[1], Path(d) / "m")
        meta = json.loads((model / "config.json").read_text())
        *path, key = where.split(".")
        node = meta
        for part in path:
            node = node[part]
        node[key] = value
        (model / "config.json").write_text(json.dumps(meta))
        with contextlib.suppress(SeqlmError):
            seqlm.load(model)
