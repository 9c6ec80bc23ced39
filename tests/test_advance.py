"""`advance` / `extend` (seqlm.protocol): a decoder's batched next-token distributions, for every family.

References, none of them seqlm's own scoring: for n-gram models the real kenlm module's BaseScore over the
whole vocabulary and a brute-force ARPA back-off walk over the ARPA text, parsed here; for the LSTM and the
Transformer a `step` chain per history (a batch of one); for the cache its formula computed from the
history in Python; for a mixture those references mixed by hand. Prefixes are extended from rows drawn with
repeats, so rows are reordered, copied and dropped along the way, as in beam search.
"""

from __future__ import annotations

import gzip
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from seqlm.cli import main
from seqlm.data.vocab import Vocab
from seqlm.models.cache import CacheConfig, CacheModel
from seqlm.models.lstm import LSTMConfig
from seqlm.models.mixture import MixtureModel
from seqlm.models.transformer import TransformerConfig
from seqlm.ngram.model import NGramModel
from seqlm.protocol import Prefixes, begin
from seqlm.registry import new_model

from conftest import require_env, require_module

LN10 = math.log(10.0)
WORDS = [f"w{i}" for i in range(40)]
# (order, pruning options): count pruning and entropy pruning leave contexts whose back-off chain skips orders
PRUNED = [(2, ["--prune", "0 1"]), (3, ["--prune-entropy", "1e-4"]), (4, ["--prune", "0 0 1"]),
          (5, ["--prune", "0 1 1 2"]), (5, ["--prune-entropy", "5e-5"])]


def write_text(path: Path, sentences: int = 700, seed: int = 0) -> Path:
    """A Markov text over WORDS with a Zipf-like choice of successor, so long n-grams repeat."""
    rng = random.Random(seed)
    lines = []
    for _ in range(sentences):
        i, words = rng.randrange(8), []
        for _ in range(rng.randint(2, 12)):
            words.append(WORDS[i])
            i = (i * 7 + int(rng.paretovariate(1.2))) % len(WORDS)
        lines.append(" ".join(words))
    path.write_text("\n".join(lines) + "\n")
    return path


def train_arpa(root: Path, order: int, options: list[str]) -> Path:
    arpa = root / f"kn{order}.arpa"
    text = write_text(root / "train.txt")
    assert main(["train", "--model", "kn", "--order", str(order), "--text", str(text), "--arpa", str(arpa),
                 *options]) == 0
    return arpa


def read_arpa_dict(path: Path) -> dict[tuple[str, ...], tuple[float, float]]:
    """n-gram -> (log10 p, log10 back-off, 0 when absent), straight from the ARPA text."""
    grams = {}
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 2 and not line.startswith("ngram "):
                grams[tuple(parts[1].split())] = (float(parts[0]), float(parts[2]) if len(parts) > 2 else 0.0)
    return grams


def brute_log10(grams: dict, order: int, history: list[str], word: str) -> float:
    """The ARPA back-off rule, one word at a time."""
    h = tuple(history[-(order - 1):]) if order > 1 else ()
    if (*h, word) in grams:
        return grams[(*h, word)][0]
    if not h:
        return -100.0  # KenLM's value for a word absent from the unigrams
    return grams.get(h, (0.0, 0.0))[1] + brute_log10(grams, order, list(h[1:]), word)


def walk(model, prefixes: Prefixes, histories: list[list[int]], steps: int, rng: random.Random, choose):
    """Yield (prefixes, histories) after each of `steps` extensions of rows drawn with repeats, each by the
    token `choose(history)` picks."""
    for _ in range(steps):
        rows = [rng.randrange(len(histories)) for _ in histories]
        tokens = [choose(histories[r]) for r in rows]
        prefixes = model.extend(prefixes, torch.tensor(rows), torch.tensor(tokens))
        histories = [histories[r] + [t] for r, t in zip(rows, tokens, strict=True)]
        yield prefixes, histories


def follower(grams: dict, vocab: Vocab, rng: random.Random):
    """A token chooser that mostly continues the longest listed n-gram (so long contexts are reached, and
    their back-off chains walked), else any word."""
    after: dict[tuple[str, ...], list[str]] = {}
    for gram in grams:
        after.setdefault(gram[:-1], []).append(gram[-1])
    words = [w for w in vocab.itos if w != "<s>"]

    def choose(history: list[int]) -> int:
        h = tuple(vocab.itos[t] for t in history)
        for k in range(min(len(h), 4), 0, -1):
            if h[-k:] in after and rng.random() < 0.85:
                return vocab.stoi[rng.choice(after[h[-k:]])]
        return vocab.stoi[rng.choice(words)]

    return choose


# ---- n-gram models against kenlm and the ARPA rule ---------------------------------------------------------


@pytest.fixture(scope="module")
def kn_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("advance_kn")


def blank_laden(root: Path, which: str) -> Path:
    """An ARPA file listing n-grams whose suffixes are not listed (test_kenlm_blank_ngrams' files)."""
    from test_kenlm_blank_ngrams import HANDMADE, UNK_CHAIN, random_pruned, write_arpa

    grams = HANDMADE if which == "handmade" else random_pruned(random.Random(7))
    return write_arpa(root / "lm.arpa", grams + UNK_CHAIN)


@pytest.mark.parametrize(("order", "options"), PRUNED + [(4, ["handmade"]), (4, ["random"])])
def test_ngram_advance_equals_kenlm_and_the_arpa_rule(kn_root, order, options):
    kenlm = require_module("kenlm", "the kenlm Python module is not installed (pip install -e '.[kenlm]')")
    root = kn_root / f"o{order}{options[0]}"
    (root / "full").mkdir(parents=True)
    if options[0] in ("handmade", "random"):
        arpa = blank_laden(root, options[0])
    else:
        arpa = train_arpa(root, order, options)
        full = NGramModel.from_arpa(train_arpa(root / "full", order, []))
        assert sum(NGramModel.from_arpa(arpa).sizes[1:]) < sum(full.sizes[1:])  # pruning took n-grams out
    model, theirs, grams = NGramModel.from_arpa(arpa), kenlm.Model(str(arpa)), read_arpa_dict(arpa)
    itos = model.vocab.itos
    keep = np.array([w != "<s>" for w in itos])
    rng = random.Random(order)
    choose = follower(grams, model.vocab, rng)
    matched = set()
    for start in ("begin", "null"):
        B = 6
        origin = begin(model, B) if start == "begin" else Prefixes(model.initial_state(B))
        first = [model.vocab.bos_id] if start == "begin" else []
        for prefixes, histories in walk(model, origin, [first] * B, 7, rng, choose):
            got = model.advance(prefixes).double().numpy() / LN10  # (B, V)
            assert got.shape == (B, len(itos)) and np.all(got[:, ~keep] == -np.inf)
            for row, h in zip(got, histories, strict=True):
                state, out = kenlm.State(), kenlm.State()
                (theirs.BeginSentenceWrite if start == "begin" else theirs.NullContextWrite)(state)
                for t in h[len(first):]:
                    theirs.BaseScore(state, itos[t], out)
                    state, out = out, state
                want = np.array([theirs.BaseScore(state, w, out) for w in itos])
                np.testing.assert_allclose(row[keep], want[keep], atol=1e-5)
                brute = [brute_log10(grams, order, [itos[t] for t in h], itos[w]) for w in np.flatnonzero(keep)]
                np.testing.assert_allclose(row[keep], brute, atol=1e-5)
                matched |= {theirs.BaseFullScore(state, w, out).ngram_length for w in itos}
    assert matched == set(range(1, order + 1))  # words matched at every order: back-off chains were walked


def test_ngram_extend_is_a_step_and_advance_its_distribution(kn_root):
    root = kn_root / "step"
    root.mkdir()
    model = NGramModel.from_arpa(train_arpa(root, 4, ["--prune", "0 1"]))
    state = model.initial_state(5)
    prefixes = Prefixes(state)
    rng = random.Random(1)
    for _ in range(6):
        rows = torch.tensor([rng.randrange(5) for _ in range(5)])
        tokens = torch.tensor([rng.randrange(len(model.vocab)) for _ in range(5)])
        logp, state = model.step(tokens, state.index_select(0, rows))
        prefixes = model.extend(prefixes, rows, tokens)
        assert torch.equal(prefixes.state, state) and prefixes.cache is None  # no distribution made yet
        torch.testing.assert_close(model.advance(prefixes), logp)


@pytest.mark.parametrize("which", ["pruned", "random"])
def test_ngram_compiled_rows_equal_the_tensor_rows(kn_root, which):
    """advance's compiled CPU rows (ngram/_dense.cpp) against the tensor version, bit for bit, in float32 and
    float64: windows of listed histories, of random words and of unknown (-1) positions, every order."""
    from seqlm.ngram.native import extension

    if extension() is None:
        require_env("CI", "the compiled loops are not built here")
    root = kn_root / f"dense-{which}"
    root.mkdir()
    arpa = train_arpa(root, 5, ["--prune", "0 1 1 2"]) if which == "pruned" else blank_laden(root, "random")
    model = NGramModel.from_arpa(arpa)
    rng = random.Random(3)
    choose = follower(read_arpa_dict(arpa), model.vocab, rng)
    windows = [prefixes.state for prefixes, _ in walk(model, begin(model, 8), [[model.vocab.bos_id]] * 8, 6, rng,
                                                      choose)]
    V, N = len(model.vocab), model.order
    windows.append(torch.randint(-1, V, (64, N - 1)))
    windows += [w[:, N - 1 - k:] for w in windows[-1:] for k in range(N - 1)]  # shorter windows: fewer orders
    for dtype in (torch.float32, torch.float64):
        tables = model.tensors(torch.device("cpu"), dtype)
        assert tables._compiled is not None
        for window in windows:
            got = tables.advance(window)
            assert got.dtype == dtype
            assert torch.equal(got, tables.distribution(tables.context_ids(window)))
            words = torch.randint(0, V, (len(window),))  # (B,) one word a row: the same entries, looked up
            assert torch.equal(tables.targets(window, words), got[torch.arange(len(window)), words])
            every = torch.arange(V).repeat(2)  # each word of the vocabulary (<s> too) after the first two rows
            assert torch.equal(tables.targets(window[:2].repeat_interleave(V, 0), every), got[:2].reshape(-1))
    with pytest.raises(IndexError, match="past the vocabulary"):
        tables.advance(torch.full((2, N - 1), V))
    with pytest.raises(IndexError, match="past the vocabulary"):
        tables.targets(windows[0][:1], torch.tensor([V]))
    window = windows[-N]  # int32 windows are read as int64
    assert torch.equal(tables.advance(window.to(torch.int32)), tables.advance(window))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_ngram_advance_on_cuda_equals_cpu(kn_root):
    root = kn_root / "cuda"
    root.mkdir()
    model = NGramModel.from_arpa(train_arpa(root, 5, ["--prune", "0 1 1 2"]))
    rng = random.Random(2)
    choose = follower(read_arpa_dict(root / "kn5.arpa"), model.vocab, rng)
    for prefixes, _ in walk(model, begin(model, 16), [[model.vocab.bos_id]] * 16, 5, rng, choose):
        on_gpu = model.advance(Prefixes(prefixes.state.cuda()))
        assert on_gpu.device.type == "cuda"
        torch.testing.assert_close(on_gpu.cpu(), model.advance(prefixes), atol=1e-5, rtol=0)


# ---- neural families, the cache, a mixture -------------------------------------------------------------


VOCAB = Vocab(["</s>", "<unk>", *WORDS[:10]])
NEURAL = {"lstm": LSTMConfig(hidden=8, layers=2),
          "transformer": TransformerConfig(layers=1, hidden=8, heads=2, d_ff=16, context=5, dropout=0.0)}


def neural(family: str):
    torch.manual_seed(0)
    return new_model(family, NEURAL[family], VOCAB).eval()


@torch.no_grad()
def chain(model, history: list[int]) -> torch.Tensor:
    """(V,) ln p after reading `history` (the start symbol first), one `step` at a time, a batch of one."""
    state = model.initial_state(1)
    for t in history:
        logp, state = model.step(torch.tensor([t]), state)
    return logp[0]


@pytest.mark.parametrize("family", list(NEURAL))
@torch.no_grad()
def test_neural_advance_equals_step_chains_and_extend_the_step_state(family):
    model = neural(family)
    rng = random.Random(3)
    B = 5
    origin, first = begin(model, B), [VOCAB.bos_id]
    anything = lambda h: rng.randrange(len(VOCAB))  # noqa: E731
    for t, (prefixes, histories) in enumerate(walk(model, origin, [first] * B, 8, rng, anything)):
        got = model.advance(prefixes)  # (B, V)
        assert got.shape == (B, len(VOCAB))
        for row, h in zip(got, histories, strict=True):  # 9 tokens read: past the Transformer's window of 5
            torch.testing.assert_close(row, chain(model, h), atol=1e-5, rtol=0)
        if t == 3:  # the state extend keeps is the one step makes: stepping on from both agrees
            rows, tokens = torch.tensor([4, 0, 0]), torch.tensor([2, 3, 2])
            logp, state = model.step(tokens, model.select_state(prefixes.state, rows))
            ext = model.extend(prefixes, rows, tokens)
            torch.testing.assert_close(model.advance(ext), logp)
            nxt = torch.tensor([5, 6, 7])
            torch.testing.assert_close(model.step(nxt, ext.state)[0], model.step(nxt, state)[0])


def cache_reference(cfg: CacheConfig, vocab: Vocab, history: list[int]) -> np.ndarray:
    """(V,) ln P(w | h) = ln (c_h(w) + alpha / S) / (M_h + alpha), from the tokens read after the start."""
    read = [t for t in history[1:] if t != vocab.bos_id or vocab.bos_id == vocab.eos_id][-cfg.window:]
    counts = np.zeros(len(vocab))
    for k, t in enumerate(reversed(read)):
        counts[t] += cfg.decay**k
    S = len(vocab) - (vocab.bos_id != vocab.eos_id)
    logp = np.log(counts + cfg.alpha / S) - np.log(counts.sum() + cfg.alpha)
    if vocab.bos_id != vocab.eos_id:
        logp[vocab.bos_id] = -np.inf
    return logp


@torch.no_grad()
def test_cache_advance_equals_its_formula():
    cfg = CacheConfig(window=4, decay=0.8, alpha=0.5)
    model = CacheModel(cfg, VOCAB)
    rng = random.Random(4)
    anything = lambda h: rng.randrange(len(VOCAB))  # noqa: E731
    for prefixes, histories in walk(model, begin(model, 6), [[VOCAB.bos_id]] * 6, 7, rng, anything):
        assert prefixes.cache is None  # the counts wait for advance
        got = model.advance(prefixes).numpy()
        for row, h in zip(got, histories, strict=True):
            np.testing.assert_allclose(row, cache_reference(cfg, VOCAB, h), rtol=0, atol=1e-12)


@torch.no_grad()
def test_mixture_advance_mixes_its_components_by_hand(kn_root):
    kenlm = require_module("kenlm", "the kenlm Python module is not installed (pip install -e '.[kenlm]')")
    root = kn_root / "mix"
    root.mkdir()
    text = root / "small.txt"
    text.write_text(" ".join(WORDS[:10]) + "\n" + " ".join(WORDS[9::-1]) + "\n" + " ".join(WORDS[:10:2]) + "\n")
    arpa = root / "kn3.arpa"
    assert main(["train", "--model", "kn", "--order", "3", "--text", str(text), "--arpa", str(arpa)]) == 0
    kn, theirs = NGramModel.from_arpa(arpa), kenlm.Model(str(arpa))
    lstm, cfg = neural("lstm"), CacheConfig(window=3, decay=0.9)
    cache = CacheModel(cfg, VOCAB)
    weights = [0.5, 0.3, 0.2]
    mix = MixtureModel([kn, lstm, cache], weights, [root / "kn", root / "lstm", root / "cache"])
    itos = mix.vocab.itos  # the n-gram model's ids; the others' through their vocabularies
    words = [w for w in itos if w != "<s>"]
    rng = random.Random(5)
    choose = follower(read_arpa_dict(arpa), mix.vocab, rng)
    for prefixes, histories in walk(mix, begin(mix, 4), [[]] * 4, 5, rng, choose):
        got = mix.advance(prefixes).numpy()  # (B, V)
        for row, h in zip(got, histories, strict=True):
            state, out = kenlm.State(), kenlm.State()
            theirs.BeginSentenceWrite(state)
            for t in h:
                theirs.BaseScore(state, itos[t], out)
                state, out = out, state
            neural_ids = [VOCAB.bos_id] + [VOCAB.id(itos[t]) for t in h]
            parts = np.stack([
                np.array([theirs.BaseScore(state, w, out) for w in words]) * LN10,
                chain(lstm, neural_ids).double().numpy()[[VOCAB.id(w) for w in words]],
                cache_reference(cfg, VOCAB, neural_ids)[[VOCAB.id(w) for w in words]]])  # (3, V - 1)
            want = np.logaddexp.reduce(parts + np.log(weights)[:, None], axis=0)
            np.testing.assert_allclose(row[[mix.vocab.stoi[w] for w in words]], want, atol=1e-5)
            assert row[mix.vocab.bos_id] == -np.inf
    assert all(c is None for c in prefixes.cache[::2]) and prefixes.cache[1] is not None  # lazy where it can be


@torch.no_grad()
def test_a_mixture_of_ngrams_looks_its_targets_up(kn_root, monkeypatch):
    """Two n-gram models mixed: sparse_targets, and advance_targets is advance's entries without any table."""
    root = kn_root / "mix-sparse"
    root.mkdir()
    arpas = [train_arpa(root, 3, []), train_arpa(root, 4, ["--prune", "0 1 1"])]
    kns = [NGramModel.from_arpa(a) for a in arpas]
    mix = MixtureModel(kns, [0.7, 0.3], [root / "a", root / "b"])
    assert mix.capabilities().sparse_targets
    rng = random.Random(4)
    choose = follower(read_arpa_dict(arpas[0]), mix.vocab, rng)
    V = len(mix.vocab)
    for prefixes, _ in walk(mix, begin(mix, 4), [[]] * 4, 4, rng, choose):
        table = mix.advance(prefixes)  # (4, V)
        rows, targets = torch.arange(4).repeat_interleave(V), torch.arange(V).repeat(4)
        with monkeypatch.context() as m:
            m.setattr(NGramModel, "advance", lambda *a: pytest.fail("advance_targets computed a table"))
            got = mix.advance_targets(prefixes, rows, targets)
        torch.testing.assert_close(got, table[rows, targets], rtol=0, atol=1e-12)


def test_advance_before_any_token_is_refused():
    from seqlm.errors import SeqlmError

    model = neural("lstm")
    with pytest.raises(SeqlmError, match="begin"):
        model.advance(Prefixes(model.initial_state(2)))
