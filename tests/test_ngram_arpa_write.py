"""The fast ARPA writer (arpa_write.py, floattext.py) against a plain reference writer kept here: numbers
as numpy's str of a float32, n-gram texts built word by word, lines joined by Python. Byte for byte."""

from __future__ import annotations

import gzip
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqlm.data.corpus import encode_sentences
from seqlm.data.vocab import EOS, Vocab
from seqlm.models.kn import KNConfig, estimate_kn
from seqlm.ngram import arpa_write, floattext
from seqlm.ngram.arpa_write import open_arpa, write_arpa
from seqlm.ngram.floattext import float32_texts, numpy2_str
from seqlm.ngram.native import extension

from conftest import require_env


def reference_arpa(tokens: list[str], keys: list[np.ndarray], probs: list[np.ndarray],
                   backoffs: list[np.ndarray]) -> bytes:
    """The ARPA text, one Python string per line (what seqlm wrote before arpa_write.py)."""
    V, order = len(tokens), len(keys)
    texts = [list(tokens)]
    for k in range(2, order + 1):
        texts.append([texts[-1][key // V] + " " + tokens[key % V] for key in keys[k - 1].tolist()])
    out = ["\\data\\\n"] + [f"ngram {k}={len(t)}\n" for k, t in enumerate(texts, 1)]
    for k in range(1, order + 1):
        lines = []
        for i, text in enumerate(texts[k - 1]):
            line = numpy2_str(np.float32(probs[k - 1][i])) + "\t" + text
            if k < order:
                line += "\t" + numpy2_str(np.float32(backoffs[k - 1][i]))
            lines.append(line)
        out.append(f"\n\\{k}-grams:\n" + "\n".join(lines) + "\n")
    out.append("\n\\end\\\n")
    return "".join(out).encode("utf-8")


def texts_of(values: np.ndarray, before: bytes = b"", after: bytes = b"") -> list[bytes]:
    rows, start, length = float32_texts(values, before, after)
    return [bytes(rows[i, start[i] : start[i] + length[i]]) for i in range(len(rows))]


SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-4, -1e-4, 9.9999e-5, 99999.99, 1e5, -65536.0, 0.1, 9.9999999,
           1048576.25, 40000.0625, -1.06175423e15, 3.4028235e38, 1e-45, -2.6589744, -99.0, 1.5]


def test_numpy2_str_by_hand() -> None:  # numpy 2.4's own texts, written down
    cases = [(123456.0, "123456.0"), (999999.0, "999999.0"), (1e6, "1e+06"), (1.5e7, "1.5e+07"),
             (9947626e9, "9.947626e+15"), (-2.5, "-2.5"), (0.0, "0.0"), (-0.0, "-0.0"), (1e-4, "1e-04"),
             (9.9999e-05, "9.9999e-05"), (float("inf"), "inf"), (float("-inf"), "-inf"), (float("nan"), "nan"),
             (-0.30103, "-0.30103")]
    assert [numpy2_str(np.float32(v)) for v, _ in cases] == [t for _, t in cases]


def value_sets() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)  # any float32
    r = rng.uniform(-6, 6, 200_000)
    log_uniform = (np.sign(rng.uniform(-1, 1, len(r))) * 10.0**r).astype(np.float32)  # both notations
    log10p = -rng.exponential(2.0, 200_000).astype(np.float32)  # like ARPA values
    ints = np.arange(-1000, 1000, dtype=np.float32)
    return [bits, log_uniform, log10p, ints, np.array(SPECIAL, dtype=np.float32)]


def numpy_texts(values: np.ndarray) -> list[str]:
    """numpy 2's str of each float32, whatever numpy is installed (numpy 1.x goes scientific later)."""
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":
        return [str(v) for v in values]
    return [numpy2_str(v) for v in values]


def test_float_texts_equal_numpys_str() -> None:
    for values in value_sets():
        want = numpy_texts(values)
        assert texts_of(values, b"\t", b"\n") == [("\t" + t + "\n").encode() for t in want]
    assert texts_of(np.array([-2.5, 0.0], dtype=np.float32)) == [b"-2.5", b"0.0"]


def test_compiled_float_texts_equal_numpys_str() -> None:
    ext = extension()
    if ext is None:
        require_env("the compiled loops could not be built here")
    for values in value_sets():
        assert ext.float32_texts(values).decode().split("\n")[:-1] == numpy_texts(values)


def _random_model(rng: np.random.Generator, order: int, words: int) -> tuple[list[str], list, list, list]:
    alphabet = list("abcxyz") + ["é", "ß", "日本", "😀", "<", ">", "'"]
    tokens = ["<s>", "</s>", "<unk>"] + [
        "".join(rng.choice(alphabet, rng.integers(1, 6))) + str(i) for i in range(words)]
    V = len(tokens)
    keys = [np.arange(V, dtype=np.int64)]
    for _ in range(2, order + 1):
        size = int(rng.integers(0, 3 * V))
        keys.append(np.unique(rng.integers(0, len(keys[-1]) * V, size)) if len(keys[-1]) else keys[-1][:0])
    pool = np.array(SPECIAL + [-0.30103, -1.0, -7.25], dtype=np.float32)

    def values(m: int) -> np.ndarray:
        v = -rng.exponential(2.0, m).astype(np.float32)
        pick = rng.random(m) < 0.2
        v[pick] = rng.choice(pool, int(pick.sum()))
        return v

    probs = [values(len(k)) for k in keys]
    backoffs = [values(len(k)) for k in keys[:-1]]
    return tokens, keys, probs, backoffs


@pytest.mark.parametrize("compiled", [True, False])
@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 5), st.integers(0, 40), st.sampled_from([3, 64, 1 << 14]))
def test_arpa_bytes_equal_the_reference(compiled: bool, seed: int, order: int, words: int, chunk: int) -> None:
    rng = np.random.default_rng(seed)
    tokens, keys, probs, backoffs = _random_model(rng, order, words)
    with pytest.MonkeyPatch.context() as mp:  # small chunks: lines and numbers cross chunk boundaries
        if not compiled:  # the numpy path (the compiled one too, where the module could be built)
            mp.setattr(arpa_write, "extension", lambda: None)
        mp.setattr(arpa_write, "CHUNK", chunk)
        mp.setattr(floattext, "CHUNK", max(1, chunk // 2))
        with tempfile.TemporaryDirectory() as tmp:
            write_arpa(Path(tmp) / "m.arpa", tokens, keys, probs, backoffs)
            assert (Path(tmp) / "m.arpa").read_bytes() == reference_arpa(tokens, keys, probs, backoffs)


@pytest.mark.parametrize("compiled", [True, False])
def test_estimated_model_written_as_the_reference_writes_it(tmp_path: Path, monkeypatch, compiled: bool) -> None:
    if not compiled:
        monkeypatch.setattr(arpa_write, "extension", lambda: None)
    rng = np.random.default_rng(3)
    sentences = [[f"w{w}" for w in rng.integers(0, 60, rng.integers(1, 15))] for _ in range(600)]
    counts: dict[str, int] = {EOS: len(sentences)}
    for s in sentences:
        for w in s:
            counts[w] = counts.get(w, 0) + 1
    vocab = Vocab.build(counts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = estimate_kn(KNConfig(order=4), encode_sentences(sentences, vocab), vocab)
    for name in ("m.arpa", "m.arpa.gz"):
        model.to_arpa(tmp_path / name)
    want = reference_arpa(model.vocab.itos, model.keys, model.log10_prob, model.log10_backoff)
    assert (tmp_path / "m.arpa").read_bytes() == want
    assert gzip.decompress((tmp_path / "m.arpa.gz").read_bytes()) == want


def test_writer_refuses_a_count_that_disagrees_with_the_header(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="header says 2"), open_arpa(tmp_path / "x.arpa", ["<s>", "a"], [2, 2]) as w:
        w.section(1)
        w.write(np.array([[0], [1]]), np.zeros(2, np.float32), np.zeros(2, np.float32))
        w.section(2)
        w.write(np.array([[0, 1]]), np.zeros(1, np.float32), None)
    assert list(tmp_path.iterdir()) == []  # nothing half-written is left behind
