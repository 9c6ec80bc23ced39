"""`seqlm query --format srilm` (SRILM's `ngram -ppl - -debug N`) and `seqlm query -n` (KenLM query's -n).

References: hand-written ARPA models whose every probability is known (the SRILM lines and the ppl / ppl1
formulas checked against hand computation), and the real kenlm module (`-n`: `score(s, bos=False, eos=False)`).
"""

from __future__ import annotations

import io
import math
import random
from pathlib import Path

import numpy as np
import pytest

import seqlm
from seqlm.cli import main

from conftest import SEQ_LEN, TINY, WORDS, require_module, write_corpus

kenlm = require_module("kenlm", "the kenlm Python module is not installed (pip install -e '.[kenlm]')")

LOG = math.log10


def query(capsys, monkeypatch, text: str, *argv) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    code = main(["query", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def g(x: float) -> str:
    return f"{x:.7g}"  # SRILM prints a float log probability with 7 significant digits


def stats(sentences: int, words: int, oovs: int, zeroprobs: int, logprob: float) -> str:
    kept = words - oovs - zeroprobs
    return (f"{sentences} sentences, {words} words, {oovs} OOVs\n{zeroprobs} zeroprobs, logprob= {g(logprob)} "
            f"ppl= {g(10 ** (-logprob / (kept + sentences)))} ppl1= {g(10 ** (-logprob / kept))}\n")


def f32(*probs: float) -> float:
    """log10 of a product of probabilities as the model holds them: each factor's log10 a float32 (as in the
    ARPA file, and in SRILM's tables), summed."""
    return sum(float(np.float32(LOG(p))) for p in probs)


def word(w: str, before: str, tag: str, *probs: float) -> str:
    return f"\tp( {w} | {before}) \t= {tag} {g(10 ** f32(*probs))} [ {g(f32(*probs))} ]\n"


@pytest.fixture(scope="module")
def bigram(tmp_path_factory) -> Path:
    """A normalised bigram model: p(a | <s>) .6, p(b | a) .5, p(</s> | b) .7, back-offs (1 - listed) / (1 - unigram)."""
    path = tmp_path_factory.mktemp("hand") / "bigram.arpa"
    uni = [(0.3, "</s>", 1), (0.1, "<unk>", 1), (0.35, "a", 0.5 / 0.75), (0.25, "b", 0.3 / 0.7), (0, "<s>", 0.4 / 0.65)]
    lines = ["\\data\\", "ngram 1=5", "ngram 2=3", "", "\\1-grams:"]
    lines += [f"{LOG(p) if p else -99}\t{w}\t{LOG(bo)}" for p, w, bo in uni]
    lines += ["", "\\2-grams:", f"{LOG(0.6)}\t<s> a", f"{LOG(0.5)}\ta b", f"{LOG(0.7)}\tb </s>", "", "\\end\\", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def test_srilm_debug2_lines_and_statistics_are_the_hand_computed_ones(bigram, capsys, monkeypatch):
    code, out, _ = query(capsys, monkeypatch, "a b\n\nb zebra a\n", bigram, "--format", "srilm")
    assert code == 0
    first = [(0.6,), (0.5,), (0.7,)]  # every bigram listed
    second = [(0.4 / 0.65, 0.25), (0.3 / 0.7, 0.1), (0.35,), (0.5 / 0.75, 0.3)]  # backed off: bo(context) p(w)
    lp1, lp2 = sum(f32(*x) for x in first), sum(f32(*x) for x in second)
    want = ("a b\n" + word("a", "<s> ", "[2gram]", 0.6) + word("b", "a ...", "[2gram]", 0.5)
            + word("</s>", "b ...", "[2gram]", 0.7) + stats(1, 2, 0, 0, lp1) + "\n"
            + "b zebra a\n" + word("b", "<s> ", "[1gram]", *second[0]) + word("<unk>", "b ...", "[1gram]", *second[1])
            + word("a", "<unk> ...", "[1gram]", *second[2]) + word("</s>", "a ...", "[1gram]", *second[3])
            + stats(1, 3, 0, 0, lp2) + "\n"  # an unknown word has <unk>'s probability: a word, not an OOV
            + "file -: " + stats(2, 5, 0, 0, lp1 + lp2))
    assert out == want
    # the formulas, by hand: ppl over words + sentences, ppl1 over words
    assert out.splitlines()[-1].endswith(f"ppl= {g(10 ** (-(lp1 + lp2) / 7))} ppl1= {g(10 ** (-(lp1 + lp2) / 5))}")


def test_srilm_debug_levels(bigram, capsys, monkeypatch):
    lp = f32(0.6) + f32(0.5) + f32(0.7)
    assert query(capsys, monkeypatch, "a b\n", bigram, "--format", "srilm", "-v", "sentence")[1] == \
        "a b\n" + stats(1, 2, 0, 0, lp) + "\n" + "file -: " + stats(1, 2, 0, 0, lp)
    assert query(capsys, monkeypatch, "a b\n", bigram, "--format", "srilm", "-v", "summary")[1] == \
        "file -: " + stats(1, 2, 0, 0, lp)


def test_srilm_zero_probabilities_are_oovs_or_zeroprobs(tmp_path, capsys, monkeypatch):
    """A model without <unk> (SRILM's closed vocabulary) and a word at -99: probability 0, left out of logprob."""
    path = tmp_path / "closed.arpa"
    path.write_text("\\data\\\nngram 1=4\n\n\\1-grams:\n-0.30103\t</s>\n-0.30103\ta\n-99\tb\n-99\t<s>\n\n\\end\\\n",
                    encoding="utf-8")
    with pytest.warns(UserWarning, match="no <unk>"):
        code, out, _ = query(capsys, monkeypatch, "a zebra b\n", path, "--format", "srilm")
    assert code == 0
    assert out == ("a zebra b\n" + word("a", "<s> ", "[1gram]", 0.5) + "\tp( <unk> | a ...) \t= [OOV] 0 [ -inf ]\n"
                   + "\tp( b | <unk> ...) \t= [1gram] 0 [ -inf ]\n" + word("</s>", "b ...", "[1gram]", 0.5)
                   + stats(1, 3, 1, 1, f32(0.5, 0.5)) + "\n" + "file -: " + stats(1, 3, 1, 1, f32(0.5, 0.5)))


@pytest.fixture(scope="module")
def kn3(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("kn")
    corpus = write_corpus(d / "corpus", n_train=150)
    assert main(["train", "--model", "kn", "--order", "3", "--data", str(corpus), "--out", str(d / "kn3")]) == 0
    return d / "kn3"


def sentences(seed: int, n: int = 25) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS + ["zebra", "<unk>"]) for _ in range(rng.randint(1, 9))) for _ in range(n)]


def test_null_context_matches_kenlm_without_bos_and_eos(kn3, capsys, monkeypatch):
    lines = sentences(1)
    code, out, _ = query(capsys, monkeypatch, "\n".join(lines) + "\n", kn3, "-n")
    assert code == 0
    theirs = kenlm.Model(str(kn3 / "model.arpa"))
    total, tokens, oov = 0.0, 0, 0
    for s, got in zip(lines, out.splitlines(), strict=False):
        ref = list(theirs.full_scores(s, bos=False, eos=False))
        fields = got.split("\t")
        assert len(fields) == len(ref) + 1  # no </s>
        for f, (p, n, _) in zip(fields, ref, strict=False):
            _, length, logp = f.rpartition("=")[2].split(" ")  # word=id length log10p
            assert int(length) == n
            assert float(logp) == pytest.approx(p, abs=1e-5)
        assert float(fields[-1].split()[1]) == pytest.approx(theirs.score(s, bos=False, eos=False), abs=1e-4)
        assert int(fields[-1].split()[3]) == sum(x[2] for x in ref)
        total, tokens, oov = total + sum(x[0] for x in ref), tokens + len(ref), oov + sum(x[2] for x in ref)
    summary = dict(line.split("\t") for line in out.splitlines()[-4:])
    assert float(summary["Perplexity including OOVs:"]) == pytest.approx(10 ** (-total / tokens), rel=1e-5)
    assert (int(summary["OOVs:"]), int(summary["Tokens:"])) == (oov, tokens)


def test_srilm_format_of_a_kn_model_matches_kenlm(kn3, capsys, monkeypatch):
    lines = sentences(2)
    code, out, _ = query(capsys, monkeypatch, "\n".join(lines) + "\n", kn3, "--format", "srilm")
    assert code == 0
    theirs = kenlm.Model(str(kn3 / "model.arpa"))
    got = [line for line in out.splitlines() if line.startswith("\tp( ")]
    ref = [x for s in lines for x in theirs.full_scores(s)]
    assert len(got) == len(ref)
    for line, (p, n, _) in zip(got, ref, strict=True):
        tag, _, logp = line.split("= ")[1].partition(" ")
        assert tag == f"[{n}gram]"
        assert float(logp.split("[ ")[1].rstrip(" ]")) == pytest.approx(p, abs=1e-6)
    logprob = sum(x[0] for x in ref)  # every token of a kn model has a non-zero probability: no OOVs
    words, sents = sum(len(s.split()) for s in lines), len(lines)
    head, tail = out.splitlines()[-2:]
    assert head == f"file -: {sents} sentences, {words} words, 0 OOVs"
    f = tail.split()  # 0 zeroprobs, logprob= L ppl= P ppl1= P1; 7 digits, kenlm's sums are float32
    assert f[:3] == ["0", "zeroprobs,", "logprob="]
    want = (logprob, 10 ** (-logprob / (words + sents)), 10 ** (-logprob / words))
    for i, w in zip((3, 5, 7), want, strict=True):
        assert float(f[i]) == pytest.approx(w, rel=2e-6)


def test_srilm_format_of_a_neural_model_has_no_ngram_tags(tmp_path, capsys, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus", n_train=40, n_eval=5)
    assert main(["train", "--model", "fnn", "--max-epochs", "1", SEQ_LEN, "8", *TINY, "--data", str(corpus),
                 "--out", str(tmp_path / "fnn")]) == 0
    lines = sentences(3, 6)
    code, out, _ = query(capsys, monkeypatch, "\n".join(lines) + "\n", tmp_path / "fnn", "--format", "srilm")
    assert code == 0
    per_token = [float(line.split("[ ")[-1].rstrip(" ]")) for line in out.splitlines() if line.startswith("\tp( ")]
    assert all("\t=  " in line for line in out.splitlines() if line.startswith("\tp( "))  # no [Ngram] tag
    ref = seqlm.score_text(seqlm.load(tmp_path / "fnn"), [s.split() for s in lines])
    np.testing.assert_allclose(per_token, np.concatenate(ref), atol=1e-6)
    code, _, err = query(capsys, monkeypatch, "a\n", tmp_path / "fnn")  # KenLM's lines need n-gram lengths
    assert code == 2 and "is a fnn model directory" in err
    code, out, err = query(capsys, monkeypatch, "a\n", tmp_path / "fnn", "--format", "srilm", "-l", "lazy")
    assert code == 2 and out == "" and err.count("\n") == 1 and "-l lazy" in err  # no load method to honour


@pytest.mark.parametrize("fmt", ["kenlm", "srilm"])
def test_lazy_load_prints_what_the_default_prints(kn3, capsys, monkeypatch, fmt):
    """KenLM query's -l: lazy leaves out the per-call tables, the numbers stay the same."""
    text = "\n".join(sentences(20, 8)) + "\n"
    outputs = [query(capsys, monkeypatch, text, kn3, "--format", fmt, *load) for load in ([], ["-l", "lazy"])]
    assert outputs[0][0] == 0 and outputs[0] == outputs[1]


def test_null_context_with_srilm_format_is_refused(kn3, capsys, monkeypatch):
    code, out, err = query(capsys, monkeypatch, "a\n", kn3, "-n", "--format", "srilm")
    assert code == 2 and out == "" and err.count("\n") == 1 and "-n" in err
