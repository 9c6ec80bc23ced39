"""--unit token: text read through a sentencepiece model or a Hugging Face tokenizer.json (issue #41).

The references are the libraries' own encoders: the pieces seqlm reads are what `SentencePieceProcessor.encode`
and `tokenizers.Tokenizer.encode` give, and a kn model over pieces scores exactly as a word-level kn model trained
on the text those libraries encode (written out as whitespace-separated pieces). Tokenizers and corpora are made
here, each test a few seconds at most.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest

from seqlm.config import DataConfig
from seqlm.errors import SeqlmError
from seqlm.protocol import TextSpec

from conftest import require_module, run_cli

spm = require_module("sentencepiece", "the sentencepiece library (pip install 'seqlm[tokenizers]')")
hf = require_module("tokenizers", "the tokenizers library (pip install 'seqlm[tokenizers]')")

SYLLABLES = "ka lo mi su te ra ni po ve du".split()


def _corpus(d: Path, seed: int = 0) -> Path:
    """train/valid/test of pseudo-words built from syllables: subword structure for a tokenizer to find."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(40)]
    d.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 300), ("valid", 40), ("test", 40)):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(n)]
        (d / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def _hf_tokenizer(train: Path, out: Path) -> Path:
    """A BPE tokenizer.json trained by the tokenizers library itself (sentencepiece-style word marks)."""
    tok = hf.Tokenizer(hf.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = hf.pre_tokenizers.Metaspace()
    tok.decoder = hf.decoders.Metaspace()
    lines = train.read_text(encoding="utf-8").splitlines()
    tok.train_from_iterator(lines, hf.trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"], show_progress=False))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return out / "tokenizer.json"


@pytest.fixture
def setup(tmp_path, capsys):
    """A corpus and both tokenizers: sentencepiece through `seqlm tokenizer train`, a tokenizer.json by hand."""
    data = _corpus(tmp_path / "data")
    code, out, _ = run_cli(capsys, "tokenizer", "train", "--text", data / "train.txt", "--vocab-size", "50",
                           "--out", tmp_path / "sp")
    assert code == 0 and json.loads(out)["pieces"] == 50
    return data, tmp_path / "sp" / "tokenizer.model", _hf_tokenizer(data / "train.txt", tmp_path / "hf")


def _lib_pieces(tokenizer: Path, lines: list[str]) -> list[list[str]]:
    """The pieces by the library alone."""
    if tokenizer.suffix == ".json":
        tok = hf.Tokenizer.from_file(str(tokenizer))
        return [tok.encode(line, add_special_tokens=False).tokens for line in lines]
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    return [sp.encode(line, out_type=str) for line in lines]


def _eval(capsys, model, text) -> dict:
    code, out, err = run_cli(capsys, "eval", model, "--text", text)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("kind", ["sentencepiece", "hf"])
def test_encode_and_decode_are_the_librarys(setup, kind, tmp_path, capsys):
    data, sp_model, hf_json = setup
    tokenizer = sp_model if kind == "sentencepiece" else hf_json
    lines = data.joinpath("test.txt").read_text().splitlines()[:10]
    text = tmp_path / "in.txt"
    text.write_text("\n".join([lines[0], "", *lines[1:]]) + "\n", encoding="utf-8")  # a blank line stays blank
    code, out, _ = run_cli(capsys, "tokenizer", "encode", "--tokenizer", tokenizer.parent, "--text", text)
    assert code == 0
    got = out.splitlines()
    assert got[1] == "" and [g.split() for g in got[:1] + got[2:]] == _lib_pieces(tokenizer, lines)
    (tmp_path / "pieces.txt").write_text(out, encoding="utf-8")
    code, out, _ = run_cli(capsys, "tokenizer", "decode", "--tokenizer", tokenizer, "--text", tmp_path / "pieces.txt")
    assert code == 0 and [x.strip() for x in out.splitlines()] == [lines[0], "", *lines[1:]]


@pytest.mark.parametrize("kind", ["sentencepiece", "hf"])
def test_kn_over_pieces_equals_kn_over_the_librarys_piece_text(setup, kind, tmp_path, capsys):
    """The independent reference: the library encodes the corpus, the pieces are written as words, and a word
    kn model of that text scores it to the same total as the token model reads the original text."""
    data, sp_model, hf_json = setup
    tokenizer = sp_model if kind == "sentencepiece" else hf_json
    pieces = tmp_path / "pieces"
    pieces.mkdir()
    for split in ("train", "test"):
        lines = (data / f"{split}.txt").read_text().splitlines()
        (pieces / f"{split}.txt").write_text("\n".join(map(" ".join, _lib_pieces(tokenizer, lines))) + "\n")
    for out, args in (("tok", ["--text", data / "train.txt", "--unit", "token", "--tokenizer", tokenizer]),
                      ("ref", ["--text", pieces / "train.txt"])):
        code, _, err = run_cli(capsys, "train", "--model", "kn", "--order", "4", "--out", tmp_path / out, *args)
        assert code == 0, err
    tok, ref = _eval(capsys, tmp_path / "tok", data / "test.txt"), _eval(capsys, tmp_path / "ref", pieces / "test.txt")
    assert tok["unit"] == "token" and tok["tokens"] == ref["tokens"]
    assert tok["log10prob"] == pytest.approx(ref["log10prob"], rel=1e-9)
    assert (tmp_path / "tok" / "vocab.txt").read_text() == (tmp_path / "ref" / "vocab.txt").read_text()


def test_ppl_per_word_counts_the_same_words_for_word_char_and_token_models(setup, tmp_path, capsys):
    """One number across units: every model's total over the text's white-space words and one </s> a line."""
    data, sp_model, _ = setup
    for name, args in (("w", []), ("c", ["--unit", "char"]), ("t", ["--unit", "token", "--tokenizer", sp_model])):
        code, _, err = run_cli(capsys, "train", "--model", "kn", "--order", "3", "--data", data, "--out",
                               tmp_path / name, *args)
        assert code == 0, err
    lines = [x for x in (data / "test.txt").read_text().splitlines() if x.split()]
    words = sum(len(x.split()) for x in lines) + len(lines)  # counted here, from the text
    w, c, t = (_eval(capsys, tmp_path / name, data / "test.txt") for name in "wct")
    assert w["tokens"] == c["words"] == t["words"] == words
    assert t["tokens"] > words and c["tokens"] > t["tokens"]  # pieces: more than words, fewer than characters
    for r in (w, c, t):
        assert r["ppl_per_word"] == pytest.approx(10 ** (-r["log10prob"] / words), rel=1e-9)


def test_the_model_directory_holds_its_tokenizer(setup, tmp_path, capsys):
    data, sp_model, hf_json = setup
    code, _, err = run_cli(capsys, "train", "--model", "kn", "--order", "3", "--data", data, "--out", tmp_path / "m",
                           "--unit", "token", "--tokenizer", sp_model.parent)  # a directory holding one works
    assert code == 0, err
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    digest = hashlib.sha256(sp_model.read_bytes()).hexdigest()[:16]
    assert meta["data"]["tokenizer"] == "tokenizer.model" and meta["text"]["tokenizer_hash"] == digest
    assert (tmp_path / "m" / "tokenizer.model").read_bytes() == sp_model.read_bytes()
    before = _eval(capsys, tmp_path / "m", data / "test.txt")
    shutil.move(tmp_path / "m", tmp_path / "moved")  # the copy goes with the directory; the original may go
    sp_model.unlink()
    assert _eval(capsys, tmp_path / "moved", data / "test.txt") == before
    code, _, err = run_cli(capsys, "train", "--model", "kn", "--order", "3", "--data", data, "--out", tmp_path / "h",
                           "--unit", "token", "--tokenizer", hf_json)
    assert code == 0 and (tmp_path / "h" / "tokenizer.json").is_file()
    # Another file with the same pieces (another training option): the same vocabulary, another tokenizer.
    code, _, err = run_cli(capsys, "tokenizer", "train", "--text", data / "train.txt", "--vocab-size", "50",
                           "--character-coverage", "0.99999", "--out", tmp_path / "sp2")
    code, _, err = run_cli(capsys, "train", "--model", "kn", "--order", "3", "--data", data, "--out", tmp_path / "m2",
                           "--unit", "token", "--tokenizer", tmp_path / "sp2")
    assert code == 0 and (tmp_path / "m2" / "vocab.txt").read_text() == (tmp_path / "moved" / "vocab.txt").read_text()
    code, _, err = run_cli(capsys, "interpolate", tmp_path / "moved", tmp_path / "m2", "--out", tmp_path / "mix")
    assert code == 2 and "reads token units of tokenizer" in err and err.count("\n") == 1  # never mixed


def test_text_spec_compares_the_tokenizer():
    a = TextSpec("token", tokenizer_hash="0123456789abcdef")
    assert a.same_reading(TextSpec("token", tokenizer_hash="0123456789abcdef"))
    assert not a.same_reading(TextSpec("token", tokenizer_hash="fedcba9876543210"))
    assert not TextSpec("word").same_reading(a) and TextSpec("word").same_reading(TextSpec("word"))


FAMILIES = {  # tiny settings: each trains one epoch in a second or two
    "fnn": ["--order", "3", "--embed", "8", "--hidden", "16", "--layers", "1", "--batch-size", "4", "--seq-len", "16"],
    "fofe": ["--embed", "8", "--hidden", "16", "--layers", "1", "--batch-size", "4", "--seq-len", "16"],
    "rnn": ["--hidden", "16", "--batch-size", "4", "--seq-len", "8"],
    "afp": ["--iterations", "2", "--hidden", "16", "--batch-size", "4", "--seq-len", "8"],
    "lstm": ["--hidden", "16", "--layers", "1", "--batch-size", "4", "--seq-len", "8"],
    "transformer": ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--context", "16",
                    "--batch-size", "4", "--seq-len", "16"],
    "cache": ["--window", "7"],
    "kn": ["--order", "3"],
}


def test_every_family_trains_scores_generates_and_mixes_on_pieces(setup, tmp_path, capsys):
    data, sp_model, _ = setup
    sp = spm.SentencePieceProcessor(model_file=str(sp_model))
    test_lines = [x for x in (data / "test.txt").read_text().splitlines() if x.split()]
    n_pieces = sum(len(sp.encode(x)) + 1 for x in test_lines)
    for name, opts in FAMILIES.items():
        epochs = [] if name in ("kn", "cache") else ["--max-epochs", "1", "--threads", "1"]
        code, _, err = run_cli(capsys, "train", "--model", name, "--data", data, "--out", tmp_path / name,
                               "--unit", "token", "--tokenizer", sp_model, *opts, *epochs)
        assert code == 0, f"{name}: {err}"
        r = _eval(capsys, tmp_path / name, data / "test.txt")
        assert r["tokens"] == n_pieces and r["unit"] == "token", name
        code, out, _ = run_cli(capsys, "score", tmp_path / name, "--text", data / "test.txt")
        assert code == 0 and sum(map(float, out.split())) == pytest.approx(r["log10prob"], rel=1e-6), name
        code, out, _ = run_cli(capsys, "generate", tmp_path / name, "--num", "3", "--max-len", "12")
        assert code == 0 and "\u2581" not in out and out.count("\n") == 3, name  # pieces joined by the decoder
    code, out, err = run_cli(capsys, "interpolate", tmp_path / "lstm", tmp_path / "kn", "--data", data,
                             "--out", tmp_path / "mix")
    assert code == 0, err
    assert _eval(capsys, tmp_path / "mix", data / "test.txt")["tokens"] == n_pieces
    nbest = tmp_path / "nbest.tsv"
    nbest.write_text("key\tacoustic\tlm\ttext\n" + "".join(f"u1-{i}\t-1.0\t0\t{line}\n"
                                                             for i, line in enumerate(test_lines[:3], 1)))
    code, out, err = run_cli(capsys, "rescore", tmp_path / "mix", "--tsv", nbest)
    assert code == 0 and len(out.splitlines()) == 4, err


def test_nemo_offset_writes_each_piece_as_its_tokenizer_id_plus_100(setup, tmp_path, capsys):
    """NeMo's train_kenlm.py writes token id i as chr(i + 100); the ARPA's unigrams are exactly those words, the
    kenlm module scores NeMo-encoded lines as seqlm scores the text, and the ARPA file reads back with the
    tokenizer to the directory's figure."""
    data, sp_model, _ = setup
    code, out, err = run_cli(capsys, "train", "--model", "kn", "--order", "3", "--data", data, "--out", tmp_path / "n",
                             "--unit", "token", "--tokenizer", sp_model, "--arpa-encoding", "nemo-offset")
    assert code == 0, err
    report = json.loads(out)
    assert report["arpa_encoding"] == "nemo-offset" and report["arpa_offset"] == 100
    sp = spm.SentencePieceProcessor(model_file=str(sp_model))
    pieces = [line.split("\t")[0] for line in (tmp_path / "n" / "vocab.txt").read_text().splitlines()]
    arpa = (tmp_path / "n" / "model.arpa").read_text(encoding="utf-8")
    section = arpa.split("\\1-grams:\n")[1].split("\n\n")[0].split("\n")  # not splitlines(): U+0085 is a word
    unigrams = {line.split("\t")[1] for line in section}
    assert "\x85" in unigrams  # id 33, which str.split() would cut at
    special = {"<s>", "</s>", "<unk>"}
    assert unigrams - special == {chr(sp.piece_to_id(p) + 100) for p in pieces if p not in special}
    lines = (data / "test.txt").read_text().splitlines()
    code, out, _ = run_cli(capsys, "eval", tmp_path / "n" / "model.arpa", "--tokenizer", sp_model, "--arpa-encoding",
                           "nemo-offset", "--text", data / "test.txt")
    assert code == 0 and json.loads(out) == _eval(capsys, tmp_path / "n", data / "test.txt")
    kenlm = pytest.importorskip("kenlm")
    lm = kenlm.Model(str(tmp_path / "n" / "model.arpa"))
    want = [lm.score(" ".join(chr(i + 100) for i in sp.encode(line)), bos=True, eos=True) for line in lines]
    code, out, _ = run_cli(capsys, "score", tmp_path / "n", "--text", data / "test.txt")
    assert code == 0 and [float(x) for x in out.split()] == pytest.approx(want, abs=1e-4)


def test_arpa_words_may_be_non_ascii_white_space(tmp_path):
    """NeMo's chr(33 + 100) and chr(60 + 100) are U+0085 and U+00A0, which str.split() cuts at and KenLM does not."""
    from seqlm.ngram.arpa import read_arpa

    arpa = tmp_path / "m.arpa"
    arpa.write_text("\\data\\\nngram 1=5\nngram 2=1\n\n\\1-grams:\n-1\t<s>\t0\n-1\t</s>\n-1\t<unk>\n"
                    "-0.5\t\x85\t-0.1\n-0.5\t\xa0\t0\n\n\\2-grams:\n-0.2\t\x85 \xa0\n\n\\end\\\n", encoding="utf-8")
    data = read_arpa(arpa)
    assert data.tokens == ["<s>", "</s>", "<unk>", "\x85", "\xa0"] and data.grams[1].tolist() == [[3, 4]]


@pytest.mark.parametrize("args, match", [
    (["--unit", "token"], "--unit token reads text through --tokenizer"),
    (["--tokenizer", "TOK"], "--tokenizer is for --unit token only"),
    (["--unit", "token", "--tokenizer", "TOK", "--raw"], "drop --raw"),
    (["--unit", "token", "--tokenizer", "TOK", "--arpa-offset", "7"], "--arpa-offset 7 has no effect"),
    (["--arpa-encoding", "nemo-offset"], "needs --unit token"),
    (["--unit", "token", "--tokenizer", "missing.model"], "no such file"),
])
def test_refusals_are_one_line(setup, tmp_path, capsys, args, match):
    data, sp_model, _ = setup
    args = [str(sp_model) if a == "TOK" else a for a in args]
    code, _, err = run_cli(capsys, "train", "--model", "kn", "--data", data, "--out", tmp_path / "x", *args)
    assert code == 2 and match in err and err.count("\n") == 1, err


def test_other_refusals(setup, tmp_path, capsys):
    data, sp_model, _ = setup
    code, _, err = run_cli(capsys, "train", "--model", "lstm", "--data", data, "--out", tmp_path / "x", "--unit",
                           "token", "--tokenizer", sp_model, "--arpa-encoding", "nemo-offset")
    assert code == 2 and "--model kn only" in err
    code, _, err = run_cli(capsys, "tokenizer", "train", "--text", data / "train.txt", "--vocab-size", "100000",
                           "--out", tmp_path / "big")
    assert code == 2 and err.startswith("seqlm: error: sentencepiece:") and err.count("\n") == 1
    code, _, err = run_cli(capsys, "tokenizer", "train", "--text", data / "train.txt", "--vocab-size", "50",
                           "--out", sp_model.parent)
    assert code == 2 and "exists" in err  # an existing tokenizer.model is kept without --force
    code, _, err = run_cli(capsys, "tokenizer", "encode", "--tokenizer", sp_model, "--vocab-size", "5")
    assert code == 2 and "--vocab-size is not an option of seqlm tokenizer encode" in err
    code, _, err = run_cli(capsys, "tokenizer", "train", "--text", data / "train.txt", "--out", tmp_path / "t")
    assert code == 2 and "needs --vocab-size" in err
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    code, _, err = run_cli(capsys, "tokenizer", "encode", "--tokenizer", bad, "--text", data / "test.txt")
    assert code == 2 and "not a sentencepiece model" in err
    with pytest.raises(SeqlmError, match="--unit token reads text"):
        DataConfig(unit="token")


def test_quantize_keeps_a_token_models_tokenizer(setup, tmp_path, capsys):
    """An int8 copy of a token model carries the tokenizer and scores as the float model does (to int8's
    rounding)."""
    data, sp_model, _ = setup
    code, _, err = run_cli(capsys, "train", "--model", "lstm", "--data", data, "--out", tmp_path / "lstm", "--unit",
                           "token", "--tokenizer", sp_model, "--hidden", "8", "--layers", "1", "--max-epochs", "1",
                           "--seq-len", "8", "--batch-size", "4", "--threads", "1")
    assert code == 0, err
    code, _, err = run_cli(capsys, "quantize", tmp_path / "lstm", "--out", tmp_path / "int8")
    assert code == 0, err
    assert (tmp_path / "int8" / "tokenizer.model").read_bytes() == sp_model.read_bytes()
    floats = _eval(capsys, tmp_path / "lstm", data / "test.txt")
    int8 = _eval(capsys, tmp_path / "int8", data / "test.txt")
    assert int8["tokens"] == floats["tokens"] and int8["ppl"] == pytest.approx(floats["ppl"], rel=0.05)
