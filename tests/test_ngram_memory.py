"""Bounded-memory estimation (`--memory`, lmplz -S): the same counts and model as in memory, and it runs
under an address-space cap (RLIMIT_AS) that the in-memory path cannot meet.

The capped subprocess builds the id cache of a corpus first (memory-mapped, so its pages are mapped
before the cap), warms up both paths on a small file, then caps its address space at what it uses plus
HEADROOM and estimates a KN3 model of the big corpus with `--memory` well below HEADROOM. The in-memory
estimate, tried under the same cap, runs out of memory: that proves the cap bites.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqlm.cli import main
from seqlm.data.corpus import TokenStream, encode_sentences
from seqlm.data.vocab import EOS, Vocab
from seqlm.models.kn import KNConfig, estimate_kn
from seqlm.ngram import external
from seqlm.ngram.counts import count_ngrams
from seqlm.ngram.external import chunk_bounds, count_ngrams_bounded
from seqlm.ngram.filearray import Appender
from seqlm.ngram.index import build_slots, build_slots_file
from seqlm.ngram.native import extension

from conftest import cli_env, require_env, write_corpus

HEADROOM_MB = 32  # the in-memory KN3 needed 40-48 MB above the warm-up at 2026-12-05's counter: it must not fit
BLOCK_SENTENCES = 600
REPEATS = 300  # about 3M tokens: in memory that is ~300 MB of sort buffers; the distinct n-grams are few

# both probes: the big corpus's vocabulary and memory-mapped id cache, and a small corpus to warm up on
CORPORA = r"""
warnings.simplefilter("ignore")
vocab = build_vocab(big)
stream = encode_file(big, vocab)  # the id cache, memory-mapped
small_vocab = build_vocab(small)
small_stream = encode_file(small, small_vocab)
"""

PROBE = r"""
import json, resource, sys, warnings
from pathlib import Path
import numpy as np
import pytest
from seqlm.data.corpus import build_vocab, encode_file
from seqlm.models.kn import KNConfig, estimate_kn

small, big, headroom = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) << 20
""" + CORPORA + r"""for memory in ("", "1M"):  # warm up: every import and lazy allocation happens before the cap
    estimate_kn(KNConfig(order=3, memory=memory), small_stream, small_vocab)
size = next(int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (size + headroom, resource.RLIM_INFINITY))
bounded = estimate_kn(KNConfig(order=3, memory="8M"), stream, vocab)
try:
    estimate_kn(KNConfig(order=3), stream, vocab)
    in_memory = "fits"
except MemoryError:
    in_memory = "MemoryError"
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
full = estimate_kn(KNConfig(order=3), stream, vocab)
same = all(np.array_equal(a, b) for name in ("keys", "log10_prob", "log10_backoff")
           for a, b in zip(getattr(bounded, name), getattr(full, name)))
print(json.dumps({"in_memory": in_memory, "same": same, "tokens": len(stream.ids), "sizes": bounded.sizes}))
"""


def _block(seed: int = 0) -> str:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(400)]
    return "".join(" ".join(rng.choice(words) for _ in range(rng.randint(2, 16))) + "\n"
                   for _ in range(BLOCK_SENTENCES))


def test_estimation_under_a_memory_cap_the_in_memory_path_cannot_meet(tmp_path: Path) -> None:
    block = _block()
    big = tmp_path / "train.txt"
    big.write_text(block * REPEATS, encoding="utf-8")
    small = tmp_path / "small.txt"
    small.write_text(block, encoding="utf-8")
    r = subprocess.run([sys.executable, "-c", PROBE, str(small), str(big), str(HEADROOM_MB)], capture_output=True,
                       text=True, env=cli_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["in_memory"] == "MemoryError", "the cap did not bite: the in-memory estimate fit in the headroom"
    assert got["same"], "bounded-memory estimate differs from the in-memory one"
    assert got["tokens"] == (len(block.split()) + BLOCK_SENTENCES) * REPEATS


MANY = r"""
import hashlib, json, resource, sys, warnings
from pathlib import Path
from seqlm.data.corpus import build_vocab, encode_file
from seqlm.models.kn import KNConfig, estimate_kn
from seqlm.ngram.binary import write_binary

small, big, out, headroom = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]) << 20
""" + CORPORA + r"""for memory in ("", "1M"):  # warm up: every import and lazy allocation happens before the cap
    warm = estimate_kn(KNConfig(order=3, memory=memory), small_stream, small_vocab)
    warm.to_arpa(out / "warm.arpa")
    write_binary(warm, out / "warm.bin")
del warm
size = next(int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (size + headroom, resource.RLIM_INFINITY))
bounded = estimate_kn(KNConfig(order=3, memory="2M"), stream, vocab)
sizes = bounded.sizes
bounded.to_arpa(out / "bounded.arpa")
write_binary(bounded, out / "bounded.bin")
del bounded
try:
    estimate_kn(KNConfig(order=3), stream, vocab).to_arpa(out / "capped.arpa")
    in_memory = "fits"
except MemoryError:
    in_memory = "MemoryError"
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
full = estimate_kn(KNConfig(order=3), stream, vocab)
full.to_arpa(out / "full.arpa")
write_binary(full, out / "full.bin")
same = all((out / f"bounded.{x}").read_bytes() == (out / f"full.{x}").read_bytes() for x in ("arpa", "bin"))
print(json.dumps({"in_memory": in_memory, "same": same, "sizes": sizes}))
"""


def test_many_distinct_ngrams_under_a_cap_the_in_memory_path_cannot_meet(tmp_path: Path) -> None:
    """Every stage bounded: about a million distinct bigrams and trigrams (random words over 30,000
    types), which the in-memory estimate cannot hold in the cap; the bounded one writes the same ARPA
    and binary files."""
    rng = np.random.default_rng(1)
    words = np.array([f"t{i}" for i in range(30_000)])
    lines = [" ".join(words[rng.integers(0, len(words), rng.integers(5, 30))]) for _ in range(60_000)]
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "small.txt").write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
    r = subprocess.run([sys.executable, "-c", MANY, str(tmp_path / "small.txt"), str(tmp_path / "train.txt"),
                        str(tmp_path), str(HEADROOM_MB)], capture_output=True, text=True, env=cli_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["sizes"][1] > 900_000 and got["sizes"][2] > 900_000, got["sizes"]
    assert got["in_memory"] == "MemoryError", "the cap did not bite: the in-memory estimate fit in the headroom"
    assert got["same"], "bounded-memory ARPA or binary differs from the in-memory one"


def _stream(sentences: list[list[int]]) -> tuple[Vocab, TokenStream]:
    words = [[f"w{w}" for w in s] for s in sentences]
    counter = Counter(w for s in words for w in s)
    counter[EOS] += len(words)
    vocab = Vocab.build(counter)
    return vocab, encode_sentences(words, vocab)


@pytest.fixture(params=["compiled", "numpy"])
def count_path(request, monkeypatch):  # external.py's loops: _count.cpp's or their numpy twins
    if request.param == "numpy":
        monkeypatch.setattr(external, "extension", lambda: None)
    elif extension() is None:
        require_env("the compiled loops could not be built here")
    return request.param


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**31), st.integers(1, 5), st.integers(2, 40))
def test_bounded_counts_equal_in_memory_counts(count_path, seed: int, order: int, types: int) -> None:
    rng = np.random.default_rng(seed)
    sentences = [rng.integers(0, types, rng.integers(0, 25)).tolist() for _ in range(rng.integers(1, 400))]
    vocab, stream = _stream(sentences)
    V, bos = len(vocab) + 1, len(vocab)
    a = count_ngrams(stream, bos, V, order)
    b = count_ngrams_bounded(stream, bos, V, order, memory=0)  # the smallest chunks: 1024 positions
    for name in ("keys", "counts", "suffix"):
        for x, y in zip(getattr(a, name), getattr(b, name), strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("compiled", [True, False])
def test_bounded_counts_in_int64_tables_equal_in_memory_counts(monkeypatch, compiled: bool) -> None:
    """Past 2^31 positions the tables and runs keep int64 counts and ids (3-field runs): forced here."""
    monkeypatch.setattr(external, "id_dtype", lambda n: np.int64)
    if not compiled:
        monkeypatch.setattr(external, "extension", lambda: None)
    elif extension() is None:
        require_env("the compiled loops could not be built here")
    rng = np.random.default_rng(7)
    vocab, stream = _stream([rng.integers(0, 30, rng.integers(0, 25)).tolist() for _ in range(300)])
    V, bos = len(vocab) + 1, len(vocab)
    a, b = count_ngrams(stream, bos, V, 4), count_ngrams_bounded(stream, bos, V, 4, memory=0)
    assert b.counts[3].dtype == np.int64 and len(b.keys[3]) > 1024  # several chunks, int64 tables
    for name in ("keys", "counts", "suffix"):
        for x, y in zip(getattr(a, name), getattr(b, name), strict=True):
            np.testing.assert_array_equal(x, y)


def test_chunks_cover_every_sentence_once() -> None:
    starts = np.cumsum([0] + [5, 0, 3000, 7, 1, 1200, 3])  # one sentence longer than a chunk
    bounds = chunk_bounds(starts, 1024)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(starts) - 1
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert all(s1 > s0 for s0, s1 in bounds)


def test_cli_memory_flag_gives_the_same_model(tmp_path: Path, capsys) -> None:
    corpus = write_corpus(tmp_path / "corpus", n_train=4000)
    for name, extra in (("mem", ["--memory", "1M"]), ("ram", [])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(["train", "--model", "kn", "--order", "4", "--data", str(corpus), "--out",
                         str(tmp_path / name), *extra]) == 0
    assert (tmp_path / "mem" / "model.arpa").read_bytes() == (tmp_path / "ram" / "model.arpa").read_bytes()
    assert json.loads((tmp_path / "mem" / "config.json").read_text())["model"]["memory"] == "1M"
    capsys.readouterr()
    assert main(["train", "--model", "kn", "--data", str(corpus), "--out", str(tmp_path / "bad"),
                 "--memory", "lots"]) == 2
    assert "--memory" in capsys.readouterr().err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vocab, stream = _stream([[1, 2, 3], [2, 3, 1]] * 50)
        assert estimate_kn(KNConfig(order=2, memory="2M"), stream, vocab).sizes == \
            estimate_kn(KNConfig(order=2), stream, vocab).sizes


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31), st.integers(0, 3000), st.sampled_from([16, 100, 1 << 20]))
def test_slot_table_built_in_windows_equals_the_in_memory_one(seed: int, m: int, window: int) -> None:
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 10**12, m))
    with tempfile.TemporaryDirectory() as tmp:
        with Appender(Path(tmp) / "keys.bin", np.int64) as out:
            out.add(keys)
        slots = build_slots_file(out.array, Path(tmp) / "slots.bin", window=window, chunk=37)
        np.testing.assert_array_equal(np.asarray(slots), build_slots(keys))


def test_a_temporary_folder_that_cannot_be_made_is_a_one_line_error(tmp_path: Path) -> None:
    from seqlm.errors import SeqlmError
    from seqlm.ngram.external_estimate import estimate_bounded

    vocab, stream = _stream([[1, 2, 3], [2, 3, 1]] * 50)
    model_vocab = Vocab(vocab.itos + ["<s>"], vocab.counts + [0])
    with pytest.raises(SeqlmError, match="TMPDIR"):
        estimate_bounded(stream, model_vocab, 3, (0.5, 1.0, 1.5), 2**20, tmp_dir=tmp_path / "missing" / "dir")


def _bounded_equals_in_memory(sentences: list[list[int]], order: int, tmp: Path) -> None:
    """estimate_bounded at the smallest budget (1024-row chunks and windows) against the in-memory
    estimate: the same tables, ARPA bytes and binary bytes."""
    from seqlm.ngram.binary import write_binary
    from seqlm.ngram.external_estimate import estimate_bounded
    from seqlm.ngram.kneser_ney import estimate_model

    vocab, stream = _stream(sentences)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = estimate_model(stream, vocab, order)
        bounded = estimate_bounded(stream, full.vocab, order, (0.5, 1.0, 1.5), memory=0, tmp_dir=tmp)
    for name in ("keys", "log10_prob", "log10_backoff"):
        for x, y in zip(getattr(full, name), getattr(bounded, name), strict=True):
            np.testing.assert_array_equal(x, np.asarray(y))
    for model, stem in ((full, "full"), (bounded, "bounded")):
        model.to_arpa(tmp / f"{stem}.arpa")
        write_binary(model, tmp / f"{stem}.bin")
    for ext in ("arpa", "bin"):
        assert (tmp / f"full.{ext}").read_bytes() == (tmp / f"bounded.{ext}").read_bytes()


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 5), st.sampled_from([5, 60, 3000]))
def test_every_bounded_stage_equals_the_in_memory_estimate(seed: int, order: int, types: int) -> None:
    rng = np.random.default_rng(seed)
    sentences = [rng.integers(0, types, rng.integers(0, 25)).tolist() for _ in range(rng.integers(1, 600))]
    with tempfile.TemporaryDirectory() as tmp:
        _bounded_equals_in_memory(sentences, order, Path(tmp))


def test_a_context_with_more_continuations_than_a_chunk(tmp_path: Path) -> None:
    """<s> followed by 2,500 different words: one context longer than the 1,024-row chunks."""
    _bounded_equals_in_memory([[i, i % 7, i % 3] for i in range(2500)], 3, tmp_path)
