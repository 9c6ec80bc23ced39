"""The dae family: layout of [reversed c(s), separator, s], peek, decoding from a code, DSAE, the real CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from seqlm.cli import main
from seqlm.data.vocab import Vocab
from seqlm.eval.dsae import dsae_report, dsae_value
from seqlm.models.dae import DAEConfig, build_dae
from seqlm.protocol import Batch

from conftest import write_corpus


def _dae(**kw):
    torch.manual_seed(0)
    vocab = Vocab(["</s>", "<unk>"] + [f"w{i}" for i in range(10)])
    cfg = DAEConfig(layers=1, d_model=16, heads=2, d_ff=32, context=64, k=2, bits=6, filter_size=32,
                    latent_d_model=32, dropout=0.0, pretrain_steps=0, **kw)
    return build_dae(cfg, vocab).eval()


def _rows(sentences: list[list[int]]) -> Batch:
    """One whole sentence per row (ids ending with </s> = 0), padded."""
    T = max(len(s) for s in sentences)
    inputs = torch.zeros(len(sentences), T, dtype=torch.long)
    targets = torch.zeros_like(inputs)
    mask = torch.zeros_like(inputs, dtype=torch.bool)
    for b, s in enumerate(sentences):
        targets[b, : len(s)] = torch.tensor(s)
        inputs[b, 1 : len(s)] = torch.tensor(s[:-1])
        mask[b, : len(s)] = True
    resets = torch.zeros_like(mask)
    resets[:, 0] = True
    return Batch(inputs, targets, mask, resets)


SENTS = [[3, 4, 5, 6, 7, 2, 0], [8, 9, 0], [5, 5, 5, 5, 5, 5, 5, 5, 5, 11, 0]]


def test_prefix_is_the_reversed_code_then_the_separator():
    model = _dae()
    dense = torch.arange(2 * 3 * 16, dtype=torch.float32).view(2, 3, 16)
    m = torch.tensor([[True, True, True], [True, False, False]])
    x, resets = model._prefixed(dense, m, torch.zeros(2, 4, 16))
    assert torch.equal(x[0, :3], dense[0].flip(0))  # c_2 c_1 c_0
    assert torch.equal(x[1, 2], dense[1, 0]) and torch.equal(x[0, 3], model.sep.detach())
    assert resets[:, :4].tolist() == [[True, False, False, False], [False, False, True, False]]


@pytest.mark.parametrize("positions", ["segment", "fixed"])
def test_batched_rows_score_as_alone(positions):
    model = _dae(code_positions=positions)
    with torch.no_grad():
        together = model.score(_rows(SENTS))
        for b, s in enumerate(SENTS):
            assert torch.allclose(model.score(_rows([s]))[0], together[b, : len(s)], atol=1e-5)


@pytest.mark.parametrize("peek", [True, False])
def test_the_code_matters_only_when_the_model_peeks(peek):
    model = _dae(peek=peek)
    batch = _rows(SENTS)
    with torch.no_grad():
        before = model.score(batch)
        model.code.bottleneck.proj.weight.add_(torch.randn_like(model.code.bottleneck.proj.weight))
        after = model.score(batch)
    assert torch.allclose(before, after, atol=1e-6) != peek


@pytest.mark.parametrize(("bottleneck", "positions", "peek"), [
    ("semhash", "segment", True), ("gumbel", "segment", True), ("semhash", "fixed", True), ("semhash", "fixed", False)])
def test_decoding_from_a_code_gives_the_scores_of_the_sentence_with_that_code(bottleneck, positions, peek):
    """step() from start_state(c(s)) through s == score(s): the cache path equals the full forward pass."""
    model = _dae(bottleneck=bottleneck, code_positions=positions, peek=peek)
    s = SENTS[0]
    batch = _rows([s])
    with torch.no_grad():
        _, symbols, _ = model.encode(batch)
        state = model.start_state(symbols)
        tok, out = torch.tensor([0]), []
        for w in s:
            logp, state = model.step(tok, state)
            out.append(logp[0, w])
            tok = torch.tensor([w])
        assert torch.allclose(torch.stack(out), model.score(batch)[0], atol=1e-5)


def test_fixed_positions_put_the_separator_at_one_place_whatever_the_code_length():
    model = _dae(code_positions="fixed")
    for m in (1, 2, 5):
        x = torch.zeros(2, m + 1 + 4, 16)  # [m symbols, separator, 4 tokens]
        pos = model._positions(x, m)
        assert pos[:, m].tolist() == [model.fixed_start] * 2 and int(pos.min()) >= 0
        assert pos[0, m + 1 :].tolist() == list(range(model.fixed_start + 1, model.fixed_start + 5))
    assert _dae()._positions(torch.zeros(1, 3, 16), 1) is None  # the default: each segment's own positions


def test_training_adds_the_latent_models_loss_on_detached_symbols():
    model = _dae(latent_share=0.5).train()  # 2 of the 3 rows
    batch = _rows(SENTS)
    logp, _, loss = model(batch)
    assert torch.allclose(loss[:, 1:], -logp[:, 1:]) and bool((loss[:2, 0] > -logp[:2, 0]).all())
    assert loss[2, 0] == -logp[2, 0]
    loss.sum().backward()
    assert model.latent.embed.weight.grad is not None


def test_a_sentence_longer_than_the_context_trains_and_scores():
    """GCIDE holds a 1,204-word sentence: its code outgrows the latent model's context (context / K + 2
    symbols), whose windows must slide as the sequence model's do, in training and in scoring."""
    model = _dae().train()  # context 64, K = 4: the latent model reads 18 positions at a time
    long = [3 + i % 9 for i in range(99)] + [0]  # 25 symbols, 126 positions with the separator
    logp, _, loss = model(_rows([long, SENTS[0]]))  # the latent model learns from the first row only
    assert bool(torch.isfinite(loss).all()) and loss[0, 0] > -logp[0, 0] and loss[1, 0] == -logp[1, 0]
    loss.sum().backward()
    assert model.latent.embed.weight.grad is not None
    with torch.no_grad():
        alone, together = model.eval().score(_rows([long])), model.score(_rows([long, SENTS[0]]))
    assert bool(torch.isfinite(alone).all()) and torch.allclose(together[0], alone[0], atol=1e-5)


def test_dsae_formula_and_caveat():
    assert dsae_value(32.0, 8.0, 16, 8) == pytest.approx(1.0)  # the paper's example: 5 bits -> 3 bits with 2 bits
    r = dsae_report(100.0, 60.0, 16, 8)
    assert r["dsae"] == pytest.approx(8 * (math.log(100) - math.log(60)) / (16 * math.log(2)))
    assert "caveat" not in r
    assert "over-capacitated" in dsae_report(3.0, 2.0, 16, 8)["caveat"]  # 2 bits > log2 3


def _tiny(corpus, out, *extra):
    flags = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--threads", "1", "--max-epochs",
             "1", "--batch-size", "8", "--seq-len", "32"]
    return main(["train", "--data", str(corpus), "--out", str(out), *flags, *extra])


def test_code_usage_counts_symbols_like_encoding_each_sentence_alone():
    from seqlm.data.corpus import encode_sentences
    from seqlm.eval.dsae import code_usage

    model = _dae()
    words = [[f"w{i - 2}" for i in s[:-1]] for s in SENTS]  # ids 2.. are w0..
    stream = encode_sentences(words, model.vocab)
    with torch.no_grad():
        alone = [model.encode(_rows([s]))[1][0].tolist() for s in SENTS]  # one row each
    flat = [x for row in alone for x in row]
    u = code_usage(model, stream)
    assert (u["symbols"], u["distinct_symbols"]) == (len(flat), len(set(flat)))
    probs = [flat.count(x) / len(flat) for x in set(flat)]
    assert u["entropy_bits"] == pytest.approx(-sum(q * math.log2(q) for q in probs))
    with torch.no_grad():  # a code pinned by its bias: one symbol, every bit constant, zero entropy
        model.code.bottleneck.proj.weight.zero_()
        model.code.bottleneck.proj.bias.fill_(-3.0)
    u = code_usage(model, stream)
    assert (u["distinct_symbols"], u["constant_bits"], u["entropy_bits"]) == (1, 6, 0.0)


def test_cli_dae_train_eval_dsae_generate(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c", n_train=120, n_eval=15)
    small = ["--k", "1", "--bits", "4", "--filter-size", "16", "--latent-d-model", "32", "--pretrain-steps", "3",
             "--context", "64"]
    assert _tiny(corpus, tmp_path / "dae", "--model", "dae", *small) == 0
    assert _tiny(corpus, tmp_path / "blind", "--model", "dae", *small, "--peek", "false") == 0
    assert _tiny(corpus, tmp_path / "tf", "--model", "transformer", "--context", "32") == 0
    capsys.readouterr()
    ppl = {}
    for name in ("dae", "blind", "tf"):
        peek = ["--allow-peek"] if name == "dae" else []
        assert main(["eval", str(tmp_path / name), "--data", str(corpus), *peek]) == 0
        ppl[name] = json.loads(capsys.readouterr().out)["ppl"]
    assert main(["dsae", str(tmp_path / "tf"), str(tmp_path / "dae"), "--data", str(corpus)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["bits"], r["K"]) == (4, 2)
    assert r["p"] == pytest.approx(ppl["tf"]) and r["p_prime"] == pytest.approx(ppl["dae"])
    assert r["dsae"] == pytest.approx((math.log2(ppl["tf"]) - math.log2(ppl["dae"])) / 2)
    code = r["code"]  # the code's usage: one symbol per K = 2 tokens of each sentence (with its </s>)
    lines = (corpus / "test.txt").read_text().splitlines()
    assert code["symbols"] == sum(math.ceil((len(s.split()) + 1) / 2) for s in lines)
    assert 1 <= code["distinct_symbols"] <= 16
    assert 0.0 <= code["entropy_bits"] <= math.log2(code["distinct_symbols"]) + 1e-9
    assert len(code["bit_on_rate"]) == 4 and 0 <= code["constant_bits"] <= 4
    assert "dsae_excl_oov" not in r  # every test word is in the vocabulary
    # words outside the vocabulary: DSAE again over the in-vocabulary tokens, from `seqlm eval`'s ppl_excl_oov
    oov_text = tmp_path / "oov.txt"
    oov_text.write_text("".join(f"{line.split()[0]} qqq {line}\n" for line in lines[:8]), encoding="utf-8")
    excl = {}
    for name in ("dae", "tf"):
        assert main(["eval", str(tmp_path / name), "--text", str(oov_text), "--allow-peek"]) == 0
        excl[name] = json.loads(capsys.readouterr().out)["ppl_excl_oov"]
    assert main(["dsae", str(tmp_path / "tf"), str(tmp_path / "dae"), "--text", str(oov_text)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["oov"] == 8 and r["p_excl_oov"] == pytest.approx(excl["tf"])
    assert r["dsae_excl_oov"] == pytest.approx((math.log2(excl["tf"]) - math.log2(excl["dae"])) / 2)
    # the equal-capacity baseline is a dae model too; swapped, or a DAE that does not peek: refused, one line
    assert main(["dsae", str(tmp_path / "blind"), str(tmp_path / "dae"), "--data", str(corpus)]) == 0
    capsys.readouterr()
    for base, dae, why in (("dae", "blind", "swapped"), ("dae", "tf", "swapped"), ("tf", "tf", "not a dae model"),
                           ("blind", "blind", "--peek false"), ("tf", "blind", "--peek false")):
        assert main(["dsae", str(tmp_path / base), str(tmp_path / dae), "--data", str(corpus)]) == 2
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1, (base, dae, err)
    assert main(["generate", str(tmp_path / "dae"), "--num", "3", "--max-len", "12"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert main(["generate", str(tmp_path / "dae"), "--latent", "3,1,15", "--beam", "3", "--num", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["generate", str(tmp_path / "dae"), "--latent", "3,16"]) == 2
    assert "--latent symbols" in capsys.readouterr().err


def test_data_parallel_training_through_the_side_path(tmp_path):
    """`--nproc 2`: every parameter must take part in every step, also while c(s) bypasses the bottleneck."""
    from conftest import seqlm_cli

    corpus = write_corpus(tmp_path / "c", n_train=60, n_eval=8)
    r = seqlm_cli("train", "--model", "dae", "--data", corpus, "--out", tmp_path / "d", "--nproc", "2",
                  "--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--k", "1", "--bits", "4",
                  "--filter-size", "16", "--latent-d-model", "32", "--batch-size", "4", "--seq-len", "16",
                  "--pretrain-steps", "1000", "--threads", "1", "--max-epochs", "1", SEQLM_CACHE=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["family"] == "dae"


def test_generate_latent_refuses_a_code_longer_than_the_fixed_start(tmp_path, capsys):
    """--code-positions fixed: c(s) sits just before the separator's fixed position, so a longer code would put
    positions below 0 (into the learned table from its end): refused, one line, exit 2."""
    corpus = write_corpus(tmp_path / "c", n_train=40, n_eval=5)
    small = ["--k", "1", "--bits", "4", "--filter-size", "16", "--latent-d-model", "16", "--pretrain-steps", "2",
             "--context", "32", "--code-positions", "fixed"]
    assert _tiny(corpus, tmp_path / "fixed", "--model", "dae", *small) == 0
    start = 32 // 2 + 1  # context // K + 1
    capsys.readouterr()
    fits = ",".join(["3"] * start)
    assert main(["generate", str(tmp_path / "fixed"), "--latent", fits, "--beam", "2", "--num", "1"]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "fixed"), "--latent", fits + ",3", "--num", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"at most {start} symbols" in err
