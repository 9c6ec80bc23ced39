"""`seqlm interpolate`: combine saved models into a mixture model directory.

rnnlm-extensions.txt ('Combination of models') interpolates RNNs, and RNNs with KN5, linearly with
equal weights. Given held-out text we estimate the weights by EM instead (the usual practice, e.g.
SRILM's compute-best-mix), and report every component's held-out perplexity next to the mixture's
so the gain is visible. All perplexities are on the mixture's vocabulary (the first component's).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seqlm import checkpoint as ckpt
from seqlm.errors import SeqlmError
from seqlm.eval.perplexity import text_logp
from seqlm.models.mixture import MixtureModel, fit_weights, mix_logp
from seqlm.protocol import encode_text


def parse_weights(text: str, k: int) -> list[float]:
    """'0.7,0.3' -> [0.7, 0.3]; one non-negative number per component, normalised to sum to 1."""
    try:
        w = [float(x) for x in text.split(",")]
    except ValueError:
        raise SeqlmError(f"--weights expects comma-separated numbers, got {text!r}") from None
    if len(w) != k:
        raise SeqlmError(f"--weights has {len(w)} numbers for {k} models; give one per model")
    if not all(math.isfinite(x) and x >= 0 for x in w) or sum(w) <= 0:
        raise SeqlmError(f"--weights must be non-negative with a positive sum, got {text!r}")
    return [x / sum(w) for x in w]


def _ppl(logp: np.ndarray) -> float:
    return math.exp(-float(logp.mean()))


def interpolate(model_paths: Sequence[str | Path], out: str | Path, valid: str | Path | None = None,
                weights: str | None = None, em: bool = False, stream: bool = False, raw: bool = False,
                max_tokens: int = 4096, sentence_only: Sequence[int] = ()) -> dict:
    """Build, save and describe a mixture; returns the JSON `seqlm interpolate` prints.

    Weights: `weights` as given, else EM on `valid` (the default when there is a valid text), else
    equal (the paper's choice). `stream` scores the valid text with every component that can carry
    state across sentences in that mode and with the others sentence by sentence; components listed in
    `sentence_only` (0-based) score sentence by sentence regardless (a Transformer trained on sentences).
    """
    import seqlm

    out = Path(out)
    if (out / ckpt.CONFIG).exists():
        raise SeqlmError(f"{out} already holds a model; choose another --out")
    if em and valid is None:
        raise SeqlmError("--em estimates the weights on held-out text: give --text FILE or --data CORPUS "
                         "(--split valid)")
    for flag, given in (("--stream", stream), ("--raw", raw)):
        if given and valid is None:  # they say how the held-out text is read; the mixture keeps neither
            raise SeqlmError(f"{flag} says how to read the held-out text, and there is none: give --text FILE or "
                             f"--data CORPUS (--split valid), or drop {flag}")
    k = len(model_paths)
    if k == 0:
        raise SeqlmError("give at least one model directory (or .arpa file) to interpolate")
    given = parse_weights(weights, k) if weights is not None else None
    components = [seqlm.load(p) for p in model_paths]
    mixture = MixtureModel(components, given or [1.0 / k] * k, model_paths, sentence_only)
    result: dict = {"out": str(out), "components": [str(p) for p in model_paths]}
    source = "given" if given else "equal"
    if valid is not None:
        can = mixture.capabilities().stream
        if stream and not can:
            print("seqlm: no component can carry state across sentences (n-gram, feed-forward, --sentence-independent "
                  "and other sentence-trained models cannot); scoring sentence by sentence", file=sys.stderr)
        stream_mode = stream and can
        text = encode_text(mixture, valid, raw=raw or None)  # the components' own reading of text
        per_component = mixture.component_logp(text, stream_mode, max_tokens, text_logp)  # (K, N)
        if given is None:
            # EM creeps when the optimum is on the simplex's edge (one model almost useless); an iteration
            # costs K*N flops, so give it room to get there: `tol` ends it as soon as nothing moves.
            mixture.set_weights(fit_weights(per_component, iters=1000).tolist())
            source = "em"
        result.update({
            "mode": "stream" if stream_mode else "sentence",
            "valid_tokens": int(per_component.shape[1]),
            "component_valid_ppl": [_ppl(row) for row in per_component],
            "valid_ppl": _ppl(mix_logp(per_component, mixture.weights)),
        })
    result["weights"] = mixture.weights.tolist()
    result["weights_from"] = source
    seqlm.save(mixture, out)
    return result
