"""Kneser-Ney n-gram family: exactness against KenLM's own output, normalisation, ARPA I/O, batching.

The golden data (lmplz/query on 3,000 PTB lines) is in $SEQLM_DATA/kenlm-oracle or
../shared/data/kenlm-oracle; the tests that need it are skipped when it is absent.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import warnings
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqlm.data.batching import sentence_batches
from seqlm.data.corpus import TokenStream, count_words, encode_file, encode_sentences
from seqlm.data.vocab import BOS, EOS, UNK, Vocab
from seqlm.errors import SeqlmError
from seqlm.models.kn import KNConfig, estimate_kn, load_kn, save_kn
from seqlm.ngram import NGramModel, count_ngrams, read_arpa
from seqlm.ngram.kneser_ney import adjust_counts, compute_discounts
from seqlm.protocol import LanguageModel

LOG10 = math.log(10.0)


def oracle_dir() -> Path:
    if os.environ.get("SEQLM_DATA"):
        return Path(os.environ["SEQLM_DATA"]) / "kenlm-oracle"
    return Path(__file__).resolve().parents[2] / "shared" / "data" / "kenlm-oracle"


ORACLE = oracle_dir()
needs_oracle = pytest.mark.skipif(not (ORACLE / "train.txt").is_file(), reason=f"no KenLM oracle in {ORACLE}")

# Discounts lmplz printed for the oracle models (README.md there): order -> (D1, D2, D3+) per level.
KENLM_DISCOUNTS = {
    3: [(0.494248, 1.22617, 1.54652), (0.802285, 1.23259, 1.61961), (0.906101, 1.29228, 1.69223)],
    5: [
        (0.494248, 1.22617, 1.54652),
        (0.802285, 1.23259, 1.61961),
        (0.922926, 1.3159, 1.77642),
        (0.972181, 1.43039, 2.08935),
        (0.980747, 1.47634, 1.54405),
    ],
}


# ---- helpers ---------------------------------------------------------------------------------------


@cache
def oracle_train() -> tuple[Vocab, TokenStream]:
    vocab = Vocab.build(count_words(ORACLE / "train.txt"))
    return vocab, encode_file(ORACLE / "train.txt", vocab, use_cache=False)


@cache
def estimated(order: int) -> NGramModel:
    vocab, stream = oracle_train()
    return estimate_kn(KNConfig(order=order), stream, vocab)


@cache
def kenlm(order: int) -> NGramModel:
    return NGramModel.from_arpa(ORACLE / f"kn{order}.arpa.gz")


def arpa_entries(path: Path) -> dict[tuple[str, ...], tuple[float, float]]:
    """n-gram words -> (log10 p, log10 back-off) for every entry of an ARPA file."""
    data = read_arpa(path)
    out = {}
    for k, grams in enumerate(data.grams, 1):
        bo = data.log10_backoff[k - 1] if k < len(data.grams) else np.zeros(len(grams))
        for row, p, b in zip(grams.tolist(), data.log10_prob[k - 1].tolist(), bo.tolist(), strict=True):
            out[tuple(data.tokens[w] for w in row)] = (p, b)
    return out


def token_log10(model: NGramModel, stream: TokenStream, **batching) -> np.ndarray:
    """(N,) log10 p of every token of `stream` (sentence by sentence, from <s>), in stream order."""
    out = np.full(len(stream.ids), np.nan)
    starts = np.asarray(stream.starts)
    for rows in sentence_batches(stream, model.vocab.bos_id, **batching):
        logp = model.score(rows.batch).double().numpy() / LOG10  # (B, T)
        mask = rows.batch.mask.numpy()
        for b in range(len(rows.sentence)):
            got = logp[b][mask[b]]
            first = starts[rows.sentence[b]] + rows.offset[b]
            out[first : first + len(got)] = got
    assert not np.isnan(out).any()
    return out


def step_log10(model: NGramModel, sentences: list[np.ndarray]) -> list[np.ndarray]:
    """log10 p of every token of every sentence by reading it token by token with `step`."""
    out = []
    for sent in sentences:
        state = model.initial_state(1)
        token = torch.tensor([model.vocab.bos_id])
        got = []
        for w in sent.tolist():
            logp, state = model.step(token, state)
            got.append(float(logp[0, w]) / LOG10)
            token = torch.tensor([w])
        out.append(np.array(got))
    return out


def tiny_stream(sentences: list[str]) -> tuple[Vocab, TokenStream]:
    split = [s.split() for s in sentences]
    counter = Counter(w for s in split for w in s)
    counter[EOS] += len(split)
    vocab = Vocab.build(counter)
    return vocab, encode_sentences(split, vocab)


def random_sentences(vocab: Vocab, rng: np.random.Generator, n: int, max_len: int = 12) -> list[np.ndarray]:
    words = [i for i in range(len(vocab)) if i not in (vocab.bos_id, vocab.eos_id)]
    return [np.append(rng.choice(words, rng.integers(0, max_len)), vocab.eos_id) for _ in range(n)]


def assert_normalised(model: NGramModel, rng: np.random.Generator, rows: int = 16) -> None:
    """Full next-word distributions after random histories (and right after <s>) sum to 1."""
    state = model.initial_state(rows)
    token = torch.full((rows,), model.vocab.bos_id)
    for _ in range(model.order + 1):
        logp, state = model.step(token, state)  # (rows, V)
        assert logp.dtype == torch.float32 and logp.shape == (rows, len(model.vocab))
        assert logp[:, model.vocab.bos_id].eq(-math.inf).all()
        total = logp.double().exp().sum(1)
        np.testing.assert_allclose(total.numpy(), 1.0, atol=1e-6)
        token = torch.multinomial(logp.double().exp(), 1).view(-1)
        token[rng.random(rows) < 0.3] = int(rng.integers(0, len(model.vocab) - 1))  # also unlikely words
        token[token == model.vocab.bos_id] = model.vocab.eos_id


# ---- 1. the estimator writes KenLM's ARPA ------------------------------------------------------------


@needs_oracle
@pytest.mark.parametrize("order", [3, 5])
def test_estimate_matches_kenlm_arpa(order: int, tmp_path: Path) -> None:
    vocab, stream = oracle_train()
    counts = count_ngrams(stream, len(vocab), len(vocab) + 1, order)  # <s> appended as the last id
    discounts = compute_discounts(adjust_counts(counts))
    got = np.array([(d.d1, d.d2, d.d3) for d in discounts])
    np.testing.assert_allclose(got, KENLM_DISCOUNTS[order], atol=6e-6)

    estimated(order).to_arpa(tmp_path / "seqlm.arpa")
    ours, theirs = arpa_entries(tmp_path / "seqlm.arpa"), arpa_entries(ORACLE / f"kn{order}.arpa.gz")
    assert ours.keys() == theirs.keys()
    # <s> is never predicted; seqlm writes 0 for it as lmplz does
    assert ours.pop((BOS,))[1] == pytest.approx(theirs.pop((BOS,))[1], abs=1e-5)
    a, b = np.array(list(ours.values())), np.array([theirs[g] for g in ours])  # (M, 2)
    np.testing.assert_allclose(a, b, atol=1e-5)
    assert ours[(UNK,)][0] == pytest.approx(-4.5294905, abs=1e-6)  # gamma_0 / (V - 1): the unseen-word share


# ---- 2, 3. per-sentence scores and perplexities of KenLM's query ----------------------------------


@needs_oracle
@pytest.mark.parametrize("source", ["estimated", "kenlm_arpa"])
@pytest.mark.parametrize("order", [3, 5])
def test_query_matches_kenlm(order: int, source: str) -> None:
    model = estimated(order) if source == "estimated" else kenlm(order)
    query = encode_file(ORACLE / "query.txt", model.vocab, use_cache=False)
    logp = token_log10(model, query)  # (N,)
    starts = np.asarray(query.starts)
    totals = np.add.reduceat(logp, starts[:-1])  # (S,)
    ref = np.loadtxt(ORACLE / f"query.kn{order}.tsv", skiprows=1, delimiter="\t")  # sentence, log10p, oov
    np.testing.assert_allclose(totals, ref[:, 1], atol=1e-4)
    oov = np.asarray(query.ids) == model.vocab.unk_id
    np.testing.assert_array_equal(np.add.reduceat(oov.astype(int), starts[:-1]), ref[:, 2])
    summary = json.loads((ORACLE / "summary.json").read_text())[f"kn{order}"]
    assert (len(logp), int(oov.sum())) == (summary["tokens"], summary["oov"])
    assert 10 ** (-logp.sum() / len(logp)) == pytest.approx(summary["ppl_incl_oov"], rel=1e-6)
    assert 10 ** (-logp[~oov].sum() / (~oov).sum()) == pytest.approx(summary["ppl_excl_oov"], rel=1e-6)


# ---- 4. normalisation ---------------------------------------------------------------------------


@needs_oracle
@pytest.mark.parametrize("order", [3, 5])
def test_step_distributions_sum_to_one(order: int) -> None:
    assert_normalised(estimated(order), np.random.default_rng(order))


def test_unk_in_training_text_is_a_word_and_still_normalised() -> None:
    """PTB has a literal <unk>: it is counted like any word and also gets the uniform (unseen-word) share."""
    vocab, stream = tiny_stream(["a <unk> b", "<unk> a c", "b a <unk> <unk>", "c c a b", "a b c <unk> a"] * 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # so few distinct counts that some order falls back
        model = estimate_kn(KNConfig(order=3), stream, vocab)
    unigram = 10.0 ** model.log10_prob[0].astype(np.float64)
    assert unigram[model.vocab.unk_id] > 0.1  # counted like a word: 9 of the 54 tokens here
    assert_normalised(model, np.random.default_rng(0))


@pytest.mark.parametrize("order", [1, 2, 9])
def test_extreme_orders_normalised(order: int, tmp_path: Path) -> None:
    vocab, stream = tiny_stream(["the cat sat on the mat", "the dog sat", "a cat ran on a mat", "end"] * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = estimate_kn(KNConfig(order=order), stream, vocab)
    assert model.order == order and model.vocab.itos[-1] == BOS
    assert isinstance(model, LanguageModel)
    assert_normalised(model, np.random.default_rng(order))
    model.to_arpa(tmp_path / "m.arpa")  # order 9 has an empty top level: "ngram 9=0"
    back = NGramModel.from_arpa(tmp_path / "m.arpa")
    assert back.sizes == model.sizes and back.order == order


# ---- 5. discount fallback -----------------------------------------------------------------------


def test_discount_fallback_warns_and_normalises() -> None:
    vocab, stream = tiny_stream(["x y z", "x y w", "z y x"])
    with pytest.warns(UserWarning, match=r"order \d.*fallback discounts 0.5 1 1.5"):
        model = estimate_kn(KNConfig(order=3), stream, vocab)
    assert_normalised(model, np.random.default_rng(1))
    with pytest.warns(UserWarning, match="fallback discounts 0.3 0.6 0.9"):
        estimate_kn(KNConfig(order=2, discount_fallback="0.3 0.6 0.9"), stream, vocab)


def test_config_validation() -> None:
    for bad in (0, 65):
        with pytest.raises(SeqlmError, match="--order"):
            KNConfig(order=bad)
    for bad in ("0.5 1", "0.5 2.5 1.5", "a b c"):
        with pytest.raises(SeqlmError, match="--discount-fallback"):
            KNConfig(discount_fallback=bad)


def test_literal_bos_in_training_text_is_refused() -> None:
    vocab, stream = tiny_stream(["a <s> b", "a b"])
    with pytest.raises(SeqlmError, match="<s>"):
        estimate_kn(KNConfig(order=2), stream, vocab)


# ---- counting, against a plain Python count --------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(2, 6), max_size=8), min_size=1, max_size=8), st.integers(1, 5))
def test_counts_match_naive_counting(sentences: list[list[int]], order: int) -> None:
    V, bos, eos = 8, 7, 0
    ids = np.array([w for s in sentences for w in s + [eos]], dtype=np.int32)
    starts = np.cumsum([0] + [len(s) + 1 for s in sentences])
    counts = count_ngrams(TokenStream(ids, starts), bos, V, order)
    naive: Counter = Counter()
    for s in sentences:
        padded = [bos] + s + [eos]
        for k in range(2, order + 1):
            naive.update(tuple(padded[i : i + k]) for i in range(len(padded) - k + 1))
    got = {}
    for k in range(2, order + 1):
        ids_k = np.arange(len(counts.keys[k - 1]))
        for j, c in zip(ids_k.tolist(), counts.counts[k - 1].tolist(), strict=True):
            words, i = [], j
            for level in range(k, 1, -1):
                key = int(counts.keys[level - 1][i])
                words.append(key % V)
                i = key // V
            got[tuple([i] + words[::-1])] = c
    assert got == dict(naive)
    unigrams = Counter(w for s in sentences for w in s + [eos])
    assert {w: c for w, c in enumerate(counts.counts[0].tolist()) if c and w != bos} == dict(unigrams)


# ---- 6. ARPA files --------------------------------------------------------------------------------


@needs_oracle
@pytest.mark.parametrize("name", ["m.arpa", "m.arpa.gz"])
def test_arpa_round_trip(name: str, tmp_path: Path) -> None:
    model = estimated(3)
    model.to_arpa(tmp_path / name)
    back = NGramModel.from_arpa(tmp_path / name)
    assert back.vocab == model.vocab and back.sizes == model.sizes
    for m in ("keys", "log10_prob", "log10_backoff"):
        for a, b in zip(getattr(model, m), getattr(back, m), strict=True):
            np.testing.assert_array_equal(a, b)
    query = encode_file(ORACLE / "query.txt", model.vocab, use_cache=False)
    np.testing.assert_array_equal(token_log10(model, query), token_log10(back, query))
    assert [p.name for p in tmp_path.iterdir()] == [name]  # atomic write leaves no temporary behind


def test_save_load_model_dir(tmp_path: Path) -> None:
    vocab, stream = tiny_stream(["a b c", "b c a", "c a b", "a a b b"] * 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = estimate_kn(KNConfig(order=2), stream, vocab)
    save_kn(model, tmp_path)
    back = load_kn(tmp_path)
    assert back.vocab == model.vocab and back.order == 2
    with pytest.raises(SeqlmError, match="model.arpa: ARPA file missing"):
        load_kn(tmp_path / "elsewhere")


TINY_ARPA = """\\data\\
ngram 1=5
ngram 2=4

\\1-grams:
-1.0\t<unk>\t0
-0.5\t</s>
-99\t<s>\t-0.3
-0.8\ta\t-0.2
-0.9\tb\t-0.1

\\2-grams:
-0.2\t<s> a
-0.4\ta b
-0.3\tb </s>
-0.6\t<s> b

\\end\\
"""


def test_arpa_errors_name_the_file(tmp_path: Path) -> None:
    cases = {
        "counts.arpa": TINY_ARPA.replace("ngram 2=4", "ngram 2=5"),
        "truncated.arpa": TINY_ARPA[: TINY_ARPA.index("-0.3\tb </s>")],
        "noend.arpa": TINY_ARPA.replace("\\end\\\n", ""),
        "nodata.arpa": "hello\n",
        "badnum.arpa": TINY_ARPA.replace("-0.4\ta b", "x.4\ta b"),
        "unknown.arpa": TINY_ARPA.replace("-0.4\ta b", "-0.4\ta zz"),
        "twice.arpa": TINY_ARPA.replace("<s> b", "<s> a"),
        "nobos.arpa": TINY_ARPA.replace("-99\t<s>\t-0.3", "-99\tc\t-0.3").replace("<s>", "c"),
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(SeqlmError, match=name.replace(".", r"\.")):
            NGramModel.from_arpa(tmp_path / name)
    full = gzip.compress(TINY_ARPA.encode())
    (tmp_path / "cut.arpa.gz").write_bytes(full[: len(full) // 2])
    with pytest.raises(SeqlmError, match=r"cut\.arpa\.gz.*corrupt or truncated"):
        NGramModel.from_arpa(tmp_path / "cut.arpa.gz")
    with pytest.raises(SeqlmError, match="header says ngram 2=5 but"):
        NGramModel.from_arpa(tmp_path / "counts.arpa")
    with pytest.raises(SeqlmError, match="no such ARPA file"):
        NGramModel.from_arpa(tmp_path / "absent.arpa")


def test_srilm_style_arpa(tmp_path: Path) -> None:
    """-99 for <s>, back-offs left out, spaces for tabs, no <unk>, a context missing from the listing."""
    text = TINY_ARPA.replace("-1.0\t<unk>\t0\n", "").replace("ngram 1=5", "ngram 1=4").replace("\t", " ")
    text = text.replace("ngram 2=4", "ngram 2=4\nngram 3=1").replace(
        "\\end\\", "\\3-grams:\n-0.05 b a b\n\n\\end\\"
    )  # "b a" is not listed: it becomes a blank entry with its back-off estimate and back-off 0
    (tmp_path / "sri.lm").write_text(text)
    with pytest.warns(UserWarning, match="no <unk>"):
        model = NGramModel.from_arpa(tmp_path / "sri.lm")
    v = model.vocab
    assert model.sizes == [5, 5, 1] and v.itos[-1] == UNK
    sent = [v.id("a"), v.id("b"), v.id("a"), v.id("b"), v.id("zz"), v.eos_id]
    got = step_log10(model, [np.array(sent)])[0]
    # a|<s>: listed; b|<s> a: listed; a|a b: bo(a b)=0 + bo(b)=-0.1 + p(a)=-0.8; b|b a: listed 3-gram;
    # <unk>|a b: bo(a b) 0 + bo(b) -0.1 + p(<unk>) -100; </s>|b <unk>: bo(<unk>) 0 + p(</s>) -0.5
    np.testing.assert_allclose(got, [-0.2, -0.4, -0.9, -0.05, -100.1, -0.5], atol=1e-6)
    blank = model.find(2, np.array(v.id("b")), np.array(v.id("a")))
    assert model.log10_prob[1][blank] == pytest.approx(-0.1 - 0.8)  # bo(b) + p(a)
    stream = encode_sentences([["a", "b", "a", "b", "zz"]], v)
    np.testing.assert_allclose(token_log10(model, stream), got, atol=1e-6)


# ---- 7. batched scoring == step scoring, sentences cut into pieces ------------------------------------


@needs_oracle
@pytest.mark.parametrize("order", [3, 5])
def test_score_equals_step_and_pieces(order: int) -> None:
    model = estimated(order)
    query = encode_file(ORACLE / "query.txt", model.vocab, use_cache=False)
    whole = token_log10(model, query)
    pieces = token_log10(model, query, max_len=3, context=order - 1, max_tokens=256)
    np.testing.assert_allclose(pieces, whole, atol=1e-9)
    rng = np.random.default_rng(order)
    picked = rng.choice(query.num_sentences, 6, replace=False)
    sents = [query.sentence(i) for i in picked] + random_sentences(model.vocab, rng, 4)
    stream = encode_sentences([model.vocab.decode(s[:-1]) for s in sents], model.vocab)
    by_step = np.concatenate(step_log10(model, sents))
    np.testing.assert_allclose(by_step, token_log10(model, stream), atol=1e-5)


def test_score_reads_bos_at_resets_and_masks_padding() -> None:
    """A reset position is read as <s> whatever the batch holds there; padding scores 0."""
    vocab, stream = tiny_stream(["a b c", "b c a", "c a b"] * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = estimate_kn(KNConfig(order=3), stream, vocab)
    ref = token_log10(model, encode_sentences([["a", "b"]], model.vocab))
    rows = next(sentence_batches(encode_sentences([["a", "b"]], model.vocab), model.vocab.eos_id))
    batch = rows.batch
    batch.inputs[0, 0] = model.vocab.eos_id  # a family without <s> would put </s> here
    fields = (batch.inputs, batch.targets, batch.mask, batch.resets)
    padded = type(batch)(*(torch.cat([t, t[:, :1]], 1) for t in fields))
    padded.mask[:, -1] = False
    padded.resets[:, -1] = False
    logp = model.score(padded)
    np.testing.assert_allclose(logp[0, :-1].numpy() / LOG10, ref, atol=1e-9)
    assert logp[0, -1] == 0.0


def test_discounts_follow_lmplz_when_no_ngram_has_adjusted_count_four():
    """lmplz needs n1, n2 and n3 only: with n4 = 0, D3+ = 3 - 4 Y n4 / n3 = 3 (checked against the prebuilt
    lmplz --discount_fallback on a corpus with such an order: its bigrams kept these discounts while seqlm
    used to fall back); a zero n3 still falls back, with a warning."""
    import warnings

    from seqlm.ngram.discounts import FALLBACK_DISCOUNTS, discount_of

    n1, n2, n3 = 42.0, 8.0, 2.0
    y = n1 / (n1 + 2 * n2)  # Chen and Goodman, eq. (26), by hand
    d = discount_of(2, [42, 8, 2, 0])
    assert (d.d1, d.d2, d.d3) == pytest.approx((1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback = discount_of(3, [51, 1, 0, 0])
    assert (fallback.d1, fallback.d2, fallback.d3) == FALLBACK_DISCOUNTS and caught
