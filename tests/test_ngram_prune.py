"""Pruning: lmplz's count pruning against KenLM's own pruned models, Stolcke's relative-entropy pruning
against a brute-force relative entropy, and both leave a model that sums to 1 after every context."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from seqlm.cli import main
from seqlm.data.corpus import encode_file
from seqlm.errors import SeqlmError
from seqlm.models.kn import KNConfig, estimate_kn
from seqlm.ngram import NGramModel
from seqlm.ngram.prune import _remove, entropy_deltas, history_log10, prune_entropy, recompute_backoffs
from test_kn import ORACLE, arpa_entries, estimated, needs_oracle, oracle_train, tiny_stream, token_log10

PRUNED = {"kn3-prune01": (3, "0 1"), "kn5-prune00112": (5, "0 0 1 1 2")}


def assert_every_context_normalised(model: NGramModel, batch: int = 400) -> None:
    """sum_w p(w | c) = 1 for every context c the model lists (every n-gram below the highest order) and
    the empty one; any other context backs off to one of these."""
    V, n = len(model.vocab), model.order - 1
    hists = [np.full((1, n), -1, dtype=np.int64)]
    for k in range(1, model.order):
        words = model.words_of(k, np.arange(model.sizes[k - 1])) if k > 1 else np.arange(V)[:, None]
        words = words[words[:, -1] != model.vocab.eos_id]  # nothing follows </s>
        hists.append(np.concatenate([np.full((len(words), n - k), -1, dtype=np.int64), words], axis=1))
    hist = np.concatenate(hists)  # (C, N-1) oldest first, -1 = none
    keep = np.ones(V, dtype=bool)
    keep[model.vocab.bos_id] = False  # <s> is never predicted
    for at in range(0, len(hist), batch):
        p = 10.0 ** model.log10_distribution(hist[at : at + batch])[:, keep]  # (b, V-1)
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=2e-6)


# ---- lmplz --prune --------------------------------------------------------------------------------


@needs_oracle
@pytest.mark.parametrize("memory", ["", "1M"])  # in memory, and every stage on files (the smallest budget)
@pytest.mark.parametrize("name", list(PRUNED))
def test_count_pruning_matches_lmplz(name: str, memory: str, tmp_path: Path) -> None:
    order, prune = PRUNED[name]
    vocab, stream = oracle_train()
    model = estimate_kn(KNConfig(order=order, prune=prune, memory=memory), stream, vocab)
    model = model.load() if memory else model  # the bounded estimate's tables are files until loaded
    model.to_arpa(tmp_path / "seqlm.arpa")
    ours, theirs = arpa_entries(tmp_path / "seqlm.arpa"), arpa_entries(ORACLE / f"{name}.arpa.gz")
    assert ours.keys() == theirs.keys()
    grams = list(ours)
    np.testing.assert_allclose([ours[g] for g in grams], [theirs[g] for g in grams], atol=1e-5)
    query = encode_file(ORACLE / "query.txt", model.vocab, use_cache=False)
    logp = token_log10(model, query)
    ref = np.loadtxt(ORACLE / f"query.{name}.tsv", skiprows=1, delimiter="\t")
    np.testing.assert_allclose(np.add.reduceat(logp, np.asarray(query.starts)[:-1]), ref[:, 1], atol=1e-4)
    summary = json.loads((ORACLE / "summary.json").read_text())[name]
    oov = np.asarray(query.ids) == model.vocab.unk_id
    assert 10 ** (-logp.mean()) == pytest.approx(summary["ppl_incl_oov"], rel=1e-6)
    assert 10 ** (-logp[~oov].mean()) == pytest.approx(summary["ppl_excl_oov"], rel=1e-6)
    assert_every_context_normalised(model)


def test_bounded_pruning_equals_in_memory() -> None:
    """--memory with --prune: the same tables bit for bit as in memory, read in chunks (5,242 rows at 1M)
    smaller than each order."""
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(60)]
    lines = [" ".join(rng.choice(words[: rng.integers(5, 60)], size=rng.integers(1, 14))) for _ in range(6000)]
    vocab, stream = tiny_stream(lines)
    for order, prune in ((3, "0 1"), (4, "0 0 1 2"), (5, "0 1 1 1 3")):
        full = estimate_kn(KNConfig(order=order, prune=prune), stream, vocab)
        bounded = estimate_kn(KNConfig(order=order, prune=prune, memory="1M"), stream, vocab).load()
        assert bounded.sizes == full.sizes and full.sizes[-1] > 0
        for name in ("keys", "log10_prob", "log10_backoff"):
            for a, b in zip(getattr(full, name), getattr(bounded, name), strict=True):
                np.testing.assert_array_equal(a, b)


@needs_oracle
def test_prune_flag_in_lmplz_syntax(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").symlink_to(ORACLE / "train.txt")
    for split in ("valid", "test"):
        (corpus / f"{split}.txt").symlink_to(ORACLE / "query.txt")
    out = tmp_path / "kn3p"
    assert main(["train", "--model", "kn", "--order", "3", "--prune", "0", "1", "--data", str(corpus),
                 "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["model"]["prune"] == "0 1"
    assert arpa_entries(out / "model.arpa").keys() == arpa_entries(ORACLE / "kn3-prune01.arpa.gz").keys()
    for bad in (["--prune", "1", "1"], ["--prune", "0", "2", "1"], ["--prune", "0", "x"], ["--prune-entropy", "-1"]):
        capsys.readouterr()
        assert main(["train", "--model", "kn", "--data", str(corpus), "--out", str(tmp_path / "bad"), *bad]) == 2
        err = capsys.readouterr().err
        assert "--prune" in err and len(err.strip().splitlines()) == 1


# ---- relative-entropy pruning (Stolcke 1998) ----------------------------------------------------------


def tiny_model() -> NGramModel:
    vocab, stream = tiny_stream(["the cat sat on the mat", "the dog sat on a mat", "a cat ran", "the dog ran on",
                                 "a dog sat", "the cat ran on the mat"] * 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return estimate_kn(KNConfig(order=3), stream, vocab)


def brute_force_delta(model: NGramModel, k: int, i: int) -> float:
    """P(h) sum_w p(w|h) ln(p(w|h) / p'(w|h)) over the whole vocabulary, p' the model without n-gram i
    of order k and with bo(h) renormalised."""
    V = len(model.vocab)
    keep = np.ones(model.sizes[k - 1], dtype=bool)
    keep[i] = False
    without = recompute_backoffs(_remove(model, k, keep))
    h = model.words_of(k - 1, np.array([model.keys[k - 1][i] // V]))  # (1, k-1)
    hist = np.concatenate([np.full((1, model.order - k), -1), h], axis=1)
    mask = np.arange(V) != model.vocab.bos_id
    p = 10.0 ** model.log10_distribution(hist)[0, mask]
    q = 10.0 ** without.log10_distribution(hist)[0, mask]
    return float(10.0 ** history_log10(model, h)[0] * np.sum(p * np.log(p / q)))


def test_entropy_deltas_equal_brute_force_relative_entropy() -> None:
    model = recompute_backoffs(tiny_model())  # back-offs exactly consistent with the float32 probabilities
    V = len(model.vocab)
    for k in (2, 3):
        deltas = entropy_deltas(model, k)
        contexts = set(np.unique(model.keys[k] // V).tolist()) if k < model.order else set()
        leaves = [i for i in range(model.sizes[k - 1]) if i not in contexts]  # removable on their own
        assert len(leaves) >= 4
        for i in leaves:
            assert deltas[i] == pytest.approx(brute_force_delta(model, k, i), rel=1e-3, abs=1e-9), (k, i)


def test_entropy_pruning_keeps_exactly_the_costly_ngrams_and_stays_normalised() -> None:
    model = tiny_model()
    deltas = entropy_deltas(model, 3)
    threshold = float(np.median(deltas))
    pruned = prune_entropy(model, threshold)
    V = len(model.vocab)
    kept = {tuple(r) for r in pruned.words_of(3, np.arange(pruned.sizes[2])).tolist()}
    expected = {tuple(r) for r in model.words_of(3, np.flatnonzero(deltas >= threshold)).tolist()}
    assert kept == expected and 0 < len(kept) < model.sizes[2]
    contexts = {tuple(r) for r in pruned.words_of(2, np.unique(pruned.keys[2] // V)).tolist()}
    assert contexts <= {tuple(r) for r in pruned.words_of(2, np.arange(pruned.sizes[1])).tolist()}
    assert_every_context_normalised(pruned)
    assert_every_context_normalised(prune_entropy(model, math.inf))  # everything but the unigrams goes
    assert prune_entropy(model, math.inf).sizes[1:] == [0, 0]


@needs_oracle
def test_entropy_pruning_on_kenlm_oracle_model() -> None:
    model = estimated(3)
    sizes, ppls = [], []
    query = encode_file(ORACLE / "query.txt", model.vocab, use_cache=False)
    for threshold in (0.0, 1e-7, 1e-6):
        pruned = prune_entropy(model, threshold) if threshold else model
        sizes.append(sum(pruned.sizes))
        ppls.append(10 ** (-token_log10(pruned, query).mean()))
        if threshold:
            assert_every_context_normalised(pruned)
    assert sizes[0] > sizes[1] > sizes[2]  # a higher threshold prunes more ...
    assert ppls[0] < ppls[1] < ppls[2] < 1.05 * ppls[0]  # ... and costs a little held-out perplexity


def test_config_refuses_bad_pruning_values() -> None:
    for bad in ("1", "0 2 1", "0 -1", "", "a"):
        with pytest.raises(SeqlmError, match="--prune"):
            KNConfig(prune=bad)
    with pytest.raises(SeqlmError, match="--prune-entropy"):
        KNConfig(prune_entropy=-1e-9)
    assert KNConfig(prune="0 1").thresholds == (0, 1) and KNConfig(prune="0,0,1").thresholds == (0, 0, 1)
