"""Model combination (rnnlm-extensions.txt, 'Combination of models') and n-best rescoring.

Tiny fnn, rnn and kn models are trained once for the module; mixtures of them must be proper
distributions, score exactly log(sum_i lambda_i p_i), save and load like any model, and `rescore`
must pick the hypothesis with the best combined score, batched exactly as one at a time.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import seqlm
from seqlm.cli import main
from seqlm.data.batching import sentence_batches
from seqlm.data.corpus import encode_file, encode_sentences
from seqlm.eval.perplexity import LOG10, can_stream, score_tokens, text_logp
from seqlm.models.mixture import MixtureModel, fit_weights, mix_logp

from conftest import SEQ_LEN, TINY, write_corpus
from conftest import run_cli as run


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Tiny fnn, rnn (stream-trained) and 3-gram kn on the same corpus, trained through the CLI."""
    d = tmp_path_factory.mktemp("combination")
    corpus = write_corpus(d / "corpus")
    runs = {
        "fnn": ["--max-epochs", "1", *TINY],
        "rnn": ["--max-epochs", "1", SEQ_LEN, "10", "--batch-size", "8", *TINY],
        "kn": ["--order", "3"],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kn on a tiny corpus falls back to default discounts
        for name, extra in runs.items():
            assert main(["train", "--model", name, "--data", str(corpus), "--out", str(d / name), *extra]) == 0
    return {"corpus": corpus, **{name: d / name for name in runs}}


def mixture(models, names: list[str], weights: list[float]) -> MixtureModel:
    paths = [models[n] for n in names]
    return MixtureModel([seqlm.load(p) for p in paths], weights, paths)


SENTS = [["the", "cat", "sat"], ["a", "dog", "ran", "fast", "on", "the", "mat"], ["zebra", "sat"], ["red"]]


@pytest.mark.parametrize("names", [["fnn", "rnn"], ["rnn", "kn"], ["kn", "rnn", "fnn"]])
def test_step_distributions_sum_to_one_and_match_score(models, names):
    """Vocabularies with and without <s>: each component reads its own start symbol, sums stay 1."""
    mix = mixture(models, names, [0.6, 0.4] if len(names) == 2 else [0.5, 0.3, 0.2])
    stream = encode_sentences(SENTS, mix.vocab)
    whole = score_tokens(mix, stream).logp
    stepped = []
    for i in range(stream.num_sentences):
        state, tok = mix.initial_state(1), torch.tensor([mix.vocab.bos_id])
        for t in stream.sentence(i).tolist():
            logp, state = mix.step(tok, state)  # (1, V)
            assert float(logp.exp().sum()) == pytest.approx(1.0, abs=1e-6)
            stepped.append(float(logp[0, t]))
            tok = torch.tensor([t])
    assert whole.tolist() == pytest.approx(stepped, abs=1e-5)


def test_score_is_log_of_the_weighted_sum(models):
    weights = [0.3, 0.7]
    mix = mixture(models, ["fnn", "rnn"], weights)
    stream = encode_sentences(SENTS, mix.vocab)
    per = [score_tokens(seqlm.load(models[n]), stream).logp for n in ("fnn", "rnn")]  # same vocabulary here
    by_hand = np.log(weights[0] * np.exp(per[0]) + weights[1] * np.exp(per[1]))
    assert score_tokens(mix, stream).logp == pytest.approx(by_hand, abs=1e-9)
    for rows in sentence_batches(stream, mix.vocab.bos_id, max_tokens=16):  # the protocol's score() too
        got = mix.score(rows.batch)  # (B, T)
        mask = rows.batch.mask
        for b in range(got.shape[0]):
            first = stream.starts[rows.sentence[b]] + rows.offset[b]
            want = by_hand[first : first + int(mask[b].sum())]
            assert got[b][mask[b]].numpy() == pytest.approx(want, abs=1e-6)
            assert float(got[b][~mask[b]].abs().sum()) == 0.0


def test_em_weights_sum_to_one_and_never_lose_to_equal_weights(models):
    mix = mixture(models, ["fnn", "rnn", "kn"], [1 / 3] * 3)
    valid = encode_file(models["corpus"] / "valid.txt", mix.vocab)
    per = mix.component_logp(valid, False, 4096, text_logp)  # (3, N)
    w = fit_weights(per)
    assert w.sum() == pytest.approx(1.0) and (w >= 0).all()
    assert mix_logp(per, w).sum() >= mix_logp(per, np.full(3, 1 / 3)).sum() - 1e-9
    assert fit_weights(np.stack([per[0], per[0]])) == pytest.approx([0.5, 0.5])  # nothing to choose between
    rng = np.random.default_rng(0)  # data drawn 80/20 from two known distributions: EM recovers the split
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7]])
    comp = rng.random(20000) < 0.8
    x = np.where(comp, rng.choice(3, 20000, p=p[0]), rng.choice(3, 20000, p=p[1]))
    assert fit_weights(np.log(p[:, x]), iters=500) == pytest.approx([0.8, 0.2], abs=0.03)


def test_interpolate_round_trips_through_load_and_eval(models, tmp_path, capsys):
    tree = tmp_path / "tree"  # components and mixture in one tree, which is then moved
    for n in ("fnn", "kn"):
        shutil.copytree(models[n], tree / n)
    valid = models["corpus"] / "valid.txt"
    code, out, err = run(capsys, "interpolate", tree / "fnn", tree / "kn", "--valid", valid, "--out", tree / "mix")
    assert code == 0, err
    r = json.loads(out)
    assert r["weights_from"] == "em" and sum(r["weights"]) == pytest.approx(1.0) and r["mode"] == "sentence"
    equal = mixture({"fnn": tree / "fnn", "kn": tree / "kn"}, ["fnn", "kn"], [0.5, 0.5])
    equal_ppl = math.exp(-equal.score_text(encode_file(valid, equal.vocab), False, 4096, text_logp).mean())
    assert r["valid_ppl"] <= equal_ppl and r["valid_ppl"] <= min(r["component_valid_ppl"]) * (1 + 1e-4)
    saved = json.loads((tree / "mix" / "config.json").read_text())
    assert saved["family"] == "mix" and saved["model"]["components"] == ["../fnn", "../kn"]
    moved = tmp_path / "moved"
    shutil.move(tree, moved)
    lm = seqlm.load(moved / "mix")
    assert isinstance(lm, MixtureModel) and lm.weights.tolist() == pytest.approx(r["weights"])
    code, out, _ = run(capsys, "eval", moved / "mix", "--text", valid)
    assert code == 0 and json.loads(out)["ppl"] == pytest.approx(r["valid_ppl"], rel=1e-9)
    code, out, _ = run(capsys, "generate", moved / "mix", "--num", "2")
    assert code == 0 and len(out.splitlines()) == 2
    code, out, _ = run(capsys, "interpolate", moved / "fnn", moved / "kn", "--weights", "1,3", "--out", tmp_path / "w")
    assert code == 0 and json.loads(out)["weights"] == [0.25, 0.75] and "valid_ppl" not in json.loads(out)


def test_stream_mode_for_an_rnn_plus_fnn_mixture(models, tmp_path, capsys):
    valid = models["corpus"] / "valid.txt"
    code, out, err = run(capsys, "interpolate", models["rnn"], models["fnn"], "--valid", valid, "--stream",
                         "--out", tmp_path / "mix")
    assert code == 0, err
    r = json.loads(out)
    assert r["mode"] == "stream"
    rnn_stream = json.loads(run(capsys, "eval", models["rnn"], "--text", valid, "--stream")[1])["ppl"]
    fnn_sentence = json.loads(run(capsys, "eval", models["fnn"], "--text", valid)[1])["ppl"]
    assert r["component_valid_ppl"] == pytest.approx([rnn_stream, fnn_sentence], rel=1e-9)
    assert can_stream(seqlm.load(tmp_path / "mix"))
    code, out, _ = run(capsys, "eval", tmp_path / "mix", "--text", valid, "--stream")
    assert code == 0 and json.loads(out)["mode"] == "stream"
    assert json.loads(out)["ppl"] == pytest.approx(r["valid_ppl"], rel=1e-9)


def test_interpolate_stream_scores_a_sentence_independent_rnn_sentence_by_sentence(models, tmp_path, capsys):
    """--stream: the stream-trained rnn carries its state, the sentence-independent one keeps its own mode."""
    indep = tmp_path / "indep"
    assert main(["train", "--model", "rnn", "--data", str(models["corpus"]), "--out", str(indep), "--max-epochs", "1",
                 SEQ_LEN, "10", "--batch-size", "8", "--sentence-independent", "true", *TINY]) == 0
    capsys.readouterr()
    valid = models["corpus"] / "valid.txt"
    code, out, err = run(capsys, "interpolate", models["rnn"], indep, "--valid", valid, "--stream",
                         "--out", tmp_path / "mix")
    assert code == 0, err
    r = json.loads(out)
    rnn_stream = json.loads(run(capsys, "eval", models["rnn"], "--text", valid, "--stream")[1])["ppl"]
    indep_sentence = json.loads(run(capsys, "eval", indep, "--text", valid)[1])["ppl"]
    assert r["mode"] == "stream" and r["component_valid_ppl"] == pytest.approx([rnn_stream, indep_sentence], rel=1e-9)
    code, out, err = run(capsys, "interpolate", indep, "--valid", valid, "--stream", "--out", tmp_path / "alone")
    assert code == 0 and json.loads(out)["mode"] == "sentence" and "--sentence-independent" in err
    assert json.loads(out)["valid_ppl"] == pytest.approx(indep_sentence, rel=1e-9)


def test_train_mix_says_to_use_interpolate(models, tmp_path, capsys):
    code, _, err = run(capsys, "train", "--model", "mix", "--data", models["corpus"], "--out", tmp_path / "m")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "seqlm interpolate" in err


# ---- n-best rescoring ----------------------------------------------------------------------------

HYPS = {
    "utt1": ["the cat sat on the mat", "the cat sat on mat", "cat the sat mat on the"],
    "utt-2": ["a dog ran fast", "a dog ran", "dog a fast ran"],
    "utt3": ["big red cat", "big cat red", "red big cat sat"],
}
ACOUSTIC = {"utt1": [-10.0, -9.0, -9.5], "utt-2": [-7.0, -7.2, -6.0], "utt3": [-5.0, -5.1, -8.0]}
OLD_LM = {"utt1": [-12.0, -13.0, -20.0], "utt-2": [-9.0, -8.0, -15.0], "utt3": [-7.0, -9.0, -11.0]}


def write_nbest(d: Path, costs: bool = False) -> tuple[Path, Path, Path]:
    sign = -1 if costs else 1
    text, ac, lm = [], [], []
    for utt, hyps in HYPS.items():
        for n, words in enumerate(hyps, 1):
            text.append(f"{utt}-{n} {words}")
            ac.append(f"{utt}-{n} {sign * ACOUSTIC[utt][n - 1]}")
            lm.append(f"{utt}-{n} {sign * OLD_LM[utt][n - 1]}")
    paths = d / "nbest.txt", d / "ac.txt", d / "lm.txt"
    for p, lines in zip(paths, (text, ac, lm), strict=True):
        p.write_text("\n".join(lines) + "\n")
    return paths


def expected(model_dir: Path, lm_weight: float, penalty: float, old_w: float | None = None) -> dict:
    """Totals by hand, every hypothesis scored on its own (seqlm.score_sentence is log10)."""
    lm = seqlm.load(model_dir)
    out = {}
    for utt, hyps in HYPS.items():
        for n, words in enumerate(hyps, 1):
            new = seqlm.score_sentence(lm, words) * LOG10
            lm_score = new if old_w is None else (1 - old_w) * new + old_w * OLD_LM[utt][n - 1]
            total = ACOUSTIC[utt][n - 1] + lm_weight * lm_score - penalty * len(words.split())
            out[f"{utt}-{n}"] = (new, total)
    return out


def read_scores(text: str, with_oov: bool = False) -> dict[str, list[float]]:
    """key -> [acoustic, old_lm, new_lm, total] (and the oov count last, if `with_oov`)."""
    lines = text.splitlines()
    assert lines[0].split("\t") == ["key", "acoustic", "old_lm", "new_lm", "total", "oov"]
    rows = {k: [float(x) for x in rest] for k, *rest in (line.split("\t") for line in lines[1:])}
    return rows if with_oov else {k: v[:4] for k, v in rows.items()}


@pytest.mark.parametrize("model", ["rnn", "mix"])
def test_rescore_batched_equals_one_at_a_time_and_picks_the_best(model, models, tmp_path, capsys):
    if model == "mix":
        assert run(capsys, "interpolate", models["rnn"], models["kn"], "--out", tmp_path / "mix")[0] == 0
    model_dir = tmp_path / "mix" if model == "mix" else models[model]
    nbest, ac, lm = write_nbest(tmp_path)
    code, out, err = run(capsys, "rescore", model_dir, "--nbest", nbest, "--acoustic", ac, "--lm-scores", lm,
                         "--lm-weight", "0.5", "--word-penalty", "0.3", "--best", tmp_path / "best.txt")
    assert code == 0, err
    got, want = read_scores(out), expected(model_dir, 0.5, 0.3)
    assert list(got) == list(want)
    for key, (new, total) in want.items():
        utt, n = key.rsplit("-", 1)
        assert got[key] == pytest.approx([ACOUSTIC[utt][int(n) - 1], OLD_LM[utt][int(n) - 1], new, total], abs=1e-5)
    best = {utt: max(range(1, 4), key=lambda n, u=utt: want[f"{u}-{n}"][1]) for utt in HYPS}
    assert (tmp_path / "best.txt").read_text() == "".join(f"{u} {HYPS[u][best[u] - 1]}\n" for u in HYPS)


def test_rescore_costs_tsv_and_interpolate_old(models, tmp_path, capsys):
    model = models["rnn"]
    nbest, ac, lm = write_nbest(tmp_path, costs=True)
    code, out, _ = run(capsys, "rescore", model, "--nbest", nbest, "--acoustic", ac, "--lm-scores", lm, "--costs",
                       "--interpolate-old", "0.25", "--out", tmp_path / "scores.tsv")
    assert code == 0 and out == ""
    want = expected(model, 1.0, 0.0, old_w=0.25)
    got = read_scores((tmp_path / "scores.tsv").read_text())
    assert [got[k][3] for k in want] == pytest.approx([-t for _, t in want.values()], abs=1e-5)  # costs out
    tsv = tmp_path / "nbest.tsv"  # the same list as one TSV file (log-likelihoods, with a header)
    rows = ["key\tacoustic\tlm\ttext"] + [f"{u}-{n}\t{ACOUSTIC[u][n - 1]}\t{OLD_LM[u][n - 1]}\t{h}"
                                          for u, hyps in HYPS.items() for n, h in enumerate(hyps, 1)]
    tsv.write_text("\n".join(rows) + "\n")
    code, out, _ = run(capsys, "rescore", model, "--tsv", tsv, "--interpolate-old", "0.25")
    assert code == 0 and [v[3] for v in read_scores(out).values()] == pytest.approx(
        [t for _, t in want.values()], abs=1e-5)


def test_rescore_reports_oovs_and_charges_the_oov_penalty(tmp_path, capsys):
    """PTB-like training text (rare words replaced by <unk>) makes an unknown word likelier than a rare known one:
    "higher prophets" beats "higher profits" on the LM alone; the oov column shows why, the penalty fixes it."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = ["the company expects higher <unk>"] * 20 + ["the company expects higher profits"] * 2 + ["the cat sat"] * 5
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text("\n".join(lines) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # default discounts on a tiny corpus
        assert main(["train", "--model", "kn", "--order", "3", "--data", str(corpus),
                     "--out", str(tmp_path / "kn")]) == 0
    capsys.readouterr()
    tsv = tmp_path / "nbest.tsv"
    tsv.write_text("utt1-1\t-10.0\t0\tthe company expects higher profits\n"
                   "utt1-2\t-10.0\t0\tthe company expects higher prophets\n")
    code, out, err = run(capsys, "rescore", tmp_path / "kn", "--tsv", tsv, "--best", tmp_path / "best.txt")
    plain = read_scores(out, with_oov=True)
    assert code == 0 and [v[4] for v in plain.values()] == [0, 1]  # "prophets" is the only unknown word
    assert (tmp_path / "best.txt").read_text() == "utt1 the company expects higher prophets\n"
    assert "1 of 2 hypotheses" in err and "--oov-penalty" in err
    lm = seqlm.load(tmp_path / "kn")  # by hand: the difference is ln P(<unk> | expects higher) - ln P(profits | ...)
    full = [np.array(x) * LOG10 for x in seqlm.score_text(lm, ["the company expects higher profits",
                                                                "the company expects higher <unk>"])]
    assert plain["utt1-2"][3] - plain["utt1-1"][3] == pytest.approx(float(full[1].sum() - full[0].sum()), abs=1e-5)
    code, out, _ = run(capsys, "rescore", tmp_path / "kn", "--tsv", tsv, "--oov-penalty", "5",
                       "--best", tmp_path / "best.txt", "--force")
    charged = read_scores(out, with_oov=True)
    for key in plain:  # total less 5 per unknown word, nothing else changed
        assert charged[key][3] == pytest.approx(plain[key][3] - 5 * plain[key][4], abs=1e-6)
    assert (tmp_path / "best.txt").read_text() == "utt1 the company expects higher profits\n"


@pytest.mark.parametrize("case", ["bad-key", "bad-score", "missing-score", "extra-score", "duplicate", "tsv-columns",
                                  "no-acoustic", "old-weight-without-lm"])
def test_rescore_malformed_input_is_one_line_and_status_2(case, models, tmp_path, capsys):
    nbest, ac, lm = write_nbest(tmp_path)
    args = ["rescore", models["fnn"], "--nbest", nbest, "--acoustic", ac]
    where = None
    if case == "bad-key":
        nbest.write_text(nbest.read_text().replace("utt3-2 ", "utt3_two "))
        where = f"{nbest}:8:"
    elif case == "bad-score":
        ac.write_text(ac.read_text().replace("utt1-2 -9.0", "utt1-2 minus-nine"))
        where = f"{ac}:2:"
    elif case == "missing-score":
        ac.write_text("\n".join(ac.read_text().splitlines()[:-1]) + "\n")
        where = f"{ac}:"
    elif case == "extra-score":
        ac.write_text(ac.read_text() + "utt9-1 -3.0\n")
        where = f"{ac}:10:"
    elif case == "duplicate":
        nbest.write_text(nbest.read_text() + "utt1-1 the cat\n")
        where = f"{nbest}:10:"
    elif case == "tsv-columns":
        tsv = tmp_path / "bad.tsv"
        tsv.write_text("utt1-1\t-1.0\t-2.0\tthe cat\nutt1-2\t-1.0\tthe dog\n")
        args = ["rescore", models["fnn"], "--tsv", tsv]
        where = f"{tsv}:2:"
    elif case == "no-acoustic":
        args = args[:4]
    elif case == "old-weight-without-lm":
        args += ["--interpolate-old", "0.5"]
    code, out, err = run(capsys, *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith("seqlm: error:"), err
    if where:
        assert where in err, err


def test_api_score_text_of_a_mixture_is_per_token_interpolation(models):
    mix = mixture(models, ["rnn", "kn"], [0.5, 0.5])
    sentence = [["the", "cat", "sat"]]
    parts = [np.array(seqlm.score_text(seqlm.load(models[n]), sentence)[0]) * LOG10 for n in ("rnn", "kn")]
    per_token = np.log(0.5 * np.exp(parts[0]) + 0.5 * np.exp(parts[1]))  # (4,) mixed per token, not per sentence
    assert seqlm.score_sentence(mix, "the cat sat") * LOG10 == pytest.approx(per_token.sum(), abs=1e-9)
