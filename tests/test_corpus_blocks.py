"""Reading text a block at a time (corpus.read_blocks, id_blocks): the compiled tokenizer (data/_tokens.cpp)
against the Python path, and both against str.split() line by line; errors still name their line."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqlm.data import corpus
from seqlm.data.corpus import id_blocks, read_sentences
from seqlm.data.native import tokens
from seqlm.errors import SeqlmError

from conftest import require_env

SPACES = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]  # every white space str.split() knows
WORDS = ["a", "b", "</s>", "<unk>", "é", "日本", "😀", "x\u200by", "ab", "\u00ad", "w1"]


def reference(text: str, table: dict[str, int], grow: bool, unk: int, eos: int) -> tuple[list[int], list[int]]:
    """The ids and sentence ends from str.split() of every '\\n'-separated line, one word at a time."""
    ids, ends = [], []
    for line in text.split("\n"):
        if words := line.split():
            ids += [table.setdefault(w, len(table)) if grow else table.get(w, unk) for w in words] + [eos]
            ends.append(len(ids))
    return ids, ends


def encoded(path, table, grow, compiled, monkeypatch, block):
    monkeypatch.setattr(corpus, "BLOCK", block)
    if not compiled:
        monkeypatch.setattr(corpus, "tokens", lambda: None)
    ids, ends, n = [], [], 0
    for i, e in id_blocks(path, False, "word", table, grow, 1, 0):
        ids += i.tolist()
        ends += (e + n).tolist()
        n += len(i)
    return ids, ends


@pytest.mark.parametrize("compiled", [True, False])
@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(WORDS), st.sampled_from(SPACES), st.just("\n")), max_size=120),
       st.sampled_from([1, 7, 1 << 20]), st.booleans())
def test_blocks_give_what_splitting_every_line_gives(tmp_path_factory, compiled, pieces, block, grow):
    if compiled and tokens() is None:
        require_env("the compiled tokenizer could not be built here")
    text = "".join(pieces)
    path = tmp_path_factory.mktemp("t") / "t.txt"
    path.write_bytes(text.encode("utf-8"))
    start = {"</s>": 0, "<unk>": 1, "a": 2}
    want_table, got_table = dict(start), dict(start)
    want = reference(text, want_table, grow, 1, 0)
    with pytest.MonkeyPatch.context() as mp:
        assert encoded(path, got_table, grow, compiled, mp, block) == want
    assert list(got_table.items()) == list(want_table.items())  # new words in order of first appearance


def test_the_compiled_tokenizer_splits_at_every_white_space():
    ext = tokens()
    if ext is None:
        require_env("the compiled tokenizer could not be built here")
    for s in SPACES:
        table = {"</s>": 0}
        ids, _ = ext.encode_lines(f"a{s}b".encode(), table, True, -1, 0)
        want = [1, 2, 0] if s != "\n" else [1, 0, 2, 0]
        assert np.frombuffer(ids, dtype=np.int32).tolist() == want, repr(s)


@pytest.mark.parametrize("bad, message", [(b"caf\xe9 x", r":7: invalid UTF-8 \(invalid continuation byte at byte 3\)"),
                                          (b"ab\x00c", r":7: contains a NUL byte")])
def test_errors_name_their_line_across_blocks(tmp_path, monkeypatch, bad, message):
    monkeypatch.setattr(corpus, "BLOCK", 8)
    path = tmp_path / "t.txt"
    path.write_bytes(b"one two\n" * 6 + bad + b"\nlast\n")
    with pytest.raises(SeqlmError, match=message):
        list(read_sentences(path))
    with pytest.raises(SeqlmError, match=message):
        list(id_blocks(path, False, "word", {"</s>": 0}, True, -1, 0))
