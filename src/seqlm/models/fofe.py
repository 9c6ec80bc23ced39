"""FOFE-FNNLM (Zhang et al. 2015, fofe-fnnlm.txt): a feed-forward LM fed with the fixed-size
ordinally-forgetting encoding of the whole history.

z_t = alpha * z_{t-1} + e_t, applied to the word embeddings (Sec. 3, "we may apply FOFE to the word
embedding vectors"), reset at each sentence start. An order-n model feeds [z_t; z_{t-1}; ...; z_{t-n+1}]
to the same ReLU layers and softmax as the n-gram FNN baseline (`seqlm.models.fnn.MLPHead`).
Training is plain back-propagation over whole packed mini-batches, no BPTT: the codes of a batch are
one matrix product (seqlm.nn.fofe.fofe_codes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from seqlm.config import TrainConfig, choice, dropout_rate, positive
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.models.fnn import INITS, MLPHead, fofe_paper_training, incml_init
from seqlm.nn.fofe import fofe_codes
from seqlm.nn.softmax import VocabLayerConfig, build_embedding, build_output
from seqlm.protocol import Batch, Capabilities, LMBase

FLOAT32_BITS = 24  # significand bits: a term below 2^-24 of a float32 sum does not change it

@dataclass
class FOFEConfig:
    order: int = 2  # 1: z_t; 2: [z_t; z_{t-1}]; n: the n most recent codes
    alpha: float = 0.7  # forgetting factor; the paper uses 0.7 (Fig. 4: good between 0.5 and 0.8)
    embed: int = 200  # word embedding size; each FOFE code z_t has this size
    hidden: int = 400  # units per ReLU hidden layer
    layers: int = 2  # ReLU hidden layers before the softmax
    dropout: float = 0.0  # on the input and every hidden layer; 0 = the paper's model
    param_init: str = "xavier"  # xavier: Glorot weights, zero biases | incml: the FOFE authors' (fnn.incml_init)
    start_pad: str = "zero"  # codes z_{t-k} from before the sentence start: zero | bos: as padded with <s> (iNCML)
    vocab_layers: VocabLayerConfig = field(default_factory=VocabLayerConfig)  # NCE, sparse codes
    train: TrainConfig = field(default_factory=fofe_paper_training)

    def __post_init__(self) -> None:
        positive(self, "order", "embed", "hidden", "layers")
        dropout_rate(self.dropout)
        choice("param_init", self.param_init, INITS)
        choice("start_pad", self.start_pad, ("zero", "bos"))
        if not 0.0 <= self.alpha <= 1.0:
            raise SeqlmError(f"--alpha must be in [0, 1], got {self.alpha}")


class FOFELM(LMBase, nn.Module):
    def __init__(self, vocab: Vocab, order: int, alpha: float, embed: int, hidden: int, layers: int,
                 dropout: float = 0.0, vocab_layers: VocabLayerConfig | None = None, param_init: str = "xavier",
                 start_pad: str = "zero"):
        super().__init__()
        self.vocab, self.order, self.alpha, self.start_pad = vocab, order, alpha, start_pad
        vl = vocab_layers or VocabLayerConfig()
        self.embedding = build_embedding(vl, vocab, embed)
        if isinstance(self.embedding, nn.Embedding):
            nn.init.xavier_uniform_(self.embedding.weight)
        self.head = MLPHead(order * embed, hidden, layers, len(vocab), dropout,
                            lambda h: build_output(vl, vocab, h, self.embedding))
        if param_init == "incml":
            incml_init(self.embedding, self.head, vl)

    def capabilities(self) -> Capabilities:
        return Capabilities(quantizable=True)

    def context_window(self) -> int | None:
        """The most recent inputs (the start symbol counted) a prediction can depend on, to float32 rounding: an
        input k back weighs alpha^k against the latest, below float32's resolution 2^-24 from
        k = ceil(24 ln 2 / -ln alpha) on (what is left out is smaller than the rounding of the code's own sum),
        and the order-n features reach n - 1 codes further back. None for alpha = 1: such codes never forget."""
        if self.alpha >= 1.0:
            return None
        reach = 1 if self.alpha <= 0.0 else math.ceil(FLOAT32_BITS * math.log(2.0) / -math.log(self.alpha))
        return reach + self.order - 1

    def _features(self, z: Tensor, resets: Tensor) -> Tensor:
        """[z_t; z_{t-1}; ...] with codes from before the sentence start set to zero.

        start_pad "bos": the FOFE authors' code (iNCML-DNNLM, batch-constructor.cpp) encodes the k-th
        code from a copy of the sentence padded with k <s>, so z_{t-k+1} gains sum_{j=0}^{min(k-2, t)}
        alpha^(t-j) e(<s>), t being the position in the sentence.
        """
        feats, prev, cut = [z], z, resets
        if self.start_pad == "bos":
            t = _in_sentence(resets).to(z.dtype)  # (B, T)
            bos = self.embedding(resets.new_full((), self.vocab.bos_id, dtype=torch.long))  # (E,)
            pad = torch.zeros_like(t)  # (B, T) weight of e(<s>) in the k-th code
        for k in range(2, self.order + 1):
            prev = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], dim=1)  # (B, T, E) shifted by one
            prev = prev.masked_fill(cut.unsqueeze(-1), 0.0)
            if self.start_pad == "bos":
                pad = pad + torch.where(t >= k - 2, self.alpha ** (t - (k - 2)).clamp(min=0), 0.0)
                feats.append(prev + pad.unsqueeze(-1) * bos)  # (B, T, E)
            else:
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
        """(B, order, E) codes, newest first; start_pad "bos" adds a last slot: the alpha^t e(<s>) the
        next step adds to the older codes."""
        state = next(self.parameters()).new_zeros(batch_size, self.order, self.embedding.embedding_dim)
        if self.start_pad == "bos":
            bos = self.embedding(torch.full((batch_size, 1), self.vocab.bos_id, device=state.device))  # (B, 1, E)
            state = torch.cat([state, bos], dim=1)  # (B, order+1, E)
        return state

    def step(self, tokens: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        codes = state[:, : self.order]  # (B, order, E)
        z = self.alpha * codes[:, 0] + self.embedding(tokens)  # (B, E) the recursion, one step
        older = codes[:, :-1]  # (B, order-1, E)
        if self.start_pad == "bos":
            older = older + state[:, -1:]  # the k-th code is the (k-1)-th one step back, plus alpha^t e(<s>)
        codes = torch.cat([z.unsqueeze(1), older], dim=1)  # (B, order, E) newest first
        if self.start_pad == "bos":
            state = torch.cat([codes, self.alpha * state[:, -1:]], dim=1)
        else:
            state = codes
        return self.head.log_probs(codes.flatten(1)), state


def _in_sentence(resets: Tensor) -> Tensor:
    """(B, T) each position's distance from the start of its sentence (or of its row)."""
    pos = torch.arange(resets.shape[1], device=resets.device).expand_as(resets)  # (B, T)
    return pos - torch.where(resets, pos, torch.zeros_like(pos)).cummax(dim=1).values


def build_fofe(cfg: FOFEConfig, vocab: Vocab) -> FOFELM:
    return FOFELM(vocab, order=cfg.order, alpha=cfg.alpha, embed=cfg.embed, hidden=cfg.hidden, layers=cfg.layers,
                  dropout=cfg.dropout, vocab_layers=cfg.vocab_layers, param_init=cfg.param_init,
                  start_pad=cfg.start_pad)
