"""The cache family (seqlm.models.cache): a proper distribution over the vocabulary, and every score equal
to a count over the history done here by hand, sentence by sentence and as a stream, through the CLI too."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import seqlm
from seqlm.data.corpus import encode_file, encode_sentences
from seqlm.data.vocab import BOS, EOS, UNK, Vocab
from seqlm.eval.perplexity import score_tokens
from seqlm.models.cache import CacheConfig, CacheModel
from seqlm.protocol import Batch

from conftest import run_cli as run
from conftest import write_corpus

WORDS = [EOS, UNK, "a", "b", "c", "d", "e"]
SENTS = [["a", "b", "a", "c"], ["b"], ["a", "a", "d", "e", "a", "b", "c", "a"], ["e", "e"], ["c", "zebra", "a"]]
SETTINGS = [(500, 1.0, 1.0), (3, 1.0, 0.5), (4, 0.7, 2.0), (50, 0.5, 0.1)]  # window, decay, alpha


def brute_force(sentences: list[list[int]], window: int, decay: float, alpha: float, size: int,
                stream: bool) -> list[float]:
    """ln P of every token: (sum of decay^k over the last `window` tokens equal to it, most recent k = 0,
    plus alpha / size) / (sum of decay^k over those tokens plus alpha); the history restarts at every
    sentence unless `stream`, where it holds every earlier token, each </s> included."""
    out, hist = [], []
    for sent in sentences:
        hist = hist if stream else []
        for tok in sent:
            recent = hist[::-1][:window]
            count = sum(decay**k for k, h in enumerate(recent) if h == tok)
            mass = sum(decay**k for k in range(len(recent)))
            out.append(math.log((count + alpha / size) / (mass + alpha)))
            hist.append(tok)
    return out


def model(window=500, decay=1.0, alpha=1.0, words=WORDS) -> CacheModel:
    return CacheModel(CacheConfig(window, decay, alpha), Vocab(list(words)))


def ids_of(stream) -> list[list[int]]:
    return [stream.sentence(i).tolist() for i in range(stream.num_sentences)]


@pytest.mark.parametrize("window, decay, alpha", SETTINGS)
@pytest.mark.parametrize("stream_mode", [False, True])
def test_scores_equal_a_count_over_the_history(window, decay, alpha, stream_mode):
    m = model(window, decay, alpha)
    stream = encode_sentences(SENTS, m.vocab)
    want = brute_force(ids_of(stream), window, decay, alpha, len(WORDS), stream_mode)
    for max_tokens in (4096, 5):  # stream chunks of 5: the window is carried from chunk to chunk
        got = score_tokens(m, stream, stream_mode, max_tokens=max_tokens).logp
        assert got.tolist() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("window, decay, alpha", SETTINGS)
def test_a_reset_inside_a_row_cuts_the_history(window, decay, alpha):
    """Packed rows (sentences laid end to end, a reset at each start) score as sentence by sentence."""
    m = model(window, decay, alpha)
    sents = ids_of(encode_sentences(SENTS, m.vocab))
    targets = [t for s in sents for t in s]
    inputs = [m.vocab.bos_id if i == 0 else s[i - 1] for s in sents for i in range(len(s))]
    resets = [i == 0 for s in sents for i in range(len(s))]
    batch = Batch(torch.tensor([inputs]), torch.tensor([targets]), torch.ones(1, len(targets), dtype=torch.bool),
                  torch.tensor([resets]))
    want = brute_force(sents, window, decay, alpha, len(WORDS), stream=False)
    assert m.score(batch)[0].tolist() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("window, decay, alpha", SETTINGS)
def test_step_distributions_sum_to_one_and_match_scores(window, decay, alpha):
    m = model(window, decay, alpha)
    stream = encode_sentences(SENTS, m.vocab)
    want = brute_force(ids_of(stream), window, decay, alpha, len(WORDS), stream=False)
    got = []
    for sent in ids_of(stream):
        state, tok = m.initial_state(1), torch.tensor([m.vocab.bos_id])
        for t in sent:
            logp, state = m.step(tok, state)  # (1, V)
            assert float(logp.exp().sum()) == pytest.approx(1.0, abs=1e-12)
            got.append(float(logp[0, t]))
            tok = torch.tensor([t])
    assert got == pytest.approx(want, abs=1e-12)


def test_a_vocabulary_with_a_start_symbol_never_predicts_it_and_still_sums_to_one():
    m = model(window=4, words=[*WORDS, BOS])
    state, tok = m.initial_state(2), torch.full((2,), m.vocab.bos_id)
    for nxt in ([2, 3], [2, 2], [m.vocab.bos_id, 4]):  # a stray <s> read mid-sentence is not counted either
        logp, state = m.step(tok, state)  # (2, V)
        assert torch.allclose(logp.exp().sum(-1), torch.ones(2, dtype=torch.float64), atol=1e-12)
        assert bool(torch.isneginf(logp[:, m.vocab.bos_id]).all())
        tok = torch.tensor(nxt)
    # the uniform floor is over the 7 words it can predict, not the 8 entries of the vocabulary
    empty, _ = m.step(torch.tensor([m.vocab.bos_id]), m.initial_state(1))
    assert float(empty[0, 2]) == pytest.approx(-math.log(len(WORDS)), abs=1e-12)


def test_cli_trains_evaluates_and_interpolates_the_cache_as_a_stream(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", n_train=60, n_eval=15)
    code, out, err = run(capsys, "train", "--model", "cache", "--data", corpus, "--out", tmp_path / "cache",
                         "--window", "7", "--decay", "0.9", "--alpha", "0.5")
    assert code == 0, err
    cache = seqlm.load(tmp_path / "cache")
    test = encode_file(corpus / "test.txt", cache.vocab)
    for flags, stream_mode in (([], False), (["--stream"], True)):
        code, out, err = run(capsys, "eval", tmp_path / "cache", "--data", corpus, *flags)
        want = brute_force(ids_of(test), 7, 0.9, 0.5, len(cache.vocab), stream_mode)
        assert json.loads(out)["ppl"] == pytest.approx(math.exp(-np.mean(want)), rel=1e-12)
    # a mixture with KN: the cache carries its history across sentences, the n-gram model cannot
    assert run(capsys, "train", "--model", "kn", "--order", "2", "--data", corpus, "--out", tmp_path / "kn")[0] == 0
    code, out, err = run(capsys, "interpolate", tmp_path / "kn", tmp_path / "cache", "--valid",
                         corpus / "valid.txt", "--stream", "--out", tmp_path / "mix")
    assert code == 0, err
    info = json.loads(out)
    assert info["mode"] == "stream" and info["weights_from"] == "em" and sum(info["weights"]) == pytest.approx(1)
    kn = seqlm.load(tmp_path / "kn")
    kn_logp = score_tokens(kn, encode_file(corpus / "test.txt", kn.vocab)).logp  # sentence by sentence
    cache_logp = brute_force(ids_of(encode_file(corpus / "test.txt", kn.vocab)), 7, 0.9, 0.5, len(cache.vocab),
                             stream=True)
    w = info["weights"]
    mixed = np.log(w[0] * np.exp(kn_logp) + w[1] * np.exp(cache_logp))
    code, out, err = run(capsys, "eval", tmp_path / "mix", "--data", corpus, "--stream")
    assert json.loads(out)["mode"] == "stream"
    assert json.loads(out)["ppl"] == pytest.approx(math.exp(-mixed.mean()), rel=1e-9)


@pytest.mark.parametrize("flag, value", [("--window", "0"), ("--decay", "0"), ("--decay", "1.5"), ("--alpha", "0")])
def test_bad_settings_are_one_line_and_status_2(flag, value, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", n_train=20, n_eval=5)
    code, out, err = run(capsys, "train", "--model", "cache", "--data", corpus, "--out", tmp_path / "c", flag, value)
    assert code == 2 and len(err.strip().splitlines()) == 1 and flag in err
