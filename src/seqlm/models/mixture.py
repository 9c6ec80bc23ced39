"""Linear interpolation of saved language models (rnnlm-extensions.txt, 'Combination of models').

    P(w | h) = sum_i lambda_i P_i(w | h),   lambda_i >= 0,  sum_i lambda_i = 1

The paper combines several RNNs, and RNNs with the KN5 baseline, this way with equal weights; here
the weights may also be estimated by EM on held-out text (`fit_weights`). A mixture is a model
directory like any other (family `mix`, built by `seqlm interpolate`): its config.json lists the
component models (directories or ARPA files, stored relative to the mixture directory so the whole
tree can be moved) and their weights, and eval/score/generate/rescore use it through the protocol.

Components must read text alike and predict the same words (protocol.check_same_text refuses others:
a word one component lacks would be scored as its <unk>, and the mixture would no longer sum to one).
Their ids may differ (an RNN's vocabulary has no <s>, an ARPA model's does, and orders differ): the
mixture reads text with the first component's vocabulary, every component sees each word through an id
table, and at a sentence start each component reads its own start symbol.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from seqlm import checkpoint as ckpt
from seqlm.data.corpus import TokenStream
from seqlm.errors import SeqlmError
from seqlm.protocol import (
    Batch,
    Capabilities,
    LanguageModel,
    LMBase,
    Prefixes,
    TextSpec,
    cat_states,
    check_same_text,
    model_device,
    select_state,
)

NOT_TRAINED = ("a mixture is not trained: combine saved models with `seqlm interpolate MODEL_DIR... "
               "--valid FILE --out DIR`")


@dataclass
class MixtureConfig:
    components: list[str] = field(default_factory=list)  # model dirs / .arpa files, relative to the mixture dir
    weights: list[float] = field(default_factory=list)  # lambda_i, one per component, summing to 1
    # components scored sentence by sentence even in stream mode (0-based; e.g. a sentence-trained Transformer)
    sentence_only: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.components = [str(c) for c in self.components]
        self.weights = [float(w) for w in self.weights]
        if len(self.components) != len(self.weights):
            raise SeqlmError(f"a mixture needs one weight per component: {len(self.components)} components, "
                             f"{len(self.weights)} weights")
        check_weights(self.weights)
        self.sentence_only = sorted({int(i) for i in self.sentence_only})
        if any(not 0 <= i < len(self.components) for i in self.sentence_only):
            raise SeqlmError(f"sentence_only names components 0..{len(self.components) - 1}, got {self.sentence_only}")

    @property
    def train(self) -> Any:
        """A mixture has no training settings; asking for them (seqlm train --model mix) says what to do instead."""
        raise SeqlmError(NOT_TRAINED)


def check_weights(weights: Sequence[float]) -> np.ndarray:
    """The weights as a (K,) array; they must be finite, non-negative and sum to 1 (to rounding)."""
    w = np.asarray(weights, dtype=np.float64)
    if len(w) and (not np.all(np.isfinite(w)) or np.any(w < 0) or abs(w.sum() - 1.0) > 1e-6):
        raise SeqlmError(f"mixture weights must be non-negative and sum to 1, got {list(map(float, w))}")
    return w


def mix_logp(per_component: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(N,) ln sum_i lambda_i p_i from (K, N) component log-probabilities, in log space (no underflow)."""
    with np.errstate(divide="ignore"):  # a zero weight is a -inf log weight: that component drops out
        log_w = np.log(np.asarray(weights, dtype=np.float64))  # (K,)
    return np.logaddexp.reduce(per_component + log_w[:, None], axis=0)  # (N,)


def fit_weights(per_component_logp: np.ndarray, iters: int = 50, tol: float = 1e-7) -> np.ndarray:
    """Interpolation weights maximising the likelihood of held-out text: EM for mixture weights.

    E-step: each token's posterior over components, r_ik = lambda_i p_ik / sum_j lambda_j p_jk;
    M-step: lambda_i = mean_k r_ik. The held-out log-likelihood never decreases; we stop after
    `iters` rounds or when the mean ln p per token improves by less than `tol`. Everything is done
    with log-probabilities, so components that give a token (almost) zero probability are fine;
    tokens no component can predict at all are left out.
    """
    logp = np.asarray(per_component_logp, dtype=np.float64)  # (K, N)
    if logp.ndim != 2 or logp.shape[0] == 0 or logp.shape[1] == 0:
        raise SeqlmError("fit_weights needs the log-probabilities of at least one token under each component")
    logp = logp[:, np.isfinite(np.logaddexp.reduce(logp, axis=0))]  # (K, N') tokens someone predicts
    if logp.shape[1] == 0:
        raise SeqlmError("no component gives any held-out token a non-zero probability")
    K = logp.shape[0]
    weights = np.full(K, 1.0 / K)
    previous = -math.inf
    for _ in range(iters):
        with np.errstate(divide="ignore"):
            joint = logp + np.log(weights)[:, None]  # (K, N') ln lambda_i p_ik
        total = np.logaddexp.reduce(joint, axis=0)  # (N',) ln of the mixture
        weights = np.exp(joint - total).mean(axis=1)  # (K,) mean posterior responsibility
        weights /= weights.sum()
        mean_ll = float(total.mean())
        if mean_ll - previous < tol:
            break
        previous = mean_ll
    return weights


class MixtureModel(LMBase):
    """Per-token linear interpolation of K models behind the LanguageModel protocol.

    `paths` says where each component was loaded from, so that the mixture can be saved (see
    `save_mixture`); `tables[i]` maps the mixture's ids to component i's. Components listed in
    `sentence_only` score sentence by sentence even when the mixture is scored as a stream.
    """

    family = "mix"

    def __init__(self, components: Sequence[LanguageModel], weights: Sequence[float],
                 paths: Sequence[str | Path], sentence_only: Sequence[int] = ()):
        if not components or len(components) != len(paths):
            raise SeqlmError("a mixture needs at least one component, each with the path it was loaded from")
        self.components = list(components)
        self.paths = [Path(p).absolute() for p in paths]
        check_same_text(self.components, [str(p) for p in paths])
        self.vocab = self.components[0].vocab
        self.tables = [torch.tensor([c.vocab.id(w) for w in self.vocab.itos], dtype=torch.long)  # (V,)
                       for c in self.components]
        self._same_ids = [len(c.vocab) == len(t) and torch.equal(t, torch.arange(len(t)))  # advance needs no gather
                          for c, t in zip(self.components, self.tables, strict=True)]
        self.training = False
        self.sentence_only = list(sentence_only)
        self.set_weights(weights)

    def set_weights(self, weights: Sequence[float]) -> None:
        w = check_weights(weights)
        if len(w) != len(self.components):
            raise SeqlmError(f"{len(self.components)} components need {len(self.components)} weights, got {len(w)}")
        self.weights = w  # (K,) float64
        self.config = MixtureConfig([str(p) for p in self.paths], w.tolist(), self.sentence_only)
        self.sentence_only = self.config.sentence_only

    def capabilities(self) -> Capabilities:
        """Streams when some component does (the paper's RNN + KN5 setting); finite-context when all are."""
        parts = [c.capabilities() for c in self.components]
        orders = [p.context_order for p in parts]
        return Capabilities(stream=any(self._streams(i) for i in range(len(parts))),
                            context_order=None if None in orders else max(orders),
                            dynamic=any(p.dynamic for p in parts), peeks=any(p.peeks for p in parts),
                            sparse_targets=all(p.sparse_targets for p in parts))

    def text_spec(self) -> TextSpec:
        return self.components[0].text_spec()  # check_same_text made them agree; the vocabulary is its

    def _streams(self, i: int) -> bool:
        """Whether component i carries its history across sentences when the mixture is scored as a stream."""
        return i not in self.sentence_only and self.components[i].capabilities().stream

    def eval(self) -> MixtureModel:
        for c in self.components:
            if isinstance(c, torch.nn.Module):
                c.eval()
        return self

    def _log_weights(self, device: torch.device) -> Tensor:
        return torch.log(torch.as_tensor(self.weights, dtype=torch.float64, device=device))  # (K,)

    def _remap(self, i: int, batch: Batch) -> Batch:
        """The batch in component i's ids; its own start symbol wherever a sentence starts."""
        comp, table = self.components[i], self.tables[i].to(batch.inputs.device)
        inputs = torch.where(batch.resets, comp.vocab.bos_id, table[batch.inputs])  # (B, T)
        remapped = Batch(inputs, table[batch.targets], batch.mask, batch.resets)
        return remapped.to(model_device(comp))

    @torch.no_grad()
    def score(self, batch: Batch) -> Tensor:
        """(B, T) ln sum_i lambda_i p_i(target), float64; 0 on padding."""
        dev = batch.targets.device
        parts = [c.score(self._remap(i, batch)).to(dev, torch.float64) for i, c in enumerate(self.components)]
        mixed = torch.logsumexp(torch.stack(parts) + self._log_weights(dev).view(-1, 1, 1), dim=0)  # (B, T)
        return mixed.masked_fill(~batch.mask, 0.0)

    def initial_state(self, batch_size: int) -> tuple[list[Any], Tensor]:
        """Every component's initial state, and which rows are still to read their start symbol (B,)."""
        return [c.initial_state(batch_size) for c in self.components], torch.ones(batch_size, dtype=torch.bool)

    def select_state(self, state: tuple[list[Any], Tensor], rows: Tensor) -> tuple[list[Any], Tensor]:
        """protocol.select_state: each component's rows through its own layout."""
        states, fresh = state
        return ([select_state(c, s, rows) for c, s in zip(self.components, states, strict=True)],
                fresh.index_select(0, rows.to(fresh.device)))

    def cat_states(self, states: list[tuple[list[Any], Tensor]]) -> tuple[list[Any], Tensor]:
        """protocol.cat_states: each component's states joined through its own layout."""
        parts = [cat_states(c, [s[0][i] for s in states]) for i, c in enumerate(self.components)]
        return parts, torch.cat([s[1] for s in states])

    @torch.no_grad()
    def step(self, tokens: Tensor, state: tuple[list[Any], Tensor]) -> tuple[Tensor, tuple[list[Any], Tensor]]:
        """Read tokens (B,); return the mixed (B, V) float64 log-distribution and the new state."""
        read = self.extend(Prefixes(state), torch.arange(len(tokens), device=tokens.device), tokens)
        return self.advance(read).to(tokens.device), read.state

    @torch.no_grad()
    def extend(self, prefixes: Prefixes, rows: Tensor, tokens: Tensor) -> Prefixes:
        """Each component extends its own prefixes, in its ids (its own <s> on rows that have read nothing),
        keeping what its `advance` needs: an n-gram or cache component computes no distribution here."""
        states, fresh = prefixes.state
        dev = tokens.device
        fresh = fresh.to(dev)[rows.to(dev)]  # (R,)
        parts = []
        for i, comp in enumerate(self.components):
            ctok = torch.where(fresh, comp.vocab.bos_id, self.tables[i].to(dev)[tokens])  # (R,) its own <s> first
            parts.append(comp.extend(Prefixes(states[i]), rows, ctok.to(model_device(comp))))
        return Prefixes(([p.state for p in parts], torch.zeros_like(fresh)), [p.cache for p in parts])

    @torch.no_grad()
    def advance(self, prefixes: Prefixes) -> Tensor:
        """(B, V) float64 ln sum_i lambda_i p_i of the next token, from each component's `advance`."""
        states, fresh = prefixes.state
        caches = prefixes.cache or [None] * len(self.components)
        dev = fresh.device
        log_weights, mixed = self._log_weights(dev), None
        for i, (comp, s, c) in enumerate(zip(self.components, states, caches, strict=True)):
            dist = comp.advance(Prefixes(s, c))  # (B, V) in its ids, maybe what its prefixes keep: never written
            if self._same_ids[i]:
                dist = dist.to(dev, torch.float64, copy=True)
            else:
                # (B, V) a copy, in the mixture's ids; gathered in the component's dtype (float32: half the bytes)
                dist = dist.index_select(1, self.tables[i].to(dist.device)).to(dev, torch.float64)
            dist.add_(log_weights[i])
            # one pass a component: a logsumexp over the stacked tables took several, each a (K, B, V) tensor
            mixed = dist if mixed is None else torch.logaddexp(mixed, dist, out=mixed)  # (B, V)
        if self.vocab.bos_id != self.vocab.eos_id:
            mixed[:, self.vocab.bos_id] = -torch.inf  # <s> is context only, never predicted
        return mixed

    @torch.no_grad()
    def advance_targets(self, prefixes: Prefixes, rows: Tensor, targets: Tensor) -> Tensor:
        """(N,) advance's entries, mixed from each component's own (in its ids), by the same sums."""
        states, fresh = prefixes.state
        caches = prefixes.cache or [None] * len(self.components)
        dev = fresh.device
        log_weights, mixed = self._log_weights(dev), None
        for i, (comp, s, c) in enumerate(zip(self.components, states, caches, strict=True)):
            ids = self.tables[i].to(targets.device)[targets]  # (N,) in its ids
            memo = None if prefixes.memo is None else prefixes.memo.setdefault(i, {})  # the component's own
            lnp = comp.advance_targets(Prefixes(s, c, memo), rows, ids).to(dev, torch.float64) + log_weights[i]
            mixed = lnp if mixed is None else torch.logaddexp(mixed, lnp)
        if self.vocab.bos_id != self.vocab.eos_id:
            mixed = mixed.masked_fill(targets.to(dev) == self.vocab.bos_id, -torch.inf)
        return mixed

    def component_logp(self, stream: TokenStream, stream_mode: bool, max_tokens: int,
                       scorer: Scorer) -> np.ndarray:
        """(K, N) ln p of every token under each component, each in its own mode.

        With `stream_mode`, components that can carry state across sentences do (Mikolov's rnnlm
        default) and the others score sentence by sentence: the paper's RNN + KN5 combination.
        `scorer(component, text in its ids, stream_mode, max_tokens)` scores one component (the static
        seqlm.eval.perplexity.score_tokens, or seqlm.eval.dynamic's dynamic evaluation).
        """
        ids = np.asarray(stream.ids)
        rows = []
        for i, (comp, table) in enumerate(zip(self.components, self.tables, strict=True)):
            remapped = TokenStream(table.numpy()[ids].astype(np.int32), stream.starts)  # (N,) its ids
            rows.append(scorer(comp, remapped, stream_mode and self._streams(i), max_tokens))
        return np.stack(rows)  # (K, N)

    def score_text(self, stream: TokenStream, stream_mode: bool, max_tokens: int, scorer: Scorer) -> np.ndarray:
        """(N,) ln p of every token of a text (`score_tokens` uses this so each component keeps its mode)."""
        return mix_logp(self.component_logp(stream, stream_mode, max_tokens, scorer), self.weights)


Scorer = Callable[[LanguageModel, TokenStream, bool, int], np.ndarray]  # (N,) ln p of a text under one model


def relative_config(model: MixtureModel, out: str | Path) -> MixtureConfig:
    """The config to save in directory `out`: component paths relative to it where possible."""
    out = Path(out).absolute()
    paths = []
    for p in model.paths:
        try:
            paths.append(os.path.relpath(p, out))
        except ValueError:  # another drive (Windows): no relative path exists
            paths.append(str(p))
    return MixtureConfig(paths, model.weights.tolist(), model.sentence_only)


def save_mixture(model: MixtureModel, out: Path) -> None:
    """Nothing to write but config.json (and vocab.txt, by seqlm.save); make its paths relative to `out`.

    seqlm.save writes config.json from `model.config` after this, so rebinding it here is enough.
    """
    model.config = relative_config(model, out)


def load_mixture(model_dir: Path, cfg: MixtureConfig) -> MixtureModel:
    """Load every component (seqlm.load, relative to the mixture directory) and combine them."""
    import seqlm

    if not cfg.components:
        raise SeqlmError(f"{model_dir / ckpt.CONFIG}: a mixture with no components; rebuild it with "
                         "`seqlm interpolate`")
    paths = [Path(model_dir) / c for c in cfg.components]  # an absolute c stays absolute
    components = []
    for p in paths:
        try:
            components.append(seqlm.load(p))
        except SeqlmError as e:
            raise SeqlmError(f"{model_dir}: component {p}: {e}") from None
    return MixtureModel(components, cfg.weights, paths, cfg.sentence_only)
