"""`seqlm interpolate --arpa-out`: n-gram models merged into one back-off ARPA model (seqlm.ngram.merge).

References: probabilities computed by hand on two hand-written bigram models with different vocabularies;
brute-force sums over the union vocabulary (seqlm's query of the written file); the components' own scores
from the real kenlm module, mixed here; seqlm's dynamic mixture; the kenlm module reading the merged file.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

import seqlm
from seqlm.cli import main
from seqlm.ngram import merge as merge_module
from seqlm.ngram.merge import merge
from seqlm.ngram.model import NGramModel
from seqlm.ngram.query import NGramQuery, State

from conftest import SEQ_LEN, TINY, require_module, write_corpus

kenlm = require_module("kenlm", "the kenlm Python module is not installed (pip install -e '.[kenlm]')")

LOG = math.log10


def write_arpa(path: Path, unigrams: dict[str, tuple[float, float]], bigrams: dict[str, float]) -> Path:
    """A bigram ARPA file from probabilities (not logs): unigrams word -> (p, back-off), bigrams "a b" -> p."""
    lines = ["\\data\\", f"ngram 1={len(unigrams)}", f"ngram 2={len(bigrams)}", "", "\\1-grams:"]
    for w, (p, bo) in unigrams.items():
        lines.append(f"{LOG(p) if p > 0 else -99}\t{w}\t{LOG(bo)}")
    lines += ["", "\\2-grams:"] + [f"{LOG(p)}\t{g}" for g, p in bigrams.items()] + ["", "\\end\\", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# A knows a and b, B knows b and c; both are normalised (each back-off weight by hand: (1 - listed p) /
# (1 - their unigram p)); <s> is only a context.
A_UNI = {"</s>": (0.3, 1), "<unk>": (0.1, 1), "a": (0.35, 0.5 / 0.75), "b": (0.25, 0.3 / 0.7), "<s>": (0, 0.4 / 0.65)}
A_BI = {"<s> a": 0.6, "a b": 0.5, "b </s>": 0.7}
B_UNI = {"</s>": (0.2, 1), "<unk>": (0.2, 0.5 / 0.6), "b": (0.4, 0.5 / 0.8), "c": (0.2, 0.4 / 0.6),
         "<s>": (0, 0.5 / 0.8)}
B_BI = {"<s> c": 0.5, "c b": 0.6, "b </s>": 0.5, "<unk> b": 0.5}

# Merged with weights 0.6, 0.4. A word a model lacks gets 0 from it as the predicted word and reads as its
# <unk> in a context: b after a is 0.6 P_A(b | a) + 0.4 P_B(b | <unk>), b after c 0.6 P_A(b | <unk>) + ...,
# where A lists nothing after <unk> (its unigram p(b), back-off 1).
MERGED_UNI = {"</s>": 0.6 * 0.3 + 0.4 * 0.2, "<unk>": 0.6 * 0.1 + 0.4 * 0.2, "a": 0.6 * 0.35,
              "b": 0.6 * 0.25 + 0.4 * 0.4, "c": 0.4 * 0.2}
MERGED_BI = {"<s> a": 0.6 * 0.6, "a b": 0.6 * 0.5 + 0.4 * 0.5, "b </s>": 0.6 * 0.7 + 0.4 * 0.5, "<s> c": 0.4 * 0.5,
             "c b": 0.6 * 0.25 + 0.4 * 0.6, "<unk> b": 0.6 * 0.25 + 0.4 * 0.5}
MERGED_BO = {"<s>": (1 - 0.36 - 0.2) / (1 - 0.21 - 0.08), "a": (1 - 0.5) / (1 - 0.31), "b": (1 - 0.62) / (1 - 0.26),
             "c": (1 - 0.39) / (1 - 0.31), "<unk>": (1 - 0.35) / (1 - 0.31), "</s>": 1.0}


def arpa_entries(path: Path) -> dict[str, tuple[float, float]]:
    """Every n-gram of an ARPA file as written: words -> (log10 p, log10 back-off or 0)."""
    entries, order = {}, 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("\\") and line.endswith("-grams:"):
            order = int(line[1])
        elif order and line.strip() and not line.startswith("\\"):
            f = line.split("\t")
            entries[f[1]] = (float(f[0]), float(f[2]) if len(f) > 2 else 0.0)
    return entries


@pytest.fixture(scope="module")
def hand(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hand")
    a, b = write_arpa(d / "a.arpa", A_UNI, A_BI), write_arpa(d / "b.arpa", B_UNI, B_BI)
    out = d / "mix.arpa"
    assert main(["interpolate", str(a), str(b), "--weights", "0.6,0.4", "--arpa-out", str(out)]) == 0
    return {"a": a, "b": b, "mix": out}


def test_merged_probabilities_and_backoffs_are_the_hand_computed_ones(hand):
    got = arpa_entries(hand["mix"])
    assert set(got) == set(MERGED_UNI) | {"<s>"} | set(MERGED_BI)  # the union of the listed n-grams
    for w, p in {**MERGED_UNI, **MERGED_BI}.items():
        assert got[w][0] == pytest.approx(LOG(p), abs=1e-6), w
    for w, bo in MERGED_BO.items():
        assert got[w][1] == pytest.approx(LOG(bo), abs=1e-6), w


def test_hand_merge_scores_through_backoff_and_kenlm_agrees(hand):
    q, theirs = NGramQuery(hand["mix"]), kenlm.Model(str(hand["mix"]))
    # "c a" is listed by nobody: bo(c) p(a); "zebra" is no model's word: the merged <unk>, after a: bo(a) p(<unk>)
    want = [LOG(0.2), LOG(MERGED_BO["c"] * 0.21), LOG(MERGED_BO["a"] * 0.14), LOG(MERGED_BO["<unk>"] * 0.26)]
    got = [p for p, _, _ in q.full_scores("c a zebra")]
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose([p for p, _, _ in theirs.full_scores("c a zebra")], want, atol=1e-6)


# ---- trained models with different vocabularies and orders --------------------------------------------

WA = "the cat dog sat on mat a ran".split()
WB = "the cat bird flew over tree a ran sat".split()


def lines_of(words: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 7))) for _ in range(n)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("trained")
    texts = {"a": lines_of(WA, 80, 1), "b": lines_of(WB, 80, 2)}
    for name, order in (("a", "3"), ("b", "2")):
        (d / f"{name}.txt").write_text("\n".join(texts[name]) + "\n", encoding="utf-8")
        assert main(["train", "--model", "kn", "--order", order, "--text", str(d / f"{name}.txt"),
                     "--arpa", str(d / f"{name}.arpa")]) == 0
    out = d / "mix.arpa"
    assert main(["interpolate", str(d / "a.arpa"), str(d / "b.arpa"), "--weights", "0.7,0.3",
                 "--arpa-out", str(out)]) == 0
    return {"dir": d, "texts": texts, "a": d / "a.arpa", "b": d / "b.arpa", "mix": out, "weights": (0.7, 0.3)}


def _next_log10(q: NGramQuery, context: list[str], word: str) -> float:
    s = State()
    q.BeginSentenceWrite(s) if context[:1] == ["<s>"] else q.NullContextWrite(s)
    for w in context[1:] if context[:1] == ["<s>"] else context:
        t = State()
        q.BaseScore(s, w, t)
        s = t
    return q.BaseScore(s, word, State())


def test_every_context_sums_to_one_over_the_union_vocabulary(trained):
    q = NGramQuery(trained["mix"])
    words = [w for w in q.vocab.itos if w != "<s>"]
    assert set(words) == set(WA) | set(WB) | {"</s>", "<unk>"}
    m = q.model
    contexts = [[]] + [[q.vocab.itos[i] for i in g] for k in (1, 2) for g in m.words_of(k, np.arange(m.sizes[k - 1]))]
    rng = random.Random(0)
    contexts += [["<s>", rng.choice(words)] for _ in range(20)] + [rng.sample(words, 2) for _ in range(20)]
    for ctx in contexts:  # listed contexts and unlisted ones (which back off)
        if ctx[-1:] == ["</s>"]:
            continue  # nothing is ever scored after </s>
        total = sum(10.0 ** _next_log10(q, ctx, w) for w in words)
        assert total == pytest.approx(1.0, abs=1e-6), ctx


def test_merged_scores_are_the_dynamic_mixture_where_both_models_know_the_words(trained):
    """Sentences of A's training text (so every n-gram is listed in A, the higher order) in words B knows too:
    each token is lambda_A P_A + lambda_B P_B, the components scored by the kenlm module."""
    both = set(WA) & set(WB)
    sentences = [s for s in trained["texts"]["a"] if set(s.split()) <= both]
    assert len(sentences) >= 5
    ka, kb, mine = kenlm.Model(str(trained["a"])), kenlm.Model(str(trained["b"])), NGramQuery(trained["mix"])
    la, lb = trained["weights"]
    for s in sentences:
        want = [LOG(la * 10**a + lb * 10**b) for (a, _, _), (b, _, _) in zip(ka.full_scores(s), kb.full_scores(s))]
        np.testing.assert_allclose([p for p, _, _ in mine.full_scores(s)], want, atol=1e-5)


def test_kenlm_reads_the_merged_file_and_scores_as_seqlm(trained):
    theirs, mine = kenlm.Model(str(trained["mix"])), NGramQuery(trained["mix"])
    rng = random.Random(3)
    vocab = sorted(set(WA) | set(WB)) + ["zebra", "<unk>"]
    for _ in range(50):
        s = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 9)))
        for bos, eos in ((True, True), (False, False)):
            a, b = list(theirs.full_scores(s, bos, eos)), list(mine.full_scores(s, bos, eos))
            np.testing.assert_allclose([x[0] for x in b], [x[0] for x in a], atol=1e-5)
            assert [x[1] for x in b] == [x[1] for x in a]


def test_one_vocabulary_merge_scores_as_seqlm_interpolate(tmp_path):
    """With one vocabulary the dynamic mixture directory is allowed; on sentences of the higher-order model's
    training text the merged file scores as it does."""
    texts = [lines_of(WA, 80, 5), lines_of(WA, 80, 6)]
    for i, order in enumerate(("3", "3")):
        (tmp_path / f"{i}.txt").write_text("\n".join(texts[i]) + "\n", encoding="utf-8")
        assert main(["train", "--model", "kn", "--order", order, "--text", str(tmp_path / f"{i}.txt"),
                     "--out", str(tmp_path / f"kn{i}")]) == 0
    models, common = [str(tmp_path / "kn0"), str(tmp_path / "kn1")], ["--weights", "0.45,0.55"]
    assert main(["interpolate", *models, *common, "--out", str(tmp_path / "mixdir")]) == 0
    assert main(["interpolate", *models, *common, "--arpa-out", str(tmp_path / "mix.arpa.gz")]) == 0
    sentences = [s.split() for s in texts[0][:30]]
    dynamic = seqlm.score_text(seqlm.load(tmp_path / "mixdir"), sentences)
    static = seqlm.score_text(seqlm.load(tmp_path / "mix.arpa.gz"), sentences)
    np.testing.assert_allclose(np.concatenate(static), np.concatenate(dynamic), atol=1e-5)


def test_chunks_give_the_same_model(trained, monkeypatch):
    """Each order is processed in chunks of CHUNK n-grams: boundaries anywhere change nothing."""
    parts = [NGramModel.from_arpa(trained[k]) for k in ("a", "b")]
    whole = merge(parts, trained["weights"]).model
    monkeypatch.setattr(merge_module, "CHUNK", 7)
    chunked = merge(parts, trained["weights"]).model
    for k in range(whole.order):
        np.testing.assert_array_equal(chunked.keys[k], whole.keys[k])
        np.testing.assert_array_equal(chunked.log10_prob[k], whole.log10_prob[k])
    for k in range(whole.order - 1):
        np.testing.assert_array_equal(chunked.log10_backoff[k], whole.log10_backoff[k])


def test_em_weights_maximise_the_heldout_likelihood(trained, capsys):
    """Weights by EM on held-out text; the printed dynamic perplexity is the one computed here from the kenlm
    module's component scores (a word a model lacks: 0 from it), and EM's weights beat nearby ones."""
    d = trained["dir"]
    held = lines_of(sorted(set(WA) | set(WB)), 30, 9)
    (d / "held.txt").write_text("\n".join(held) + "\n", encoding="utf-8")
    assert main(["interpolate", str(trained["a"]), str(trained["b"]), "--text", str(d / "held.txt"),
                 "--arpa-out", str(d / "em.arpa")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["weights_from"] == "em"
    ka, kb = kenlm.Model(str(trained["a"])), kenlm.Model(str(trained["b"]))
    per = []  # (tokens, 2) probabilities under A and B by the merge's rule
    for s in held:
        words = s.split() + ["</s>"]
        for w, (a, _, _), (b, _, _) in zip(words, ka.full_scores(s), kb.full_scores(s), strict=True):
            per.append((10**a if w in ka else 0.0, 10**b if w in kb else 0.0))
    per = np.array(per)

    def ppl(wa: float) -> float:
        return float(10 ** -np.mean(np.log10(per @ np.array([wa, 1 - wa]))))

    wa = report["weights"][0]
    assert report["dynamic_valid_ppl"] == pytest.approx(ppl(wa), rel=1e-6)
    assert ppl(wa) < min(ppl(wa - 0.02), ppl(wa + 0.02))
    assert report["valid_ppl"] == pytest.approx(10 ** -np.mean([p for s in held for p, _, _ in
                                                                  NGramQuery(d / "em.arpa").full_scores(s)]), rel=1e-6)


# ---- refused -----------------------------------------------------------------------------------------


def _refused(capsys, *argv: str, match: str) -> None:
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err


def test_bad_input_is_one_line_and_exit_2(trained, tmp_path, capsys):
    a, b, out = str(trained["a"]), str(trained["b"]), str(tmp_path / "x.arpa")
    _refused(capsys, "interpolate", a, "--arpa-out", out, match="two or more")
    _refused(capsys, "interpolate", a, b, "--weights", "0.5,-0.5", "--arpa-out", out, match="non-negative")
    _refused(capsys, "interpolate", a, b, "--weights", "0,0", "--arpa-out", out, match="positive sum")
    _refused(capsys, "interpolate", a, b, "--weights", "1,0", "--arpa-out", out, match="weight of 0")
    _refused(capsys, "interpolate", a, b, "--weights", "0.5", "--arpa-out", out, match="one per model")
    _refused(capsys, "interpolate", a, b, "--stream", "--text", a, "--arpa-out", out, match="--stream")
    _refused(capsys, "interpolate", a, b, "--out", str(tmp_path / "dyn"), match="--arpa-out FILE instead merges")
    _refused(capsys, "interpolate", a, b, "--out", str(tmp_path / "d"), "--arpa-out", out, match="not allowed")
    assert not Path(out).exists()
    corpus = write_corpus(tmp_path / "corpus", n_train=40, n_eval=5)
    assert main(["train", "--model", "fnn", "--max-epochs", "1", SEQ_LEN, "8", *TINY, "--data", str(corpus),
                 "--out", str(tmp_path / "fnn")]) == 0
    capsys.readouterr()
    _refused(capsys, "interpolate", a, str(tmp_path / "fnn"), "--arpa-out", out, match="is a fnn model")
    Path(out).write_text("mine\n", encoding="utf-8")
    _refused(capsys, "interpolate", a, b, "--arpa-out", out, match="exists")
    assert Path(out).read_text(encoding="utf-8") == "mine\n"
