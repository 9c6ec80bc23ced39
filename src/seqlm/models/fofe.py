"""FOFE-FNNLM (Zhang et al. 2015, fofe-fnnlm.txt): a feed-forward LM fed with the fixed-size
ordinally-forgetting encoding of the whole history.

z_t = alpha * z_{t-1} + e_t, applied to the word embeddings (Sec. 3, "we may apply FOFE to the word
embedding vectors"), reset at each sentence start. An order-n model feeds [z_t; z_{t-1}; ...; z_{t-n+1}]
to the same ReLU layers and softmax as the n-gram FNN baseline (`seqlm.models.fnn.MLPHead`).
Training is plain back-propagation over whole packed mini-batches, no BPTT: the codes of a batch are
one matrix product (seqlm.nn.fofe.fofe_codes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from seqlm.config import TrainConfig, dropout_rate, positive
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.models.fnn import MLPHead, fofe_paper_training
from seqlm.nn.fofe import fofe_codes
from seqlm.nn.softmax import VocabLayerConfig, build_embedding, build_output
from seqlm.protocol import Batch


@dataclass
class FOFEConfig:
    order: int = 2  # 1: z_t; 2: [z_t; z_{t-1}]; n: the n most recent codes
    alpha: float = 0.7  # forgetting factor; the paper uses 0.7 (Fig. 4: good between 0.5 and 0.8)
    embed: int = 200
    hidden: int = 400
    layers: int = 2
    dropout: float = 0.0  # on the input and every hidden layer; 0 = the paper's model
    vocab_layers: VocabLayerConfig = field(default_factory=VocabLayerConfig)  # NCE, sparse codes
    train: TrainConfig = field(default_factory=fofe_paper_training)

    def __post_init__(self) -> None:
        positive(self, "order", "embed", "hidden", "layers")
        dropout_rate(self.dropout)
        if not 0.0 <= self.alpha <= 1.0:
            raise SeqlmError(f"--alpha must be in [0, 1], got {self.alpha}")


class FOFELM(nn.Module):
    def __init__(self, vocab: Vocab, order: int, alpha: float, embed: int, hidden: int, layers: int,
                 dropout: float = 0.0, vocab_layers: VocabLayerConfig | None = None):
        super().__init__()
        self.vocab, self.order, self.alpha = vocab, order, alpha
        vl = vocab_layers or VocabLayerConfig()
        self.embedding = build_embedding(vl, vocab, embed)
        if isinstance(self.embedding, nn.Embedding):
            nn.init.xavier_uniform_(self.embedding.weight)
        self.head = MLPHead(order * embed, hidden, layers, len(vocab), dropout,
                            lambda h: build_output(vl, vocab, h, self.embedding))

    def _features(self, z: Tensor, resets: Tensor) -> Tensor:
        """[z_t; z_{t-1}; ...] with codes from before the sentence start set to zero."""
        feats, prev, cut = [z], z, resets
        for _ in range(self.order - 1):
            prev = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], dim=1)  # (B, T, E) shifted by one
            prev = prev.masked_fill(cut.unsqueeze(-1), 0.0)
            feats.append(prev)
            cut = cut | torch.cat([torch.zeros_like(cut[:, :1]), cut[:, :-1]], dim=1)  # reach one more back
        return torch.cat(feats, dim=-1)  # (B, T, order*E)

    def forward(self, batch: Batch, state: None = None) -> tuple[Tensor, None]:
        z = fofe_codes(self.embedding(batch.inputs), batch.resets, self.alpha)  # (B, T, E)
        if self.training:  # the output layer's own training loss (the contract in seqlm.train.steps)
            loss = self.head.loss(self._features(z, batch.resets), batch.targets)  # (B, T)
            return None, None, loss.masked_fill(~batch.mask, 0.0)
        logp = self.head.target_log_probs(self._features(z, batch.resets), batch.targets)  # (B, T)
        return logp.masked_fill(~batch.mask, 0.0), None

    def score(self, batch: Batch) -> Tensor:
        return self(batch)[0]

    def initial_state(self, batch_size: int) -> Tensor:
        return next(self.parameters()).new_zeros(batch_size, self.order, self.embedding.embedding_dim)

    def step(self, tokens: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        z = self.alpha * state[:, 0] + self.embedding(tokens)  # (B, E) the recursion, one step
        state = torch.cat([z.unsqueeze(1), state[:, :-1]], dim=1)  # (B, order, E) newest first
        return self.head.log_probs(state.flatten(1)), state


def build_fofe(cfg: FOFEConfig, vocab: Vocab) -> FOFELM:
    return FOFELM(vocab, order=cfg.order, alpha=cfg.alpha, embed=cfg.embed, hidden=cfg.hidden, layers=cfg.layers,
                  dropout=cfg.dropout, vocab_layers=cfg.vocab_layers)
