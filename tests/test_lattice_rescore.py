"""`seqlm rescore --lattice` against a hand computation on tiny SLF lattices the tests write.

Every path of the lattice is listed here by brute force and scored as HTK's LArcTotLike does:
acscale * a + prscale * r + lmscale * (W new + (1 - W) old) + wdpenalty per non-null word - oov_penalty per
word the model scores as <unk>, new = the model's sentence score. The CLI must give the same totals for the
best path of every distinct text, with the header's scales or the flags', and its n-best output must rescore
through `--tsv` to the same totals.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

import seqlm
from seqlm.cli import main
from seqlm.data.corpus import encode_sentences
from seqlm.eval.perplexity import score_tokens
from seqlm.lattice import read_lattices

from conftest import run_cli as run
from conftest import write_corpus

# (src, dst, word, a, l, r): two arcs spell "the" (a duplicate text), "zebra" is outside the vocabulary
ARCS = [(0, 1, "<s>", 0.0, 0.0, 0.0), (1, 2, "the", -3.0, -1.0, -0.2), (1, 2, "the", -3.5, -0.5, 0.0),
        (1, 2, "a", -2.5, -2.0, 0.0), (2, 3, "cat", -4.0, -1.0, 0.0), (2, 3, "zebra", -1.0, -0.5, -0.1),
        (2, 4, "!NULL", -0.5, 0.0, 0.0), (3, 4, "sat", -2.0, -1.0, 0.0), (4, 5, "</s>", -0.3, 0.0, 0.0)]
HEADER = {"acscale": 0.5, "lmscale": 2.0, "wdpenalty": -1.5, "prscale": 3.0}
NOT_LM = {"<s>", "</s>", "!NULL"}


def write_slf(path: Path, name: str = "utt1", upper: bool = False, base: float | None = None, **header) -> Path:
    head = {**HEADER, **header}
    lines = ["VERSION=1.0", f"UTTERANCE=\"{name}\"", " ".join(f"{k}={v}" for k, v in head.items())]
    if base:
        lines.append(f"base={base}")
    lines += [f"N=6 L={len(ARCS)}", *(f"I={i}" for i in range(6))]
    ln = math.log(base) if base and base != 1.0 else 1.0
    for j, (s, e, w, a, lm, r) in enumerate(ARCS):
        w = w.upper() if upper and w not in NOT_LM else w
        lines.append(f"J={j} S={s} E={e} W={w} a={a / ln} l={lm / ln} r={r / ln}")
    path.write_text("\n".join(lines) + "\n")
    return path


def all_paths() -> list[list[tuple]]:
    """Every start-to-end arc sequence of ARCS (depth first, by hand)."""
    def walk(node: int) -> list[list[tuple]]:
        if node == 5:
            return [[]]
        return [[arc, *rest] for arc in ARCS if arc[0] == node for rest in walk(arc[1])]
    return walk(0)


def expected(model, acscale, lmscale, wdpenalty, prscale, w=1.0, oov_penalty=0.0) -> dict[tuple, float]:
    """text -> total of its best path, computed from the model's sentence scores."""
    paths = all_paths()
    texts = [tuple(arc[2] for arc in p if arc[2] not in NOT_LM) for p in paths]
    new = score_tokens(model, encode_sentences([list(t) for t in texts], model.vocab)).sentence_totals()
    best: dict[tuple, float] = {}
    for p, text, n in zip(paths, texts, new, strict=True):
        total = sum(acscale * a + prscale * r + (0 if word == "!NULL" else wdpenalty) for _, _, word, a, _, r in p)
        total += lmscale * (w * n + (1 - w) * sum(arc[4] for arc in p))
        total -= oov_penalty * sum(word not in model.vocab.stoi for word in text)
        best[text] = max(best.get(text, -math.inf), total)
    return best


def read_table(path: Path) -> dict[str, list[float]]:
    lines = path.read_text().splitlines()
    assert lines[0].split("\t") == ["key", "acoustic", "old_lm", "new_lm", "total", "oov"]
    return {k: [float(x) for x in rest] for k, *rest in (line.split("\t") for line in lines[1:])}


def reports(err: str) -> list[dict]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def kn(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("lattice_rescore")
    corpus = write_corpus(d / "corpus")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # default discounts on a tiny corpus
        assert main(["train", "--model", "kn", "--order", "2", "--data", str(corpus), "--out", str(d / "kn")]) == 0
    return d / "kn"


def test_slf_header_scales_are_read_as_htk_reads_them(tmp_path):
    lat = read_lattices(write_slf(tmp_path / "a.slf", base=10.0))[1][0]
    assert (lat.acscale, lat.lmscale, lat.wdpenalty, lat.prscale) == (0.5, 2.0, -1.5, 3.0)  # base= not applied
    assert [round(a.acoustic, 9) for a in lat.arcs] == [a for _, _, _, a, _, _ in ARCS]  # a= l= r= in base 10
    plain = read_lattices(write_slf(tmp_path / "b.slf", base=1.0))[1][0]  # HTK: base=1 is natural logs
    assert [a.lm for a in plain.arcs] == [lm for _, _, _, _, lm, _ in ARCS]


@pytest.mark.parametrize("flags, scales", [
    ([], dict(HEADER)),
    (["--acoustic-scale", "0.1", "--lm-scale", "5", "--word-penalty", "2"],
     {"acscale": 0.1, "lmscale": 5.0, "wdpenalty": -2.0, "prscale": 3.0}),
    (["--word-penalty", "0.7", "--oov-penalty", "4", "--new-lm-weight", "0.25"], {**HEADER, "wdpenalty": -0.7}),
])
def test_totals_are_the_hand_computation_with_header_or_flag_scales(flags, scales, kn, tmp_path, capsys):
    slf = write_slf(tmp_path / "utt1.slf")
    code, out, err = run(capsys, "rescore", kn, "--lattice", slf, "--nbest-decode", "10", "--out", tmp_path / "t.tsv",
                         "--lattice-out", tmp_path / "lats", *flags)
    assert code == 0, err
    w = float(flags[flags.index("--new-lm-weight") + 1]) if "--new-lm-weight" in flags else 1.0
    oov = float(flags[flags.index("--oov-penalty") + 1]) if "--oov-penalty" in flags else 0.0
    want = expected(seqlm.load(kn), **scales, w=w, oov_penalty=oov)
    table = read_table(tmp_path / "t.tsv")
    assert len(table) == len(want) == 6  # nine paths, six texts: the best path of each
    got = sorted(row[3] for row in table.values())
    np.testing.assert_allclose(got, sorted(want.values()), atol=1e-5)
    best = max(want, key=want.get)
    assert out == "utt1 " + " ".join(best) + "\n"
    (rep,) = reports(err)
    assert {k: rep[k] for k in scales} == scales and rep["new_lm_weight"] == w and rep["oov_penalty"] == oov
    flag_of = {"acscale": "--acoustic-scale", "lmscale": "--lm-scale", "wdpenalty": "--word-penalty", "prscale": ""}
    assert rep["scales_from"] == {k: "flag" if f in flags else "header" for k, f in flag_of.items()}
    written = read_lattices(tmp_path / "lats" / "utt1.slf")[1][0]  # its header says what the totals used
    assert (written.acscale, written.lmscale, written.wdpenalty) == (scales["acscale"], scales["lmscale"],
                                                                       scales["wdpenalty"])


def by_text(tmp_path: Path, kn: Path, capsys, name: str, *flags: str) -> dict[tuple, list[float]]:
    """text -> score table row of a lattice run (the --nbest-out file names each key's text)."""
    slf = write_slf(tmp_path / "utt1.slf")
    nb, table = tmp_path / f"{name}-nb.tsv", tmp_path / f"{name}.tsv"
    code, _, err = run(capsys, "rescore", kn, "--lattice", slf, "--nbest-decode", "10", "--nbest-out", nb,
                       "--out", table, *flags)
    assert code == 0, err
    texts = {k: tuple(t.split()) for k, _, _, t in (line.split("\t") for line in nb.read_text().splitlines()[1:])}
    return {texts[k]: row for k, row in read_table(table).items()}


def test_word_and_oov_penalties_change_the_totals_by_hand(kn, tmp_path, capsys):
    """Per text: --word-penalty 2 takes the header's wdpenalty -1.5 to -2 on each non-null word (the text's
    words and the two sentence marks); --oov-penalty 3 takes 3 more per unknown word."""
    base = by_text(tmp_path, kn, capsys, "base")
    pen = by_text(tmp_path, kn, capsys, "pen", "--word-penalty", "2", "--oov-penalty", "3")
    assert set(base) == set(pen) and len(base) == 6
    for text, row in pen.items():
        n_oov = sum(w == "zebra" for w in text)
        assert row[3] == pytest.approx(base[text][3] + (-2 - HEADER["wdpenalty"]) * (len(text) + 2) - 3 * n_oov,
                                       abs=1e-5)
        assert row[4] == n_oov and row[1:3] == base[text][1:3]


def test_lattice_nbest_rescores_through_tsv_to_the_same_totals(kn, tmp_path, capsys):
    """Upper-case lattice, --lowercase: the n-best file has the model's words, no <s>/</s>, one line per text,
    and `rescore --tsv` with the run's lmscale and -wdpenalty gives the lattice path's totals."""
    slf = write_slf(tmp_path / "utt1.slf", name="utt 1", upper=True)
    flags = ["--new-lm-weight", "0.6", "--oov-penalty", "2.5"]
    code, _, err = run(capsys, "rescore", kn, "--lattice", slf, "--lowercase", "--nbest-decode", "10",
                       "--nbest-out", tmp_path / "nb.tsv", "--out", tmp_path / "lat.tsv", *flags)
    assert code == 0, err
    lines = (tmp_path / "nb.tsv").read_text().splitlines()
    assert lines[0] == "key\tacoustic\tlm\ttext"
    texts = [line.split("\t")[3] for line in lines[1:]]
    assert len(texts) == len(set(texts)) == 6 and all(t == t.lower() and "<s>" not in t for t in texts)
    assert [line.split("\t")[0] for line in lines[1:]] == [f"utt_1-{i}" for i in range(1, 7)]
    (rep,) = reports(err)
    code, out, err = run(capsys, "rescore", kn, "--tsv", tmp_path / "nb.tsv", "--lm-scale", rep["lmscale"],
                         "--word-penalty", -rep["wdpenalty"], *flags)
    assert code == 0, err
    lat, tsv = read_table(tmp_path / "lat.tsv"), read_table_text(out)
    assert list(lat) == list(tsv)
    for key in lat:  # new_lm, total and oov agree; acoustic and old_lm are the file's columns
        np.testing.assert_allclose(tsv[key], lat[key], atol=1e-5)


def read_table_text(text: str) -> dict[str, list[float]]:
    rows = [line.split("\t") for line in text.splitlines()[1:]]
    return {k: [float(x) for x in rest] for k, *rest in rows}


def test_nbest_scales_and_penalties_are_the_same_formula(kn, tmp_path, capsys):
    """n-best lists: total = acoustic_scale * ac + lm_scale * (W new + (1 - W) old) - P * words - O * oovs."""
    tsv = tmp_path / "n.tsv"
    hyps = [("u-1", -3.0, -2.0, "the cat sat"), ("u-2", -2.0, -4.0, "a zebra"), ("u-3", -6.0, -1.0, "")]
    tsv.write_text("".join(f"{k}\t{a}\t{lm}\t{t}\n" for k, a, lm, t in hyps))
    code, out, err = run(capsys, "rescore", kn, "--tsv", tsv, "--acoustic-scale", "0.5", "--lm-scale", "3",
                         "--new-lm-weight", "0.8", "--word-penalty", "1.25", "--oov-penalty", "2")
    assert code == 0, err
    model = seqlm.load(kn)
    new = score_tokens(model, encode_sentences([t.split() for *_, t in hyps], model.vocab)).sentence_totals()
    want = [0.5 * a + 3 * (0.8 * n + 0.2 * lm) - 1.25 * len(t.split()) - 2 * ("zebra" in t)
            for (_, a, lm, t), n in zip(hyps, new, strict=True)]
    np.testing.assert_allclose([row[3] for row in read_table_text(out).values()], want, atol=1e-5)


def test_old_spellings_are_aliases_of_the_new_meaning(kn, tmp_path, capsys):
    slf = write_slf(tmp_path / "utt1.slf")
    args = ["rescore", kn, "--lattice", slf, "--nbest-decode", "4"]
    results = {}
    for name, flags in (("new", ["--lm-scale", "3", "--new-lm-weight", "0.75"]),
                        ("old", ["--lm-weight", "3", "--interpolate-old", "0.25"]),
                        ("htk", ["--lmscale", "3", "--interpolate-old", "0.25"])):
        code, _, err = run(capsys, *args, "--out", tmp_path / f"{name}.tsv", *flags)
        assert code == 0, err
        notes = [line for line in err.splitlines() if line.startswith("seqlm:")]
        assert len(notes) == (0 if name == "new" else 2) and all("old spelling" in n for n in notes)
        results[name] = read_table(tmp_path / f"{name}.tsv")
    assert results["new"] == results["old"] == results["htk"]
    assert reports(err)[0]["lmscale"] == 3.0 and reports(err)[0]["new_lm_weight"] == 0.75


@pytest.mark.parametrize("argv, says", [
    (["--lattice", "{slf}", "--nbest", "5"], "--nbest-decode N"),
    (["--lattice", "{slf}", "--out", "{tmp}"], "--lattice-out DIR"),
    (["--lattice", "{slf}", "--nbest-decode", "3"], "--nbest-out FILE"),
    (["--lattice", "{slf}", "--lm-scale", "2", "--lm-weight", "2"], "give one of them"),
    (["--lattice", "{slf}", "--new-lm-weight", "1.5"], "between 0 and 1"),
    (["--lattice", "{slf}", "--tsv", "x.tsv"], "--lattice takes no --tsv"),
    (["--tsv", "{tsv}", "--lowercase"], "--lowercase"),
    (["--tsv", "{tsv}", "--nbest-out", "x"], "--nbest-out"),
    (["--tsv", "{tsv}", "--new-lm-weight", "0.5", "--lm-weight", "2"], None),  # fine: the tsv has old scores
])
def test_options_a_mode_cannot_honour_are_refused_in_one_line(argv, says, kn, tmp_path, capsys):
    slf, tsv = write_slf(tmp_path / "utt1.slf"), tmp_path / "n.tsv"
    tsv.write_text("utt1-1\t-3.0\t-2.0\tthe cat\n")
    argv = [a.format(slf=slf, tmp=tmp_path, tsv=tsv) for a in argv]
    code, out, err = run(capsys, "rescore", kn, *argv)
    if says is None:
        assert code == 0, err
        return
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and says in err, err


def test_slf_bad_header_values_are_one_line_errors(kn, tmp_path, capsys):
    for bad in ("lmscale=abc", "acscale=nan"):
        slf = tmp_path / "bad.slf"
        slf.write_text(write_slf(tmp_path / "ok.slf").read_text().replace("lmscale=2.0", bad))
        code, _, err = run(capsys, "rescore", kn, "--lattice", slf)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "header" in err, err
    slf.write_text(write_slf(tmp_path / "ok.slf").read_text().replace("r=-0.2", "r=x"))
    code, _, err = run(capsys, "rescore", kn, "--lattice", slf)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "r='x'" in err, err


def test_mostly_unknown_words_get_one_line_with_the_likely_cause(kn, tmp_path, capsys):
    upper = [write_slf(tmp_path / f"u{i}.slf", name=f"u{i}", upper=True) for i in range(2)]
    code, _, err = run(capsys, "rescore", kn, "--lattice", *upper)
    notes = [line for line in err.splitlines() if not line.startswith("{")]
    assert code == 0 and len(notes) == 1 and "try --lowercase" in notes[0], err
    assert all(r["oov_tokens"] == r["word_tokens"] == 6 for r in reports(err))  # the, the, a, cat, zebra, sat
    code, _, err = run(capsys, "rescore", kn, "--lattice", *upper, "--lowercase")
    assert code == 0 and [line for line in err.splitlines() if not line.startswith("{")] == []
    assert all(r["oov_tokens"] == 1 for r in reports(err))  # zebra
