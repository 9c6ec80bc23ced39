"""LSTM language model (Zaremba et al. 2014 style; the encoder of sparse-word-representations.txt, Sec. 2).

    e(t) = embed(w(t)),   (h(t), c(t)) = LSTM_L(e(t), h(t-1), c(t-1)),   P(w | h) = softmax(W h(t) + b)

torch's fused multi-layer nn.LSTM; dropout on the embeddings, between layers and on the output layer's
input (Zaremba et al.'s placement). The state runs on across the whole text (stream mode, TBPTT over
`seq_len`-step chunks, like the `rnn` family) or restarts at every sentence (`--sentence-independent`).
The vocabulary-sized layers come from `seqlm.nn.softmax.build_embedding/build_output`: a full softmax
(or class-factorised), NCE training (`--objective nce`), sparse-code compression (`--codes`); `--tie-embeddings`
shares the embedding with the output weights (Press & Wolf 2017; needs embed = hidden).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlm.config import TrainConfig, choice, dropout_rate, positive
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.models.rnn import rnn_batches
from seqlm.nn.lstm_step import LSTMStep
from seqlm.nn.readout import StateReadout
from seqlm.nn.softmax import VocabLayerConfig, build_embedding, build_output
from seqlm.protocol import Batch, Capabilities, LMBase

State = tuple[Tensor, Tensor]  # (h, c), each (layers, B, H)


def _lstm_training() -> TrainConfig:
    # Adam with the newbob schedule, 64 rows x 20 steps, as the rnn family: SGD at lr 1 (Zaremba et al.)
    # needs far more epochs than a CPU budget allows.
    return TrainConfig(optimizer="adam", lr=0.002, batch_size=64, bptt=20, min_improvement=1.0, halving_epochs=4,
                       clip=1.0, max_epochs=20)


@dataclass
class LSTMConfig:
    embed: int = 0  # word embedding size; 0 = hidden
    hidden: int = 200  # LSTM units per layer
    layers: int = 2  # stacked LSTM layers
    dropout: float = 0.0  # on the embeddings, between layers and before the output layer
    # output weights = the embedding matrix (needs embed 0 or = hidden; --tied: its old name, still accepted)
    tie_embeddings: bool = False
    output: str = "full"  # full | class (class-factorised) | adaptive (torch's) | tree (Huffman hierarchical softmax)
    classes: int = 0  # class output: number of classes; 0 = round(sqrt(V))
    cutoffs: str = ""  # adaptive output: cluster boundaries in frequency rank, e.g. 2000,10000; "" = 2k/10k/50k < V
    div_value: float = 4.0  # adaptive output: tail cluster i projects the state to hidden / div_value^i dimensions
    tail_bias: bool = False  # adaptive output: a bias per tail word (torch's tails have none), from its unigram share
    sentence_independent: bool = False  # reset the state at every sentence (train and eval)
    vocab_layers: VocabLayerConfig = field(default_factory=VocabLayerConfig)
    train: TrainConfig = field(default_factory=_lstm_training)

    def __post_init__(self) -> None:
        positive(self, "hidden", "layers", "div_value")
        if self.embed < 0 or self.classes < 0:
            raise SeqlmError("--embed and --classes must be 0 (automatic) or positive")
        dropout_rate(self.dropout)
        choice("output", self.output, ("full", "class", "adaptive", "tree"))
        if self.tail_bias and self.output != "adaptive":
            raise SeqlmError("--tail-bias applies to the adaptive output layer only (--output adaptive)")
        if self.tie_embeddings and self.embed not in (0, self.hidden):
            raise SeqlmError(f"--tie-embeddings needs --embed 0 or equal to --hidden ({self.hidden}), got {self.embed}")
        if self.tie_embeddings and (self.vocab_layers.codes or self.output != "full"):
            raise SeqlmError("--tie-embeddings works with the plain full output layer only (no --codes, --output "
                             "full)")

    @property
    def tied(self) -> bool:  # the old name (config.json files, --tied)
        return self.tie_embeddings


class TiedEmbedding(nn.Module):
    """The output layer's weight matrix read as an embedding table (held by reference: saved once)."""

    def __init__(self, proj: nn.Linear):
        super().__init__()
        self._proj = (proj,)

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self._proj[0].weight)  # (..., H)


class LSTMLM(StateReadout, LMBase, nn.Module):
    def __init__(self, vocab: Vocab, embed: int, hidden: int, layers: int, dropout: float, tied: bool,
                 output: str, classes: int, cutoffs: str, div_value: float, tail_bias: bool,
                 sentence_independent: bool, vocab_layers: VocabLayerConfig):
        super().__init__()
        self.vocab, self.sentence_independent = vocab, sentence_independent
        embedding = build_embedding(vocab_layers, vocab, embed)
        if isinstance(embedding, nn.Embedding):
            nn.init.uniform_(embedding.weight, -0.1, 0.1)
        n_cls = classes or round(len(vocab) ** 0.5)
        # every LSTM starts from the unigram model (what NCE needs), so that objectives compare fairly
        self.out = build_output(vocab_layers, vocab, hidden, embedding, output, n_cls, unigram_bias=True,
                                cutoffs=cutoffs, div_value=div_value, tail_bias=tail_bias)
        self.embedding = TiedEmbedding(self.out.proj) if tied else embedding
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, dropout=dropout if layers > 1 else 0.0,
                            batch_first=True)
        for name, p in self.lstm.named_parameters():
            nn.init.uniform_(p, -0.1, 0.1) if "weight" in name else nn.init.zeros_(p)
        self.drop = nn.Dropout(dropout)
        self._step = LSTMStep()  # inference tables, made from the weights when first asked (not saved)

    def capabilities(self) -> Capabilities:
        # a model trained to restart at every sentence never learnt to use a carried state
        return Capabilities(stream=not self.sentence_independent, dynamic=True, quantizable=True,
                            sparse_targets=self.reads_targets())

    def initial_state(self, batch_size: int) -> State:
        w = self.lstm.weight_hh_l0
        zeros = w.new_zeros(self.lstm.num_layers, batch_size, self.lstm.hidden_size)  # (L, B, H)
        return zeros, zeros.clone()

    # torch's LSTM keeps the batch on dimension 1 of its state: rows are picked and joined there
    def select_state(self, state: State, rows: Tensor) -> State:
        """protocol.select_state: rows (R,) of (h, c) -> each (L, R, H)."""
        return tuple(s.index_select(1, rows.to(s.device)) for s in state)  # type: ignore[return-value]

    def cat_states(self, states: list[State]) -> State:
        """protocol.cat_states: the rows of several (h, c) states, in order."""
        return torch.cat([s[0] for s in states], dim=1), torch.cat([s[1] for s in states], dim=1)  # (L, B, H)

    def _start(self, batch: Batch, state: State | None) -> State:
        """The state each row starts from: carried over, or fresh where a sentence starts (stream mode)."""
        B = batch.inputs.shape[0]
        if state is None or (self.sentence_independent and bool(batch.resets[:, 0].all())):
            return self.initial_state(B)  # mid-sentence (a long line's next piece) the state goes on
        if bool(batch.resets[:, 0].any()):
            keep = (~batch.resets[:, 0]).to(state[0].dtype).view(1, B, 1)  # (1, B, 1)
            return state[0] * keep, state[1] * keep
        return state

    def hidden_states(self, batch: Batch, state: State | None) -> tuple[Tensor, State]:
        """(B*T, H) top-layer outputs (dropout applied) and the state after the batch."""
        if bool(batch.resets[:, 1:].any()):
            raise SeqlmError("lstm batches may start a sentence only in their first column")
        x = self.drop(self.embedding(batch.inputs))  # (B, T, E)
        h, state = self.lstm(x, self._start(batch, state))  # (B, T, H), ((L, B, H), (L, B, H))
        return self.drop(h).flatten(0, 1), state  # (B*T, H)

    def forward(self, batch: Batch, state: State | None = None):
        """(log_probs (B, T), state); in training mode (None, state, per-token loss (B, T)): the output
        layer's own training loss (cross-entropy, or NCE), see seqlm.train.steps."""
        h, state = self.hidden_states(batch, state)
        B, T = batch.targets.shape
        if self.training:
            loss = self.out.loss(h, batch.targets.flatten()).view(B, T)  # (B, T)
            return None, state, loss.masked_fill(~batch.mask, 0.0)
        logp = self.out.target_log_probs(h, batch.targets.flatten()).view(B, T)  # (B, T)
        return logp.masked_fill(~batch.mask, 0.0), state

    def score(self, batch: Batch) -> Tensor:
        return self.score_stream(batch, None)[0]

    def score_stream(self, batch: Batch, state: State | None) -> tuple[Tensor, State]:
        was = self.training
        self.eval()  # exact log-probabilities, whatever mode the caller left the model in
        try:
            logp, state = self(batch, state)[:2]
        finally:
            self.train(was)
        return logp, state

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        state = self.recur(tokens, state)
        return self.out.log_probs(self.readout(state)), state  # (B, V)

    def recur(self, tokens: Tensor, state: State) -> State:
        """The state after reading tokens (B,), the output layer not computed (nn/readout.py); at inference
        through nn/lstm_step.py (a decoder's few rows at a time), else torch's LSTM."""
        fast = self._step.step(self.lstm, self.embedding, len(self.vocab), tokens, state, self.parameters())
        if fast is not None:
            return fast  # ((L, B, H), (L, B, H))
        return self.lstm(self.embedding(tokens).unsqueeze(1), state)[1]  # ((L, B, H), (L, B, H))

    def readout(self, state: State) -> Tensor:
        return state[0][-1]  # (B, H) the top layer's last output: what the output layer reads


def build_lstm(cfg: LSTMConfig, vocab: Vocab) -> LSTMLM:
    return LSTMLM(vocab, embed=cfg.embed or cfg.hidden, hidden=cfg.hidden, layers=cfg.layers, dropout=cfg.dropout,
                  tied=cfg.tied, output=cfg.output, classes=cfg.classes, cutoffs=cfg.cutoffs,
                  div_value=cfg.div_value, tail_bias=cfg.tail_bias, sentence_independent=cfg.sentence_independent,
                  vocab_layers=cfg.vocab_layers)


lstm_batches = rnn_batches  # a continuous stream in B rows, or whole sentences per row when sentence-independent
