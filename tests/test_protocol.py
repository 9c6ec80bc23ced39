"""Every neural family honours the LanguageModel protocol the same way (KN has its own tests)."""

from __future__ import annotations

import math

import pytest
import torch

from seqlm.config import apply_overrides
from seqlm.data.batching import sentence_batches
from seqlm.data.corpus import encode_sentences
from seqlm.data.vocab import EOS, UNK, Vocab
from seqlm.eval.perplexity import evaluate, score_tokens
from seqlm.protocol import LanguageModel
from seqlm.registry import FAMILIES, MixtureFamily, NeuralFamily, new_model

WORDS = [EOS, UNK] + [f"w{i}" for i in range(20)]
SENTS = [["w1", "w2", "w3", "w4", "w5", "w6", "w7"], ["w3"], ["w9", "w1", "w19", "w4"], ["w2"] * 11]
VARIANTS = {
    "fnn": {"order": 3},
    "fofe": {"order": 2, "alpha": 0.5},
    "rnn": {"output": "class", "classes": 4},
    "rnn-full": {"output": "full", "activation": "tanh"},
}


def make(variant: str, **extra):
    torch.manual_seed(0)
    name = variant.split("-")[0]
    vocab = Vocab(WORDS, [0, 0] + [30 - i for i in range(20)])
    cfg = FAMILIES[name].config()
    apply_overrides([cfg], {"hidden": 12, "embed": 6, **VARIANTS[variant], **extra})
    model = new_model(name, cfg, vocab).double()
    model.eval()
    return model


@pytest.mark.parametrize("variant", VARIANTS)
def test_step_distributions_sum_to_one(variant):
    model = make(variant)
    assert isinstance(model, LanguageModel)
    state = model.initial_state(3)
    tokens = torch.full((3,), model.vocab.bos_id)
    for nxt in ([2, 3, 4], [5, 5, 5]):
        logp, state = model.step(tokens, state)  # (3, V)
        assert torch.allclose(logp.exp().sum(-1), torch.ones(3, dtype=logp.dtype), atol=1e-6)
        tokens = torch.tensor(nxt)


@pytest.mark.parametrize("variant", VARIANTS)
def test_incremental_scoring_equals_whole_sentence_scoring(variant):
    model = make(variant)
    stream = encode_sentences(SENTS, model.vocab)
    whole = score_tokens(model, stream).logp
    manual = []
    with torch.no_grad():
        for i in range(stream.num_sentences):
            state, tok = model.initial_state(1), torch.tensor([model.vocab.bos_id])
            for t in stream.sentence(i).tolist():
                logp, state = model.step(tok, state)
                manual.append(float(logp[0, t]))
                tok = torch.tensor([t])
    assert whole.tolist() == pytest.approx(manual, abs=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_batched_equals_one_sentence_at_a_time(variant):
    model = make(variant)
    stream = encode_sentences(SENTS, model.vocab)
    together = score_tokens(model, stream, max_tokens=10_000).logp
    alone = [score_tokens(model, encode_sentences([s], model.vocab)).logp for s in SENTS]
    assert together.tolist() == pytest.approx([x for a in alone for x in a.tolist()], abs=1e-9)


@pytest.mark.parametrize("variant", ["fnn", "fofe"])
def test_long_sentences_split_into_pieces_score_the_same(variant):
    model = make(variant)
    stream = encode_sentences(SENTS, model.vocab)
    whole = score_tokens(model, stream).logp
    pieces = []
    with torch.no_grad():
        for rows in sentence_batches(stream, model.vocab.bos_id, max_tokens=64, max_len=3, context=60):
            pieces.append(model.score(rows.batch).sum())
    assert float(sum(pieces)) == pytest.approx(float(whole.sum()), abs=1e-6)


def test_stream_mode_carries_state_across_sentences():
    model = make("rnn")
    stream = encode_sentences(SENTS, model.vocab)
    independent = score_tokens(model, stream).logp
    carried = score_tokens(model, stream, stream_mode=True).logp
    n0 = len(SENTS[0]) + 1
    assert carried[:n0].tolist() == pytest.approx(independent[:n0].tolist(), abs=1e-9)  # same first sentence
    assert abs(carried[n0:].sum() - independent[n0:].sum()) > 1e-6  # then the history differs


def _step_by_step(model, stream, carry: bool) -> list[float]:
    """ln p of every token by `step`, one token at a time: the reference for both scoring modes.

    carry=False: a fresh state and <s> at every sentence. carry=True: one state over the whole text,
    which reads each </s> as the next sentence's context (rnnlm's stream).
    """
    out = []
    state, tok = model.initial_state(1), torch.tensor([model.vocab.bos_id])
    with torch.no_grad():
        for i in range(stream.num_sentences):
            if not carry:
                state, tok = model.initial_state(1), torch.tensor([model.vocab.bos_id])
            for t in stream.sentence(i).tolist():
                logp, state = model.step(tok, state)  # (1, V)
                out.append(float(logp[0, t]))
                tok = torch.tensor([t])
    return out


@pytest.mark.parametrize("max_tokens", [4, 4096])  # 4: chunk edges fall inside sentences
def test_stream_mode_equals_one_state_carried_token_by_token(max_tokens):
    model = make("rnn")
    stream = encode_sentences(SENTS, model.vocab)
    carried = score_tokens(model, stream, stream_mode=True, max_tokens=max_tokens).logp
    assert carried.tolist() == pytest.approx(_step_by_step(model, stream, carry=True), abs=1e-9)


@pytest.mark.parametrize("max_tokens", [4, 4096])
def test_a_sentence_independent_rnn_is_scored_sentence_by_sentence_in_both_modes(max_tokens, capsys):
    model = make("rnn", sentence_independent=True)
    stream = encode_sentences(SENTS, model.vocab)
    reference = _step_by_step(model, stream, carry=False)
    for stream_mode in (False, True):
        r = evaluate(model, stream, stream_mode=stream_mode, max_tokens=max_tokens)
        assert r["mode"] == "sentence"
        assert r["log10prob"] == pytest.approx(sum(reference) / math.log(10), abs=1e-9)
        logp = score_tokens(model, stream, stream_mode=stream_mode, max_tokens=max_tokens).logp
        assert logp.tolist() == pytest.approx(reference, abs=1e-9)
    assert "--sentence-independent" in capsys.readouterr().err  # --stream said what it did instead


def test_oov_is_every_token_scored_as_unk_literal_or_unseen():
    """The one OOV definition (KenLM's): a word outside the vocabulary and a literal <unk> both count."""
    model = make("fnn")
    stream = encode_sentences([["w1", "<unk>", "zebra", "w2"], ["giraffe"]], model.vocab)
    r = evaluate(model, stream)
    logp = score_tokens(model, stream).logp  # (7,) w1 <unk> zebra w2 </s> giraffe </s>
    inside = [0, 3, 4, 6]  # by hand: the positions of w1, w2 and the two </s>
    assert r["oov"] == 3 and r["tokens"] == 7
    assert r["ppl_excl_oov"] == pytest.approx(math.exp(-logp[inside].sum() / len(inside)), rel=1e-12)
    assert r["ppl"] == pytest.approx(math.exp(-logp.sum() / 7), rel=1e-12)


def test_registry_matches_cli_choices():
    from seqlm.cli import build_parser

    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    model_action = next(a for a in train._actions if a.dest == "model")
    trainable = [n for n, f in FAMILIES.items() if not isinstance(f, MixtureFamily)]
    assert model_action.metavar == "{" + ",".join(trainable) + "}" and "mix" not in model_action.metavar
    for name in FAMILIES:  # every family parses (mix too: training it says how mixtures are built)
        assert model_action.type(name) == name
    for name, fam in FAMILIES.items():
        cfg = fam.config()
        assert fam.summary and cfg is not None, name
        if isinstance(fam, NeuralFamily):  # model keys never shadow training keys
            from dataclasses import fields

            model_keys = {f.name for f in fields(cfg)} - {"train"}
            assert not model_keys & {f.name for f in fields(cfg.train)}, name
