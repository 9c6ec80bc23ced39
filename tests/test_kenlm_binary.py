"""KenLM's own binary files (build_binary) read by seqlm, against the kenlm module reading the same file.

Each binary is built here by KenLM's build_binary (from $KENLM_BIN, PATH or ../shared/tools/kenlm) in every
layout: probing, trie, trie -q 8 -b 8, trie -a 22 and trie -q 8 -b 8 -a 22, from the KenLM oracle's ARPA
files (lmplz output, unpruned and pruned) and from ARPA files with blank n-grams that
test_kenlm_blank_ngrams writes (pruned suffixes: KenLM adds blanks to its tables, in both layouts). seqlm's
and kenlm's full_scores (scores, n-gram lengths, OOV flags) and BaseFullScore walks must agree, and so must
the vocabularies. Damaged files (truncated, a flipped header byte) and layouts seqlm does not read fail
through `seqlm eval` with one line and exit status 2.

build_binary (a peer tool, prebuilt in ../shared/tools/kenlm, needing boost libraries a fresh machine lacks)
made the files in tests/data/kenlm-binary once, named by the ARPA file's content hash and the layout; the
tests read those, so they need neither the tool nor its libraries, and build a file afresh only when its ARPA
changed. The comparison with KenLM's own `query` program runs only where that program runs.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import seqlm
import seqlm.kenlm as ours
from seqlm.errors import SeqlmError
from seqlm.ngram import kenlm_probing
from seqlm.ngram.kenlm_binary import is_kenlm_binary, read_kenlm_binary
from seqlm.ngram.model import NGramModel
from test_kenlm_blank_ngrams import HANDMADE, UNK_CHAIN, random_pruned, sentences, write_arpa
from test_kn import ORACLE, needs_oracle

from conftest import ROOT, require_env, require_module, run_cli

kenlm = require_module("kenlm", "the kenlm Python module is not installed (pip install -e '.[kenlm]')")

LAYOUTS = {
    "probing": ["probing"],
    "trie": ["trie"],
    "trie-q8": ["-q", "8", "-b", "8", "trie"],
    "trie-a22": ["-a", "22", "trie"],
    "trie-q8-a22": ["-q", "8", "-b", "8", "-a", "22", "trie"],
}
WITHOUT_WORDS = {"trie-v": ["-v", "trie"]}  # build_binary -v: a layout seqlm refuses
FIXTURES = Path(__file__).parent / "data" / "kenlm-binary"


def fixture(arpa: Path, layout: str) -> Path:
    """Where build_binary's file for this ARPA text (by content) and layout is kept."""
    data = arpa.read_bytes()
    text = gzip.decompress(data) if arpa.suffix == ".gz" else data
    return FIXTURES / f"{arpa.name.split('.')[0]}-{hashlib.sha256(text).hexdigest()[:12]}.{layout}.bin.gz"


def find_build_binary() -> Path | None:
    """KenLM's build_binary: $KENLM_BIN (the tool or its folder), PATH, or ../shared/tools/kenlm."""
    env = os.environ.get("KENLM_BIN")
    for cand in [Path(env) if env else None, shutil.which("build_binary"), ROOT.parent / "shared/tools/kenlm"]:
        if cand is None:
            continue
        tool = Path(cand) / "build_binary" if Path(cand).is_dir() else Path(cand)
        if tool.is_file() and os.access(tool, os.X_OK):
            return tool
    return None


def runnable_build_binary() -> Path | None:
    """build_binary, where it is found and runs (its usage printed), else None."""
    tool = find_build_binary()
    if tool is None:
        return None
    usage = subprocess.run([str(tool), "-h"], capture_output=True, text=True)
    return tool if "Usage" in usage.stdout + usage.stderr else None


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(arpa, layout) -> build_binary's file: the kept one (tests/data/kenlm-binary), else made now."""
    root, made = tmp_path_factory.mktemp("kenlm-bin"), {}

    def run(arpa: Path, layout: str) -> Path:
        out = root / f"{arpa.name}.{layout}.bin"
        if (arpa, layout) not in made:
            kept = fixture(arpa, layout)
            if kept.is_file():
                out.write_bytes(gzip.decompress(kept.read_bytes()))
            else:
                _build_binary(arpa, layout, out)
            made[arpa, layout] = out
        return made[arpa, layout]

    return run


def _build_binary(arpa: Path, layout: str, out: Path) -> None:
    """A file no fixture holds (its ARPA changed): build_binary makes it; SEQLM_KEEP_KENLM_FIXTURES=1 keeps it."""
    tool = runnable_build_binary()
    if tool is None:
        require_env(f"no kept KenLM binary for {arpa.name} ({layout}) and build_binary cannot run here; "
                    "see ../shared/tools/kenlm/README.md")
    args = (LAYOUTS | WITHOUT_WORDS)[layout]
    r = subprocess.run([str(tool), *args, str(arpa), str(out)], capture_output=True, text=True)
    assert r.returncode == 0, f"build_binary {layout} {arpa}: {r.stderr}"
    if os.environ.get("SEQLM_KEEP_KENLM_FIXTURES"):  # how tests/data/kenlm-binary was made
        fixture(arpa, layout).write_bytes(gzip.compress(out.read_bytes(), 9))


@pytest.fixture(scope="module")
def blank_arpas(tmp_path_factory) -> dict[str, Path]:
    """ARPA files whose n-grams lack suffixes (KenLM adds blanks for them), written with the blank-n-gram tests'
    helpers: their shapes by hand, pruned at random, and by hand with a context that is itself only a blank
    ("a e f" after "h a e"), which the probing build accepts and the trie build does not."""
    root = tmp_path_factory.mktemp("blanks")
    listed = [g for g in HANDMADE if g[0] != "a e f"]
    return {"handmade": write_arpa(root / "handmade.arpa", listed + UNK_CHAIN),
            "random": write_arpa(root / "random.arpa", random_pruned(random.Random(7)) + UNK_CHAIN),
            "blank-context": write_arpa(root / "blank-context.arpa", HANDMADE + UNK_CHAIN)}


def arpa_words(path: Path) -> set[str]:
    """The unigrams of an ARPA file (plain or gzip), read directly."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    section = text.split("\\1-grams:")[1].split("\\2-grams:")[0]
    return {line.split()[1] for line in section.splitlines() if line.strip()}


def assert_same_as_kenlm(path: Path, lines: list[str], arpa: Path) -> None:
    """seqlm.kenlm and kenlm on one binary: vocabulary, full_scores of every line (with and without <s>
    and </s>), and one long BaseFullScore walk across the lines, as a streaming decoder does."""
    theirs, mine = kenlm.Model(str(path)), ours.Model(str(path))
    assert mine.order == theirs.order
    words = arpa_words(arpa) | {"<unk>"}
    assert set(mine.vocab.itos) == words and len(mine.vocab.itos) == len(words)
    for w in sorted(words)[:300] + ["zebra-oov", "<UNK>"]:
        assert (w in mine) == (w in theirs), w
    for line in lines:
        for bos, eos in ((True, True), (False, False), (True, False)):
            a, b = list(theirs.full_scores(line, bos, eos)), list(mine.full_scores(line, bos, eos))
            np.testing.assert_allclose([x[0] for x in b], [x[0] for x in a], atol=1e-4, err_msg=line)
            assert [x[1:] for x in b] == [tuple(x[1:]) for x in a], (line, bos, eos)
    s, t, a, b = ours.State(), ours.State(), kenlm.State(), kenlm.State()
    mine.BeginSentenceWrite(s)
    theirs.BeginSentenceWrite(a)
    for word in " ".join(lines[:40]).split():
        x, y = mine.BaseFullScore(s, word, t), theirs.BaseFullScore(a, word, b)
        assert (x.ngram_length, x.oov) == (y.ngram_length, y.oov), word
        assert x.log_prob == pytest.approx(y.log_prob, abs=1e-4)
        assert mine.BaseScore(s, word, t) == pytest.approx(theirs.BaseScore(a, word, b), abs=1e-4)
        s, t, a, b = t, s, b, a


@needs_oracle
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", ["kn3", "kn5-prune00112"])
def test_oracle_binaries_score_as_kenlm(build, name, layout):
    arpa = ORACLE / f"{name}.arpa.gz"
    path = build(arpa, layout)
    assert is_kenlm_binary(path)
    assert_same_as_kenlm(path, (ORACLE / "query.txt").read_text().splitlines(), arpa)


@needs_oracle
@pytest.mark.parametrize("layout", ["trie-q8-a22"])
def test_oracle_kn5_binaries_score_as_kenlm(build, layout):
    """The unpruned KN5, its five orders packed (probing's search through four orders of hashes is the pruned
    KN5's test: the unpruned file would add 5 MB to the kept files)."""
    arpa = ORACLE / "kn5.arpa.gz"
    assert_same_as_kenlm(build(arpa, layout), (ORACLE / "query.txt").read_text().splitlines()[:150], arpa)


@pytest.mark.parametrize(("which", "layout"), [(w, x) for w in ("handmade", "random") for x in LAYOUTS]
                         + [("blank-context", "probing")])
def test_blank_ngrams_score_as_kenlm(build, blank_arpas, which, layout):
    """KenLM's blanks (a suffix the ARPA file lacks) are entries of its binary; seqlm reads them as such, so
    the n-gram lengths reported (which count blanks) are kenlm's too."""
    arpa = blank_arpas[which]
    path = build(arpa, layout)
    plain = NGramModel.from_arpa(arpa)
    assert sum(read_kenlm_binary(path).sizes) > sum(plain.sizes)  # the blanks are there
    assert_same_as_kenlm(path, sentences(random.Random(4), 200) + ["a b c d", "e f g h", "h a e f"], arpa)


@needs_oracle
def test_seqlm_commands_read_kenlm_binaries(build, tmp_path, capsys, monkeypatch):
    """`seqlm eval`, `info`, `convert` and seqlm.load take a KenLM binary like any n-gram file: the perplexity
    of the oracle's query text is the one KenLM's query printed (summary.json), and the ARPA file converted from
    a quantized trie scores in kenlm as the binary itself does."""
    summary = json.loads((ORACLE / "summary.json").read_text())["kn3"]
    for layout in ("probing", "trie"):
        path = build(ORACLE / "kn3.arpa.gz", layout)
        code, out, err = run_cli(capsys, "eval", path, "--text", ORACLE / "query.txt")
        assert code == 0, err
        report = json.loads(out)
        assert report["ppl"] == pytest.approx(summary["ppl_incl_oov"], rel=1e-5)
        assert (report["oov"], report["tokens"]) == (summary["oov"], summary["tokens"])
    code, out, _ = run_cli(capsys, "info", path)
    assert code == 0 and "KenLM binary file" in json.loads(out)["source"]
    assert seqlm.load(path).order == 3
    quantized = build(ORACLE / "kn3.arpa.gz", "trie-q8")
    code, _, err = run_cli(capsys, "convert", quantized, tmp_path / "q8.arpa")
    assert code == 0, err
    a, b = kenlm.Model(str(quantized)), kenlm.Model(str(tmp_path / "q8.arpa"))
    for line in (ORACLE / "query.txt").read_text().splitlines()[:50]:
        assert b.score(line) == pytest.approx(a.score(line), abs=1e-4)


def _damaged(good: bytes) -> dict[str, bytes]:
    """Copies of a binary with one kind of damage each."""
    def flip(at: int) -> bytes:
        b = bytearray(good)
        b[at] ^= 0xFF
        return bytes(b)

    return {"cut in the header": good[:100], "cut in the tables": good[: len(good) // 2],
            "cut in the words": good[:-50], "flipped magic byte": flip(20), "flipped test value": flip(62),
            "flipped order": flip(88), "flipped model type": flip(96), "flipped 2-gram count": flip(108 + 9)}


@pytest.mark.parametrize("layout", ["probing", "trie", "trie-q8-a22"])
def test_damaged_binaries_fail_with_one_line(build, blank_arpas, tmp_path, capsys, layout):
    good = build(blank_arpas["random"], layout).read_bytes()
    text = tmp_path / "text.txt"
    text.write_text("a b c d\ne f g h\n")
    for what, data in _damaged(good).items():
        bad = tmp_path / "lm.bin"
        bad.write_bytes(data)
        code, out, err = run_cli(capsys, "eval", bad, "--text", text)
        assert code == 2, what
        assert len(err.strip().splitlines()) == 1 and "KenLM binary file" in err and "Traceback" not in err, what
        with pytest.raises(OSError, match="Cannot read model"):
            ours.Model(str(bad))


def test_unsupported_variants_are_refused(build, blank_arpas, tmp_path, capsys):
    """Without its words (-v) the vocabulary cannot be known; probing with rest costs (build_binary -r, model
    type 1) is not read. Each says so in one line."""
    arpa = blank_arpas["handmade"]
    no_words = build(arpa, "trie-v")
    rest = bytearray(build(arpa, "probing").read_bytes())
    rest[96] = 1  # the model type field: probing with rest costs
    (tmp_path / "rest.bin").write_bytes(bytes(rest))
    text = tmp_path / "text.txt"
    text.write_text("a b c d\n")
    for path, why in ((no_words, "without its words"), (tmp_path / "rest.bin", "probing with rest costs")):
        code, _, err = run_cli(capsys, "eval", path, "--text", text)
        assert code == 2 and why in err and len(err.strip().splitlines()) == 1


def test_probing_search_finds_entries_the_join_misses(build, blank_arpas, monkeypatch):
    """An entry that no context-suffix pair reaches (a flag gone wrong) is found by trying every first word:
    with a seventh of the candidates withheld, the model read is the same."""
    path = build(blank_arpas["random"], "probing")
    want = read_kenlm_binary(path)
    real = kenlm_probing._candidates

    def fewer(*args):
        for i, j in real(*args):
            keep = (i % 7) != 3
            yield i[keep], j[keep]

    monkeypatch.setattr(kenlm_probing, "_candidates", fewer)
    got = read_kenlm_binary(path)
    assert got.vocab == want.vocab
    for k in range(want.order):
        np.testing.assert_array_equal(got.keys[k], want.keys[k])
        np.testing.assert_array_equal(got.log10_prob[k], want.log10_prob[k])


def test_probing_search_cost_is_bounded(build, blank_arpas, monkeypatch):
    """Past the budget the search is refused (pointing to the trie layout); above SLOW it warns."""
    path = build(blank_arpas["handmade"], "probing")
    monkeypatch.setattr(kenlm_probing, "SLOW", 10)
    with pytest.warns(UserWarning, match="minutes"):
        read_kenlm_binary(path)
    monkeypatch.setattr(kenlm_probing, "BUDGET", 10)
    with pytest.raises(SeqlmError, match="trie layout"):
        read_kenlm_binary(path)


@needs_oracle
def test_query_prints_kenlm_querys_word_ids_and_lengths(build, capsys, monkeypatch):
    """`seqlm query` on a KenLM binary prints the `word=id length` fields KenLM's own query program prints for
    it: KenLM's ids are seqlm's. Only where that program runs (a peer tool, not installed by `make test`)."""
    tool = runnable_build_binary()
    query = tool.parent / "query" if tool is not None else None
    if query is None or not query.is_file():
        pytest.skip("KenLM's query program does not run here (../shared/tools/kenlm/README.md)")
    path = build(ORACLE / "kn3.arpa.gz", "trie")
    text = "\n".join((ORACLE / "query.txt").read_text().splitlines()[:20]) + "\n"
    theirs = subprocess.run([str(query), str(path)], input=text, capture_output=True, text=True,
                            check=True).stdout.splitlines()[:20]
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    code, out, _ = run_cli(capsys, "query", path)
    for a, b in zip(theirs, out.splitlines()[:20], strict=True):
        assert [t.rsplit(" ", 1)[0] for t in a.split("\t")[:-1]] == [t.rsplit(" ", 1)[0] for t in b.split("\t")[:-1]]
