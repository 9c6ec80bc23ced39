"""seqlm decode (seqlm.decode): the CTC prefix beam search against independent references.

- Exhaustive search: on 4 labels and 5-6 frames every alignment is enumerated, its probability summed into
  the transcript it yields; with a beam wide enough and nothing pruned, the decoder's n-best is that table,
  scores included: without an LM, with a tiny word LM (its scores from the kenlm module, the words' rule
  written out here), and token by token with a character LM.
- pyctcdecode + the kenlm module, on simulated utterances: the same transcripts (its `decode`), the same
  n-best and scores (its `decode_beams`), with and without hotwords.
- A small LSTM: the LM part of the best transcript equals its sentence score (one forward pass).
- Hotwords change the result as their rule says; the CLI writes what the API gives; bad input is one line,
  exit 2, nothing written.
Every test runs twice: with the compiled frame step and with the tensor one (tests/test_decode_twins.py compares
the two directly).
"""

from __future__ import annotations

import itertools
import json
import logging
import math

import numpy as np
import pytest
import torch

import seqlm
from seqlm.cli import main
from seqlm.decode import CTCDecoder, DecodeConfig, resolve
from seqlm.decode.lexicon import Hotwords, parse_hotwords

from conftest import require_env, require_module, write_chain_corpus, write_corpus

ALPHA, BETA = 0.6, 1.0
WIDE = dict(beam_width=100_000, beam_prune_logp=-1e9, token_min_logp=-1e9, prune_history=False, nbest=100_000)
LN10 = math.log(10)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, params=["compiled", "tensor"])
def search(request, monkeypatch):
    """Every test runs with both frame steps: the compiled one (seqlm.decode.compiled, the CPU's default) and
    the tensor one (seqlm.decode.search, its twin, which runs on a GPU)."""
    from seqlm.decode import compiled, decoder

    if request.param == "tensor":
        monkeypatch.setattr(decoder, "compiled_search", lambda tables: None)
    elif compiled.extension() is None:
        require_env("the compiled frame step (_search.cpp) could not be built here")
    return request.param


def log_softmax(x: np.ndarray) -> np.ndarray:
    return x - np.logaddexp.reduce(x, axis=1, keepdims=True)


def exhaustive(logits: np.ndarray, labels, key) -> dict:
    """{key(label sequence): ln of the summed probability of every alignment that yields it}."""
    lp = log_softmax(logits)
    out: dict = {}
    for path in itertools.product(range(lp.shape[1]), repeat=lp.shape[0]):
        seq = [c for i, c in enumerate(path) if c != labels.blank and (i == 0 or c != path[i - 1])]
        k = key(seq)
        out[k] = np.logaddexp(out.get(k, -np.inf), lp[np.arange(len(path)), path].sum())
    return out


def assert_nbest(got, want: dict, key, tol: float = 1e-9) -> None:
    """The decoder's n-best is the table: the same keys, scores within `tol` (LM scores are float32)."""
    table = {key(h): h.score for h in got}
    assert table.keys() == want.keys()
    for k, score in want.items():
        assert table[k] == pytest.approx(score, abs=tol), k


def test_without_lm_the_wide_beam_is_the_exhaustive_sum():
    labels = resolve(["", " ", "a", "b"])
    decoder = CTCDecoder(labels, None, DecodeConfig(**WIDE))
    rng = np.random.default_rng(0)
    mats = [rng.normal(0, 1.5, (T, 4)) for T in (4, 5, 6, 6)]
    for logits, nbest in zip(mats, decoder.decode(mats), strict=True):
        want = exhaustive(logits, labels, labels.render)  # "a  b", " ab" and "ab " read as "a b", "ab"
        assert_nbest(nbest, want, lambda h: h.text)
        assert nbest[0].text == max(want, key=want.get)


@pytest.fixture(scope="module")
def tiny_words(tmp_path_factory):
    """A KN3 model of the words a, b, ab, ba (and its ARPA, for the kenlm module)."""
    root = tmp_path_factory.mktemp("tiny")
    (root / "c").mkdir()
    rng = np.random.default_rng(1)
    lines = [" ".join(rng.choice(["a", "b", "ab", "ba"], size=rng.integers(1, 4))) for _ in range(60)]
    (root / "c" / "train.txt").write_text("\n".join(lines) + "\n")
    assert main(["train", "--model", "kn", "--order", "3", "--data", str(root / "c"), "--out", str(root / "kn")]) == 0
    return root / "kn"


def word_lm_score(model, text: str) -> float:
    """The word rule written out, log10 scores from the kenlm module: alpha * (ln p(w | h) + unk_offset * ln 10
    for a word outside the unigrams) + beta per word, then alpha * ln p(</s>)."""
    words = text.split()
    scores = [s for s, _, _ in model.full_scores(text, bos=True, eos=True)]  # log10, </s> last
    unknown = [w not in ("a", "b", "ab", "ba") for w in words]
    total = sum(ALPHA * LN10 * (s - 10.0 * u) + BETA for s, u in zip(scores, unknown, strict=False))
    return total + ALPHA * LN10 * scores[-1]


def test_with_a_word_lm_the_wide_beam_is_the_exhaustive_sum(tiny_words):
    kenlm = require_module("kenlm", "the kenlm Python module is not installed")
    reference = kenlm.Model(str(tiny_words / "model.arpa"))
    labels = resolve(["", " ", "a", "b"])
    cfg = DecodeConfig(alpha=ALPHA, beta=BETA, trailing_space="ignore", **WIDE)
    decoder = CTCDecoder(labels, seqlm.load(tiny_words), cfg)
    rng = np.random.default_rng(2)
    mats = [rng.normal(0, 1.5, (T, 4)) for T in (5, 6, 6)]
    for logits, nbest in zip(mats, decoder.decode(mats), strict=True):
        acoustic = exhaustive(logits, labels, labels.render)
        want = {t: s + word_lm_score(reference, t) for t, s in acoustic.items()}
        assert_nbest(nbest, want, lambda h: h.text, tol=1e-5)
        assert any(w not in ("a", "b", "ab", "ba") for t in want for w in t.split())  # words outside the LM too


def test_token_level_with_a_character_lm_is_the_exhaustive_sum(tmp_path):
    kenlm = require_module("kenlm", "the kenlm Python module is not installed")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "train.txt").write_text("ab a\nba ab\na b\nab ba a\nb b a\n")
    assert main(["train", "--model", "kn", "--order", "3", "--unit", "char", "--data", str(tmp_path / "c"),
                 "--out", str(tmp_path / "kc")]) == 0
    reference = kenlm.Model(str(tmp_path / "kc" / "model.arpa"))
    labels = resolve(["<blank>", " ", "a", "b"])  # the space label is the character model's `_`
    decoder = CTCDecoder(labels, seqlm.load(tmp_path / "kc"), DecodeConfig(alpha=ALPHA, beta=BETA, **WIDE))
    assert not decoder.tables.word_level  # a character model: token level by default

    def lm(seq: tuple[int, ...]) -> float:
        tokens = " ".join("_" if c == 1 else labels.names[c] for c in seq)
        scores = [s for s, _, _ in reference.full_scores(tokens, bos=True, eos=True)]
        return sum(ALPHA * LN10 * s + BETA for s in scores[:-1]) + ALPHA * LN10 * scores[-1]

    rng = np.random.default_rng(3)
    mats = [rng.normal(0, 1.5, (T, 4)) for T in (5, 6)]
    for logits, nbest in zip(mats, decoder.decode(mats), strict=True):
        want = {s: a + lm(s) for s, a in exhaustive(logits, labels, tuple).items()}
        assert_nbest(nbest, want, lambda h: h.labels, tol=1e-5)


def simulate(text: str, labels: list[str], rng: np.random.Generator, noise: float, peak: float = 4.0) -> np.ndarray:
    """(frames, labels) logits: 1-2 frames per character and a blank after each, `peak` over N(0, noise)."""
    index = {c: i for i, c in enumerate(labels)}
    frames = []
    for c in text:
        frames += [index[c]] * int(rng.integers(1, 3)) + [index[""]]
    logits = rng.normal(0.0, noise, (len(frames), len(labels)))  # (F, L)
    logits[np.arange(len(frames)), frames] += peak
    return logits


@pytest.fixture(scope="module")
def kn3(tmp_path_factory):
    return build_kn3(tmp_path_factory.mktemp("kn3"))


def build_kn3(root):
    """A word KN3 model (its directory, the model, its words), labels for its characters, and 20 simulated
    utterances of its test sentences with the sentences."""
    corpus = write_corpus(root / "corpus", n_train=200)
    assert main(["train", "--model", "kn", "--order", "3", "--data", str(corpus), "--out", str(root / "kn3")]) == 0
    model = seqlm.load(root / "kn3")
    vocab = [w for w in model.vocab.itos if w not in ("<s>", "</s>")]
    labels = ["", " ", *sorted({c for w in vocab for c in w})]
    rng = np.random.default_rng(0)
    lines = (corpus / "test.txt").read_text().splitlines()[:20]
    return root / "kn3", model, vocab, labels, [simulate(line, labels, rng, noise=1.5) for line in lines], lines


def build_char_kn3(root):
    """Labels of two letters and a space, a character KN3 on a tiny text of them, and 30 random utterances:
    decoding at token level."""
    (root / "c").mkdir()
    (root / "c" / "train.txt").write_text("ab a\nba ab\na b\nab ba a\nb b a\nba ba\n")
    assert main(["train", "--model", "kn", "--order", "3", "--unit", "char", "--data", str(root / "c"),
                 "--out", str(root / "kc")]) == 0
    rng = np.random.default_rng(6)
    return ["<blank>", " ", "a", "b"], seqlm.load(root / "kc"), [rng.normal(0, 2, (int(rng.integers(4, 30)), 4))
                                                              for _ in range(30)]


def pyctcdecoder(kn3, **options):
    require_module("kenlm", "the kenlm Python module is not installed")
    pyctcdecode = require_module("pyctcdecode", "pyctcdecode is not installed (pip install -e '.[ctc]')")
    logging.getLogger("pyctcdecode").setLevel(logging.ERROR)
    out, _, vocab, labels, _, _ = kn3
    return pyctcdecode.build_ctcdecoder(labels, str(out / "model.arpa"), unigrams=vocab, alpha=ALPHA, beta=BETA,
                                        **options)


def test_transcripts_equal_pyctcdecode_with_the_kenlm_module(kn3):
    _, model, _, labels, mats, lines = kn3
    theirs = pyctcdecoder(kn3)
    ours = CTCDecoder(resolve(labels), model, DecodeConfig(alpha=ALPHA, beta=BETA, beam_width=16, batch_size=7))
    want = [theirs.decode(m, beam_width=16) for m in mats]  # prune_history, as `decode` does
    got = [n[0].text for n in ours.decode(mats)]
    assert got == want
    assert sum(w != line for w, line in zip(want, lines, strict=True)) >= 5  # the noise makes errors: a real test


def test_nbest_and_scores_equal_pyctcdecode_decode_beams(kn3):
    _, model, _, labels, mats, _ = kn3
    theirs = pyctcdecoder(kn3)
    cfg = DecodeConfig(alpha=ALPHA, beta=BETA, beam_width=16, prune_history=False, nbest=16)
    several = 0
    for logits, nbest in zip(mats[:8], CTCDecoder(resolve(labels), model, cfg).decode(mats[:8]), strict=True):
        beams = theirs.decode_beams(logits, beam_width=16)
        assert [h.text for h in nbest] == [b[0] for b in beams]
        np.testing.assert_allclose([h.score for h in nbest], [b[-1] for b in beams], atol=1e-4)
        np.testing.assert_allclose([h.acoustic for h in nbest], [b[-2] for b in beams], atol=1e-9)
        several += len(beams) > 3
    assert several >= 4


@pytest.mark.parametrize("with_lm", [True, False])
def test_hotwords_equal_pyctcdecode(kn3, with_lm):
    path, model, _, labels, mats, _ = kn3
    pyctcdecode = require_module("pyctcdecode", "pyctcdecode is not installed (pip install -e '.[ctc]')")
    theirs = pyctcdecoder(kn3) if with_lm else pyctcdecode.build_ctcdecoder(labels)
    hot = ["cat", "slow dog", "mat"]
    ours = CTCDecoder(resolve(labels), model if with_lm else None, DecodeConfig(alpha=ALPHA, beta=BETA, beam_width=16),
                      hotwords=parse_hotwords([], hot, 4.0))
    want = [theirs.decode(m, beam_width=16, hotwords=hot, hotword_weight=4.0) for m in mats]
    assert [n[0].text for n in ours.decode(mats)] == want
    plain = CTCDecoder(resolve(labels), model if with_lm else None, DecodeConfig(alpha=ALPHA, beta=BETA, beam_width=16))
    assert [n[0].text for n in plain.decode(mats)] != want  # the boost changed some transcript


def test_a_hotword_adds_its_weight_to_the_words_it_matches():
    """Without an LM a transcript scores its alignments alone; a hotword adds its weight once per word of the
    transcript that equals it, so it wins where its acoustic score trails by less than that."""
    labels = resolve(["", " ", "a", "b", "c", "t"])
    logits = np.full((5, 6), -5.0)
    for f, c in enumerate([4, 2, 0, 5, 0]):  # c a _ t _, with b nearly as likely as t
        logits[f, c] = 2.0
    logits[3, 3] = 1.5
    cfg = DecodeConfig(nbest=10, prune_history=False)
    plain = {h.text: h.score for h in CTCDecoder(labels, None, cfg).decode([logits])[0]}
    boosted = {h.text: h.score for h in CTCDecoder(labels, None, cfg, hotwords={"cab": 0.8}).decode([logits])[0]}
    assert max(plain, key=plain.get) == "cat" and max(boosted, key=boosted.get) == "cab"
    assert boosted["cab"] == pytest.approx(plain["cab"] + 0.8)
    assert boosted["cat"] == pytest.approx(plain["cat"])
    hot = Hotwords(parse_hotwords(["cab 3", "cabin 5", "new york 2"], ["cat"], 1.0), labels, torch.device("cpu"))
    node = lambda s: torch.tensor([hot.trie.index.get(s, -1)])  # noqa: E731
    assert float(hot.partial(node("ca"), torch.tensor([2]))) == pytest.approx(3 * 2 / 3)  # cab: the shortest
    assert float(hot.partial(node("cabi"), torch.tensor([4]))) == pytest.approx(5 * 4 / 5)
    assert float(hot.finished(node("cat"))) == 1.0 and float(hot.partial(node("x"), torch.tensor([1]))) == 0.0
    assert parse_hotwords(["new york 2"], [], 1.0) == {"new": 2.0, "york": 2.0}  # a phrase counts as its words


def test_a_neural_lm_scores_the_best_transcript_as_its_sentence_score(tmp_path):
    corpus = write_chain_corpus(tmp_path / "corpus", n_train=200, n_eval=10)
    assert main(["train", "--model", "lstm", "--data", str(corpus), "--out", str(tmp_path / "lstm"), "--hidden",
                 "16", "--layers", "1", "--max-epochs", "1", "--batch-size", "8", "--threads", "1"]) == 0
    model = seqlm.load(tmp_path / "lstm")
    vocab = [w for w in model.vocab.itos if not w.startswith("<")]
    labels = ["", " ", *sorted({c for w in vocab for c in w})]
    rng = np.random.default_rng(4)
    mats = [simulate(line, labels, rng, noise=1.0) for line in (corpus / "test.txt").read_text().splitlines()[:4]]
    cfg = DecodeConfig(alpha=ALPHA, beta=BETA, beam_width=8, trailing_space="ignore")
    for nbest in CTCDecoder(resolve(labels), model, cfg).decode(mats):
        best = nbest[0]
        words = best.text.split()
        assert words and all(w in vocab for w in words)
        want = ALPHA * LN10 * seqlm.score_sentence(model, best.text) + BETA * len(words)
        assert best.lm == pytest.approx(want, abs=1e-4)


def test_batches_decode_as_one_utterance_at_a_time(kn3):
    _, model, _, labels, mats, _ = kn3
    cfg = dict(alpha=ALPHA, beta=BETA, beam_width=8, nbest=3)
    together = CTCDecoder(resolve(labels), model, DecodeConfig(batch_size=20, **cfg)).decode(mats[:10])
    alone = CTCDecoder(resolve(labels), model, DecodeConfig(batch_size=1, **cfg)).decode(mats[:10])
    for a, b in zip(together, alone, strict=True):
        assert [h.text for h in a] == [h.text for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-9)


@pytest.fixture
def on_disk(kn3, tmp_path):
    path, _, _, labels, mats, _ = kn3
    (tmp_path / "utts").mkdir()
    for i, m in enumerate(mats[:5]):
        np.save(tmp_path / "utts" / f"u{i}.npy", m.astype(np.float32))
    np.savez(tmp_path / "all.npz", **{f"u{i}": m.astype(np.float32) for i, m in enumerate(mats[:5])})
    (tmp_path / "labels.txt").write_text("\n".join(labels) + "\n")
    return tmp_path, path


def test_cli_writes_what_the_api_decodes(on_disk, kn3, capsys):
    tmp, path = on_disk
    _, model, _, labels, mats, lines = kn3
    args = ["decode", "--labels", str(tmp / "labels.txt"), "--lm", str(path), "--alpha", "0.6", "--beta", "1",
            "--beam-width", "16"]
    want = [n[0].text for n in CTCDecoder(resolve(labels), model, DecodeConfig(alpha=ALPHA, beta=BETA, beam_width=16))
            .decode([m.astype(np.float32) for m in mats[:5]])]
    assert main([*args, str(tmp / "utts")]) == 0
    assert capsys.readouterr().out.splitlines() == want
    assert main([*args, str(tmp / "all.npz"), "--json", "--nbest", "2", "--out", str(tmp / "out.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp / "out.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == want and [r["name"] for r in rows] == [f"u{i}" for i in range(5)]
    assert all(len(r["nbest"]) <= 2 and r["score"] == pytest.approx(r["acoustic"] + r["lm"]) for r in rows)
    assert main([*args, str(tmp / "all.npz"), "--out", str(tmp / "out.jsonl")]) == 2  # exists: --force to replace
    (tmp / "refs.txt").write_text("\n".join(lines[:5]) + "\n")
    assert main([*args, str(tmp / "utts"), "--tune", "--refs", str(tmp / "refs.txt"), "--tune-alpha", "0.3,0.6",
                 "--tune-beta", "0,1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["grid"]) == 4 and report["wer"] == min(g["wer"] for g in report["grid"])


def refused(args: list[str], capsys, out) -> str:
    """The one line `seqlm decode` prints for bad input; exit status 2 and no output file."""
    assert main(["decode", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("seqlm: error:") and not out.exists()
    return err


def test_bad_input_is_one_line_and_nothing_written(on_disk, capsys, tmp_path):
    tmp, path = on_disk
    out, labels = tmp / "out.txt", str(tmp / "labels.txt")
    (tmp / "short.txt").write_text("\n".join((tmp / "labels.txt").read_text().splitlines()[:-1]) + "\n")
    assert "columns" in refused([str(tmp / "utts"), "--labels", str(tmp / "short.txt")], capsys, out)
    bad = np.load(tmp / "utts" / "u0.npy")
    bad[3, 2] = np.nan
    np.save(tmp / "nan.npy", bad)
    assert "NaN" in refused([str(tmp / "nan.npy"), "--labels", labels], capsys, out)
    (tmp / "empty.npy").write_bytes(b"")
    assert "not a NumPy" in refused([str(tmp / "empty.npy"), "--labels", labels], capsys, out)
    (tmp / "none").mkdir()
    assert "needs .npy" in refused([str(tmp / "none"), "--labels", labels], capsys, out)
    (tmp / "nolabels.txt").write_text("")
    assert "no labels" in refused([str(tmp / "utts"), "--labels", str(tmp / "nolabels.txt")], capsys, out)
    upper = [lb.upper() for lb in (tmp / "labels.txt").read_text().splitlines()]
    (tmp / "upper.txt").write_text("\n".join(upper) + "\n")
    err = refused([str(tmp / "utts"), "--labels", str(tmp / "upper.txt"), "--lm", str(path)], capsys, out)
    assert "occur in no word" in err
    err = refused([str(tmp / "utts"), "--labels", labels, "--lm", str(path), "--lm-unit", "token"], capsys, out)
    assert "not tokens" in err
    (tmp / "c").mkdir()
    (tmp / "c" / "train.txt").write_text("ab a\nba ab\n")
    assert main(["train", "--model", "kn", "--order", "2", "--unit", "char", "--data", str(tmp / "c"),
                 "--out", str(tmp / "kc")]) == 0
    capsys.readouterr()
    err = refused([str(tmp / "utts"), "--labels", labels, "--lm", str(tmp / "kc"), "--lm-unit", "word"], capsys, out)
    assert "whitespace-separated words" in err
    assert "--refs" in refused([str(tmp / "utts"), "--labels", labels, "--tune"], capsys, out)


def test_the_cycle_collector_is_paused_during_a_search_and_left_as_it_was(kn3, monkeypatch):
    import gc

    from seqlm.decode import decoder as decoder_module

    _, model, _, labels, mats, _ = kn3
    seen = []
    search = decoder_module.CTCDecoder._search_batch
    monkeypatch.setattr(decoder_module.CTCDecoder, "_search_batch",
                        lambda self, m: seen.append(gc.isenabled()) or search(self, m))
    decoder = CTCDecoder(resolve(labels), model, DecodeConfig(alpha=ALPHA, beta=BETA, beam_width=4, batch_size=8))
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            decoder.decode(mats[:10])
            assert gc.isenabled() is enabled
    finally:
        gc.enable()
    assert seen and not any(seen)


@pytest.mark.parametrize("level", ["word", "token"])
def test_compacting_the_lm_pool_changes_nothing(kn3, tmp_path, monkeypatch, level):
    """The LM pool dropped and repacked every frame (decoder.py's _compact, LMPool.compact) against never:
    the same n-best, scores and LM scores."""
    from seqlm.decode import decoder as decoder_module
    from seqlm.decode.lmpool import LMPool

    _, model, _, labels, mats, _ = kn3
    if level == "token":
        labels, model, mats = build_char_kn3(tmp_path)
    cfg = DecodeConfig(alpha=ALPHA, beta=BETA, beam_width=8, nbest=8, batch_size=7, prune_history=False)
    calls, moved = [], []
    compact, pack = LMPool.compact, LMPool._pack

    def counted(self, live):
        calls.append(self.size)
        return compact(self, live)

    def packed(self, old):
        moved.append(int((old >= len(old)).sum()))
        return pack(self, old)

    monkeypatch.setattr(decoder_module, "POOL_SLACK", 0)
    monkeypatch.setattr(LMPool, "compact", counted)
    monkeypatch.setattr(LMPool, "_pack", packed)
    often = CTCDecoder(resolve(labels), model, cfg).decode(mats)
    assert len(calls) >= 10 and sum(moved) > 0  # compacted, and rows moved
    monkeypatch.setattr(decoder_module.CTCDecoder, "_compact", lambda self, beams: beams)
    never = CTCDecoder(resolve(labels), model, cfg).decode(mats)
    for a, b in zip(often, never, strict=True):
        assert [h.text for h in a] == [h.text for h in b]
        assert [h.labels for h in a] == [h.labels for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-12)
        np.testing.assert_allclose([h.lm for h in a], [h.lm for h in b], atol=1e-12)


def sparse_then_whole_rows(model, labels, mats, cfg, monkeypatch) -> tuple[list, list]:
    """The n-best lists of two decodes: as the model declares (sparse_targets: no table row computed), then with
    the declaration turned off (more than 10 rows of the table computed)."""
    from dataclasses import replace

    tables, advance = [], type(model).advance

    def counted(self, prefixes):
        table = advance(self, prefixes)  # (B, V)
        tables.append(table.shape[0])
        return table

    monkeypatch.setattr(type(model), "advance", counted)
    sparse = CTCDecoder(resolve(labels), model, cfg).decode(mats)
    assert not tables
    caps = model.capabilities()
    monkeypatch.setattr(type(model), "capabilities", lambda self: replace(caps, sparse_targets=False))
    rows = CTCDecoder(resolve(labels), model, cfg).decode(mats)
    assert sum(tables) > 10
    return sparse, rows


def test_a_sparse_pool_scores_what_the_pools_rows_score(kn3, monkeypatch):
    """Word level with an n-gram (sparse_targets): the pool keeps states only and asks advance_targets for the words
    the beams end, never a row of the table; the same decode with the pool keeping whole rows (the model's
    declaration turned off) gives the same n-best and scores, compacted often in both."""
    from seqlm.decode import decoder as decoder_module

    _, model, _, labels, mats, _ = kn3
    assert model.capabilities().sparse_targets
    cfg = DecodeConfig(alpha=ALPHA, beta=BETA, beam_width=8, nbest=8, batch_size=7, prune_history=False)
    monkeypatch.setattr(decoder_module, "POOL_SLACK", 0)
    sparse, rows = sparse_then_whole_rows(model, labels, mats, cfg, monkeypatch)
    for a, b in zip(sparse, rows, strict=True):
        assert [h.text for h in a] == [h.text for h in b]
        assert [h.labels for h in a] == [h.labels for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-12)
        np.testing.assert_allclose([h.lm for h in a], [h.lm for h in b], atol=1e-12)


@pytest.mark.parametrize(("name", "output"), [("lstm", "class"), ("rnn", "class"), ("rnn", "tree")])
def test_a_class_output_model_is_scored_word_by_word_from_its_state(kn3, monkeypatch, name, output):
    """A recurrent model with a class-factorised (or tree) output declares sparse_targets (nn/readout.py): the
    pool asks advance_targets for the words the beams end, read from the states, never a (V,) row; the same
    decode with whole rows (the declaration turned off) gives the same n-best, the scores to float32 rounding;
    the pool compacted often, so that the normalisers it keeps (protocol.Prefixes.memo) move with the rows."""
    from seqlm.config import apply_overrides
    from seqlm.decode import decoder as decoder_module
    from seqlm.registry import family, new_model

    vocab = kn3[1].vocab
    cfg = family(name).config()
    apply_overrides([cfg], {"hidden": 16, "output": output, "classes": 5})
    model = new_model(name, cfg, vocab).eval()
    if output == "tree":  # a fresh tree's scores do not depend on the history (zero weights)
        torch.nn.init.normal_(model.out.weight, std=0.5)
    assert model.capabilities().sparse_targets
    _, _, _, labels, mats, _ = kn3
    decode_cfg = DecodeConfig(alpha=ALPHA, beta=BETA, beam_width=8, nbest=8, batch_size=7, prune_history=False)
    monkeypatch.setattr(decoder_module, "POOL_SLACK", 0)
    sparse, rows = sparse_then_whole_rows(model, labels, mats, decode_cfg, monkeypatch)
    for a, b in zip(sparse, rows, strict=True):
        assert [h.text for h in a] == [h.text for h in b]
        np.testing.assert_allclose([h.lm for h in a], [h.lm for h in b], rtol=0, atol=1e-4)
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=0, atol=1e-4)


@pytest.mark.parametrize("setup", ["word-lm", "pieces", "hotwords", "heavy-hotwords"])
def test_leaving_out_labels_by_their_score_bound_changes_nothing(kn3, monkeypatch, setup):
    """The search skips candidates whose best reachable score is below what is sure to be pruned
    (seqlm.decode.search.Search.candidates); trying every candidate must give the same n-best and scores."""
    from seqlm.decode import decoder as decoder_module

    _, model, _, labels, mats, _ = kn3
    cfg = DecodeConfig(alpha=ALPHA, beta=BETA, beam_width=4, nbest=4, prune_history=False)
    lm, hot, names = model, None, labels
    if setup == "pieces":  # word starts as ▁ pieces next to a space label, no LM: groups of other shapes
        names, lm = ["", " ", "a", "b", "▁a", "▁b"], None
        rng = np.random.default_rng(5)
        mats = [rng.normal(0, 2, (int(rng.integers(4, 12)), 6)) for _ in range(40)]
    if setup == "hotwords":
        hot = parse_hotwords([], ["cat", "mat"], 2.0)
    if setup == "heavy-hotwords":  # words the utterances say, at pyctcdecode's default weight: many ends boosted
        _, _, _, _, _, lines = kn3
        hot = parse_hotwords([], sorted({w for line in lines for w in line.split()})[::3], 10.0)
    pruned = CTCDecoder(resolve(names), lm, cfg, hotwords=hot).decode(mats)
    monkeypatch.setattr(decoder_module.Tables, "bound", property(lambda self: None))  # try every candidate
    full = CTCDecoder(resolve(names), lm, cfg, hotwords=hot).decode(mats)
    for a, b in zip(pruned, full, strict=True):
        assert [h.text for h in a] == [h.text for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-9)


def test_log_posteriors_read_each_utterance_as_probabilities_or_logits():
    """One batch of probabilities, logits, log posteriors and probabilities that do not sum to 1 (read as logits),
    of different lengths: each utterance as numpy reads it alone, frame-major, in a reused buffer; float32 logits
    in float32 (within its rounding of the float64 result), the others in float64."""
    from seqlm.decode.decoder import MIN_P, log_posteriors

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(7, 5)) * 3
    probs = np.exp(log_softmax(logits[:4]))
    probs[0, :] = [1.0, 0.0, 0.0, 0.0, 0.0]  # a zero is clipped at MIN_P
    mats = [logits.astype(np.float32), probs, log_softmax(logits[:6]), np.full((3, 5), 0.1),
            probs[1:].astype(np.float32)]
    want = [log_softmax(logits.astype(np.float32).astype(np.float64)), np.log(np.maximum(probs, MIN_P)),
            log_softmax(log_softmax(logits[:6])), log_softmax(np.full((3, 5), 0.1)), np.log(probs[1:])]
    buffer = torch.empty(0, dtype=torch.float64)
    for _ in range(2):  # the second batch reuses the first one's buffer
        buffer, lp = log_posteriors(mats, buffer)
        assert lp.shape == (7, 5, 5)
        for i, w in enumerate(want):
            tol = 1e-6 if mats[i].dtype == np.float32 else 1e-12
            np.testing.assert_allclose(lp[: len(w), i].numpy(), np.maximum(w, math.log(MIN_P)), rtol=0, atol=tol)
    # an utterance without frames (the API lets one through; `seqlm decode` refuses it) last in its dtype's group
    buffer, lp = log_posteriors([mats[0], np.zeros((0, 5), np.float32), mats[2], np.zeros((0, 5))], buffer)
    assert lp.shape == (7, 4, 5)
    np.testing.assert_allclose(lp[:6, 2].numpy(), np.maximum(want[2], math.log(MIN_P)), rtol=0, atol=1e-12)
