"""Binary n-gram models and the KenLM-style query API, against the ARPA path, brute force and KenLM.

References: the KenLM oracle's ARPA files and `query` output ($SEQLM_DATA/kenlm-oracle), a back-off walk
written out in plain Python over the ARPA entries, and the `kenlm` Python module when it is installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqlm
from seqlm.cli import main
from seqlm.data.corpus import encode_file
from seqlm.errors import SeqlmError
from seqlm.models.kn import BINARY, KNConfig, estimate_kn, save_kn
from seqlm.ngram import NGramModel
from seqlm.ngram.binary import FORMAT_VERSION, HEADER, SECTION, layout, read_binary, write_binary
from seqlm.ngram.checksum import BLOCK_BYTES, MASK, checksum, checksum_blocks
from seqlm.ngram.index import build_slots, lookup
from seqlm.ngram.query import NGramQuery, State
from test_kn import ORACLE, arpa_entries, needs_oracle, tiny_stream, token_log10

from conftest import cli_env, require_module, write_corpus

MODELS = ["kn3", "kn5", "kn3-prune01", "kn5-prune00112"]


def python_backoff(entries: dict, order: int, history: list[str], word: str) -> tuple[float, int]:
    """log10 p(word | history) and the matched length by the ARPA rule, one dict lookup at a time."""
    bo = 0.0
    for n in range(min(order - 1, len(history)), -1, -1):
        ctx = tuple(history[len(history) - n:])
        if ctx + (word,) in entries:
            return bo + entries[ctx + (word,)][0], n + 1
        bo += entries.get(ctx, (0.0, 0.0))[1] if n else 0.0
    raise AssertionError("every word has a unigram")


@pytest.fixture(scope="module")
def binaries(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bin")
    out = {}
    for name in MODELS:
        out[name] = folder / f"{name}.bin"
        write_binary(NGramModel.from_arpa(ORACLE / f"{name}.arpa.gz"), out[name])
    return out


# ---- the hash index -------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**40), max_size=300, unique=True), st.lists(st.integers(-5, 2**40), max_size=50))
def test_hash_index_finds_exactly_the_keys(keys: list[int], other: list[int]) -> None:
    sorted_keys = np.array(sorted(keys), dtype=np.int64)
    slots = build_slots(sorted_keys)
    query = np.array(keys + other, dtype=np.int64)
    rank = {k: i for i, k in enumerate(sorted(keys))}
    expected = [rank.get(q, -1) if q >= 0 else -1 for q in query.tolist()]
    assert lookup(slots, sorted_keys, query).tolist() == expected
    assert (slots >= 0).sum() == len(keys) and slots[-1] == -1  # probing always ends on an empty slot


# ---- binary == ARPA, for every n-gram -------------------------------------------------------------


@needs_oracle
@pytest.mark.parametrize("name", MODELS)
def test_binary_scores_every_ngram_as_the_arpa(name: str, binaries: dict[str, Path]) -> None:
    arpa, binary = NGramModel.from_arpa(ORACLE / f"{name}.arpa.gz"), read_binary(binaries[name])
    assert isinstance(binary.keys[0], np.ndarray) and not binary.keys[-1].flags.writeable  # mapped, not copied
    assert binary.vocab == arpa.vocab and binary.sizes == arpa.sizes
    np.testing.assert_array_equal(arpa.log10_prob[0], binary.log10_prob[0])
    for k in range(2, arpa.order + 1):  # each listed n-gram scored as its history then its word
        words = arpa.words_of(k, np.arange(arpa.sizes[k - 1]))  # (M_k, k)
        starts = np.zeros((len(words), k - 1), dtype=bool)
        starts[:, 0] = words[:, 0] == arpa.vocab.bos_id
        a = arpa.walk(words[:, :-1], starts, words[:, 1:])
        b = binary.walk(words[:, :-1], starts, words[:, 1:])
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(b[0][:, -1], arpa.log10_prob[k - 1])  # the listed value itself
        assert (b[1][:, -1] == k).all()


@needs_oracle
@pytest.mark.parametrize("name", MODELS)
def test_binary_query_reproduces_kenlm_query(name: str, binaries: dict[str, Path]) -> None:
    model = read_binary(binaries[name])
    query = encode_file(ORACLE / "query.txt", model.vocab, use_cache=False)
    logp = token_log10(model, query)  # through the protocol's score
    starts = np.asarray(query.starts)
    ref = np.loadtxt(ORACLE / f"query.{name}.tsv", skiprows=1, delimiter="\t")
    np.testing.assert_allclose(np.add.reduceat(logp, starts[:-1]), ref[:, 1], atol=1e-4)
    summary = json.loads((ORACLE / "summary.json").read_text())[name]
    assert 10 ** (-logp.mean()) == pytest.approx(summary["ppl_incl_oov"], rel=1e-6)


# ---- full_scores: matched lengths are the back-off walk's -----------------------------------------


@needs_oracle
@pytest.mark.parametrize("name", ["kn3", "kn5-prune00112"])
def test_full_scores_equal_the_python_backoff_walk(name: str, binaries: dict[str, Path]) -> None:
    entries = arpa_entries(ORACLE / f"{name}.arpa.gz")
    m = NGramQuery(binaries[name])
    parsed = NGramQuery(ORACLE / f"{name}.arpa.gz")  # no hash index: binary search
    lines = (ORACLE / "query.txt").read_text().splitlines()[:60]
    for line in lines:
        assert list(parsed.full_scores(line)) == list(m.full_scores(line))
        words = line.split()
        history = ["<s>"]
        for (logp, length, oov), word in zip(m.full_scores(line), words + ["</s>"], strict=True):
            w = word if word in m else "<unk>"
            ref, ref_len = python_backoff(entries, m.order, history, w)
            assert logp == pytest.approx(ref, abs=1e-5) and length == ref_len and oov == (w == "<unk>")
            history.append(w)


@needs_oracle
def test_score_perplexity_state_and_corpus_paths_agree(binaries: dict[str, Path]) -> None:
    m = NGramQuery(binaries["kn5"])
    lines = (ORACLE / "query.txt").read_text().splitlines()
    corpus = m.score_corpus(lines)
    ref = np.loadtxt(ORACLE / "query.kn5.tsv", skiprows=1, delimiter="\t")
    np.testing.assert_allclose(np.add.reduceat(corpus.log10_prob, corpus.starts[:-1]), ref[:, 1], atol=1e-4)
    for i, line in enumerate(lines[:40]):
        scores = list(m.full_scores(line))
        a, b = corpus.starts[i], corpus.starts[i + 1]
        np.testing.assert_allclose([s[0] for s in scores], corpus.log10_prob[a:b], atol=1e-12)
        assert [s[1] for s in scores] == corpus.length[a:b].tolist()
        assert m.score(line) == pytest.approx(ref[i, 1], abs=1e-4)
        assert m.perplexity(line) == pytest.approx(10 ** (-ref[i, 1] / len(scores)), rel=1e-4)
        state, out = State(), State()
        m.BeginSentenceWrite(state)
        total = 0.0
        for word in line.split() + ["</s>"]:
            total += m.BaseScore(state, word, out)
            assert len(out.words) <= m.order - 1
            state, out = out, state
        assert total == pytest.approx(m.score(line), abs=1e-9)
    # no <s>, no </s>: the first word from no context (its unigram), and the state starts empty
    line = lines[1]
    state, out = State(), State()
    m.NullContextWrite(state)
    total = 0.0
    for word in line.split():
        total += m.BaseScore(state, word, out)
        state, out = out, state
    assert m.score(line, bos=False, eos=False) == pytest.approx(total, abs=1e-9)
    first = line.split()[0]
    assert next(m.full_scores(line, bos=False))[0] == pytest.approx(
        float(m.model.log10_prob[0][m.vocab.id(first)]))


@needs_oracle
def test_kenlm_module_agrees_on_a_converted_kenlm_arpa(tmp_path: Path) -> None:
    kenlm_py = require_module("kenlm", "the kenlm Python module is not installed")
    r = subprocess.run([sys.executable, "-m", "seqlm", "convert", str(ORACLE / "kn5.arpa.gz"), str(tmp_path / "m.bin")],
                       capture_output=True, text=True, env=cli_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    ours, theirs = NGramQuery(tmp_path / "m.bin"), kenlm_py.Model(str(ORACLE / "kn5.arpa.gz"))
    ptb_test = ORACLE.parent / "ptb" / "test.txt"  # PTB test when the data folder has it (11% OOV here)
    text = ptb_test if ptb_test.is_file() else ORACLE / "query.txt"
    lines = text.read_text().splitlines()
    theirs_scores = [x for line in lines for x in theirs.full_scores(line)]  # (log10 p, length, oov) per token
    batched = ours.score_corpus(lines)
    np.testing.assert_allclose(batched.log10_prob, [x[0] for x in theirs_scores], atol=1e-5)
    assert batched.length.tolist() == [x[1] for x in theirs_scores]
    assert batched.oov.tolist() == [x[2] for x in theirs_scores]
    for line in lines[:100]:  # the per-sentence API too
        a, b = list(ours.full_scores(line)), list(theirs.full_scores(line))
        np.testing.assert_allclose([x[0] for x in a], [x[0] for x in b], atol=1e-5)
        assert [x[1:] for x in a] == [tuple(x[1:]) for x in b]


# ---- model directories, CLI, bad files ---------------------------------------------------------------


def test_train_writes_binary_and_load_maps_it(tmp_path: Path, capsys) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "kn"
    assert main(["train", "--model", "kn", "--order", "3", "--data", str(corpus), "--out", str(out)]) == 0
    assert (out / "model.arpa").is_file() and (out / BINARY).is_file()
    mapped, parsed = seqlm.load(out), seqlm.load(out / "model.arpa")
    assert not mapped.keys[1].flags.writeable  # the binary, memory-mapped
    text = [line.split() for line in (corpus / "test.txt").read_text().splitlines()]
    assert seqlm.score_text(mapped, text) == seqlm.score_text(parsed, text)
    assert seqlm.load(out / BINARY).sizes == parsed.sizes  # a binary file loads on its own too
    # resume of an estimated model re-estimates the same model (it used to fail on a false "<s>")
    before = (out / "model.arpa").read_bytes()
    capsys.readouterr()
    assert main(["train", "--model", "kn", "--data", str(corpus), "--out", str(out), "--resume"]) == 0
    captured = capsys.readouterr()
    assert "re-estimating" in captured.err and (out / "model.arpa").read_bytes() == before
    assert json.loads(captured.out.strip().splitlines()[-1])["test_ppl"] > 1


@needs_oracle
def test_cli_query_prints_kenlm_lines_and_summary(tmp_path: Path, binaries: dict[str, Path]) -> None:
    text = (ORACLE / "query.txt").read_text()
    r = subprocess.run([sys.executable, "-m", "seqlm", "query", str(binaries["kn3"])], input=text,
                       capture_output=True, text=True, env=cli_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    ref = np.loadtxt(ORACLE / "query.kn3.tsv", skiprows=1, delimiter="\t")
    totals = [float(line.split("Total: ")[1].split()[0]) for line in lines[:300]]
    oovs = [int(line.split("OOV: ")[1]) for line in lines[:300]]
    np.testing.assert_allclose(totals, ref[:, 1], atol=1e-4)
    assert oovs == ref[:, 2].astype(int).tolist()
    first = lines[0].split("\t")[0]  # word=id length log10
    word, rest = first.split("=")
    assert word == text.split()[0] and len(rest.split()) == 3
    summary = json.loads((ORACLE / "summary.json").read_text())["kn3"]
    tail = dict(line.split(":\t") for line in lines[300:])
    assert float(tail["Perplexity including OOVs"]) == pytest.approx(summary["ppl_incl_oov"], rel=1e-6)
    assert float(tail["Perplexity excluding OOVs"]) == pytest.approx(summary["ppl_excl_oov"], rel=1e-6)
    assert (int(tail["OOVs"]), int(tail["Tokens"])) == (summary["oov"], summary["tokens"])


def test_convert_round_trip_and_bad_files(tmp_path: Path, capsys) -> None:
    vocab, stream = tiny_stream(["a b c", "b c a", "c a b", "a a b b", "c b a c"] * 5)
    with pytest.warns(UserWarning):
        model = estimate_kn(KNConfig(order=3), stream, vocab)
    save_kn(model, tmp_path)
    assert main(["convert", str(tmp_path / BINARY), str(tmp_path / "back.arpa")]) == 0
    assert (tmp_path / "back.arpa").read_text() == (tmp_path / "model.arpa").read_text()
    data = bytearray((tmp_path / BINARY).read_bytes())
    cases = {
        "version.bin": data[:8] + (FORMAT_VERSION + 1).to_bytes(4, "little") + data[12:],
        "v1.bin": data[:8] + (1).to_bytes(4, "little") + data[12:],
        "short.bin": data[: HEADER.size + 10],
        "cut.bin": data[: len(data) // 2],
        "text.arpa": b"not a model\n",
    }
    messages = {"version.bin": f"version {FORMAT_VERSION + 1}, this seqlm reads version {FORMAT_VERSION}",
                "v1.bin": r"version 1 \(no checksums\).*seqlm convert", "short.bin": "truncated",
                "cut.bin": "past the end", "text.arpa": "no \\\\data\\\\ line"}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(bytes(content))
        with pytest.raises(SeqlmError, match=messages[name]):
            NGramQuery(tmp_path / name)
        capsys.readouterr()
        assert main(["convert", str(tmp_path / name), str(tmp_path / "x.bin")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert main(["query", str(tmp_path / "nothing.bin")]) == 2
    assert "no such model" in capsys.readouterr().err


# ---- checksums, types and id ranges -----------------------------------------------------------------


def reference_checksum(data: bytes) -> int:
    """checksum.py's definition written out word by word in Python integers, weights from splitmix64."""
    def weight(i: int) -> int:
        z = ((i + 1) * 0x9E3779B97F4A7C15) & MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return (z ^ (z >> 31)) | 1

    h = len(data)
    for a in range(0, len(data), BLOCK_BYTES):
        part = data[a:a + BLOCK_BYTES]
        words = [int.from_bytes(part[i:i + 8].ljust(8, b"\0"), "little") for i in range(0, len(part), 8)]
        h = (h * 0x9E3779B97F4A7C15 + sum(w * weight(i) for i, w in enumerate(words))) & MASK
    return h


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 199), st.integers(1, 255))
def test_checksum_matches_its_definition_and_sees_any_one_byte(data: bytes, at: int, flip: int) -> None:
    ref = reference_checksum(data)
    assert checksum(np.frombuffer(data, dtype=np.uint8)) == ref
    if data:
        changed = bytearray(data)
        changed[at % len(data)] ^= flip  # one changed word is always caught (odd weights)
        assert checksum(np.frombuffer(bytes(changed), dtype=np.uint8)) != ref


def test_checksum_across_blocks_and_pieces() -> None:
    data = np.random.default_rng(0).integers(0, 256, size=BLOCK_BYTES + 13, dtype=np.uint8)
    whole = checksum(data)
    assert whole == reference_checksum(data.tobytes())
    assert whole == checksum_blocks([data[:BLOCK_BYTES], data[BLOCK_BYTES:]], len(data))  # the writer's path
    swapped = np.concatenate([data[8:16], data[:8], data[16:]])  # two words trade places
    assert checksum(swapped) != whole


def _tiny_binary(tmp_path: Path) -> tuple[Path, bytes]:
    vocab, stream = tiny_stream(["a b c", "b c a", "c a b", "a a b b", "c b a c", "b b c a a"] * 5)
    with pytest.warns(UserWarning):
        model = estimate_kn(KNConfig(order=3), stream, vocab)
    save_kn(model, tmp_path)
    return tmp_path / BINARY, (tmp_path / BINARY).read_bytes()


def _sections_of(data: bytes, order: int) -> dict[str, tuple[int, int, bytes]]:
    """name -> (offset, bytes, dtype) from the section table."""
    return {name: SECTION.unpack_from(data, HEADER.size + i * SECTION.size)[:3]
            for i, (name, _) in enumerate(layout(order))}


def _reseal(data: bytearray, order: int) -> bytes:
    """`data` with every checksum and the header crc recomputed: a file edited on purpose, which only the
    type and range checks can refuse."""
    import zlib

    table = b""
    for off, n, dt in _sections_of(bytes(data), order).values():
        table += SECTION.pack(off, n, dt, checksum(np.frombuffer(bytes(data[off:off + n]), dtype=np.uint8)))
    magic, version, bo, order_, _, V = HEADER.unpack_from(data, 0)
    crc = zlib.crc32(HEADER.pack(magic, version, bo, order_, 0, V) + table)
    data[:HEADER.size + len(table)] = HEADER.pack(magic, version, bo, order_, crc, V) + table
    return bytes(data)


def _refused(path: Path, match: str, capsys) -> None:
    """read_binary raises a SeqlmError matching `match`; `seqlm query` and `seqlm eval` exit 2 with it
    as their one stderr line."""
    with pytest.raises(SeqlmError, match=match):
        read_binary(path)
    capsys.readouterr()
    for argv in (["query", str(path)], ["convert", str(path), str(path.with_suffix(".arpa"))]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and match.split(".")[0] in err, err
    assert not path.with_suffix(".arpa").exists()


def test_every_damaged_section_is_refused_by_its_checksum(tmp_path: Path, capsys) -> None:
    path, data = _tiny_binary(tmp_path)
    model = read_binary(path)
    sections = _sections_of(data, model.order)
    bad = tmp_path / "bad.bin"
    for name, (off, n, _) in sections.items():
        assert n > 0, name
        zeroed = bytearray(data)
        zeroed[off:off + n] = bytes(n)  # the case: prob_3 zeroed used to load and score
        bad.write_bytes(zeroed)
        _refused(bad, f"section {name} fails its checksum", capsys)
        flipped = bytearray(data)
        flipped[off + n - 1] ^= 0x10  # the last byte: a partial word
        bad.write_bytes(flipped)
        with pytest.raises(SeqlmError, match=f"section {name} fails its checksum"):
            read_binary(bad)
    header = bytearray(data)
    header[16] = 2  # the order: the section table no longer matches the header crc
    bad.write_bytes(header)
    _refused(bad, "header or section table fails its checksum", capsys)
    table = bytearray(data)
    table[HEADER.size + SECTION.size + 1] ^= 1  # an offset in the section table
    bad.write_bytes(table)
    _refused(bad, "header or section table fails its checksum", capsys)


def test_types_and_id_ranges_are_checked_even_with_valid_checksums(tmp_path: Path, capsys) -> None:
    path, data = _tiny_binary(tmp_path)
    model = read_binary(path)
    sections, bad = _sections_of(data, model.order), tmp_path / "bad.bin"

    def edit(name: str, values: np.ndarray, dtype: str) -> None:
        off, n, _ = sections[name]
        changed = bytearray(data)
        changed[off:off + n] = np.asarray(values, dtype=dtype).tobytes()
        bad.write_bytes(_reseal(changed, model.order))

    slots = np.array(model.index[2])
    slots[slots >= 0] = np.where(slots[slots >= 0] == 0, 10**6, slots[slots >= 0])  # the IndexError
    edit("slots_3", slots, "<i4")
    _refused(bad, "slots_3 hold ids out of range", capsys)
    slots = np.array(model.index[2])
    slots[-1] = 0  # probing would run off the end
    edit("slots_3", slots, "<i4")
    _refused(bad, "slots_3 is shorter than its hash range or does not end with an empty slot", capsys)
    for value in (len(model.vocab) * model.sizes[0], -1):  # a prefix id past order 1's n-grams; a negative key
        keys = np.array(model.keys[1])
        keys[-1] = value
        edit("keys_2", keys, "<i8")
        _refused(bad, "keys_2 hold ids out of range", capsys)
    changed = bytearray(data)
    at = HEADER.size + list(sections).index("prob_1") * SECTION.size + 16  # prob_1's dtype: <f8 would read
    # the floats as doubles
    changed[at:at + 8] = b"<f8".ljust(8, b"\0")
    bad.write_bytes(_reseal(changed, model.order))
    _refused(bad, "section prob_1 has type '<f8', expected <f4", capsys)
    changed[at:at + 8] = b"O".ljust(8, b"\0")  # an object dtype must never reach np.frombuffer
    bad.write_bytes(_reseal(changed, model.order))
    _refused(bad, "section prob_1 has type 'O'", capsys)
    off, n, _ = sections["vocab"]
    changed = bytearray(data)
    changed[off] = 0xFF  # not UTF-8
    bad.write_bytes(_reseal(changed, model.order))
    _refused(bad, "vocabulary block is not UTF-8", capsys)
    bad.write_bytes(_reseal(bytearray(data), model.order))  # resealing an intact file changes nothing
    assert bad.read_bytes() == data and read_binary(bad).sizes == model.sizes
