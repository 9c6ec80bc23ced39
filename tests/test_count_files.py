"""Count files and weighted lines for the kn family (#42 item 3): `seqlm count --write-counts` (SRILM's
ngram-count -write), `seqlm train --model kn --counts A,B` (-read, several files merged) and
`--text-has-weights`, through the real command line, against independent references: a hand reader of the
file and a brute-force count (collections.Counter), the text's own estimate (shards merged == the text
concatenated, whole weights == repeated lines, byte for byte), and Witten-Bell on fractional counts computed
by hand from its definition."""

from __future__ import annotations

import gzip
import math
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import run_cli, write_corpus

TINY = ["the cat sat on the mat", "the dog sat", "a cat ran on the mat", "the cat sat", "dog ran"]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():  # tiny corpora: sparse count-of-counts warn (fallback discounts)
        warnings.simplefilter("ignore")
        yield


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def brute_counts(lines: list[str], order: int, weights: list[float] | None = None) -> Counter:
    """Every n-gram of `<s> w1 .. wn </s>` up to `order`, each line counted with its weight (1 by default)."""
    counts: Counter = Counter()
    for line, w in zip(lines, weights or [1] * len(lines), strict=True):
        seq = ("<s>", *line.split(), "</s>")
        for k in range(1, order + 1):
            for i in range(len(seq) - k + 1):
                counts[seq[i:i + k]] += w
    return counts


def read_by_hand(path: Path) -> list[tuple[tuple[str, ...], str]]:
    """The lines of a count file as (words, count text), checking the format: one tab, words split by one space."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        out = []
        for line in f.read().splitlines():
            gram, count = line.split("\t")
            assert gram == gram.strip() and "  " not in gram
            out.append((tuple(gram.split(" ")), count))
    return out


def _ok(capsys, *argv) -> str:
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    return out


def _train_arpa(capsys, tmp_path: Path, name: str, *argv) -> bytes:
    _ok(capsys, "train", "--model", "kn", *argv, "--arpa", tmp_path / name)
    return (tmp_path / name).read_bytes()


def _count(capsys, text: Path, dest: Path, order: int = 3, *extra) -> Path:
    _ok(capsys, "count", "--text", text, "--order", order, "--write-counts", dest, *extra)
    return dest


@pytest.mark.parametrize("name", ["tiny.counts", "tiny.counts.gz"])
def test_the_count_file_holds_a_brute_force_count_of_the_text(capsys, tmp_path, name):
    text = _write(tmp_path / "tiny.txt", TINY)
    lines = read_by_hand(_count(capsys, text, tmp_path / name, 3))
    written = {gram: int(c) for gram, c in lines}
    assert len(written) == len(lines)  # each n-gram once
    assert {g: c for g, c in written.items() if c} == brute_counts(TINY, 3)
    assert [g for g, c in written.items() if not c] == [("<unk>",)]  # the vocabulary's word never seen
    seen: set = set()
    for gram, _ in lines:  # depth-first: an n-gram after its first words, the first level in text order
        assert len(gram) == 1 or gram[:-1] in seen
        seen.add(gram)
    assert [g[0] for g, _ in lines if len(g) == 1][:4] == ["<s>", "the", "cat", "sat"]


def test_counts_read_back_are_the_counts_of_the_text(capsys, tmp_path):
    from seqlm.config import DataConfig
    from seqlm.data.corpus import build_vocab, encode_file
    from seqlm.ngram.countfile import read_counts
    from seqlm.ngram.counts import count_ngrams
    from seqlm.ngram.from_counts import counts_over, counts_vocab
    from seqlm.ngram.weighted import strip_weights, weighted_vocab

    text = write_corpus(tmp_path / "c", n_train=120) / "train.txt"
    vocab = build_vocab(text)
    direct = count_ngrams(encode_file(text, vocab), len(vocab), len(vocab) + 1, 4)
    weighted = _write(tmp_path / "w.txt", [f"{(i % 7) / 3 + 0.1!r} {line}" for i, line in
                                           enumerate(text.read_text().splitlines())])
    plain, weights = strip_weights(weighted, tmp_path, raw=False)
    wvocab = weighted_vocab(plain, DataConfig(), "word", weights)
    fractional = count_ngrams(encode_file(plain, wvocab, use_cache=False), len(wvocab), len(wvocab) + 1, 4, weights)
    assert fractional.counts[3].dtype.kind == "f"
    for src, want, v, extra in ((text, direct, vocab, []), (weighted, fractional, wvocab, ["--text-has-weights"])):
        cf = read_counts([str(_count(capsys, src, tmp_path / "c.counts", 4, "--force", *extra))])
        got_vocab = counts_vocab(cf, DataConfig())
        got = counts_over(cf, got_vocab)
        assert got_vocab.itos == v.itos and (got.vocab_size, got.bos_id) == (want.vocab_size, want.bos_id)
        for k in range(4):  # exactly: fractional counts as the same float64
            assert np.array_equal(got.keys[k], want.keys[k]) and np.array_equal(got.suffix[k], want.suffix[k])
            assert got.counts[k].dtype.kind == want.counts[k].dtype.kind
            assert np.array_equal(got.counts[k], want.counts[k])


@pytest.mark.parametrize("options", [[], ["--smoothing", "witten-bell"], ["--smoothing", "katz"], ["--prune", "0", "1"],
                                     ["--min-count", "2"], ["--vocab", "WORDS"], ["--prune-entropy", "1e-3"]],
                         ids=lambda o: " ".join(o) or "modified-kn")
def test_shards_counted_apart_and_merged_estimate_the_text_they_make_together(capsys, tmp_path, options):
    lines = (write_corpus(tmp_path / "c", n_train=200) / "train.txt").read_text().splitlines()
    a, b = _write(tmp_path / "a.txt", lines[:90]), _write(tmp_path / "b.txt", lines[90:])
    both = _write(tmp_path / "ab.txt", lines)
    _write(tmp_path / "words.txt", ["the", "cat", "dog", "sat", "on", "mat", "ran"])
    options = [str(tmp_path / "words.txt") if o == "WORDS" else o for o in options]
    ca, cb = _count(capsys, a, tmp_path / "a.counts", 3), _count(capsys, b, tmp_path / "b.counts.gz", 3)
    merged = _train_arpa(capsys, tmp_path, "merged.arpa", "--counts", f"{ca},{cb}", *options)
    assert merged == _train_arpa(capsys, tmp_path, "text.arpa", "--order", "3", "--text", both, *options)
    one = _train_arpa(capsys, tmp_path, "one.arpa", "--counts", ca, "--order", "2", *options)
    assert one == _train_arpa(capsys, tmp_path, "a2.arpa", "--order", "2", "--text", a, *options)  # orders cut


def test_merging_breaks_ties_in_count_as_the_concatenated_text_does(capsys, tmp_path):
    # A alone ranks x (2) before y (1); merged with B they tie at 2, and y, first in A+B, comes first.
    a, b = _write(tmp_path / "a.txt", ["y x x", "z"]), _write(tmp_path / "b.txt", ["y", "z w"])
    both = _write(tmp_path / "ab.txt", ["y x x", "z", "y", "z w"])
    counts = [_count(capsys, t, tmp_path / f"{t.stem}.counts", 2) for t in (a, b)]
    merged = _train_arpa(capsys, tmp_path, "m.arpa", "--counts", ",".join(map(str, counts)))
    text = _train_arpa(capsys, tmp_path, "t.arpa", "--order", "2", "--text", both)
    assert merged == text and text.index(b"\ty") < text.index(b"\tx")


def test_whole_weights_count_as_repeated_lines(capsys, tmp_path):
    weighted = _write(tmp_path / "w.txt", ["2 the cat sat on the mat", "1 the dog sat", "0 never counted words",
                                           "3 a cat ran on the mat", "", "+1.0 dog ran"])
    repeated = _write(tmp_path / "r.txt", [TINY[0]] * 2 + [TINY[1]] + [TINY[2]] * 3 + [TINY[4]])
    w = _train_arpa(capsys, tmp_path, "w.arpa", "--order", "3", "--text", weighted, "--text-has-weights")
    assert w == _train_arpa(capsys, tmp_path, "r.arpa", "--order", "3", "--text", repeated)
    assert b"never" not in w
    cw = _count(capsys, weighted, tmp_path / "w.counts", 3, "--text-has-weights")
    assert cw.read_bytes() == _count(capsys, repeated, tmp_path / "r.counts", 3).read_bytes()


def witten_bell(lines: list[str], weights: list[float], order: int):
    """Interpolated Witten-Bell by its definition (Chen & Goodman 1998, 2.5) on weighted counts, lowest level
    interpolated with the uniform distribution over the vocabulary without <s>: p(w | h) and back-off(h)."""
    counts = brute_counts(lines, order, weights)
    vocab = {g[0] for g in counts if len(g) == 1} - {"<s>"} | {"<unk>"}
    followers: dict[tuple, dict[str, float]] = {}
    for g, c in counts.items():
        if len(g) > 1 or g != ("<s>",):
            followers.setdefault(g[:-1], {})[g[-1]] = c

    def weight(h: tuple) -> tuple[dict, float, int]:
        f = followers.get(h, {})
        return f, sum(f.values()), sum(1 for c in f.values() if c > 0)

    def prob(w: str, h: tuple) -> float:
        f, C, T = weight(h)
        lower = 1 / len(vocab) if not h else prob(w, h[1:])
        return (f.get(w, 0) + T * lower) / (C + T) if C else lower

    def backoff(h: tuple) -> float:
        _, C, T = weight(h)
        return T / (C + T) if C else 1.0

    return prob, backoff


def read_arpa_by_hand(path: Path) -> dict[tuple[str, ...], tuple[float, float]]:
    """(log10 p, log10 back-off or 0) of every n-gram of an ARPA file."""
    out, k = {}, 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("\\") and line.endswith("-grams:"):
            k = int(line[1:line.index("-")])
        elif k and line.strip() and not line.startswith("\\"):
            f = line.split("\t")
            out[tuple(f[1].split(" "))] = (float(f[0]), float(f[2]) if len(f) > 2 else 0.0)
    return out


def test_witten_bell_on_fractional_weights_is_its_definition(capsys, tmp_path):
    weights = [0.3, 1.7, 2.5, 0.25, 1.0]
    text = _write(tmp_path / "w.txt", [f"{w} {line}" for w, line in zip(weights, TINY, strict=True)])
    out = tmp_path / "wb.arpa"
    _train_arpa(capsys, tmp_path, out.name, "--order", "3", "--smoothing", "witten-bell", "--text", text,
                "--text-has-weights")
    prob, backoff = witten_bell(TINY, weights, 3)
    model = read_arpa_by_hand(out)
    assert len(model) == len(brute_counts(TINY, 3)) + 1  # every n-gram seen, and <unk>
    for gram, (logp, logbo) in model.items():
        if gram != ("<s>",):
            assert logp == pytest.approx(math.log10(prob(gram[-1], gram[:-1])), abs=2e-6), gram
        assert logbo == pytest.approx(math.log10(backoff(gram)), abs=2e-6), gram
    counts = _count(capsys, text, tmp_path / "wb.counts", 3, "--text-has-weights")
    written = read_by_hand(counts)
    assert {g: float(c) for g, c in written if c != "0"} == pytest.approx(dict(brute_counts(TINY, 3, weights)))
    assert ("<s> a", "2.5") in [(" ".join(g), c) for g, c in written]  # a decimal, read back as written
    again = _train_arpa(capsys, tmp_path, "again.arpa", "--counts", counts, "--smoothing", "witten-bell")
    assert again == out.read_bytes()


@pytest.mark.parametrize("smoothing", ["modified-kn", "kn", "absolute", "katz", "witten-bell", "additive"])
def test_fractional_counts_only_for_the_methods_defined_on_them(capsys, tmp_path, smoothing):
    text = _write(tmp_path / "w.txt", [f"{w} {line}" for w, line in zip([0.5, 1, 2, 1, 1], TINY, strict=True)])
    counts = _write(tmp_path / "f.counts", ["<s>\t1.5", "<s> a\t1.5", "a\t1.5", "a </s>\t1.5", "</s>\t1.5"])
    for source in (["--text", text, "--text-has-weights"], ["--counts", counts]):
        code, _, err = run_cli(capsys, "train", "--model", "kn", "--order", "2", "--smoothing", smoothing, *source,
                               "--arpa", tmp_path / "m.arpa", "--force")
        if smoothing in ("witten-bell", "additive"):
            assert code == 0, err
        else:
            assert code == 2 and err.count("\n") == 1 and "fractional" in err and "witten-bell or additive" in err
            assert not (tmp_path / "m.arpa").exists()


BAD_COUNTS = {
    "no count": (["a\t1", "a b"], "not a number"),
    "a word for a count": (["a\tmany"], "not a number"),
    "a negative count": (["a\t-2"], "not a number"),
    "empty": ([], "no n-gram counts"),
    "a missing prefix": (["a\t2", "b\t1", "c\t1", "a b c\t1"], "first words"),
    "a missing suffix": (["a\t2", "b\t1", "a b\t1", "b a\t1", "x\t1", "a b x\t1"], "last words"),
    "a word without its unigram": (["a\t1", "a b\t1"], "as a unigram"),
    "<s> inside": (["a\t1", "<s>\t1", "a <s>\t1"], "<s> only as its first word"),
    "a zero count above unigrams": (["a\t1", "a a\t0"], "count 0"),
}


@pytest.mark.parametrize("case", BAD_COUNTS, ids=list(BAD_COUNTS))
def test_a_bad_count_file_is_one_line_and_writes_nothing(capsys, tmp_path, case):
    lines, says = BAD_COUNTS[case]
    bad = _write(tmp_path / "bad.counts", lines)
    code, out, err = run_cli(capsys, "train", "--model", "kn", "--counts", bad, "--arpa", tmp_path / "m.arpa",
                             "--out", tmp_path / "model")
    assert code == 2 and err.startswith("seqlm: error: ") and err.count("\n") == 1 and says in err, err
    assert "Traceback" not in err and sorted(p.name for p in tmp_path.iterdir()) == ["bad.counts"]


def test_bad_weights_and_refused_options_are_one_line_and_write_nothing(capsys, tmp_path):
    good = _write(tmp_path / "good.txt", TINY)
    c3 = _count(capsys, good, tmp_path / "c3.counts", 3)
    c2 = _count(capsys, good, tmp_path / "c2.counts", 2)
    weighted = ["count", "--text-has-weights", "--text"]
    cases = [
        ([*weighted, _write(tmp_path / "x.txt", ["2 a b", "x a b"])], "x.txt:2", "not a weight"),
        ([*weighted, _write(tmp_path / "n.txt", ["-1 a b"])], "n.txt:1", "not a weight"),
        ([*weighted, _write(tmp_path / "z.txt", ["0 a", ""])], "z.txt", "no weighted"),
        (["count", "--text", _write(tmp_path / "e.txt", [])], "e.txt", "no sentences"),
        ([*weighted, _write(tmp_path / "u.txt", ["1 the cat", "0 x", "2 the dog"]), "--vocab",
          _write(tmp_path / "v.txt", ["the", "cat"]), "--unk", "none"], "u.txt:3: 'dog' is not in the vocabulary"),
        (["count", "--text", good, "--order", "0"], "--order", "between 1"),
        (["count", "--text", good, "--write-counts", c3], "exists", "--force"),
        (["train", "--model", "kn", "--counts", c3, "--text", good], "--data/--text", "--counts"),
        (["train", "--model", "kn", "--counts", f"{c3},{c2}"], "different orders", "c2.counts: 2"),
        (["train", "--model", "kn", "--counts", c2, "--order", "3"], "--order 3", "up to order 2"),
        (["train", "--model", "kn", "--counts", c3, "--memory", "1G"], "--memory", "drop --memory"),
        (["train", "--model", "kn", "--counts", c3, "--text-has-weights"], "--text-has-weights", "does not apply"),
        (["train", "--model", "lstm", "--counts", c3], "--counts", "--model kn"),
        (["train", "--model", "lstm", "--text-has-weights", "--text", good], "--text-has-weights", "--model kn"),
        (["train", "--model", "kn", "--counts", tmp_path / "missing.counts"], "missing.counts", "no such file"),
    ]
    before = sorted(p.name for p in tmp_path.iterdir())
    for argv, *says in cases:
        out = (["--write-counts", tmp_path / "out.counts"] if "--write-counts" not in argv else []) \
            if argv[0] == "count" else ["--arpa", tmp_path / "out.arpa"] if "kn" in argv else ["--out", tmp_path / "m"]
        code, _, err = run_cli(capsys, *argv, *out)
        assert code == 2 and err.startswith("seqlm: error: ") and err.count("\n") == 1, (argv, err)
        assert all(s in err for s in says), (argv, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == before, argv  # no output, no temporary file left
