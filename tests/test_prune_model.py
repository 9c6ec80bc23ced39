"""`seqlm prune` on finished models (ngram/shrink.py): entropy pruning equal to pruning at estimation, orders
dropped (every context still sums to 1), a vocabulary kept (sentences of its words score as before); the
kenlm module reads and scores every file written (the independent scorer), and bad requests exit 2."""

from __future__ import annotations

import itertools
import json
import warnings

import pytest

from conftest import require_module, run_cli, write_corpus


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("prune")
    corpus = write_corpus(d / "corpus", n_train=400)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback-discount warnings of a tiny corpus
        from seqlm.cli import main

        for out, extra in (("full", []), ("pruned", ["--prune-entropy", "2e-4"])):
            assert main(["train", "--model", "kn", "--order", "4", "--data", str(corpus), "--out", str(d / out),
                         *extra]) == 0
    return d, corpus


@pytest.mark.parametrize("src", ["full", "full/model.arpa", "full/model.bin"])
def test_entropy_pruning_a_saved_model_equals_pruning_at_estimation(models, capsys, src):
    d, _ = models
    code, out, err = run_cli(capsys, "prune", d / src, d / "p.arpa", "--entropy", "2e-4", "--force")
    assert code == 0, err
    report = json.loads(out)
    assert sum(report["ngrams"]) < sum(report["ngrams_before"])
    assert (d / "p.arpa").read_text() == (d / "pruned" / "model.arpa").read_text()


def _words(arpa) -> list[str]:
    lines = arpa.read_text().split("\\1-grams:")[1].split("\\2-grams:")[0].strip().splitlines()
    return [line.split("\t")[1] for line in lines]


def test_fewer_orders_keep_the_lower_numbers_and_still_sum_to_one(models, capsys):
    kenlm = require_module("kenlm", "the kenlm module scores the written file")
    d, _ = models
    code, _, err = run_cli(capsys, "prune", d / "full", d / "o2.arpa", "--order", "2", "--force")
    assert code == 0, err
    small = kenlm.Model(str(d / "o2.arpa"))
    assert small.order == 2
    words = [w for w in _words(d / "o2.arpa") if w != "<s>"]
    for prev in ["<s>", *words[:6]]:
        state = kenlm.State()
        (small.BeginSentenceWrite if prev == "<s>" else small.NullContextWrite)(state)
        if prev != "<s>":
            small.BaseScore(state, prev, state)
        total = sum(10 ** small.BaseScore(state, w, kenlm.State()) for w in words)
        assert total == pytest.approx(1.0, abs=1e-5)
    # a bigram model scores a bigram-listed pair as the 4-gram model does after <s> (both read the same bigram)
    for a, b in itertools.islice(itertools.product(words, words), 20):
        one = list(small.full_scores(f"{a} {b}", eos=False))[1]
        if one[1] == 2:  # a listed bigram: its number is the 4-gram model's
            assert one[0] == pytest.approx(_bigram(d / "full" / "model.arpa", a, b), abs=1e-6)


def _bigram(arpa, a: str, b: str) -> float:
    for line in arpa.read_text().split("\\2-grams:")[1].split("\\3-grams:")[0].strip().splitlines():
        parts = line.split("\t")
        if parts[1] == f"{a} {b}":
            return float(parts[0])
    raise AssertionError(f"{a} {b} is not listed")


def test_a_vocabulary_keeps_its_sentences_scores(models, capsys, tmp_path):
    kenlm = require_module("kenlm", "the kenlm module scores the written file")
    d, _ = models
    keep = ["the", "cat", "sat", "mat"]
    (tmp_path / "words.txt").write_text("\n".join(keep) + "\n")
    code, out, err = run_cli(capsys, "prune", d / "full", tmp_path / "v.bin", "--vocab", tmp_path / "words.txt")
    assert code == 0, err
    code, _, err = run_cli(capsys, "convert", tmp_path / "v.bin", tmp_path / "v.arpa")
    assert code == 0, err
    assert sorted(_words(tmp_path / "v.arpa")) == sorted([*keep, "<s>", "</s>", "<unk>"])
    full, small = kenlm.Model(str(d / "full" / "model.arpa")), kenlm.Model(str(tmp_path / "v.arpa"))
    lines = [" ".join(s) for n in (1, 3, 5) for s in itertools.islice(itertools.product(keep, repeat=n), 40)]
    for line in lines:
        assert small.score(line) == pytest.approx(full.score(line), abs=1e-5)


@pytest.mark.parametrize("argv, says", [
    ([], "give what to prune"),
    (["--prune", "1"], "needs the n-gram counts"),
    (["--order", "7"], "orders 1..4"),
    (["--entropy", "-1"], "must be >= 0"),
])
def test_bad_requests_exit_2_and_write_nothing(models, capsys, tmp_path, argv, says):
    d, _ = models
    code, _, err = run_cli(capsys, "prune", d / "full", tmp_path / "x.arpa", *argv)
    assert code == 2 and says in err and err.count("\n") == 1 and not (tmp_path / "x.arpa").exists()


def test_an_existing_output_is_kept_without_force(models, capsys, tmp_path):
    d, _ = models
    (tmp_path / "x.arpa").write_text("mine")
    code, _, err = run_cli(capsys, "prune", d / "full", tmp_path / "x.arpa", "--order", "2")
    assert code == 2 and (tmp_path / "x.arpa").read_text() == "mine"
