"""`seqlm interpolate`: combine saved models into a mixture model directory.

rnnlm-extensions.txt ('Combination of models') interpolates RNNs, and RNNs with KN5, linearly with
equal weights. Given held-out text we estimate the weights by EM instead (the usual practice, e.g.
SRILM's compute-best-mix), and report every component's held-out perplexity next to the mixture's
so the gain is visible. All perplexities are on the mixture's vocabulary (the first component's).

With --arpa-out the n-gram components are merged into one back-off model instead (seqlm.ngram.merge, SRILM's
`ngram -mix-lm ... -write-lm`), over the union of their vocabularies: the tool for models trained with
different vocabularies, which a dynamic mixture refuses.
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
    _check_heldout(valid, em, stream, raw)
    k = len(model_paths)
    if k == 0:
        raise SeqlmError("give at least one model directory (or .arpa file) to interpolate")
    given = parse_weights(weights, k) if weights is not None else None
    components = [seqlm.load(p) for p in model_paths]
    _refuse_vocab_union(components, model_paths)
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


def _check_heldout(valid, em: bool, stream: bool, raw: bool) -> None:
    if em and valid is None:
        raise SeqlmError("--em estimates the weights on held-out text: give --text FILE or --data CORPUS "
                         "(--split valid)")
    for flag, given in (("--stream", stream), ("--raw", raw)):
        if given and valid is None:  # they say how the held-out text is read; the mixture keeps neither
            raise SeqlmError(f"{flag} says how to read the held-out text, and there is none: give --text FILE or "
                             f"--data CORPUS (--split valid), or drop {flag}")


def _refuse_vocab_union(components: list, paths: Sequence[str | Path]) -> None:
    """A dynamic mixture needs one vocabulary (protocol.check_same_text); n-gram models with different ones can
    still be merged into one back-off model: say so where that applies."""
    from seqlm.ngram.model import NGramModel

    words = [set(c.vocab.itos) - {"<s>"} for c in components]
    if all(isinstance(c, NGramModel) for c in components) and any(w != words[0] for w in words):
        other, differ = next((p, w ^ words[0]) for p, w in zip(paths, words, strict=True) if w != words[0])
        raise SeqlmError(f"{paths[0]} and {other} have different vocabularies ({len(differ)} words in one only, e.g. "
                         f"{sorted(differ)[:3]}): a dynamic mixture (--out DIR) needs one vocabulary; --arpa-out FILE "
                         "instead merges n-gram models into one back-off model over the union of theirs "
                         "(docs/ngram.md)")


def interpolate_arpa(model_paths: Sequence[str | Path], arpa_out: str | Path, valid: str | Path | None = None,
                     weights: str | None = None, em: bool = False, stream: bool = False, raw: bool = False) -> dict:
    """`seqlm interpolate ... --arpa-out FILE`: merge n-gram models into one back-off ARPA model (ngram/merge.py)
    and return the JSON to print. Weights as `interpolate` chooses them, EM scoring each held-out token by the
    merge's rule (a component gives a word it lacks 0); the held-out perplexities printed are each component's
    alone, that dynamic mixture's (`dynamic_valid_ppl`) and the merged model's (`valid_ppl`), all on the union
    vocabulary's reading of the text."""
    from seqlm.ngram.merge import check_components, merge

    _check_heldout(valid, em, stream, raw)
    if stream:
        raise SeqlmError("--stream: n-gram models score each sentence from its start; drop --stream for --arpa-out")
    if len(model_paths) < 2:
        raise SeqlmError("--arpa-out merges two or more n-gram models; give at least two")
    given = parse_weights(weights, len(model_paths)) if weights is not None else None
    if given is not None and min(given) == 0:
        raise SeqlmError("--weights: a weight of 0 leaves the words only that model knows with probability 0 in "
                         "the merged model; leave that model out instead")
    components = [_load_ngram(p) for p in model_paths]
    check_components(components, [str(p) for p in model_paths])
    equal = [1.0 / len(components)] * len(components)
    held = _heldout(components, valid, raw) if valid is not None else None
    lam = given or (fit_weights(held[1], iters=1000).tolist() if held is not None else equal)
    merged = merge(components, lam)
    merged.model.to_arpa(arpa_out)
    result = {"arpa_out": str(arpa_out), "components": [str(p) for p in model_paths], "order": merged.model.order,
              "vocab_size": len(merged.model.vocab), "ngrams": merged.model.sizes, "weights": list(lam),
              "weights_from": "given" if given else "em" if held is not None else "equal"}
    return result | (_heldout_report(merged, held, lam) if held is not None else {})


def _load_ngram(path: str | Path):
    """seqlm.load for an n-gram model; another family's directory is refused before its weights are read."""
    import seqlm

    config = Path(path) / ckpt.CONFIG
    family = ckpt.read_json(config, "config.json").get("family") if config.is_file() else "kn"
    if family != "kn":
        raise SeqlmError(f"{path} is a {family} model: --arpa-out merges n-gram models (kn directories, ARPA or "
                         "seqlm binary files); use --out DIR for a dynamic mixture of any models")
    return seqlm.load(path)


def _heldout(components: list, valid: str | Path, raw: bool) -> tuple:
    """The held-out text read with the union vocabulary, each component's ln p of it alone (K, N), and
    (K, N) ln p by the merge's rule (-inf where a component lacks the predicted word)."""
    from seqlm.data.corpus import encode_file
    from seqlm.ngram.merge import heldout_log10, union_vocab
    from seqlm.ngram.model import LN10
    from seqlm.protocol import require

    spec = require(components[0], raw=raw or None)
    vocab, tables = union_vocab(components)
    stream = encode_file(valid, vocab, spec.raw, unit=spec.unit)
    alone, has = heldout_log10(components, tables, stream)
    return stream, np.where(has, alone * LN10, -np.inf), alone * LN10


def _heldout_report(merged, held: tuple, lam: list[float]) -> dict:
    from seqlm.ngram.model import LN10
    from seqlm.ngram.query import NGramQuery

    stream, by_rule, alone = held
    static = NGramQuery(merged.model).score_corpus(stream).log10_prob * LN10
    return {"valid_tokens": int(len(static)), "component_valid_ppl": [_ppl(row) for row in alone],
            "dynamic_valid_ppl": _ppl(mix_logp(by_rule, np.asarray(lam))), "valid_ppl": _ppl(static)}
