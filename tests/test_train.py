"""The one training loop: schedule, determinism, precision, limits, metrics.

Learning is measured against a reference computed here: the unigram perplexity of the tiny corpus
(maximum likelihood on train, scored on valid, </s> counted), which a model must beat by a stated
margin. (A uniform guess over its 14 tokens is 14; the unigram model about 11.5.)
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import seqlm
from seqlm.cli import main
from seqlm.data.corpus import build_vocab_and_encode
from seqlm.models.rnn import RNNConfig
from seqlm.registry import FAMILIES
from seqlm.train.schedule import NewBob

from conftest import TINY, write_corpus

N_TRAIN = 600  # sentences: enough for 3 epochs to beat the unigram model clearly, in seconds


def unigram_ppl(corpus: Path) -> float:
    """Perplexity of valid.txt under the maximum-likelihood unigram model of train.txt (</s> counted)."""
    def sentences(split: str) -> list[list[str]]:
        return [line.split() + ["</s>"] for line in (corpus / f"{split}.txt").read_text().splitlines()]

    counts = Counter(w for s in sentences("train") for w in s)
    total = sum(counts.values())
    valid = [w for s in sentences("valid") for w in s]
    return math.exp(-sum(math.log(counts[w] / total) for w in valid) / len(valid))


def test_newbob_keeps_then_halves_for_a_fixed_number_of_epochs():
    s = NewBob(lr=0.4, min_improvement=1.0, halving_epochs=3)
    lrs = []
    for ppl in [300, 200, 150, 149.5, 149, 148, 147.9, 150]:
        if s.done:
            break
        s.update(ppl)
        lrs.append(s.lr)
    # improves by >= 1 until 150 -> 149.5, then three halvings and stop
    assert lrs == [0.4, 0.4, 0.4, 0.2, 0.1, 0.05, 0.025] and s.done


def _train(tmp_path, name: str, *extra: str) -> list[dict]:
    corpus = tmp_path / "corpus"
    if not corpus.exists():
        write_corpus(corpus, n_train=N_TRAIN)
    out = tmp_path / name
    assert main(["train", "--model", "fnn", "--data", str(corpus), "--out", str(out), "--seq-len", "20",
                 "--max-epochs", "2", *TINY, *extra]) == 0
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_same_seed_same_run_other_seed_other_run(tmp_path):
    a = _train(tmp_path, "a", "--seed", "3")
    b = _train(tmp_path, "b", "--seed", "3")
    c = _train(tmp_path, "c", "--seed", "4")
    assert [r["valid_ppl"] for r in a] == [r["valid_ppl"] for r in b]
    assert [r["valid_ppl"] for r in a] != [r["valid_ppl"] for r in c]


def test_training_keeps_freed_memory_for_its_next_step(tmp_path, monkeypatch):
    """Training raises glibc's mmap and trim thresholds (train/memory.py): where glibc is, mallopt accepts both
    (a wrong parameter or value is refused, False), and `seqlm train` sets them before its first step, unless
    --keep-memory false."""
    import platform

    from seqlm.train import loop, memory

    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert memory.keep_freed_memory()
    calls = []
    monkeypatch.setattr(loop, "keep_freed_memory", lambda: calls.append(1) or True)
    _train(tmp_path, "m", "--max-epochs", "1")
    assert calls == [1]
    _train(tmp_path, "n", "--max-epochs", "1", "--keep-memory", "false")  # glibc's defaults left alone
    assert calls == [1]


def test_training_beats_the_unigram_model_and_logs_every_epoch(tmp_path):
    rows = _train(tmp_path, "m", "--max-epochs", "3", "--lr", "0.3")
    assert len(rows) == 3 and rows[-1]["valid_ppl"] < 0.95 * unigram_ppl(tmp_path / "corpus")
    for key in ("epoch", "lr", "train_ppl", "valid_ppl", "train_tokens_per_s", "wall_seconds", "lr_halved"):
        assert key in rows[0]


@pytest.mark.parametrize("extra", [("--precision", "bf16", "--lr", "0.3"), ("--optimizer", "adam", "--lr", "0.01"),
                                   ("--clip", "0.5", "--momentum", "0.9", "--lr", "0.05")])
def test_options_train(tmp_path, extra):
    rows = _train(tmp_path, "m", "--max-epochs", "3", *extra)
    assert rows[-1]["valid_ppl"] < 0.97 * unigram_ppl(tmp_path / "corpus")
    assert rows[0]["precision"] == ("bf16" if "bf16" in extra else "fp32")


@pytest.mark.parametrize("truncation", ["block", "exact"])
def test_rnn_class_output_trains_in_bf16_as_in_fp32(tmp_path, truncation):
    """bf16 runs the Elman and class-output matmuls in bf16 (fp32 states, softmaxes, updates): the same
    seed reaches about the same valid perplexity as fp32."""
    corpus = tmp_path / "corpus"
    write_corpus(corpus, n_train=N_TRAIN)
    ppl = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        assert main(["train", "--model", "rnn", "--data", str(corpus), "--out", str(out), "--hidden", "24",
                     "--output", "class", "--classes", "6", "--batch-size", "8", "--truncation", truncation,
                     "--max-epochs", "3", "--lr", "0.02", "--precision", precision]) == 0
        ppl[precision] = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["valid_ppl"]
    assert ppl["fp32"] < 0.97 * unigram_ppl(corpus)
    assert abs(ppl["bf16"] / ppl["fp32"] - 1) < 0.03, ppl


def test_max_minutes_cuts_the_epoch_short_and_records_it_as_partial(tmp_path):
    rows = _train(tmp_path, "m", "--max-epochs", "50", "--max-minutes", "0.0001")
    # the epoch in progress is cut short, evaluated and saved, marked partial; no more start
    assert len(rows) == 1 and rows[0]["partial"] and rows[0]["batches"] < rows[0]["of"]
    assert not rows[0]["lr_halved"]


@pytest.mark.parametrize("family, extra", [("fofe", ["--optimizer", "adam"]), ("rnn", ["--batch-size", "4"]),
                                           ("rnn", ["--batch-size", "4", "--sentence-independent"])])
def test_each_neural_family_beats_the_unigram_model(tmp_path, family, extra):
    corpus = write_corpus(tmp_path / "corpus", n_train=N_TRAIN)
    out = tmp_path / family
    assert main(["train", "--model", family, "--data", str(corpus), "--out", str(out), "--seq-len", "10",
                 "--max-epochs", "3", "--lr", "0.01", *TINY, *extra]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and rows[-1]["valid_ppl"] < 0.9 * unigram_ppl(corpus)


def test_sentence_independent_batches_hold_each_sentence_once_from_a_fresh_state(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", n_train=50)
    vocab, train = build_vocab_and_encode(corpus / "train.txt")
    cfg = RNNConfig(hidden=8, sentence_independent=True)
    cfg.train.batch_size, cfg.train.seq_len = 4, 10
    batches = list(FAMILIES["rnn"].batches(cfg, vocab)(train, np.random.default_rng(0), (0, 1)))
    got = sorted(tuple(b.targets[r][b.mask[r]].tolist()) for b in batches for r in range(len(b.targets)))
    starts = np.asarray(train.starts)
    want = sorted(tuple(train.ids[starts[i] : starts[i + 1]].tolist()) for i in range(train.num_sentences))
    assert got == want  # every sentence exactly once, whole
    assert all(b.resets[:, 0].all() and not b.resets[:, 1:].any() for b in batches)
    model = FAMILIES["rnn"].build(cfg, vocab)
    carried = torch.rand(len(batches[0].targets), 8)
    with torch.no_grad():  # whatever state is passed in, a sentence-independent model starts afresh
        torch.testing.assert_close(model(batches[0], carried)[0], model(batches[0], None)[0])


@pytest.mark.parametrize("family", ["fnn", "fofe", "rnn"])
def test_dropout_trains_and_is_off_when_scoring(tmp_path, family):
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / family
    extra = ["--batch-size", "4"] if family == "rnn" else []
    assert main(["train", "--model", family, "--data", str(corpus), "--out", str(out), "--seq-len", "10",
                 "--max-epochs", "2", "--dropout", "0.5", *TINY, *extra]) == 0
    model = seqlm.load(out)
    text = [line.split() for line in (corpus / "test.txt").read_text().splitlines()]
    first, again = seqlm.score_text(model, text), seqlm.score_text(model, text)
    assert first == again  # a loaded model scores deterministically: no dropout at inference
