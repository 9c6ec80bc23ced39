"""Discrete sequence autoencoding efficiency (discrete-autoencoders.txt, Sec. 3):

    DSAE = (log2 p - log2 p') / (b / K) = K (ln p - ln p') / (b ln 2)

p: the per-token perplexity of a baseline LM, p': that of the model that peeks at c(s) (b bits a symbol, one
symbol per K tokens, so c(s) carries b / K bits per token). DSAE is the share of those bits the model uses.
"""

from __future__ import annotations

import math
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


def dsae_from_dirs(baseline: str | Path, dae: str | Path, data: str | None, text: str | None, split: str) -> dict:
    """`seqlm dsae BASELINE DAE`: both models scored on the same text, sentence by sentence."""
    import seqlm
    from seqlm.data.corpus import encode_file
    from seqlm.data.datasets import resolve_corpus, split_path
    from seqlm.eval.perplexity import evaluate

    base, model = seqlm.load(baseline), seqlm.load(dae)
    if getattr(model, "family", None) != "dae":
        raise SeqlmError(f"{dae}: not a dae model (it is {getattr(model, 'family', '?')}); give BASELINE then DAE")
    unit = model.data_config.unit
    if base.vocab != model.vocab or getattr(base.data_config, "unit", "word") != unit:
        raise SeqlmError("the two models have different vocabularies or units: per-token perplexities would not "
                         "be comparable; train both on the same corpus with the same --unit")
    if not (data or text) or (data and text):
        raise SeqlmError("give the text: --data CORPUS (with --split) or --text FILE")
    path = Path(text) if text else split_path(resolve_corpus(data), split)
    stream = encode_file(path, model.vocab, unit=unit)
    p, p_prime = evaluate(base, stream)["ppl"], evaluate(model, stream)["ppl"]
    return dsae_report(p, p_prime, model.bits, model.code.K)
