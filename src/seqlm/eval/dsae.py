"""Discrete sequence autoencoding efficiency (discrete-autoencoders.txt, Sec. 3):

    DSAE = (log2 p - log2 p') / (b / K) = K (ln p - ln p') / (b ln 2)

p: the per-token perplexity of a baseline LM, p': that of the model that peeks at c(s) (b bits a symbol, one
symbol per K tokens, so c(s) carries b / K bits per token). DSAE is the share of those bits the model uses.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from seqlm.errors import SeqlmError

CAVEAT = ("over-capacitated: c(s) can carry b/K = {cap:.3g} bits per token, more than the baseline's log2 p = "
          "{need:.3g}; DSAE = 1 is impossible even with perfect autoencoding, compare such figures with care")


def dsae_value(p: float, p_prime: float, bits: int, K: int) -> float:
    return (math.log2(p) - math.log2(p_prime)) / (bits / K)


def dsae_report(p: float, p_prime: float, bits: int, K: int) -> dict:
    """p, p', b, K, DSAE, and the paper's caveat when b / K exceeds log2 p."""
    out = {"p": p, "p_prime": p_prime, "bits": bits, "K": K, "code_bits_per_token": bits / K,
           "log2_p": math.log2(p), "log2_p_prime": math.log2(p_prime), "dsae": dsae_value(p, p_prime, bits, K)}
    if bits / K > math.log2(p):
        out["caveat"] = CAVEAT.format(cap=bits / K, need=math.log2(p))
    return out


def code_usage(model, stream) -> dict:
    """How much of its b bits a dae model's code uses on a text: distinct symbols, the symbols' empirical
    entropy (bits, at most min(b, log2 count)) and the bits that never (or always) fire. A collapsed code (a
    few distinct symbols, constant bits) explains a DSAE near 0 whatever the decoder."""
    import torch

    from seqlm.data.batching import sentence_batches
    from seqlm.nn.bottleneck import symbols_to_bits

    counts: Counter = Counter()
    was = model.training
    model.eval()
    with torch.no_grad():
        for rows in sentence_batches(stream, model.vocab.bos_id, max_tokens=4096):
            _, symbols, m = model.encode(rows.batch)  # (B, M), (B, M)
            counts.update(symbols[m].tolist())
    model.train(was)
    n = sum(counts.values())
    probs = [c / n for c in counts.values()]
    sym = torch.tensor(list(counts), dtype=torch.long)
    weight = torch.tensor(list(counts.values()), dtype=torch.float).unsqueeze(1)  # (distinct, 1)
    on = (symbols_to_bits(sym, model.bits) * weight).sum(0) / n  # (b,) share of symbols with bit i set
    return {"symbols": n, "distinct_symbols": len(counts), "entropy_bits": -sum(q * math.log2(q) for q in probs),
            "constant_bits": int(((on < 0.01) | (on > 0.99)).sum()), "bit_on_rate": [round(float(x), 4) for x in on]}


def _peeks(model) -> bool:
    return model.capabilities().peeks


def check_pair(base, model, baseline: str | Path, dae: str | Path) -> None:
    """DAE must peek at c(s) and BASELINE must not: swapped arguments (or a `--peek false` DAE) would print a
    DSAE of a pair the formula is not about (negative, or 0 by construction)."""
    if _peeks(base):
        raise SeqlmError(f"{baseline}: the BASELINE peeks at c(s) (a dae model with peek); the arguments look "
                         "swapped: give BASELINE (no peeking) then DAE")
    if model.family != "dae":
        raise SeqlmError(f"{dae}: not a dae model (it is {model.family}); give BASELINE then DAE")
    if not _peeks(model):
        raise SeqlmError(f"{dae}: this dae model was trained with --peek false, so it does not peek at c(s); "
                         "give it as BASELINE and a dae model with peek as DAE")


def dsae_from_dirs(baseline: str | Path, dae: str | Path, data: str | None, text: str | None, split: str) -> dict:
    """`seqlm dsae BASELINE DAE`: both models scored on the same text, sentence by sentence."""
    import seqlm
    from seqlm.data.datasets import resolve_corpus, split_path
    from seqlm.eval.perplexity import evaluate
    from seqlm.protocol import encode_text

    base, model = seqlm.load(baseline), seqlm.load(dae)
    check_pair(base, model, baseline, dae)
    if base.vocab != model.vocab or not base.text_spec().same_reading(model.text_spec()):
        raise SeqlmError("the two models have different vocabularies or units: per-token perplexities would not "
                         "be comparable; train both on the same corpus with the same --unit")
    if not (data or text) or (data and text):
        raise SeqlmError("give the text: --data CORPUS (with --split) or --text FILE")
    path = Path(text) if text else split_path(resolve_corpus(data), split)
    stream = encode_text(model, path)
    ev_base, ev_dae = evaluate(base, stream), evaluate(model, stream)
    out = dsae_report(ev_base["ppl"], ev_dae["ppl"], model.bits, model.code.K)
    if ev_base["oov"]:  # how much of the gain is on <unk>: the same formula over the in-vocabulary tokens alone
        out |= {"oov": ev_base["oov"], "tokens": ev_base["tokens"], "p_excl_oov": ev_base["ppl_excl_oov"],
                "p_prime_excl_oov": ev_dae["ppl_excl_oov"],
                "dsae_excl_oov": dsae_value(ev_base["ppl_excl_oov"], ev_dae["ppl_excl_oov"], model.bits, model.code.K)}
    return out | {"code": code_usage(model, stream)}
