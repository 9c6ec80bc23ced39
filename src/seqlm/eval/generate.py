"""Generating sentences from any LanguageModel through its `initial_state` / `step` methods: ancestral
sampling, and beam search.

Beam search reorders the rows of a model's state as hypotheses are kept or dropped, through the
protocol's `select_state` (whatever the family's state layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from seqlm.data.tokenizers import units_of
from seqlm.errors import SeqlmError
from seqlm.eval.perplexity import model_device
from seqlm.protocol import LanguageModel, State, select_state


def _check(num: int, max_len: int, temperature: float = 1.0) -> None:
    if num < 1 or max_len < 1:
        raise SeqlmError("--num, --beam and --max-len must be at least 1")
    if temperature <= 0:
        raise SeqlmError(f"--temperature must be positive, got {temperature}")


@torch.no_grad()
def sample(model: LanguageModel, num: int, seed: int = 0, temperature: float = 1.0,
           max_len: int = 100) -> list[list[str]]:
    """Draw `num` sentences in parallel; each ends at `</s>` (not shown) or after `max_len` tokens."""
    _check(num, max_len, temperature)
    ids = sample_ids(model, num, torch.Generator().manual_seed(seed), temperature, max_len)
    return [model.vocab.decode(s) for s in ids]


@torch.no_grad()
def sample_ids(model: LanguageModel, num: int, gen: torch.Generator, temperature: float = 1.0, max_len: int = 100,
               start: tuple[Tensor, State] | None = None) -> list[list[int]]:
    """Token ids of `num` samples; `start` = (log-probs (num, V), state) after some prefix, else a sentence start."""
    if isinstance(model, torch.nn.Module):
        model.eval()
    vocab = model.vocab
    device = model_device(model)
    logp, state = start or model.step(torch.full((num,), vocab.bos_id, dtype=torch.long, device=device),
                                      model.initial_state(num))
    out: list[list[int]] = [[] for _ in range(num)]
    done = torch.zeros(num, dtype=torch.bool)
    for _ in range(max_len):
        logits = logp.float().cpu() / temperature  # (num, V)
        if vocab.bos_id != vocab.eos_id:
            logits[:, vocab.bos_id] = -torch.inf  # <s> is context only
        nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen).squeeze(1)  # (num,)
        for i in range(num):
            if not done[i]:
                if int(nxt[i]) == vocab.eos_id:
                    done[i] = True
                else:
                    out[i].append(int(nxt[i]))
        if bool(done.all()):
            break
        logp, state = model.step(nxt.to(device), state)
    return out


@dataclass
class Hypothesis:
    ids: list[int]  # the tokens, `</s>` not included
    logp: float  # natural-log probability, `</s>` included when finished


@torch.no_grad()
def beam_search(model: LanguageModel, beam: int, max_len: int = 100,
                start: tuple[Tensor, State] | None = None) -> list[Hypothesis]:
    """The `beam` most probable sentences found, best first (probability of the words and `</s>`).

    `start` = (log-probs (1, V), state) after some prefix, else a sentence start. Search stops when the best
    finished sentence is more probable than every live hypothesis (scores only fall as words are added),
    or after `max_len` tokens (hypotheses still open are returned unfinished, after the finished ones).
    """
    _check(beam, max_len)
    if isinstance(model, torch.nn.Module):
        model.eval()
    vocab, device = model.vocab, model_device(model)
    logp, state = start or model.step(torch.tensor([vocab.bos_id], device=device), model.initial_state(1))
    live = [Hypothesis([], 0.0)]
    done: list[Hypothesis] = []
    for _ in range(max_len):
        scores = logp.double().cpu() + torch.tensor([h.logp for h in live], dtype=torch.float64).unsqueeze(1)
        if vocab.bos_id != vocab.eos_id:
            scores[:, vocab.bos_id] = -torch.inf
        top, flat = scores.flatten().topk(min(2 * beam, scores.numel()))  # (2k,) enough to keep k live
        rows, keep = [], []
        for s, f in zip(top.tolist(), flat.tolist(), strict=True):
            r, w = divmod(f, scores.shape[1])
            if w == vocab.eos_id:
                done.append(Hypothesis(live[r].ids, s))
            elif len(keep) < beam:
                rows.append(r)
                keep.append(Hypothesis(live[r].ids + [w], s))
        done.sort(key=lambda h: -h.logp)
        if not keep or (len(done) >= beam and done[beam - 1].logp >= keep[0].logp):
            break
        live = keep
        rows_t = torch.tensor(rows)
        logp, state = model.step(torch.tensor([h.ids[-1] for h in live], device=device),
                                 select_state(model, state, rows_t))
    else:
        done += live
    return sorted(done, key=lambda h: -h.logp)[:beam] if done else live


def detokenize(tokens: list[str], unit: Any = "word") -> str:
    """Tokens as text: words joined by spaces, characters joined with `_` read as a space, or pieces joined by
    their tokenizer's decode (a seqlm.data.tokenizers.Tokenizer as `unit`)."""
    if not isinstance(unit, str):
        return unit.decode(tokens)
    return " ".join(tokens) if unit == "word" else "".join(tokens).replace("_", " ")


def run_generate(args: Any) -> list[str]:
    """`seqlm generate`: sampled sentences, or with --beam N the best min(--num, N) of a beam search."""
    import seqlm

    model = seqlm.load(args.model_dir)
    lines = model.generate_lines(args)  # a model that needs more than a sentence start (dae: c(s) first)
    if lines is not None:
        return lines
    if args.latent:
        raise SeqlmError(f"--latent: a {model.family} model has no latent code to decode from (only a dae model "
                         "has one); drop --latent")
    if args.beam:
        why = "--beam searches for the most probable sentences, nothing is sampled"
        _unused("--temperature", args.temperature, 1.0, why)
        _unused("--seed", args.seed, 0, why)
    unit = units_of(model.text_spec())
    if args.beam:
        hyps = beam_search(model, args.beam, args.max_len)[: args.num]
        return [detokenize(model.vocab.decode(h.ids), unit) for h in hyps]
    return [detokenize(s, unit) for s in sample(model, args.num, args.seed, args.temperature, args.max_len)]


def _unused(option: str, value: float, neutral: float, why: str) -> None:
    """Refuse an option whose value would change nothing here (`why`): a user who set it expects it to."""
    if value != neutral:
        raise SeqlmError(f"{option} {value:g} has no effect: {why}; drop {option}")


def _parse_code(text: str, bits: int) -> list[int]:
    try:
        code = [int(x) for x in text.split(",")]
    except ValueError:
        raise SeqlmError(f"--latent expects comma-separated integers, got {text!r}") from None
    if not code or not all(0 <= c < 2**bits for c in code):
        raise SeqlmError(f"--latent symbols must be integers in [0, {2**bits}) (b = {bits} bits)")
    return code


@torch.no_grad()
def decode_code(model: Any, code: list[int], beam: int, max_len: int) -> list[Hypothesis]:
    """Beam search for s given the latent symbols c(s) (a dae model)."""
    device = model_device(model)
    state = model.start_state(torch.tensor([code], device=device))
    room = model.lm.context - int(state[3].max()) - 1  # the prefix and the sentence share the positions
    if room < 1:
        raise SeqlmError(f"a code of {len(code)} symbols leaves no room for a sentence in the model's "
                         f"{model.lm.context} positions; give fewer --latent symbols")
    start = model.step(torch.tensor([model.vocab.bos_id], device=device), state)
    return beam_search(model, beam, min(max_len, room), start=start)


def run_dae_generate(model: Any, args: Any) -> list[str]:
    """dae: sample c(s) from the latent model and beam-decode s from each (one line per sample); or with
    --latent, the best min(--num, beam) sentences for that code. The beam is --beam, else 4."""
    _check(args.num, args.max_len)
    _unused("--temperature", args.temperature, 1.0,
            "a dae model samples its code at temperature 1 and beam-decodes the sentence from it")
    if args.latent:
        _unused("--seed", args.seed, 0, "--latent gives the code and a beam search decodes it, nothing is sampled")
    model.eval()
    unit = units_of(model.text_spec())
    beam = args.beam or 4
    if args.latent:
        hyps = decode_code(model, _parse_code(args.latent, model.bits), beam, args.max_len)[: args.num]
        return [detokenize(model.vocab.decode(h.ids), unit) for h in hyps]
    codes = model.sample_codes(args.num, torch.Generator().manual_seed(args.seed), model.latent.context - 1)
    return [detokenize(model.vocab.decode(decode_code(model, c, beam, args.max_len)[0].ids), unit) for c in codes]
