"""The protocol's invariants, for every registered family: a family gets all of these by being registered
(with a tiny configuration in VARIANTS; a test fails for a family that has none).

Each variant is trained for one short epoch on a tiny corpus this file writes, through `seqlm train`, then:
`score` equals step-by-step `step` and every `step` distribution sums to one (NCE and sparse-code variants
included: normalised exactly at evaluation); sentence scores do not depend on how sentences are batched or
ordered; stream scores do not depend on the chunk length (for a model that streams); save/load gives the
same scores; `eval` equals the summed `score`; `generate` with a seed is reproducible; beam search runs and
its best hypothesis scores what rescoring its text gives; lattice expansion (a small SLF lattice this file
writes, whose paths reach nodes with histories of different lengths) gives every path the score of its
sentence scored alone. A model that peeks at the scored text (dae) is refused where a text is scored.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.conftest import WORDS, write_corpus

import seqlm
from seqlm.cli import main
from seqlm.data.corpus import encode_file, encode_sentences
from seqlm.eval.generate import beam_search, sample
from seqlm.eval.perplexity import LOG10, can_stream, score_tokens
from seqlm.lattice import WordMap, expand, read_lattices, words_of
from seqlm.lattice.expand import NOT_PREDICTED
from seqlm.nn.sparse_code import CodeBook
from seqlm.registry import FAMILIES

COMMON = ["--threads", "1", "--max-epochs", "1"]
TRANSFORMER = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32"]
DAE = [*TRANSFORMER, "--context", "32", "--k", "1", "--bits", "4", "--filter-size", "16", "--latent-d-model", "16",
       "--pretrain-steps", "2", "--batch-size", "4", "--seq-len", "32"]
CODES = "CODES"  # replaced by the path of a codes file the fixture writes
VARIANTS: dict[str, tuple[str, list[str]]] = {  # name: (family, `seqlm train` options)
    "kn": ("kn", ["--order", "3"]),
    "fnn": ("fnn", ["--order", "3", "--embed", "8", "--hidden", "16", "--layers", "1", "--batch-size", "4",
                    "--seq-len", "16"]),
    "fnn-codes": ("fnn", ["--order", "3", "--embed", "8", "--hidden", "16", "--layers", "1", "--batch-size", "4",
                          "--seq-len", "16", "--codes", CODES]),
    "fofe": ("fofe", ["--embed", "8", "--hidden", "16", "--layers", "1", "--batch-size", "4", "--seq-len", "16"]),
    "rnn": ("rnn", ["--hidden", "16", "--batch-size", "4", "--seq-len", "8"]),
    "transformer": ("transformer", [*TRANSFORMER, "--context", "6", "--batch-size", "4", "--seq-len", "12"]),
    "afp": ("afp", ["--iterations", "2", "--hidden", "16", "--batch-size", "4", "--seq-len", "8"]),
    "lstm": ("lstm", ["--hidden", "16", "--layers", "2", "--batch-size", "4", "--seq-len", "8"]),
    "lstm-class": ("lstm", ["--hidden", "16", "--layers", "2", "--output", "class", "--batch-size", "4",
                            "--seq-len", "8"]),  # sparse_targets: read from the state (nn/readout.py)
    "lstm-adaptive": ("lstm", ["--hidden", "16", "--layers", "1", "--output", "adaptive", "--cutoffs", "4,8",
                               "--batch-size", "4", "--seq-len", "8"]),  # sparse_targets too
    "rnn-tree": ("rnn", ["--hidden", "16", "--output", "tree", "--batch-size", "4", "--seq-len", "8"]),  # sparse too
    "lstm-nce": ("lstm", ["--hidden", "16", "--layers", "1", "--objective", "nce", "--noise-samples", "4",
                          "--batch-size", "4", "--seq-len", "8"]),
    "dae": ("dae", [*DAE, "--peek", "false"]),  # the equal-capacity baseline: an ordinary LM
    "dae-peek": ("dae", DAE),  # p(s | c(s)) with c(s) from s itself: no step-by-step scoring of a text
    "cache": ("cache", ["--window", "7", "--decay", "0.9"]),  # a unigram cache over the recent history
    "mix": ("mix", ["lstm", "transformer", "kn"]),  # `seqlm interpolate` of these variants
    "mix-cache": ("mix", ["rnn", "cache"]),
}
PEEKS = {"dae-peek"}


def test_every_registered_family_has_a_tiny_variant():
    assert set(FAMILIES) <= {fam for fam, _ in VARIANTS.values()}


# -- the corpus, the lattice and the models --------------------------------------------------------------------
def _codes(path: Path) -> Path:
    """A sparse codes file: four base words, three others as non-negative mixes of them, the rest uncoded."""
    base = ["the", "cat", "dog", "sat"]
    codes = {w: [(i, 1.0)] for i, w in enumerate(base)}
    codes |= {"ran": [(0, 0.3), (2, 0.7)], "fast": [(1, 1.0), (3, 0.2)], "red": [(2, 0.5)]}
    CodeBook(base, codes).write(path)
    return path


def _lattice(path: Path, length: int = 8, seed: int = 0) -> Path:
    """SLF: a chain of `length` words with a skip arc over every pair, so nodes are reached by histories of
    different lengths (and paths longer than the tiny Transformer's context); 34 paths."""
    rng = random.Random(seed)
    n_nodes = length + 3  # 0 -(!NULL)-> 1 -> ... -> length+1 -(</s>)-> length+2
    arcs = [(0, 1, "!NULL")]
    arcs += [(i, i + 1, rng.choice(WORDS)) for i in range(1, length + 1)]
    arcs += [(i, i + 2, rng.choice(WORDS)) for i in range(1, length)]
    arcs += [(length + 1, length + 2, "</s>")]
    lines = ["VERSION=1.0", "UTTERANCE=conformance", "lmscale=10.0 wdpenalty=0.0", f"N={n_nodes} L={len(arcs)}"]
    lines += [f"I={i} t={i / 10:.2f}" for i in range(n_nodes)]
    lines += [f"J={j} S={s} E={e} W={w} a={-rng.uniform(1, 50):.2f} l=0.00" for j, (s, e, w) in enumerate(arcs)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class Zoo:
    """The corpus, and each variant trained the first time a test asks for it (so `-k` runs only what it needs)."""

    def __init__(self, root: Path):
        self.root = root
        self.corpus = write_corpus(root / "corpus", n_train=60, n_eval=8)
        self.text = self.corpus / "test.txt"
        self.codes = _codes(root / "codes.txt")
        self.lattice = _lattice(root / "lattice.slf")
        self.dirs: dict[str, Path] = {}

    def dir(self, name: str) -> Path:
        if name not in self.dirs:
            fam, opts = VARIANTS[name]
            out = self.root / name
            if fam == "mix":
                parts = [str(self.dir(v)) for v in opts]
                weights = ",".join(["0.4", "0.3", "0.3"][: len(parts)])
                assert main(["interpolate", *parts, "--out", str(out), "--weights", weights]) == 0
            else:
                opts = [str(self.codes) if o == CODES else o for o in opts]
                assert main(["train", "--model", fam, "--data", str(self.corpus), "--out", str(out),
                             *(COMMON if fam not in ("kn", "cache") else []), *opts]) == 0
            self.dirs[name] = out
        return self.dirs[name]

    def model(self, name: str):
        return seqlm.load(self.dir(name))


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> Zoo:
    return Zoo(tmp_path_factory.mktemp("conformance"))


def _sentences(zoo: Zoo) -> list[list[str]]:
    return [line.split() for line in zoo.text.read_text().splitlines() if line.split()]


def _totals(model, sentences: list[list[str]], **kw) -> np.ndarray:
    return score_tokens(model, encode_sentences(sentences, model.vocab), **kw).sentence_totals()


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


ALL = list(VARIANTS)
ORDINARY = [n for n in VARIANTS if n not in PEEKS]  # the ones whose score of a text is p(text)


# -- the invariants -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ORDINARY)
def test_score_equals_step_by_step_and_steps_are_normalised(zoo, name):
    model = zoo.model(name)
    stream = encode_file(zoo.text, model.vocab)
    whole = score_tokens(model, stream).logp
    stepped = []
    with torch.no_grad():
        for i in range(stream.num_sentences):
            state, tok = model.initial_state(1), torch.tensor([model.vocab.bos_id])
            for t in stream.sentence(i).tolist():
                logp, state = model.step(tok, state)  # (1, V)
                assert float(torch.logsumexp(logp.double(), dim=-1)) == pytest.approx(0.0, abs=1e-5)
                stepped.append(float(logp[0, t]))
                tok = torch.tensor([t])
    np.testing.assert_allclose(whole, stepped, atol=1e-4)


@pytest.mark.parametrize("name", ORDINARY)
def test_sentence_scores_do_not_depend_on_batching_or_order(zoo, name):
    model = zoo.model(name)
    sents = _sentences(zoo)
    together = _totals(model, sents, max_tokens=4096)
    one_by_one = _totals(model, sents, max_tokens=1)
    order = list(reversed(range(len(sents))))
    shuffled = _totals(model, [sents[i] for i in order], max_tokens=16)
    np.testing.assert_allclose(one_by_one, together, atol=1e-5)
    np.testing.assert_allclose(shuffled, together[order], atol=1e-5)


@pytest.mark.parametrize("name", ORDINARY)
def test_stream_scores_do_not_depend_on_the_chunk_length(zoo, name, capsys):
    model = zoo.model(name)
    stream = encode_file(zoo.text, model.vocab)
    if not can_stream(model):  # it declares so: `eval --stream` says it scores sentence by sentence
        assert main(["eval", str(zoo.dir(name)), "--text", str(zoo.text), "--stream"]) == 0
        assert _json(capsys)["mode"] == "sentence"
        return
    ref = score_tokens(model, stream, stream_mode=True, max_tokens=4096).logp
    for chunk in (1, 3, 7):
        np.testing.assert_allclose(score_tokens(model, stream, stream_mode=True, max_tokens=chunk).logp, ref,
                                   atol=1e-5, err_msg=f"chunks of {chunk}")


@pytest.mark.parametrize("name", ORDINARY)
def test_save_and_load_give_identical_scores(zoo, name, tmp_path):
    model = zoo.model(name)
    seqlm.save(model, tmp_path / "copy")
    again = seqlm.load(tmp_path / "copy")
    sents = _sentences(zoo)
    assert _totals(again, sents).tolist() == _totals(model, sents).tolist()


@pytest.mark.parametrize("name", ORDINARY)
def test_eval_equals_the_summed_score(zoo, name, capsys):
    d, text = str(zoo.dir(name)), str(zoo.text)
    assert main(["eval", d, "--text", text]) == 0
    log10prob = _json(capsys)["log10prob"]
    assert main(["score", d, "--text", text]) == 0
    per_sentence = [float(x) for x in capsys.readouterr().out.split()]
    assert len(per_sentence) == len(_sentences(zoo))
    assert sum(per_sentence) == pytest.approx(log10prob, abs=1e-6 * len(per_sentence) + 1e-9)


@pytest.mark.parametrize("name", ALL)
def test_generate_with_a_seed_is_reproducible_and_beam_search_runs(zoo, name, capsys):
    d = str(zoo.dir(name))
    capsys.readouterr()
    runs = []
    for _ in range(2):
        assert main(["generate", d, "--num", "3", "--seed", "7", "--max-len", "12"]) == 0
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1] and len(runs[0].splitlines()) == 3
    assert main(["generate", d, "--beam", "3", "--num", "3", "--max-len", "15"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    if name not in PEEKS:
        model = zoo.model(name)
        assert sample(model, 4, seed=3, max_len=12) == sample(model, 4, seed=3, max_len=12)


@pytest.mark.parametrize("name", ORDINARY)
def test_beam_search_best_scores_what_rescoring_gives(zoo, name, capsys):
    model = zoo.model(name)
    hyps = beam_search(model, 3, max_len=15)
    assert len(hyps) == 3 and all(a.logp >= b.logp for a, b in zip(hyps, hyps[1:], strict=False))
    finished = [h for h in hyps if len(h.ids) < 15]  # `</s>` was scored
    if not finished:  # a model that never prefers `</s>` (a cache repeats its own words): check the prefixes
        assert name == "cache", "no hypothesis ended within 15 tokens"
        for h in hyps:
            logp = score_tokens(model, encode_sentences([model.vocab.decode(h.ids)], model.vocab)).logp
            assert logp[:-1].sum() == pytest.approx(h.logp, abs=1e-4)  # every token but the `</s>` never chosen
        return
    np.testing.assert_allclose([h.logp for h in finished],
                               _totals(model, [model.vocab.decode(h.ids) for h in finished]), atol=1e-4)
    words = [h for h in finished if h.ids]  # and the best sentence with words, through `seqlm score`
    if words:
        text = zoo.root / f"beam-{name}.txt"
        text.write_text(" ".join(model.vocab.decode(words[0].ids)) + "\n", encoding="utf-8")
        capsys.readouterr()
        assert main(["score", str(zoo.dir(name)), "--text", str(text)]) == 0
        assert float(capsys.readouterr().out) == pytest.approx(words[0].logp / LOG10, abs=1e-4)


def _path_scores(lat) -> tuple[list[list[str]], np.ndarray]:
    paths = list(lat.paths())
    sents = [[w for w in words_of(p) if w not in NOT_PREDICTED] for p in paths]
    return sents, np.array([sum(a.lm for a in p) for p in paths])


@pytest.mark.parametrize("name", ORDINARY)
def test_lattice_expansion_gives_every_path_its_own_score(zoo, name, tmp_path):
    """No merging (order above every path's length): each path's LM score is its sentence scored alone."""
    model = zoo.model(name)
    lat = read_lattices(zoo.lattice)[1][0]
    n_paths = sum(1 for _ in lat.paths())
    exp = expand(lat, model, WordMap(model.vocab), order=50)
    sents, got = _path_scores(exp.lattice)
    assert len(sents) == n_paths == 34
    np.testing.assert_allclose(got, _totals(model, sents), atol=1e-4)
    merged = expand(lat, model, WordMap(model.vocab), merge_order=2)  # the default expansion, histories merged
    sents, got = _path_scores(merged.lattice)
    assert len(sents) == n_paths and np.isfinite(got).all()
    if model.capabilities().context_order:  # finite context: its own order is exact already
        assert merged.exact
        np.testing.assert_allclose(got, _totals(model, sents), atol=1e-4)
    # and through the command line, the expanded lattice written back
    assert main(["rescore", str(zoo.dir(name)), "--lattice", str(zoo.lattice), "--order", "50",
                 "--lattice-out", str(tmp_path / "out"), "--best", str(tmp_path / "best.txt")]) == 0
    sents, got = _path_scores(read_lattices(tmp_path / "out" / zoo.lattice.name)[1][0])
    np.testing.assert_allclose(got, _totals(model, sents), atol=1e-3)


# -- a model that peeks at the text it scores ------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PEEKS))
def test_peeking_model_is_refused_where_text_is_scored_unless_asked(zoo, name, capsys, tmp_path):
    d, text = str(zoo.dir(name)), str(zoo.text)
    nbest = tmp_path / "n.tsv"
    nbest.write_text("u-1\t-1.0\t-2.0\tthe cat\nu-2\t-1.5\t-2.0\tthe dog\n", encoding="utf-8")
    refusals = [["eval", d, "--text", text], ["score", d, "--text", text], ["rescore", d, "--tsv", str(nbest)],
                ["rescore", d, "--lattice", str(zoo.lattice)],
                ["interpolate", d, str(zoo.dir("kn")), "--out", str(tmp_path / "mix"), "--valid", text]]
    for argv in refusals:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--allow-peek" in err and "c(s)" in err, (argv, err)
    assert not (tmp_path / "mix").exists()
    assert main(["eval", d, "--text", text, "--allow-peek"]) == 0
    r = _json(capsys)
    assert "p(s|c(s))" in r["peeks"] and math.isfinite(r["ppl"])
    # a mixture holding it peeks as well
    assert main(["interpolate", d, str(zoo.dir("kn")), "--out", str(tmp_path / "mix"), "--weights", "0.5,0.5",
                 "--allow-peek"]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "mix"), "--text", text]) == 2


# -- the contract: what each model declares (protocol.Capabilities, protocol.TextSpec) holds -------------------
def _after(model, history: list[int]) -> torch.Tensor:
    """(V,) the step distribution after reading the start symbol and `history` (ids)."""
    state = model.initial_state(1)
    with torch.no_grad():
        for tok in [model.vocab.bos_id, *history]:
            logp, state = model.step(torch.tensor([tok]), state)
    return logp[0].double()


@pytest.mark.parametrize("name", ALL)
def test_the_saved_contract_is_what_the_model_declares(zoo, name):
    from dataclasses import asdict

    model = zoo.model(name)
    meta = json.loads((zoo.dir(name) / "config.json").read_text())
    assert meta["capabilities"] == asdict(model.capabilities())
    assert meta["text"] == asdict(model.text_spec())
    assert meta["text"]["unit"] == "word" and meta["text"]["vocab_size"] == len(model.vocab)


@pytest.mark.parametrize("name", ORDINARY)
def test_a_declared_finite_context_or_window_bounds_what_the_model_reads(zoo, name):
    """context_order n: the next-word distribution depends on the last n - 1 tokens only; window W: two
    histories of one length that differ only more than W tokens back give the same distribution. A model
    declaring neither is unbounded: some history far back changes its prediction."""
    model = zoo.model(name)
    caps = model.capabilities()
    rng = random.Random(1)
    ids = [model.vocab.id(w) for w in WORDS[:6]]
    for _ in range(3):
        tail = [rng.choice(ids) for _ in range(8)]
        a = [rng.choice(ids) for _ in range(5)] + tail
        b = [rng.choice(ids) for _ in range(5)] + tail
        if caps.context_order is not None:
            short = tail[len(tail) - (caps.context_order - 1):]
            torch.testing.assert_close(_after(model, a), _after(model, short), atol=1e-5, rtol=0)
        if caps.window is not None and caps.window <= len(tail):
            torch.testing.assert_close(_after(model, a), _after(model, b), atol=1e-5, rtol=0)
    if caps.context_order is None and caps.window is None and name not in ("cache", "mix-cache"):
        changed = any(not torch.allclose(_after(model, [i, *tail[:2]]), _after(model, [j, *tail[:2]]), atol=1e-7)
                      for i in ids for j in ids if i != j)  # three tokens back: past any n-gram window here
        assert changed, "a model declaring an unbounded history ignores what it read first"


@pytest.mark.parametrize("name", ORDINARY)
def test_advance_targets_are_advances_entries_and_sparse_ones_read_no_table(zoo, name, monkeypatch):
    """advance_targets(prefixes, rows, targets) is advance(prefixes)[rows, targets] (to float32 rounding); a
    model declaring sparse_targets answers without computing the (B, V) table."""
    from seqlm.protocol import begin

    model = zoo.model(name)
    rng = random.Random(2)
    ids = [model.vocab.id(w) for w in WORDS[:6]]
    with torch.no_grad():
        prefixes = begin(model, 3)
        for _ in range(3):
            tokens = torch.tensor([rng.choice(ids) for _ in range(3)])
            prefixes = model.extend(prefixes, torch.tensor([2, 0, 1]), tokens)
        rows = torch.tensor([2, 0, 0, 1, 1, 2])
        targets = torch.tensor([*ids[:4], model.vocab.eos_id, model.vocab.bos_id])
        want = model.advance(prefixes)[rows, targets]
        if model.capabilities().sparse_targets:
            monkeypatch.setattr(type(model), "advance", lambda *a: pytest.fail("a sparse model computed the table"))
        got = model.advance_targets(prefixes, rows, targets)
    assert got.shape == (6,)
    torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=1e-5)  # float32, summed another way


@pytest.mark.parametrize("name", ORDINARY)
def test_step_targets_are_steps_entries(zoo, name):
    """step_targets(tokens, state, rows, targets) (a lattice expander's arcs) is step's table at (rows, targets),
    to float32 rounding, and leaves the state step leaves."""
    from seqlm.protocol import select_state

    model = zoo.model(name)
    ids = [model.vocab.id(w) for w in WORDS[:6]]
    with torch.no_grad():
        start = torch.full((3,), model.vocab.bos_id)
        _, state = model.step(start, model.initial_state(3))
        tokens = torch.tensor(ids[:3])
        rows = torch.tensor([2, 0, 0, 1, 1, 2])
        targets = torch.tensor([*ids[:4], model.vocab.eos_id, ids[5]])
        logp, want_state = model.step(tokens, select_state(model, state, torch.arange(3)))
        got, got_state = model.step_targets(tokens, state, rows, targets)
    torch.testing.assert_close(got.double(), logp[rows, targets].double(), rtol=0, atol=1e-5)
    after = torch.tensor([ids[4]] * 3)  # the states agree: the next step from each gives the same table
    torch.testing.assert_close(model.step(after, got_state)[0], model.step(after, want_state)[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ORDINARY)
def test_declared_stream_and_dynamic_capabilities_match_the_commands(zoo, name, capsys):
    model, d, text = zoo.model(name), str(zoo.dir(name)), str(zoo.text)
    caps = model.capabilities()
    assert main(["eval", d, "--text", text, "--stream"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["mode"] == ("stream" if caps.stream else "sentence")
    assert caps.stream or "sentence by sentence" in out.err
    code = main(["eval", d, "--text", text, "--dynamic-lr", "0.1"])
    assert code == (0 if caps.dynamic else 2), capsys.readouterr().err


@pytest.mark.parametrize("name", ["kn", "lstm", "cache", "mix"])
def test_declared_quantizable_matches_seqlm_quantize(zoo, name, tmp_path, capsys):
    code = main(["quantize", str(zoo.dir(name)), "--out", str(tmp_path / "int8")])
    assert code == (0 if zoo.model(name).capabilities().quantizable else 2), capsys.readouterr().err


@pytest.mark.parametrize("name", ["kn", "rnn", "mix"])
def test_blank_lines_are_no_sentence_and_score_prints_a_line_per_input_line(zoo, name, tmp_path, capsys):
    lines = ["the cat sat", "", "a dog ran fast", "   ", "red"]
    blank, plain = tmp_path / "blank.txt", tmp_path / "plain.txt"
    blank.write_text("\n".join(lines) + "\n", encoding="utf-8")
    plain.write_text("\n".join(x for x in lines if x.strip()) + "\n", encoding="utf-8")
    d = str(zoo.dir(name))
    assert main(["score", d, "--text", str(blank)]) == 0
    got = capsys.readouterr().out.split("\n")[:-1]
    assert len(got) == len(lines) and got[1] == got[3] == ""
    assert main(["score", d, "--text", str(plain)]) == 0
    assert [x for x in got if x] == capsys.readouterr().out.split()
    assert main(["eval", d, "--text", str(blank)]) == 0
    with_blanks = _json(capsys)
    assert main(["eval", d, "--text", str(plain)]) == 0
    assert with_blanks["sentences"] == 3 and with_blanks == _json(capsys)


def test_query_counts_blank_lines_as_eval_does(zoo, tmp_path, capsys, monkeypatch):
    import io

    text = "the cat sat\n\na dog ran fast\n"
    zoo.dir("kn")  # trained first, if this test runs alone: its JSON is not query's output
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["query", str(zoo.dir("kn"))]) == 0
    out = capsys.readouterr().out.split("\n")
    assert out[1] == "" and "Tokens:\t9" in "\n".join(out)  # 7 words and two </s>: the blank line adds none
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    assert main(["eval", str(zoo.dir("kn")), "--text", str(tmp_path / "t.txt")]) == 0
    assert _json(capsys)["tokens"] == 9


def test_a_mixture_of_different_vocabularies_is_refused_naming_the_words(tmp_path, capsys):
    """Two caches over {a} and {a, b, c}: mixed, the second's b and c would be the first's <unk> and the
    distribution would not sum to one (0.90 or 1.17 before); refused, in either order, by every entry."""
    from seqlm.errors import SeqlmError
    from seqlm.models.mixture import MixtureModel

    for name, text in (("small", "a a a\n"), ("big", "a b c\n")):
        (tmp_path / f"{name}.txt").write_text(text, encoding="utf-8")
        assert main(["train", "--model", "cache", "--text", str(tmp_path / f"{name}.txt"),
                     "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    for pair in (["small", "big"], ["big", "small"]):
        dirs = [str(tmp_path / p) for p in pair]
        assert main(["interpolate", *dirs, "--out", str(tmp_path / f"mix-{pair[0]}")]) == 2
        err = capsys.readouterr().err
        assert "different vocabularies" in err and "'b'" in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / f"mix-{pair[0]}").exists()
        with pytest.raises(SeqlmError, match="different vocabularies"):
            MixtureModel([seqlm.load(d) for d in dirs], [0.5, 0.5], dirs)


def test_a_character_model_reads_every_text_as_characters(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", n_train=40, n_eval=5)
    char, word = tmp_path / "char", tmp_path / "word"
    for out, unit in ((char, "char"), (word, "word")):
        assert main(["train", "--model", "fnn", "--unit", unit, "--data", str(corpus), "--out", str(out), *COMMON,
                     "--order", "3", "--embed", "8", "--hidden", "16", "--layers", "1", "--batch-size", "4",
                     "--seq-len", "16"]) == 0
    model = seqlm.load(char)
    assert model.text_spec().unit == "char"
    scores = seqlm.score_text(model, ["the cat"])[0]
    assert len(scores) == len("the_cat") + 1  # every character, the word boundary and </s>
    (tmp_path / "nbest.tsv").write_text("u-1\t0\t0\tthe cat\n", encoding="utf-8")
    assert main(["rescore", str(char), "--tsv", str(tmp_path / "nbest.tsv"), "--out", str(tmp_path / "r.tsv")]) == 0
    row = (tmp_path / "r.tsv").read_text().splitlines()[1].split("\t")
    assert float(row[3]) == pytest.approx(sum(scores) * LOG10, abs=1e-4)  # new_lm: ln p of the spelt sentence
    capsys.readouterr()
    assert main(["eval", str(char), "--text", str(corpus / "test.txt"), "--raw"]) == 2  # not how it was trained
    assert "--raw" in capsys.readouterr().err
    assert main(["interpolate", str(char), str(word), "--out", str(tmp_path / "mix")]) == 2
    assert "read text alike" in capsys.readouterr().err


def test_seqlm_kenlm_models_carry_the_contract_and_refuse_character_models(zoo, tmp_path, capsys):
    from seqlm import kenlm
    from seqlm.errors import SeqlmError

    for name in ("kn", "lstm", "mix"):
        lm = kenlm.Model(str(zoo.dir(name)))
        model = zoo.model(name)
        assert lm.text_spec() == model.text_spec() and lm.capabilities() == model.capabilities()
    corpus = write_corpus(tmp_path / "corpus", n_train=20, n_eval=3)
    assert main(["train", "--model", "cache", "--unit", "char", "--data", str(corpus),
                 "--out", str(tmp_path / "c")]) == 0
    with pytest.raises(SeqlmError, match="char units"):
        kenlm.Model(str(tmp_path / "c"))
