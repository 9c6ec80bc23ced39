"""The data pipeline: vocabulary, readers, id cache, and the three batch shapes."""

from __future__ import annotations

import gzip
from collections import Counter

import numpy as np
import pytest
import torch

from seqlm.data.batching import history, packed_batches, sentence_batches, stream_batches
from seqlm.data.corpus import count_words, encode_file, encode_sentences, read_sentences, tokenize_raw
from seqlm.data.vocab import EOS, UNK, Vocab
from seqlm.errors import SeqlmError

from conftest import shared_data


def test_vocab_order_limits_and_round_trip(tmp_path):
    c = Counter({"a": 5, "b": 3, "c": 3, "d": 1, UNK: 2, EOS: 4})
    v = Vocab.build(c)
    assert v.itos[:2] == [EOS, UNK] and v.itos[2:] == ["a", "b", "c", "d"]
    small = Vocab.build(c, max_vocab=4)
    assert small.itos == [EOS, UNK, "a", "b"] and small.counts[1] == 2 + 3 + 1  # dropped words count as <unk>
    assert Vocab.build(c, min_count=3).itos == [EOS, UNK, "a", "b", "c"]
    assert small.encode(["a", "zzz", "c"]) == [2, 1, 1]
    v.save(tmp_path / "vocab.txt")
    assert Vocab.load(tmp_path / "vocab.txt") == v
    with pytest.raises(SeqlmError, match="max-vocab"):
        Vocab.build(c, max_vocab=0)


def test_readers_gzip_crlf_raw_and_errors(tmp_path):
    p = tmp_path / "a.txt.gz"
    with gzip.open(p, "wt", encoding="utf-8", newline="") as f:
        f.write("the cat\r\n\r\n  sat  on\tmat \r\n")
    assert list(read_sentences(p)) == [["the", "cat"], ["sat", "on", "mat"]]
    assert tokenize_raw("Hello, world! It's 3.5 U.S. dollars. ok") == [
        ["Hello", ",", "world", "!"], ["It's", "3.5", "U.S", "."], ["dollars", "."], ["ok"]]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\nbad \xff byte\n")
    with pytest.raises(SeqlmError, match=r"bad.txt:2: invalid UTF-8"):
        list(read_sentences(bad))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    with pytest.raises(SeqlmError, match="no sentences"):
        count_words(empty)


def test_encode_file_is_cached_and_memory_mapped(corpus):
    v = Vocab.build(count_words(corpus / "train.txt"))
    a = encode_file(corpus / "test.txt", v)
    b = encode_file(corpus / "test.txt", v)
    assert isinstance(b.ids, np.memmap) and np.array_equal(a.ids, b.ids)
    lines = (corpus / "test.txt").read_text().splitlines()
    assert a.num_sentences == len(lines) and len(a.ids) == sum(len(line.split()) + 1 for line in lines)
    assert a.ids[a.starts[1] - 1] == v.eos_id


def _stream(sents: list[list[str]]):
    words = Counter(w for s in sents for w in s)
    v = Vocab.build(words)
    return v, encode_sentences(sents, v)


def test_sentence_batches_cover_each_token_once_even_when_split():
    sents = [["a", "b", "c", "d", "e", "f", "g"], ["b"], ["c", "a"]]
    v, s = _stream(sents)
    seen = []
    for rows in sentence_batches(s, v.bos_id, max_tokens=6, max_len=3, context=2):
        b = rows.batch
        for r in range(b.inputs.shape[0]):
            m = b.mask[r]
            first = int(s.starts[rows.sentence[r]] + rows.offset[r])
            assert b.targets[r][m].tolist() == s.ids[first : first + int(m.sum())].tolist()
            if rows.offset[r] == 0:
                assert bool(b.resets[r, 0]) and int(b.inputs[r, 0]) == v.bos_id
            else:  # a continuation piece carries real context and no reset
                assert not bool(b.resets[r].any()) and not bool(m[0])
            seen += list(range(first, first + int(m.sum())))
    assert sorted(seen) == list(range(len(s.ids)))


def test_history_stops_at_sentence_start():
    from seqlm.protocol import Batch

    inp = torch.tensor([[0, 5, 6, 0, 7]])
    b = Batch(inp, inp, torch.ones_like(inp, dtype=torch.bool), torch.tensor([[1, 0, 0, 1, 0]], dtype=torch.bool))
    assert history(b, 2).tolist() == [[[-1, 0], [0, 5], [5, 6], [-1, 0], [0, 7]]]


def test_packed_batches_partition_the_corpus_and_shard():
    sents = [[f"w{i}"] * (i % 5 + 1) for i in range(40)]
    v, s = _stream(sents)
    rng = np.random.default_rng(0)
    batches = list(packed_batches(s, v.bos_id, batch_tokens=7, rows=2, rng=rng))
    tgt = torch.cat([b.targets[b.mask] for b in batches])
    assert sorted(tgt.tolist()) == sorted(np.asarray(s.ids).tolist())
    resets = torch.cat([b.resets[b.mask] for b in batches])
    inputs = torch.cat([b.inputs[b.mask] for b in batches])
    assert int(resets.sum()) == s.num_sentences and bool((inputs[resets] == v.bos_id).all())
    shard0 = list(packed_batches(s, v.bos_id, 7, 2, np.random.default_rng(0), shard=(0, 2)))
    shard1 = list(packed_batches(s, v.bos_id, 7, 2, np.random.default_rng(0), shard=(1, 2)))
    assert len(shard0) == len(shard1) and torch.equal(shard0[0].targets, batches[0].targets)


def test_stream_batches_rows_continue():
    sents = [["a", "b", "c"]] * 20
    v, s = _stream(sents)
    chunks = list(stream_batches(s, v.bos_id, batch_size=2, bptt=5))
    row0 = torch.cat([c.targets[0] for c in chunks])
    inp0 = torch.cat([c.inputs[0] for c in chunks])
    assert torch.equal(inp0[1:], row0[:-1])  # each row is one continuous text
    assert bool(chunks[0].resets[:, 0].all()) and not bool(torch.cat([c.resets[:, 1:] for c in chunks], 1).any())


def test_ptb_token_counts():
    data = shared_data()
    if data is None or not (data / "ptb" / "test.txt").exists():
        pytest.skip("shared PTB copy not present")
    v = Vocab.build(count_words(data / "ptb" / "train.txt"))
    assert len(v) == 10000
    test = encode_file(data / "ptb" / "test.txt", v)
    assert len(test.ids) == 82430 and test.num_sentences == 3761
    assert len(test.ids) - test.num_sentences == 78669
