"""n-gram feed-forward LM (Bengio et al. 2003), the FOFE paper's baseline (fofe-fnnlm.txt, Sec. 4).

The previous n-1 words are looked up in a shared projection (embedding) table, concatenated, passed
through ReLU hidden layers and a full softmax over the vocabulary. Positions before a sentence start
read the start symbol, as an n-gram model pads with <s>.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from seqlm.config import TrainConfig, choice, dropout_rate, positive
from seqlm.data.batching import history
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.nn.softmax import FullSoftmax, VocabLayerConfig, build_embedding, build_output
from seqlm.protocol import Batch, Capabilities, LMBase


def fofe_paper_training() -> TrainConfig:
    # fofe-fnnlm.txt Sec. 4: SGD, mini-batch 200, lr 0.4, keep it while valid ppl drops by >= 1,
    # then six more epochs halving it each epoch.
    return TrainConfig(optimizer="sgd", lr=0.4, batch_size=1, seq_len=200, min_improvement=1.0, halving_epochs=6)


INITS = ("xavier", "incml")


def incml_init(embedding: nn.Module, head: MLPHead, vocab_layers: VocabLayerConfig) -> None:
    """The initialisation of the FOFE authors' trainer (iNCML-DNNLM, source/layer.cpp): every layer's
    weights and biases uniform in +-sqrt(6 / (fan_in + fan_out)), the embedding in +-sqrt(6 / (embed + V))."""
    if vocab_layers.objective != "softmax" or vocab_layers.codes or not isinstance(embedding, nn.Embedding):
        raise SeqlmError("--param-init incml needs the plain embedding and softmax (no --objective nce, no --codes)")
    for lin in [*head.hidden, head.softmax.proj]:
        bound = (6.0 / (lin.in_features + lin.out_features)) ** 0.5
        nn.init.uniform_(lin.weight, -bound, bound)
        nn.init.uniform_(lin.bias, -bound, bound)
    V, E = embedding.weight.shape
    nn.init.uniform_(embedding.weight, -(6.0 / (E + V)) ** 0.5, (6.0 / (E + V)) ** 0.5)


@dataclass
class FNNConfig:
    order: int = 3  # n: predicts from the previous n-1 words
    embed: int = 200  # projection (word embedding) size of each of the n-1 context words
    hidden: int = 400  # units per ReLU hidden layer
    layers: int = 2  # ReLU hidden layers before the softmax
    dropout: float = 0.0  # on the input and every hidden layer; 0 = the paper's model
    param_init: str = "xavier"  # xavier: Glorot weights, zero biases | incml: the FOFE authors' code (incml_init)
    vocab_layers: VocabLayerConfig = field(default_factory=VocabLayerConfig)  # NCE, sparse codes
    train: TrainConfig = field(default_factory=fofe_paper_training)

    def __post_init__(self) -> None:
        positive(self, "embed", "hidden", "layers")
        dropout_rate(self.dropout)
        choice("param_init", self.param_init, INITS)
        if not 2 <= self.order <= 20:
            raise SeqlmError(f"--order must be between 2 and 20 for fnn, got {self.order}")


class MLPHead(nn.Module):
    """ReLU hidden layers then a softmax: shared by the FNN and FOFE families.

    Glorot/Xavier normalised initialisation, no pre-training (fofe-fnnlm.txt Sec. 4).
    """

    def __init__(self, in_features: int, hidden: int, layers: int, vocab_size: int, dropout: float = 0.0,
                 output: Callable[[int], nn.Module] | None = None):
        super().__init__()
        self.drop = nn.Dropout(dropout)  # not in the paper (dropout 0): an option against overfitting
        dims = [in_features] + [hidden] * layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.softmax = output(dims[-1]) if output else FullSoftmax(dims[-1], vocab_size)  # seqlm.nn.softmax
        for lin in self.hidden:
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def features(self, x: Tensor) -> Tensor:
        for lin in self.hidden:
            x = torch.relu(lin(self.drop(x)))  # (..., H)
        return self.drop(x)

    def target_log_probs(self, x: Tensor, targets: Tensor) -> Tensor:
        h = self.features(x)  # (B, T, H)
        return self.softmax.target_log_probs(h.flatten(0, -2), targets.flatten()).view(targets.shape)

    def log_probs(self, x: Tensor) -> Tensor:
        return self.softmax.log_probs(self.features(x))  # (B, V)

    def loss(self, x: Tensor, targets: Tensor) -> Tensor:
        """The output layer's training loss per position (-log p, or NCE's), shaped like targets."""
        h = self.features(x)  # (B, T, H)
        return self.softmax.loss(h.flatten(0, -2), targets.flatten()).view(targets.shape)


class FNNLM(LMBase, nn.Module):
    def __init__(self, vocab: Vocab, order: int, embed: int, hidden: int, layers: int, dropout: float = 0.0,
                 vocab_layers: VocabLayerConfig | None = None, param_init: str = "xavier"):
        super().__init__()
        self.vocab = vocab
        self.order = order
        vl = vocab_layers or VocabLayerConfig()
        self.embedding = build_embedding(vl, vocab, embed)
        if isinstance(self.embedding, nn.Embedding):
            nn.init.xavier_uniform_(self.embedding.weight)
        self.head = MLPHead((order - 1) * embed, hidden, layers, len(vocab), dropout,
                            lambda h: build_output(vl, vocab, h, self.embedding))
        if param_init == "incml":
            incml_init(self.embedding, self.head, vl)

    def capabilities(self) -> Capabilities:
        return Capabilities(context_order=self.order, quantizable=True)

    def _context(self, ids: Tensor) -> Tensor:
        ids = torch.where(ids < 0, torch.full_like(ids, self.vocab.bos_id), ids)  # before the start: <s>
        return self.embedding(ids).flatten(-2)  # (..., (n-1)*E)

    def forward(self, batch: Batch, state: None = None) -> tuple[Tensor, None]:
        ctx = self._context(history(batch, self.order - 1))  # (B, T, (n-1)*E)
        if self.training:  # the output layer's own training loss (the contract in seqlm.train.steps)
            return None, None, self.head.loss(ctx, batch.targets).masked_fill(~batch.mask, 0.0)
        logp = self.head.target_log_probs(ctx, batch.targets)  # (B, T)
        return logp.masked_fill(~batch.mask, 0.0), None

    def score(self, batch: Batch) -> Tensor:
        return self(batch)[0]

    def initial_state(self, batch_size: int) -> Tensor:
        return torch.full((batch_size, self.order - 1), -1, dtype=torch.long, device=next(self.parameters()).device)

    def step(self, tokens: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        state = torch.cat([state[:, 1:], tokens.view(-1, 1)], dim=1)  # (B, n-1)
        return self.head.log_probs(self._context(state)), state


def build_fnn(cfg: FNNConfig, vocab: Vocab) -> FNNLM:
    return FNNLM(vocab, order=cfg.order, embed=cfg.embed, hidden=cfg.hidden, layers=cfg.layers, dropout=cfg.dropout,
                 vocab_layers=cfg.vocab_layers, param_init=cfg.param_init)
