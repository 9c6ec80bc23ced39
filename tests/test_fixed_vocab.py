"""A fixed vocabulary, `--vocab FILE` (issue #41), for every family, and kn's closed vocabulary `--unk none`.

The ids follow the built vocabulary's rules (checked against lists made here by hand); a neural family maps
words outside the file to <unk>; kn counts them and prunes them as lmplz --limit_vocab_file does (against
BruteKN, Kneser-Ney written out by its definition in test_kn_high_order.py, and against numbers lmplz printed
for the KenLM oracle corpus); under --unk none an unknown word in training or scored text is an error naming
the word and the line.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import seqlm
from seqlm.cli import main
from seqlm.errors import SeqlmError
from test_kn_high_order import BruteKN

from conftest import TINY, write_corpus


def run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fallback discounts on tiny corpora
        code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *argv) -> str:
    code, _, err = run(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def vocab_rows(model_dir: Path) -> list[tuple[str, int]]:
    rows = [line.split("\t") for line in (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()]
    return [(w, int(c)) for w, c in rows]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---- the ids: </s>, <unk>, the file's words seen in training by count (ties by first occurrence), then unseen


def test_ids_follow_the_vocabulary_order_rules(tmp_path, capsys):
    train = write(tmp_path / "train.txt", "b a c\na b\nd b e\n")  # b 3, a 2, then c d e once each, in that order
    listing = write(tmp_path / "v.txt", "e\n<unk>\nzz\na\n<s>\nb\t7\nyy\na\n\n</s>\n")  # b's count is ignored
    code = run(capsys, "train", "--model", "cache", "--text", train, "--vocab", listing, "--out", tmp_path / "m")[0]
    assert code == 0
    # by hand: specials first (<unk> counts c and d, outside the list), b and a by count, e (count 1), then the
    # words never seen in the file's order; <s> and the duplicate a are left out
    assert vocab_rows(tmp_path / "m") == [("</s>", 3), ("<unk>", 2), ("b", 3), ("a", 2), ("e", 1), ("zz", 0), ("yy", 0)]
    spec = json.loads((tmp_path / "m" / "config.json").read_text())["text"]
    tokens = "\n".join(w for w, _ in vocab_rows(tmp_path / "m"))
    assert spec["vocab_hash"] == hashlib.sha256(tokens.encode()).hexdigest()[:16] and spec["vocab_size"] == 7
    code, out, _ = run(capsys, "eval", tmp_path / "m", "--text", write(tmp_path / "t.txt", "c a zz\nd\n"))
    assert code == 0 and json.loads(out)["oov"] == 2  # c and d are <unk>; zz is a word of the model


def test_the_training_words_as_a_list_give_the_built_vocabulary(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c")
    words = Counter(w for line in (corpus / "train.txt").read_text().splitlines() for w in line.split())
    listing = write(tmp_path / "v.txt", "\n".join(sorted(words, reverse=True)) + "\n")  # any order in the file
    for name, extra in (("built", []), ("fixed", ["--vocab", listing])):
        assert run(capsys, "train", "--model", "cache", "--text", corpus / "train.txt", "--out", tmp_path / name,
                   *extra)[0] == 0
    assert vocab_rows(tmp_path / "built") == vocab_rows(tmp_path / "fixed")


def test_a_neural_family_maps_words_outside_the_file_to_unk(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c")
    counts = Counter(w for line in (corpus / "train.txt").read_text().splitlines() for w in line.split())
    listing = write(tmp_path / "v.txt", "mat\nthe\nnever\ncat\n")
    code, _, err = run(capsys, "train", "--model", "fnn", "--data", corpus, "--out", tmp_path / "m", "--vocab",
                       listing, "--max-epochs", "1", *TINY)
    assert code == 0, err
    by_count = sorted(["mat", "the", "cat"], key=lambda w: -counts[w])  # the corpus has no ties among these
    outside = sum(c for w, c in counts.items() if w not in ("mat", "the", "cat"))
    assert [w for w, _ in vocab_rows(tmp_path / "m")] == ["</s>", "<unk>", *by_count, "never"]
    assert vocab_rows(tmp_path / "m")[1] == ("<unk>", outside)
    code, out, _ = run(capsys, "eval", tmp_path / "m", "--text", corpus / "test.txt")
    test_words = [w for line in (corpus / "test.txt").read_text().splitlines() for w in line.split()]
    assert code == 0 and json.loads(out)["oov"] == sum(w not in ("mat", "the", "cat") for w in test_words)


def test_bad_vocabulary_options_are_refused(tmp_path, capsys):
    train = write(tmp_path / "train.txt", "a b\nb c\n")
    args = ("train", "--model", "kn", "--order", "2", "--text", train, "--out", tmp_path / "m")
    assert "no such file" in refused(capsys, *args, "--vocab", tmp_path / "missing.txt")
    for text, line in (("a\nb c\n", 2), ("a\tx\n", 1)):
        err = refused(capsys, *args, "--vocab", write(tmp_path / "v.txt", text))
        assert f"v.txt:{line}: expected one word a line" in err
    assert "--max-vocab and --min-count" in refused(capsys, *args, "--vocab", write(tmp_path / "v.txt", "a\n"),
                                                      "--min-count", "2")
    assert "lists characters" in refused(capsys, *args, "--unit", "char", "--vocab", write(tmp_path / "v.txt", "ab\n"))
    assert "--unk must be one of map, none" in refused(capsys, *args, "--unk", "drop")
    corpus = write_corpus(tmp_path / "c")
    assert "for kn models" in refused(capsys, "train", "--model", "fnn", "--data", corpus, "--out", tmp_path / "f",
                                      "--unk", "none", *TINY)


# ---- kn: lmplz --limit_vocab_file ------------------------------------------------------------------------


TRAIN = ["the cat sat on the mat", "the dog sat on a log", "a cat ran", "the cat and the dog ran",
         "a dog sat on the cat", "on the mat sat a cat"] * 2
KEEP = ["the", "cat", "sat", "on", "mat", "a", "ran", "unseen"]  # not: dog, log, and


@pytest.mark.parametrize("order", [2, 3, 4])
def test_kn_limited_vocabulary_matches_brute_force(order, tmp_path, capsys):
    train = write(tmp_path / "train.txt", "\n".join(TRAIN) + "\n")
    test = write(tmp_path / "test.txt", "the dog sat on the mat\na cat sat on a log and ran\nunseen cat\n")
    listing = write(tmp_path / "v.txt", "\n".join(KEEP) + "\n")
    assert run(capsys, "train", "--model", "kn", "--order", order, "--text", train, "--vocab", listing,
               "--out", tmp_path / "m")[0] == 0
    # as lmplz: the words kept are the file's words seen in training; a word of the file never seen is not in
    model = seqlm.load(tmp_path / "m")
    assert set(model.vocab.itos) == set(KEEP) - {"unseen"} | {"<s>", "</s>", "<unk>"}
    brute = BruteKN([s.split() for s in TRAIN], order, keep=set(KEEP))
    expected = [brute.sentence_log10(line.split()) for line in test.read_text().splitlines()]
    for got, want in zip(seqlm.score_text(model, test.read_text().splitlines()), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=2e-6)
    code, out, _ = run(capsys, "eval", tmp_path / "m", "--text", test)
    assert code == 0 and json.loads(out)["oov"] == 4  # dog, log, and, unseen


def test_kn_limited_vocabulary_is_re_estimated_alike_on_resume(tmp_path, capsys):
    train = write(tmp_path / "train.txt", "\n".join(TRAIN) + "\n")
    args = ("train", "--model", "kn", "--order", "3", "--text", train, "--out", tmp_path / "m",
            "--vocab", write(tmp_path / "v.txt", "\n".join(KEEP) + "\n"))
    assert run(capsys, *args)[0] == 0
    before = (tmp_path / "m" / "model.arpa").read_bytes()
    assert run(capsys, *args, "--resume")[0] == 0
    assert (tmp_path / "m" / "model.arpa").read_bytes() == before


def _oracle() -> Path:
    if os.environ.get("SEQLM_DATA"):
        return Path(os.environ["SEQLM_DATA"]) / "kenlm-oracle"
    return Path(__file__).resolve().parents[2] / "shared" / "data" / "kenlm-oracle"


ORACLE = _oracle()

# What lmplz (KenLM 4cb443e) wrote for the oracle's train.txt with --limit_vocab_file listing every word whose
# count is not a multiple of 3, and a word it never saw: n-grams per order and a few entries (log10 p, back-off).
LMPLZ = {
    ("3",): ([4792, 15859, 12888], {
        ("<unk>",): (-4.0160832, 0.0), ("</s>",): (-1.4406402, 0.0), ("six",): (-3.4179788, -0.2267823),
        ("rail",): (-3.957889, -0.09567154), ("accounts", "for"): (-1.4339107, 0.0),
        ("is", "already"): (-3.079083, -0.042823426)}),
    ("5", "--prune", "0", "0", "1"): ([4792, 15859, 824, 312, 143], {
        ("<unk>",): (-4.0160832, 0.0), ("rail",): (-3.957889, -0.09567154),
        ("at", "least", "$", "N"): (-0.00709308, -0.13184507), ("dec.", "N", "N", "at"): (-0.83307385, 0.0),
        ("exchange", "composite", "trading", "yesterday"): (-1.2350062, 0.0),
        ("purchase", "of", "columbia", "pictures", "entertainment"): (-0.24066892, 0.0)}),
}


@pytest.mark.skipif(not (ORACLE / "train.txt").is_file(), reason=f"no KenLM oracle in {ORACLE}")
@pytest.mark.parametrize("options", list(LMPLZ))
def test_kn_limited_vocabulary_matches_lmplz(options, tmp_path, capsys):
    counts = Counter(w for line in (ORACLE / "train.txt").read_text().splitlines() for w in line.split())
    listing = write(tmp_path / "v.txt", "\n".join([w for w in counts if counts[w] % 3] + ["zzzunseen"]) + "\n")
    assert run(capsys, "train", "--model", "kn", "--order", *options, "--text", ORACLE / "train.txt",
               "--vocab", listing, "--out", tmp_path / "m")[0] == 0
    sizes, entries = LMPLZ[options]
    model = seqlm.load(tmp_path / "m")
    assert model.sizes == sizes
    for gram, (p, bo) in entries.items():
        assert _entry(model, [model.vocab.stoi[w] for w in gram]) == pytest.approx((p, bo), abs=2e-6), gram


def _entry(model, ids: list[int]) -> tuple[float, float]:
    """(log10 p, log10 back-off) of the n-gram `ids`, found down the trie numbering (docs/ngram.md, "Keys")."""
    V, node = len(model.vocab), ids[0]
    for k, w in enumerate(ids[1:], 2):
        key = node * V + w
        node = int(np.searchsorted(model.keys[k - 1], key))
        assert model.keys[k - 1][node] == key, "n-gram not in the model"
    k = len(ids)
    bo = float(model.log10_backoff[k - 1][node]) if k < model.order else 0.0
    return float(model.log10_prob[k - 1][node]), bo


# ---- kn: a closed vocabulary, --unk none -----------------------------------------------------------------


def test_closed_vocabulary_refuses_unknown_words_in_training_text(tmp_path, capsys):
    train = write(tmp_path / "train.txt", "a b\n\nb c d\n")
    listing = write(tmp_path / "v.txt", "a\nb\nc\n")
    err = refused(capsys, "train", "--model", "kn", "--order", "2", "--text", train, "--vocab", listing,
                  "--unk", "none", "--out", tmp_path / "m")
    assert "train.txt:3: 'd' is not in the vocabulary, which is closed (--unk none)" in err
    assert not (tmp_path / "m" / "model.arpa").exists()


def test_closed_vocabulary_refuses_unknown_words_in_scored_text(tmp_path, capsys, monkeypatch):
    train = write(tmp_path / "train.txt", "a b\nb c a\n")
    listing = write(tmp_path / "v.txt", "a\nb\nc\nnever\n")
    assert run(capsys, "train", "--model", "kn", "--order", "2", "--text", train, "--vocab", listing, "--unk", "none",
               "--out", tmp_path / "m")[0] == 0
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["data"]["unk"] == "none" and cfg["data"]["vocab"] == str(listing)
    # closed: the file's words are the model's, a word never seen included (it gets the unseen-word share)
    assert [w for w, _ in vocab_rows(tmp_path / "m")] == ["</s>", "<unk>", "a", "b", "c", "never", "<s>"]
    text = write(tmp_path / "t.txt", "a never b\n\nc zz a\n")
    for command in ("eval", "score"):
        assert "t.txt:3: 'zz' is not in the vocabulary" in refused(capsys, command, tmp_path / "m", "--text", text)
    with pytest.raises(SeqlmError, match="sentence 2: 'zz' is not in the vocabulary"):
        seqlm.score_text(seqlm.load(tmp_path / "m"), ["a b", "c zz a"])
    code, out, _ = run(capsys, "eval", tmp_path / "m", "--text", write(tmp_path / "ok.txt", "a never b\n"))
    assert code == 0 and json.loads(out)["oov"] == 0 and json.loads(out)["tokens"] == 4
    # seqlm query is KenLM's query: an unknown word is <unk> there, at every verbosity
    for level in ("word", "sentence"):
        monkeypatch.setattr("sys.stdin", io.StringIO(text.read_text()))
        code, out, _ = run(capsys, "query", tmp_path / "m", "-v", level)
        assert code == 0 and "OOVs:\t1\n" in out


def test_closed_vocabulary_built_from_the_text_refuses_what_min_count_dropped(tmp_path, capsys):
    train = write(tmp_path / "train.txt", "a b a\nb a c\n")
    err = refused(capsys, "train", "--model", "kn", "--order", "2", "--text", train, "--min-count", "2",
                  "--unk", "none", "--out", tmp_path / "m")
    assert "train.txt:2: 'c' is not in the vocabulary" in err
