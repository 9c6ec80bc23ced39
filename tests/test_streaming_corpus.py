"""A corpus larger than the memory a process may use still becomes a vocabulary and cached ids.

The subprocess caps its address space (RLIMIT_AS) at what it already uses plus HEADROOM, then builds
the vocabulary and the id cache of a training file four times HEADROOM in one streaming pass. Reading
that file whole under the same cap fails, which proves the cap bites. Memory-mapping the finished
cache counts as address space too (though it is disk, not RAM), so the cap is lifted to open it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter

import numpy as np

from seqlm.data.corpus import build_vocab, count_words, encode_file
from seqlm.data.vocab import EOS, Vocab

from conftest import cli_env

HEADROOM_MB = 24
REPEATS = 4 * HEADROOM_MB  # 1 MB blocks: the corpus is 4x what the capped process may allocate

PROBE = r"""
import json, resource, sys
from pathlib import Path
from seqlm.data.corpus import build_vocab

small, big, headroom = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) << 20
build_vocab(small)  # warm up: every import and lazy allocation happens before the cap
size = next(int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (size + headroom, resource.RLIM_INFINITY))
vocab = build_vocab(big)
try:
    big.read_bytes()
    whole = "fits"
except MemoryError:
    whole = "MemoryError"
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print(json.dumps({"itos": vocab.itos, "counts": vocab.counts, "whole": whole}))
"""


def _block(seed: int = 0) -> tuple[bytes, Counter, int]:
    """About 1 MB of text over 3,000 word types; its word counts and its number of sentences."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(3000)]
    lines: list[str] = []
    size = 0
    while size < 1 << 20:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
        lines.append(line)
        size += len(line) + 1
    text = "\n".join(lines) + "\n"
    return text.encode(), Counter(text.split()), len(lines)


def test_vocabulary_and_ids_of_a_corpus_4x_the_memory_cap(tmp_path):
    block, counts, sentences = _block()
    big = tmp_path / "train.txt"
    with open(big, "wb") as f:
        for _ in range(REPEATS):
            f.write(block)
    small = tmp_path / "small.txt"
    small.write_bytes(block[: block.index(b"\n", 20_000) + 1])

    r = subprocess.run([sys.executable, "-c", PROBE, str(small), str(big), str(HEADROOM_MB)], capture_output=True,
                       text=True, env=cli_env(), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["whole"] == "MemoryError", "the cap did not bite: the whole file fit in the headroom"

    # The capped pass built the same vocabulary as counting in memory would...
    expected = Counter({w: c * REPEATS for w, c in counts.items()})
    expected[EOS] = sentences * REPEATS
    ref = Vocab.build(expected)
    assert got["itos"] == ref.itos and got["counts"] == ref.counts
    # ... and left the encoded text in the cache, which encode_file opens without re-reading the text.
    stream = encode_file(big, Vocab(got["itos"], got["counts"]))
    assert len(stream.ids) == (sum(counts.values()) + sentences) * REPEATS
    assert isinstance(stream.ids, np.memmap)
    n = sum(counts.values()) + sentences
    first = encode_file(small, ref, use_cache=False)
    assert np.array_equal(stream.ids[: len(first.ids)], first.ids)
    assert np.array_equal(stream.ids[n : n + len(first.ids)], first.ids)  # the second copy of the block
    assert np.array_equal(np.diff(np.asarray(stream.starts[: sentences + 1])),
                          np.asarray([len(x.split()) + 1 for x in block.decode().splitlines()]))


def test_one_pass_equals_count_then_encode(tmp_path):
    """build_vocab's single pass gives exactly the two-pass result, cut-offs and literal specials included."""
    text = "b a <unk> c\n\n a b </s> b\r\nd d d e\n"
    path = tmp_path / "t.txt"
    path.write_text(text * 3, encoding="utf-8")
    for max_vocab, min_count in ((None, 1), (4, 1), (None, 4)):
        ref = Vocab.build(count_words(path), max_vocab, min_count)
        vocab = build_vocab(path, max_vocab=max_vocab, min_count=min_count)
        assert vocab.itos == ref.itos and vocab.counts == ref.counts
        a, b = encode_file(path, vocab), encode_file(path, ref, use_cache=False)
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.starts, b.starts)


# ---------------------------------------------------------------- training batches stream too


def _reference_gather(stream, order, bos_id):
    """The whole-text layout the streaming batchers must reproduce (simple, O(text) memory)."""
    inputs, targets, resets = [], [], []
    for s in order:
        sent = np.asarray(stream.sentence(s), dtype=np.int64)
        targets.append(sent)
        inputs.append(np.concatenate([[bos_id], sent[:-1]]))
        resets.append(np.arange(len(sent)) == 0)
    return tuple(np.concatenate(a) if a else np.zeros(0, dtype=t) for a, t in
                 ((inputs, np.int64), (targets, np.int64), (resets, bool)))


def _reference_packed(stream, bos_id, batch_tokens, rows, rng, shard):
    from seqlm.data.batching import _as_batch

    order = rng.permutation(stream.num_sentences)
    inputs, targets, resets = _reference_gather(stream, order, bos_id)
    step, (rank, world) = batch_tokens * rows, shard
    n_batches = (len(targets) + step - 1) // step
    n_batches -= n_batches % world if n_batches >= world else 0
    for k in range(rank, n_batches, world):
        sl = slice(k * step, (k + 1) * step)
        yield _as_batch(inputs[sl], targets[sl], resets[sl], rows, batch_tokens)


def _reference_stream(stream, bos_id, batch_size, bptt, reset_at_sentences, shard):
    inputs, targets, resets = _reference_gather(stream, np.arange(stream.num_sentences), bos_id)
    if not reset_at_sentences:
        inputs = np.concatenate([[bos_id], targets[:-1]])
        resets = np.zeros_like(resets)
    rank, world = shard
    per_row = len(targets) // (batch_size * world)
    if per_row == 0:
        batch_size, per_row = 1, len(targets) // world
    view = slice(rank * batch_size * per_row, (rank + 1) * batch_size * per_row)
    inp, tgt, rst = (a[view].reshape(batch_size, per_row).copy() for a in (inputs, targets, resets))
    rst[:, 0] = True
    for t0 in range(0, per_row, bptt):
        yield inp[:, t0 : t0 + bptt], tgt[:, t0 : t0 + bptt], rst[:, t0 : t0 + bptt]


def _random_stream(seed: int):
    from seqlm.data.corpus import TokenStream

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, size=rng.integers(1, 300))
    ids = rng.integers(0, 50, size=int(lengths.sum())).astype(np.int32)
    return TokenStream(ids, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


def _same(a, b) -> bool:
    return all(np.array_equal(getattr(a, f).numpy(), getattr(b, f).numpy())
               for f in ("inputs", "targets", "mask", "resets"))


def test_packed_batches_gather_in_slices_yet_match_the_whole_text_layout(monkeypatch):
    from seqlm.data import batching

    monkeypatch.setattr(batching, "GATHER_TOKENS", 37)  # many slices, cutting through sentences
    for seed in range(12):
        stream = _random_stream(seed)
        for batch_tokens, rows, world in ((7, 1, 1), (5, 3, 2), (20, 2, 3), (1000, 1, 2)):
            for rank in range(world):
                got = list(batching.packed_batches(stream, 99, batch_tokens, rows, np.random.default_rng(seed),
                                                   (rank, world)))
                ref = list(_reference_packed(stream, 99, batch_tokens, rows, np.random.default_rng(seed),
                                             (rank, world)))
                assert len(got) == len(ref) and all(_same(a, b) for a, b in zip(got, ref))


def test_stream_batches_read_chunks_yet_match_the_whole_text_layout():
    from seqlm.data.batching import stream_batches

    for seed in range(12):
        stream = _random_stream(seed)
        for batch_size, bptt, world in ((1, 7, 1), (4, 5, 1), (3, 6, 2), (10**4, 9, 2)):
            for reset in (False, True):
                for rank in range(world):
                    got = list(stream_batches(stream, 99, batch_size, bptt, reset, (rank, world)))
                    ref = list(_reference_stream(stream, 99, batch_size, bptt, reset, (rank, world)))
                    assert len(got) == len(ref)
                    for b, (inp, tgt, rst) in zip(got, ref):
                        assert np.array_equal(b.inputs.numpy(), inp) and np.array_equal(b.targets.numpy(), tgt)
                        assert np.array_equal(b.resets.numpy(), rst) and bool(b.mask.all())
