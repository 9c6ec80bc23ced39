"""Lattices: SLF / Kaldi readers and writers, exact expansion against sentence scoring, `seqlm rescore --lattice`."""

from __future__ import annotations

import gzip
import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import TINY, shared_data

import seqlm
from seqlm.cli import main
from seqlm.data.corpus import encode_sentences
from seqlm.eval.perplexity import score_tokens
from seqlm.lattice import WordMap, best_paths, expand, read_lattices, same_graph, words_of, write_lattices
from seqlm.lattice.expand import NOT_PREDICTED

DATA = shared_data()
pytestmark = pytest.mark.skipif(DATA is None, reason="needs the shared lattices (SEQLM_DATA)")
SMALL = DATA / "lattices" / "small" if DATA else Path()
AMI = sorted((DATA / "lattices" / "ami").glob("*.lat.gz")) if DATA else []
SMALLEST_AMI = DATA / "lattices" / "ami" / "AMI-3E0501_u3005_134465_134730.lat.gz" if DATA else Path()


def _slf():
    return read_lattices(SMALL / "lattice.slf")[1][0]


def _kaldi():
    return read_lattices(SMALL / "lattice.lat", SMALL / "words.txt")[1][0]


def test_both_formats_give_the_same_graph():
    slf, kaldi = _slf(), _kaldi()
    assert (slf.num_nodes, len(slf.arcs), slf.start, slf.end) == (24, 39, 0, 23)
    assert (slf.lmscale, slf.wdpenalty) == (12.3, 0.7)
    assert same_graph(slf, kaldi)
    assert {a.word for a in slf.arcs if a.src == 4 and a.dst == 14} == {"the"}


def test_write_and_read_back_is_lossless(tmp_path):
    for lat, fmt, name in ((_slf(), "slf", "a.slf"), (_kaldi(), "kaldi", "a.lat"),
                           (read_lattices(SMALLEST_AMI)[1][0], "slf", "ami.lat.gz")):
        write_lattices([lat], tmp_path / name, fmt, SMALL / "words.txt")
        back = read_lattices(tmp_path / name, SMALL / "words.txt")[1][0]
        assert same_graph(lat, back, tol=1e-9)
        assert [a.word for a in back.arcs] == [a.word for a in lat.arcs]  # spelling of null words kept
        assert [a.fields for a in back.arcs] == [a.fields for a in lat.arcs]
        assert (back.lmscale, back.wdpenalty, back.words_on_nodes) == (lat.lmscale, lat.wdpenalty, lat.words_on_nodes)
        assert back.node_fields == lat.node_fields


def test_all_ami_lattices_read():
    assert len(AMI) == 8
    for path in AMI:
        lat = read_lattices(path)[1][0]
        header = gzip.decompress(path.read_bytes()).decode()
        n, links = map(int, re.search(r"^N=(\d+)\s+L=(\d+)", header, re.M).groups())
        assert (lat.num_nodes, len(lat.arcs)) == (n, links)
        assert 834 <= lat.num_nodes <= 4967 and lat.words_on_nodes and lat.lmscale == 14.0
        # words sit on nodes: every link into a node carries that node's word
        assert all(a.word == lat.node_fields[a.dst]["W"] for a in lat.arcs)


def _corpus(tmp_path: Path, lat, n: int = 300, lowercase: bool = False) -> Path:
    """Sentences from the lattice's own paths (and shuffles of them), so the models know its words."""
    rng = random.Random(0)
    sents = [[w.lower() if lowercase else w for w in words_of(p) if w not in NOT_PREDICTED]
             for p in lat.paths(limit=2000)]
    lines = []
    for _ in range(n):
        s = list(rng.choice(sents))
        if rng.random() < 0.3:
            rng.shuffle(s)
        lines.append(" ".join(s))
    d = tmp_path / "corpus"
    d.mkdir(exist_ok=True)
    for split in ("train", "valid", "test"):
        (d / f"{split}.txt").write_text("\n".join(lines[: n if split == "train" else 30]) + "\n")
    return d


def _train(tmp_path: Path, corpus: Path, name: str, *opts: str) -> Path:
    out = tmp_path / name
    assert main(["train", "--data", str(corpus), "--out", str(out), *opts]) == 0
    return out


def _finite(model):
    assert model.capabilities().context_order is not None  # n-gram, FNN and AFP-K models say their order themselves
    return model


def _sentence_lnp(model, sentences: list[list[str]]) -> np.ndarray:
    return score_tokens(model, encode_sentences(sentences, model.vocab)).sentence_totals()


def _check_every_path(lat, model, words: WordMap, **kw) -> None:
    exp = expand(lat, model, words, **kw)
    paths = list(exp.lattice.paths())
    assert len(paths) == sum(1 for _ in lat.paths())  # expansion keeps every path, once
    sents = [[w for w in words_of(p) if w not in NOT_PREDICTED] for p in paths]
    mapped = [[w.lower() if words.lowercase else w for w in s] for s in sents]
    want = _sentence_lnp(model, mapped)
    got = np.array([sum(a.lm for a in p) for p in paths])
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert sorted(map(tuple, sents)) == sorted(tuple(w for w in words_of(p) if w not in NOT_PREDICTED)
                                               for p in lat.paths())
    return exp


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models")
    corpus = _corpus(tmp, _slf())
    return {"kn3": _train(tmp, corpus, "kn3", "--model", "kn", "--order", "3"),
            "afp2": _train(tmp, corpus, "afp2", "--model", "afp", "--iterations", "2", "--max-epochs", "1", *TINY),
            "rnn": _train(tmp, corpus, "rnn", "--model", "rnn", "--max-epochs", "1", *TINY),
            "fnn3": _train(tmp, corpus, "fnn3", "--model", "fnn", "--order", "3", "--embed", "8", "--hidden", "16",
                           "--max-epochs", "1", "--threads", "1"),
            "corpus": corpus}


def test_every_path_score_is_the_sentence_score_for_exact_models(models):
    lat = _slf()
    for name, order in (("kn3", 3), ("afp2", 3), ("fnn3", 3)):
        model = _finite(seqlm.load(models[name]))
        exp = _check_every_path(lat, model, WordMap(model.vocab))
        assert exp.exact and exp.order == order
        assert exp.states > lat.num_nodes  # the expansion did split nodes


def test_unbounded_rnn_is_flagged_approximate_and_exact_with_a_long_enough_merge_order(models):
    lat, model = _slf(), seqlm.load(models["rnn"])
    short = expand(lat, model, WordMap(model.vocab), merge_order=2)
    assert not short.exact and short.order == 2
    long = _check_every_path(lat, model, WordMap(model.vocab), merge_order=10)  # longer than any path: no merging
    assert not long.exact  # the model does not say it is finite: still reported as approximate
    assert short.states < long.states


def test_beam_and_state_cap_are_off_by_default_and_reported_when_they_bind(models):
    lat, model = _slf(), _finite(seqlm.load(models["kn3"]))
    free = expand(lat, model, WordMap(model.vocab))
    assert free.pruned_beam == free.pruned_cap == 0
    capped = expand(lat, model, WordMap(model.vocab), max_states=1)
    assert capped.pruned_cap > 0 and not capped.exact and capped.max_states_per_node == 1
    beamed = expand(lat, model, WordMap(model.vocab), beam=1.0)
    assert beamed.pruned_beam > 0 and not beamed.exact


def test_exact_one_best_equals_exhaustive_nbest_rescoring_on_the_smallest_ami_lattice(tmp_path):
    lat = read_lattices(SMALLEST_AMI)[1][0]
    corpus = _corpus(tmp_path, lat, lowercase=True)
    model = _finite(seqlm.load(_train(tmp_path, corpus, "kn3", "--model", "kn", "--order", "3")))
    words = WordMap(model.vocab, lowercase=True)
    exp = expand(lat, model, words)
    assert exp.exact
    (best_total, best_arcs), = best_paths(exp.lattice, 1)
    # every path of the lattice (597), its sentence scored by the model: the same best total and words
    paths = list(lat.paths())
    assert len(paths) == 597
    sents = [[w.lower() for w in words_of(p) if w not in NOT_PREDICTED] for p in paths]
    lm = _sentence_lnp(model, sents)
    totals = np.array([sum(lat.total(a, 0.0) for a in p) for p in paths]) + lat.lmscale * lm
    i = int(np.argmax(totals))
    assert best_total == pytest.approx(totals[i], abs=1e-3)
    assert [w.lower() for w in words_of(best_arcs) if w not in NOT_PREDICTED] == sents[i]
    # and the 5 best of the expanded lattice are the 5 best sentences of the list
    top = best_paths(exp.lattice, 5)
    np.testing.assert_allclose([t for t, _ in top], np.sort(totals)[::-1][:5], atol=1e-3)


def scored_paths(lat):
    """(words, lm, acoustic) of every path: node numbers follow arc order, which differs between files."""
    return sorted((tuple(words_of(p)), round(sum(a.lm for a in p), 3), round(sum(a.acoustic for a in p), 2))
                  for p in lat.paths())


def test_cli_rescores_lattices_in_their_own_format(models, tmp_path, capsys):
    kn = str(models["kn3"])  # kn without context_order: merged at its order, reported approximate
    out = tmp_path / "out"
    code = main(["rescore", str(models["afp2"]), "--lattice", str(SMALL / "lattice.slf"), str(SMALL / "lattice.lat"),
                 "--words", str(SMALL / "words.txt"), "--lattice-out", str(out), "--nbest-decode", "3",
                 "--nbest-out", str(out / "nbest.tsv")])
    assert code == 0
    captured = capsys.readouterr()
    best = captured.out.splitlines()
    assert len(best) == 2 and best[0].split()[0] == "utterance_123" and best[0].split()[1:] == best[1].split()[1:]
    reports = [json.loads(line) for line in captured.err.splitlines() if line.startswith("{")]
    assert all(r["exact"] and r["order"] == 3 for r in reports)
    slf = read_lattices(out / "lattice.slf")[1][0]
    kaldi = read_lattices(out / "lattice.lat", SMALL / "words.txt")[1][0]
    assert slf.num_nodes == kaldi.num_nodes == reports[0]["expanded_nodes"] == reports[1]["expanded_nodes"]

    assert scored_paths(slf) == [(tuple(w for w in ws if w not in ("!ENTER", "!EXIT")), lm, ac)
                                 for ws, lm, ac in scored_paths(kaldi)] or scored_paths(slf) == scored_paths(kaldi)
    nbest = (out / "nbest.tsv").read_text().splitlines()
    assert nbest[0].startswith("key") and len(nbest) == 1 + 2 * 3
    # --new-lm-weight 0 keeps the old LM scores (on the expanded lattice); 0.5 is halfway
    for w in ("0", "0.5"):
        assert main(["rescore", kn, "--lattice", str(SMALL / "lattice.slf"), "--lattice-out", str(tmp_path / w),
                     "--new-lm-weight", w, "--merge-order", "3"]) == 0
    old, half = (read_lattices(tmp_path / w / "lattice.slf")[1][0] for w in ("0", "0.5"))
    assert scored_paths(old) == scored_paths(_slf())
    assert any(abs(a.lm - b.lm) > 1e-3 for a, b in zip(old.arcs, half.arcs, strict=True))
    reports = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert reports and all(r["exact"] and r["order"] == 3 for r in reports)  # KN3 says its order: exact
    assert main(["rescore", str(models["rnn"]), "--lattice", str(SMALL / "lattice.slf"), "--lattice-out",
                 str(tmp_path / "rnn")]) == 0  # an unbounded history: merged, and the output says so
    reports = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert reports and not reports[0]["exact"] and reports[0]["note"].startswith("approximate")


def test_cli_bad_lattices_are_one_line_errors(models, tmp_path, capsys):
    bad = tmp_path / "bad.slf"
    bad.write_text("VERSION=1.0\nN=2 L=1\nI=0\nI=1\nJ=0 S=0 E=5 W=a a=0 l=0\n")
    cyc = tmp_path / "cyc.slf"
    cyc.write_text("N=2 L=2\nI=0\nI=1\nJ=0 S=0 E=1 W=a\nJ=1 S=1 E=0 W=b\n")
    for argv in (["--lattice", str(bad)], ["--lattice", str(cyc)], ["--lattice", str(SMALL / "lattice.lat")],
                 ["--lattice", str(tmp_path / "missing.slf")]):
        capsys.readouterr()
        assert main(["rescore", str(models["kn3"]), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("seqlm: error:") and "\n" not in err


def test_slf_base_and_words_map(tmp_path, models):
    """base=10 scores are read as natural logs and written back in base 10; --map and --lowercase apply."""
    text = (SMALL / "lattice.slf").read_text().replace("lmscale=12.3", "base=10.0 lmscale=12.3")
    (tmp_path / "b10.slf").write_text(text)
    b10, e = read_lattices(tmp_path / "b10.slf")[1][0], _slf()
    assert all(abs(x.lm - y.lm * math.log(10)) < 1e-9 for x, y in zip(b10.arcs, e.arcs, strict=True))
    write_lattices([b10], tmp_path / "back.slf", "slf")
    assert "l=-87.29 " in (tmp_path / "back.slf").read_text()  # still base 10 in the file
    model = seqlm.load(models["kn3"])
    words = WordMap(model.vocab, lowercase=True, mapping={"DIDN'T": "it"})
    assert words.token("DIDN'T") == model.vocab.id("it") and words.token("THE") == model.vocab.id("the")
    assert words.token("zzz") == model.vocab.unk_id and words.unknown == {"zzz"}
    assert words.token("!NULL") is None and words.token("<s>") is None and words.token("</s>") is None
    mapping = tmp_path / "map.txt"
    mapping.write_text("didn't it\n")
    assert main(["rescore", str(models["kn3"]), "--lattice", str(SMALL / "lattice.slf"), "--map", str(mapping),
                 "--best", str(tmp_path / "best.txt")]) == 0
    best = (tmp_path / "best.txt").read_text().split()
    assert best[0] == "utterance_123" and "didn't" in best  # every path has it: the lattice's spelling is kept
