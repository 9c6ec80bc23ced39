"""Dynamic evaluation (Mikolov et al. 2010, "dynamic" models; Krause et al. 2018): the model goes on
learning from the test text while it reads it.

The text is cut into segments. Each segment is scored by the weights as they are (the static scoring
code, without gradients), and only after that one plain SGD step on the segment's mean -ln p (lr
`--dynamic-lr`, from a second pass with gradients) updates them: no token is ever scored by weights that
have seen it. The second pass costs one more forward per segment and buys this: with lr 0 the scores are
the static ones, bit for bit, whatever kernels a family's layers choose with and without gradients.
The updates go to a copy of the model; the model passed in, and its directory on disk, never change.

- Stream mode (`eval --stream`): the text as one stream cut into segments of N tokens, the state carried
  from segment to segment exactly as static stream evaluation carries it between its chunks (which are
  4096 tokens: with N = 4096 and lr 0 the figures are the static ones, bit for bit).
- Sentence mode: segments of consecutive whole sentences holding at least N tokens, each sentence
  scored from a fresh start (with lr 0: static sentence evaluation, to rounding).

It applies to models with weights and a history that runs on (the recurrent families and the
Transformer: Capabilities.dynamic in seqlm.protocol); n-gram, cache and feed-forward models are refused. In a
mixture every such component learns from its own scores, as the RNNs of Mikolov's combinations do; the
other components score as usual and the mixture's weights stay fixed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from seqlm.data.batching import sentence_rows, stream_batches
from seqlm.data.corpus import TokenStream
from seqlm.errors import SeqlmError
from seqlm.eval.perplexity import score_tokens
from seqlm.models.mixture import mix_logp
from seqlm.protocol import Batch, Capabilities, LanguageModel, LMBase, TextSpec, model_device, require

DEFAULT_SEGMENT = 20  # tokens per segment (stream mode); sentence mode: whole sentences holding at least this many


def updatable(model: LanguageModel) -> bool:
    """A model dynamic evaluation applies to: it declares so (trainable weights, a history that runs on)."""
    return (model.capabilities().dynamic and isinstance(model, nn.Module)
            and any(p.requires_grad for p in model.parameters()))


def _segments(model: LanguageModel, stream: TokenStream, stream_mode: bool,
              segment: int) -> Iterator[tuple[Batch, int]]:
    """(batch, text position of its first target): N-token chunks of the stream, or rows of consecutive
    whole sentences holding at least N tokens, in text order."""
    bos = model.vocab.bos_id
    if stream_mode:
        for i, batch in enumerate(stream_batches(stream, bos, batch_size=1, bptt=segment)):
            yield batch, i * segment
        return
    starts = np.asarray(stream.starts)
    first = 0
    while first < stream.num_sentences:
        last = first + 1
        while last < stream.num_sentences and starts[last] - starts[first] < segment:
            last += 1
        group = [(s, 0, int(starts[s + 1] - starts[s])) for s in range(first, last)]
        yield sentence_rows(stream, bos, group, context=0).batch, int(starts[first])
        first = last


def _passes(net: LanguageModel, stream: TokenStream, stream_mode: bool, segment: int,
            params: list[nn.Parameter]) -> Iterator[tuple[int, np.ndarray, tuple[torch.Tensor | None, ...]]]:
    """Per segment in text order: (text position of its first target, its ln p scored by the weights as they
    are, the gradient of its mean -ln p). The caller may change the weights before asking for the next."""
    device = model_device(net)
    state = None
    for batch, pos in _segments(net, stream, stream_mode, segment):
        batch = batch.to(device)
        with torch.no_grad():  # scored exactly as static evaluation scores it, by the weights so far
            logp, next_state = net.score_stream(batch, state) if stream_mode else (net.score(batch), None)
        scores = logp.double().cpu()[batch.mask.cpu()].numpy()  # row by row: text order
        with torch.enable_grad():  # then the gradient, from a pass with gradients over the same segment
            logp = net.score_stream(batch, state)[0] if stream_mode else net.score(batch)  # (B, T)
            grads = torch.autograd.grad(-logp.sum() / batch.num_tokens, params, allow_unused=True)
        yield pos, scores, grads
        state = next_state  # the history runs on as the weights that read it left it


def sgd_step(params: list[nn.Parameter], lr: float) -> Callable[[tuple[torch.Tensor | None, ...]], None]:
    """Today's rule (`--dynamic-rule sgd`): theta <- theta - lr * gradient."""
    def step(grads: tuple[torch.Tensor | None, ...]) -> None:
        for p, g in zip(params, grads, strict=True):
            if g is not None:
                p.add_(g, alpha=-lr)
    return step


def dynamic_logp(model: LanguageModel, stream: TokenStream, stream_mode: bool, lr: float,
                 segment: int = DEFAULT_SEGMENT, rule: Any = None) -> np.ndarray:
    """(N,) ln p of every token, each scored before the one update that sees it (module docstring). `rule`:
    None for plain SGD, or a seqlm.eval.dynamic_rms.RmsRule (Krause et al. 2018)."""
    stream_mode = stream_mode and model.capabilities().stream  # else by sentence, as static evaluation scores it
    net = copy.deepcopy(model)  # the caller's model (and the directory it came from) stay as they were
    net.eval()  # no dropout: the scores are the model's own, and so is the gradient
    params = [p for p in net.parameters() if p.requires_grad]
    step = sgd_step(params, lr) if rule is None else rule.step(model, net, params, lr, stream_mode, segment)
    out = np.zeros(len(stream.ids), dtype=np.float64)
    for pos, scores, grads in _passes(net, stream, stream_mode, segment, params):
        out[pos : pos + len(scores)] = scores
        with torch.no_grad():
            step(grads)
    return out


RULES = ("sgd", "rms")  # --dynamic-rule: plain SGD (the default), Krause et al.'s RMS rule (seqlm.eval.dynamic_rms)


def _rule(rule: str, decay: float | None, stats: str | Path | None, stats_tokens: int | None) -> Any:
    """None for plain SGD (it takes none of the options of rms), else the RmsRule the options describe."""
    if rule not in RULES:
        raise SeqlmError(f"--dynamic-rule must be one of {', '.join(RULES)}, got {rule!r}")
    if rule == "sgd":
        given = [f for f, v in (("--dynamic-decay", decay), ("--dynamic-stats", stats),
                                ("--dynamic-stats-tokens", stats_tokens)) if v is not None]
        if given:
            raise SeqlmError(f"{', '.join(given)}: options of --dynamic-rule rms, not of plain SGD (the default)")
        return None
    from seqlm.eval.dynamic_rms import RmsRule

    return RmsRule.from_options(decay, stats, stats_tokens)


class Dynamic(LMBase):
    """A model under dynamic evaluation, for `evaluate` / `score_tokens`: it scores whole texts its own
    way (`score_text`), like a mixture. Each call starts again from the saved weights."""

    def __init__(self, model: LanguageModel, lr: float | None, segment: int | None = None, rule: str = "sgd",
                 decay: float | None = None, stats: str | Path | None = None, stats_tokens: int | None = None):
        if lr is None:
            raise SeqlmError("--dynamic-segment, --dynamic-rule and the rule's options set up dynamic evaluation: "
                             "give --dynamic-lr LR too")
        if not (np.isfinite(lr) and lr >= 0):
            raise SeqlmError(f"--dynamic-lr must be a non-negative number, got {lr}")
        segment = DEFAULT_SEGMENT if segment is None else segment
        if segment < 1:
            raise SeqlmError(f"--dynamic-segment must be at least 1 token, got {segment}")
        require(model, dynamic="--dynamic-lr")  # a mixture: when one of its components learns
        self.model, self.lr, self.segment = model, float(lr), segment
        self.vocab, self.family = model.vocab, model.family
        self.rule = _rule(rule, decay, stats, stats_tokens)

    def capabilities(self) -> Capabilities:
        return self.model.capabilities()

    def text_spec(self) -> TextSpec:
        return self.model.text_spec()

    def settings(self) -> dict[str, Any]:
        rule = {"dynamic_rule": "sgd"} if self.rule is None else self.rule.settings()
        return {"dynamic_lr": self.lr, "dynamic_segment": self.segment, **rule}

    def _score(self, model: LanguageModel, stream: TokenStream, stream_mode: bool, max_tokens: int) -> np.ndarray:
        if updatable(model):
            return dynamic_logp(model, stream, stream_mode, self.lr, self.segment, self.rule)
        return score_tokens(model, stream, stream_mode, max_tokens).logp  # a mixture's static component

    def score_text(self, stream: TokenStream, stream_mode: bool, max_tokens: int, scorer: Any) -> np.ndarray:
        per = self.model.component_logp(stream, stream_mode, max_tokens, self._score)  # (K, N): a mixture
        if per is not None:  # each component in its own mode
            return mix_logp(per, self.model.weights)
        return self._score(self.model, stream, stream_mode and self.model.capabilities().stream, max_tokens)
