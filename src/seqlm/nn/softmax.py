"""Output layers: full softmax, PyTorch's adaptive softmax (Grave et al. 2017,
`torch.nn.AdaptiveLogSoftmaxWithLoss`) and, in nn/class_softmax.py, the class-factorised softmax of Mikolov et al.
(ICASSP 2011).

All layers share one interface. Callers flatten (B, T, H) hidden states to (N, H).

- ``target_log_probs(h, targets) -> (N,)``: natural-log probability of each target word; this is what
  training and perplexity need, and it never builds an (N, V) tensor in the class-factorised layer.
- ``log_probs(h) -> (N, V)``: the full normalised distribution in word-id order, for generation.

- ``loss(h, targets) -> (N,)``: the training loss of each position: -log P for the exact layers, the NCE
  loss when the layer is trained by noise-contrastive estimation (seqlm.nn.nce).

`build_embedding` / `build_output` turn a family's `VocabLayerConfig` into these layers (dense, NCE-trained,
sparse-code compressed), so a family needs one line for each and never branches on the objective.

Log-softmaxes are computed in float32 (float64 if the layer is float64), so both layers work under
``torch.autocast('cpu', dtype=torch.bfloat16)`` and return float32 log-probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlm.config import choice, positive
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.nn.class_softmax import ClassSoftmax
from seqlm.nn.cross_entropy import linear_cross_entropy, upcast
from seqlm.nn.nce import NCE
from seqlm.nn.sparse_code import CodeBook, CodedEmbedding, CodedLinear, SparseCodes, codes_for_vocab, linear_rows
from seqlm.nn.tree_softmax import TreeSoftmax


class FullSoftmax(nn.Module):
    """Plain softmax over the whole vocabulary: y = softmax(V s) (paper, 'Model description').

    `proj` is the output projection (nn.Linear, or a sparse-code CodedLinear); `nce`, if given, trains it
    by noise-contrastive estimation instead of cross-entropy. Log-probabilities are always exact.
    """

    def __init__(self, hidden: int, vocab_size: int, proj: nn.Module | None = None, nce: NCE | None = None) -> None:
        super().__init__()
        self.hidden = hidden
        self.vocab_size = vocab_size
        self.proj = proj if proj is not None else nn.Linear(hidden, vocab_size)
        self.nce = nce

    def _logits(self, h: Tensor) -> Tensor:
        logits = upcast(self.proj(h))  # (N, V)
        if self.nce is not None and not self.training:
            self.nce.record(h, logits)  # the true log Z_h comes free with exact evaluation
        return logits

    def target_log_probs(self, h: Tensor, targets: Tensor) -> Tensor:
        # cross_entropy fuses log-softmax and the gather, which is faster than doing them separately
        return -F.cross_entropy(self._logits(h), targets, reduction="none")  # (N,)

    def log_probs(self, h: Tensor) -> Tensor:
        return F.log_softmax(self._logits(h), dim=-1)  # (N, V)

    def pair_log_probs(self, h: Tensor, rows: Tensor, targets: Tensor, memo: dict | None = None) -> Tensor:
        """(N,) log P(targets[i] | h[rows[i]]), h (B, H) (`memo` unused: ClassSoftmax's interface)."""
        return self.target_log_probs(h[rows], targets)

    def loss(self, h: Tensor, targets: Tensor) -> Tensor:
        if self.nce is not None:
            return self.nce.loss(self.proj, h, targets)  # (N,)
        if torch.is_grad_enabled() and isinstance(self.proj, (nn.Linear, CodedLinear)):
            weight, bias = linear_rows(self.proj, None)  # (V, H), (V,)
            return linear_cross_entropy(h, weight, bias, targets)  # (N,) seqlm.nn.cross_entropy
        return -self.target_log_probs(h, targets)


def adaptive_cutoffs(vocab_size: int, spec: str = "") -> list[int]:
    """Cluster boundaries in frequency rank: `spec` ("2000,10000"), or 2k / 10k / 50k where below V."""
    try:
        cuts = [int(c) for c in spec.split(",") if c.strip()] if spec else [c for c in (2000, 10000, 50000)
                                                                             if c < vocab_size]
    except ValueError:
        cuts = []
    if not cuts or cuts != sorted(set(cuts)) or cuts[0] <= 0 or cuts[-1] >= vocab_size:
        raise SeqlmError(f"--cutoffs must be increasing ranks between 1 and V-1 = {vocab_size - 1}, got {spec!r}")
    return cuts


class AdaptiveSoftmax(nn.Module):
    """torch.nn.AdaptiveLogSoftmaxWithLoss over words ranked by training frequency (it needs frequent words
    first): a head over the most frequent words plus one entry per tail cluster, each tail cluster behind a
    smaller projection (H / div_value^i). Exact and normalised; cost per token ~ H (head + one cluster).

    `unigram`: start from the unigram model, as the full output layer does (head biases = log p of the head
    words and of each cluster's mass). torch's tail layers have no bias, so a tail word's frequency must be
    learnt through its projection; `tail_bias` gives each tail word a bias (started at log p within its
    cluster when `unigram`), torch's own forward unchanged."""

    def __init__(self, hidden: int, counts: Sequence[int] | Tensor, cutoffs: list[int], div_value: float = 4.0,
                 unigram: bool = False, tail_bias: bool = False):
        super().__init__()
        if int(hidden // div_value ** len(cutoffs)) < 1:  # torch would build a width-0 projection silently
            raise SeqlmError(f"adaptive output: the last tail cluster's projection, hidden {hidden} / div_value "
                             f"{div_value}^{len(cutoffs)}, is under one dimension: lower --div-value or the clusters")
        counts = torch.as_tensor(counts, dtype=torch.long)
        order = torch.sort(counts, descending=True, stable=True).indices  # (V,) rank -> word id
        self.register_buffer("word_to_rank", torch.empty_like(order).scatter_(0, order, torch.arange(len(order))))
        self.asm = nn.AdaptiveLogSoftmaxWithLoss(hidden, len(order), cutoffs, div_value=div_value, head_bias=True)
        if tail_bias:
            for tail in self.asm.tail:  # Sequential(projection, cluster output): the output gets a bias
                tail[1] = nn.Linear(tail[1].in_features, tail[1].out_features, bias=True)
        if unigram and self.asm.head.bias.device.type != "meta":
            self._start_from_unigram(_log_unigram(counts[order]).double())  # (V,) in rank order

    @torch.no_grad()
    def _start_from_unigram(self, log_p: Tensor) -> None:
        asm = self.asm
        bounds = [0, *asm.cutoffs]  # the head's words, then each cluster's ranks
        asm.head.bias[: bounds[1]] = log_p[: bounds[1]].float()
        for i, tail in enumerate(asm.tail):
            cluster = log_p[bounds[i + 1] : bounds[i + 2]]  # (size,)
            mass = torch.logsumexp(cluster, 0)
            asm.head.bias[asm.shortlist_size + i] = mass.float()
            if tail[1].bias is not None:
                tail[1].bias.copy_((cluster - mass).float())  # log p within the cluster

    def target_log_probs(self, h: Tensor, targets: Tensor) -> Tensor:
        # torch's module mixes its cluster outputs with index_copy_, which fails on bf16 under autocast: fp32
        with torch.autocast(h.device.type, enabled=False):
            return self.asm(upcast(h), self.word_to_rank[targets]).output  # (N,)

    def loss(self, h: Tensor, targets: Tensor) -> Tensor:
        return -self.target_log_probs(h, targets)  # (N,)

    def log_probs(self, h: Tensor) -> Tensor:
        return self.asm.log_prob(upcast(h))[:, self.word_to_rank]  # (N, V) in word-id order

    def pair_log_probs(self, h: Tensor, rows: Tensor, targets: Tensor, memo: dict | None = None) -> Tensor:
        """(N,) log P(targets[i] | h[rows[i]]), h (B, H) (`memo` unused: ClassSoftmax's interface)."""
        return self.target_log_probs(h[rows], targets)


@dataclass
class VocabLayerConfig:
    """The vocabulary-sized layers of a neural family: how the output is trained, and sparse-code compression."""

    objective: str = "softmax"  # softmax (exact cross-entropy) | nce (noise-contrastive estimation)
    noise_samples: int = 100  # nce: noise words k drawn per target
    noise_power: float = 1.0  # nce: noise distribution = unigram counts ** power, normalised (paper: 1)
    noise_sharing: str = "token"  # nce: token (k words per position) | batch (one draw shared by the batch: faster)
    normaliser: str = "one"  # nce: one (Z_h = 1) | regression (ZRegression, log Z_h = w_Z . h + b_Z)
    codes: str = ""  # sparse codes file (seqlm sparse-codes): embedding U x, output weights D x, far fewer parameters
    code_bias: bool = False  # with --codes: a free output bias per word instead of the compressed c^T x
    code_bias_prior: bool = False  # compressed bias: c^T x plus each word's fixed log unigram probability
    code_base: int = 0  # set from --codes when the model is first built: base rows (not an option)
    code_nonzeros: int = 0  # set from --codes when the model is first built: non-zero code entries (not an option)

    def __post_init__(self) -> None:
        choice("objective", self.objective, ("softmax", "nce"))
        choice("noise_sharing", self.noise_sharing, ("batch", "token"))
        choice("normaliser", self.normaliser, ("one", "regression"))
        positive(self, "noise_samples", "noise_power")


def _sparse_codes(cfg: VocabLayerConfig, vocab: Vocab) -> SparseCodes | None:
    """The codes of the model's words: from the codes file for a new model, placeholders for a saved one
    (its weights file holds the codes; loading fills them)."""
    if not cfg.codes:
        return None
    if cfg.code_base:
        return SparseCodes.empty(len(vocab), cfg.code_base, cfg.code_nonzeros)
    indptr, index, value, num_base = codes_for_vocab(CodeBook.read(cfg.codes), vocab)
    codes = SparseCodes(*(torch.from_numpy(a).to("cpu") for a in (indptr, index, value)), num_base)
    if torch.empty(0).device.type != "meta":  # the real build (not a meta-device size check) fixes the shapes
        cfg.code_base, cfg.code_nonzeros = num_base, len(index)
    return codes


def build_embedding(cfg: VocabLayerConfig, vocab: Vocab, dim: int) -> nn.Module:
    """nn.Embedding, or with --codes the compressed CodedEmbedding (U x). Both map ids (...) -> (..., dim)."""
    codes = _sparse_codes(cfg, vocab)
    if codes is None:
        return nn.Embedding(len(vocab), dim)  # torch's initialisation: each family may re-initialise it
    return CodedEmbedding(codes, dim)


def build_output(cfg: VocabLayerConfig, vocab: Vocab, hidden: int, embedding: nn.Module | None = None,
                 output: str = "full", classes: int = 0, unigram_bias: bool = False, cutoffs: str = "",
                 div_value: float = 4.0, tail_bias: bool = False) -> nn.Module:
    """The output layer a family's config asks for. With --codes the output shares `embedding`'s codes.
    `unigram_bias`: start from the unigram model (biases = log unigram probabilities; always so for NCE)."""
    if output in ("class", "adaptive", "tree"):
        if cfg.objective != "softmax" or cfg.codes:
            raise SeqlmError("--objective nce and --codes need the full output layer (--output full)")
        counts = torch.tensor(vocab.counts, dtype=torch.long, device="cpu").clamp(min=1)
        if output == "tree":
            return TreeSoftmax(hidden, counts)
        if output == "adaptive":
            return AdaptiveSoftmax(hidden, counts, adaptive_cutoffs(len(vocab), cutoffs), div_value, unigram_bias,
                                   tail_bias)
        return ClassSoftmax(hidden, counts, min(classes, len(vocab)))
    proj = None
    if cfg.codes:
        if not isinstance(embedding, CodedEmbedding):
            raise SeqlmError("--codes: this family has no word embedding to share its codes with")
        prior = cfg.code_bias_prior and not cfg.code_bias
        proj = CodedLinear(embedding.codes, hidden, cfg.code_bias,
                           _log_unigram(torch.tensor(vocab.counts, device="cpu")) if prior else None)
    nce = None
    if cfg.objective == "nce":
        counts = torch.tensor(vocab.counts, dtype=torch.long, device="cpu")
        nce = NCE(hidden, counts, cfg.noise_samples, cfg.noise_power, cfg.noise_sharing, cfg.normaliser)
    layer = FullSoftmax(hidden, len(vocab), proj, nce)
    if (unigram_bias or nce is not None) and layer.proj.bias.device.type != "meta":
        # The unigram model's Z_h is 1. NCE needs that start: with zero biases Z_h = V, far from the Z_h = 1
        # it assumes, and the first updates wreck the model (PTB, 5k tokens: valid ppl 26k, above uniform).
        _unigram_bias(layer.proj, torch.tensor(vocab.counts, dtype=torch.long, device="cpu"))
    return layer


def _log_unigram(counts: Tensor) -> Tensor:
    """(V,) log unigram probabilities from word counts (unseen words count 1)."""
    c = counts.double().clamp(min=1)
    return torch.log(c / c.sum()).float()


@torch.no_grad()
def _unigram_bias(proj: nn.Module, counts: Tensor) -> None:
    """Output biases = log unigram probabilities; a compressed bias c gets each base word's own value
    (or stays 0 where a fixed log-unigram prior already gives every word its own)."""
    if getattr(proj, "prior", None) is not None:
        return
    log_p = _log_unigram(counts)  # (V,)
    if proj.bias.numel() == log_p.numel():
        proj.bias.copy_(log_p)
        return
    codes = proj.codes  # CodedLinear with c (B,): word i with the one-hot code e_j is base word j
    length = codes.code_indptr[1:] - codes.code_indptr[:-1]  # (V,)
    one_hot = (length == 1) & (codes.code_value[codes.code_indptr[:-1].clamp(max=codes.nonzeros - 1)] == 1.0)
    words = torch.nonzero(one_hot).flatten()  # (B,) ids of the base words
    proj.bias[codes.code_index[codes.code_indptr[words]]] = log_p[words]


def layer_stats(model: nn.Module) -> dict[str, float]:
    """What the model's layers measured since the last call (NCE: log Z_h), for metrics.jsonl."""
    out: dict[str, float] = {}
    for m in model.modules():
        if isinstance(m, NCE):
            out.update(m.epoch_stats())
    return out


def parameters_by_layer(model: object) -> dict[str, int]:
    """Trainable parameters per top-level layer (shared ones counted once, where first met), and the
    embedding + output total the sparse-code compression is about."""
    if not isinstance(model, nn.Module):
        return {}
    out: dict[str, int] = {}
    for name, p in model.named_parameters():  # named_parameters yields a shared tensor once
        top = name.split(".")[0]
        out[top] = out.get(top, 0) + p.numel()
    out["embedding+output"] = out.get("embedding", 0) + out.get("out", 0)
    return out
