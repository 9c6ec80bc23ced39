"""Models shared between processes and threads (docs/integrations.md, "Processes and threads").

Every kind of model seqlm.load returns (kn from a model directory, an ARPA file or a binary file, lstm,
transformer, cache, mix) and seqlm.kenlm.Model pickle and score exactly as before, in this process, in forked
workers and in spawned ones; a binary n-gram model pickles as its file and is mapped again, not copied. The
pyctcdecode adapter decodes a batch in fork and spawn pools to the serial transcripts. Threads sharing one
model get what one thread gets. A forked worker runs an LSTM after the parent ran one on two threads (GNU
OpenMP's hang, seqlm/forking.py); every pool result is awaited with a timeout, so a hang fails the test.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import random
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import seqlm
import seqlm.kenlm as kenlm
from seqlm.cli import main
from seqlm.errors import SeqlmError

from conftest import WORDS, write_corpus

TIMEOUT = 120  # seconds for any pool's results: a worker that hangs fails the test instead of stalling it
KINDS = ("kn", "kn-arpa", "kn-binary", "lstm", "transformer", "cache", "mix")
NEURAL = ["--threads", "1", "--max-epochs", "1", "--batch-size", "4"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> dict:
    """kind -> the path seqlm.load reads, each model trained here; "text": sentences to score."""
    root = tmp_path_factory.mktemp("zoo")
    corpus = write_corpus(root / "corpus", n_train=80, n_eval=10)
    train = {"kn": ["--model", "kn", "--order", "3"],
             "lstm": ["--model", "lstm", "--hidden", "16", "--layers", "2", "--seq-len", "8", *NEURAL],
             "transformer": ["--model", "transformer", "--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff",
                             "32", "--context", "6", "--seq-len", "12", *NEURAL],
             "cache": ["--model", "cache", "--window", "7", "--decay", "0.9"]}
    for name, opts in train.items():
        assert main(["train", *opts, "--data", str(corpus), "--out", str(root / name)]) == 0
    assert main(["interpolate", str(root / "lstm"), str(root / "kn"), str(root / "cache"), "--weights", "0.4,0.3,0.3",
                 "--out", str(root / "mix")]) == 0
    assert main(["convert", str(root / "kn" / "model.arpa"), str(root / "kn.bin")]) == 0
    paths = {k: str(root / k) for k in train} | {"mix": str(root / "mix"), "kn-binary": str(root / "kn.bin"),
                                                 "kn-arpa": str(root / "kn" / "model.arpa")}
    rng = random.Random(1)
    text = [[rng.choice(WORDS + ["zebra"]) for _ in range(rng.randint(1, 14))] for _ in range(12)]
    return paths | {"text": text}


@pytest.fixture(scope="module")
def spawn_pool():
    """One spawn pool for the module: each worker imports torch and seqlm afresh (seconds), so only once."""
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        yield pool


def mapped(model) -> bool:
    """Whether the n-gram tables are views of a memory-mapped file (not arrays in this process's memory)."""
    return all(isinstance(k.base, np.memmap) for k in model.keys)


# ---- what the workers run (module level, so that spawned workers find them by name) ---------------------------

_INHERITED: dict = {}  # set before forking: a forked worker finds the parent's objects here, unpickled


def _score(args) -> list[list[float]]:
    model, text = args
    return seqlm.score_text(_INHERITED[model] if isinstance(model, str) else model, text)


def _kenlm_calls(model: kenlm.Model, text: list[list[str]]) -> list:
    """BaseScore along each sentence, full_scores and score: what a decoder and a scorer call."""
    out = []
    for words in text:
        state, after = kenlm.State(), kenlm.State()
        model.BeginSentenceWrite(state)
        walk = []
        for w in words:
            walk.append(model.BaseScore(state, w, after))
            state, after = after, state
        sentence = " ".join(words)
        out.append((walk, list(model.full_scores(sentence)), model.score(sentence)))
    return out


def _kenlm_in_worker(args) -> tuple[list, bool]:
    model, text = args
    return _kenlm_calls(model, text), model.has_null_context and mapped(model.model)


# ---- pickling -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_pickle_round_trip_gives_identical_scores(zoo, kind):
    model = seqlm.load(zoo[kind])
    before = seqlm.score_text(model, zoo["text"])
    blob = pickle.dumps(model)
    again = pickle.loads(blob)
    assert type(again) is type(model) and again.family == model.family and again.config == model.config
    assert seqlm.score_text(again, zoo["text"]) == before
    if kind in ("kn", "kn-binary"):  # the file, not the tables, travels; the copy maps it again
        assert len(blob) < 1000 and mapped(again) and again.mapped_file == model.mapped_file


def test_used_models_pickle_and_kenlm_models_pickle_as_their_path(zoo):
    """Caches made by use (the Python walk's memoryviews, a neural scorer's history tree) stay behind."""
    kn = seqlm.load(zoo["kn"])
    kn.score_word((kn.vocab.bos_id,), kn.vocab.stoi["the"])  # builds the memoryviews, which cannot pickle
    assert seqlm.score_text(pickle.loads(pickle.dumps(kn)), zoo["text"]) == seqlm.score_text(kn, zoo["text"])
    query = seqlm.NGramQuery(kn)
    assert list(pickle.loads(pickle.dumps(query)).full_scores("the cat sat")) == list(query.full_scores("the cat sat"))
    for kind in ("kn", "kn-arpa", "lstm", "mix"):
        model = kenlm.Model(zoo[kind])
        before = _kenlm_calls(model, zoo["text"])
        blob = pickle.dumps(model)
        assert len(blob) < 1000  # the path: the receiving process loads (or maps) the model itself
        assert _kenlm_calls(pickle.loads(blob), zoo["text"]) == before


def test_a_binary_file_changed_since_pickling_is_refused(zoo, tmp_path):
    path = tmp_path / "kn.bin"
    path.write_bytes(open(zoo["kn-binary"], "rb").read())
    blob = pickle.dumps(seqlm.load(path))
    os.utime(path, ns=(0, 0))  # same bytes, another time stamp: it may not be the file the model mapped
    with pytest.raises(SeqlmError, match="changed .* since this model was pickled"):
        pickle.loads(blob)


# ---- processes ------------------------------------------------------------------------------------------------

def test_forked_workers_score_as_the_parent(zoo):
    """Inherited models (nothing pickled) and models sent to the workers (pickled), after the parent ran the LSTM
    on two threads: without seqlm.forking a forked LSTM forward waits for ever on OpenMP's lost threads."""
    models = {k: seqlm.load(zoo[k]) for k in KINDS}
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        want = {k: seqlm.score_text(m, zoo["text"]) for k, m in models.items()}
        _INHERITED.update(models)
        with multiprocessing.get_context("fork").Pool(2) as pool:
            inherited = pool.map_async(_score, [(k, zoo["text"]) for k in KINDS]).get(TIMEOUT)
            sent = pool.map_async(_score, [(models[k], zoo["text"]) for k in KINDS]).get(TIMEOUT)
    finally:
        torch.set_num_threads(threads)
        _INHERITED.clear()
    assert inherited == sent == [want[k] for k in KINDS]


def test_spawned_workers_score_as_the_parent(zoo, spawn_pool):
    models = [seqlm.load(zoo[k]) for k in KINDS]
    got = spawn_pool.map_async(_score, [(m, zoo["text"]) for m in models]).get(TIMEOUT)
    assert got == [seqlm.score_text(m, zoo["text"]) for m in models]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_kenlm_models_in_workers(zoo, spawn_pool, context):
    """kenlm.Model sent to workers: each loads it from its path (a binary mapped again) and calls as here."""
    models = [kenlm.Model(zoo[k]) for k in ("kn", "lstm")]
    args = [(m, zoo["text"]) for m in models]
    if context == "spawn":
        got = spawn_pool.map_async(_kenlm_in_worker, args).get(TIMEOUT)
    else:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            got = pool.map_async(_kenlm_in_worker, args).get(TIMEOUT)
    assert [g[0] for g in got] == [_kenlm_calls(m, zoo["text"]) for m in models]
    assert [g[1] for g in got] == [True, False]  # the KN model directory's binary is mapped in the worker


# ---- pyctcdecode ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_ctc_decode_batch_in_a_pool_gives_the_serial_transcripts(zoo, spawn_pool, context, caplog):
    from conftest import require_module

    require_module("pyctcdecode", "pyctcdecode is not installed (pip install -e '.[ctc]')")
    from seqlm.kenlm.ctc import build_ctcdecoder
    from test_ctc import labels_for, simulate_logits

    labels = labels_for(WORDS + ["zebra"])
    decoder = build_ctcdecoder(labels, zoo["kn"], alpha=0.6, beta=1.0)
    rng = np.random.default_rng(0)
    logits = [simulate_logits(" ".join(words), labels, rng, noise=1.5) for words in zoo["text"][:6]]
    serial = decoder.decode_batch(None, logits, beam_width=16)
    decoded = [w for t in serial for w in t.split()]
    assert len(decoded) >= 20 and sum(w in WORDS for w in decoded) >= 0.8 * len(decoded)  # words, not noise
    with caplog.at_level(logging.WARNING), multiprocessing.get_context("fork").Pool(2) as fork_pool:
        pool = spawn_pool if context == "spawn" else fork_pool
        assert decoder.decode_batch(pool, logits, beam_width=16) == serial
        beams = decoder.decode_beams_batch(pool, logits, beam_width=16)
    assert [b[0][0] for b in beams] == serial
    assert "Falling back to sequential" not in caplog.text  # the workers decoded: pyctcdecode alone refuses spawn


# ---- threads --------------------------------------------------------------------------------------------------

def _in_threads(n: int, job) -> list:
    """job(i) for i < n, each in its own thread, with the interpreter switching threads often (races show)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        with ThreadPoolExecutor(n) as ex:
            return list(ex.map(job, range(n)))
    finally:
        sys.setswitchinterval(interval)


def _rotated(text: list, i: int) -> list:
    return text[i % len(text):] + text[: i % len(text)]


@pytest.mark.parametrize("kind", ["kn", "kn-arpa", "lstm"])
def test_threads_sharing_a_kenlm_model_get_what_one_thread_gets(zoo, kind):
    """Each thread starts at another sentence, so they interleave their calls; a neural Model's scorer shares
    its pending steps between threads (a lock; without it some thread reads a node never stepped)."""
    model = kenlm.Model(zoo[kind])
    text = zoo["text"] * (1 if kind == "lstm" else 4)
    want = [_kenlm_calls(model, _rotated(text, i)) for i in range(8)]
    assert _in_threads(8, lambda i: _kenlm_calls(model, _rotated(text, i))) == want


@pytest.mark.parametrize("kind", ["lstm", "transformer", "mix"])
def test_threads_sharing_a_model_through_score_text(zoo, kind):
    model = seqlm.load(zoo[kind])
    want = [seqlm.score_text(model, _rotated(zoo["text"], i)) for i in range(6)]
    assert _in_threads(6, lambda i: seqlm.score_text(model, _rotated(zoo["text"], i))) == want


def test_compiled_loops_load_once_for_threads_asking_together(monkeypatch):
    """A thread asking while another builds waits for that module instead of taking the Python twin for good."""
    from seqlm.data import native

    monkeypatch.setattr(native, "_MODULES", {})
    built = []

    def slow_build(name, sources):
        built.append(name)
        threading.Event().wait(0.2)
        return object()

    monkeypatch.setattr(native, "_build", slow_build)
    got = _in_threads(4, lambda i: native.compiled("_x", []))
    assert built == ["_x"] and all(g is got[0] and g is not None for g in got)
