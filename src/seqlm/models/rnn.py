"""Elman recurrent LM (Mikolov et al., ICASSP 2011, rnnlm-extensions.txt).

x(t) = [w(t); s(t-1)], s(t) = f(U x(t)), y(t) = g(V s(t)): the input word's embedding feeds an Elman
layer (sigmoid, or tanh) whose state runs on across the whole text (the toolkit's default) or restarts
at every sentence (`--sentence-independent`, what n-best rescoring needs). The output is a full
softmax or the class-factorised one ('Speedup techniques': P(w|h) = P(c|h) P(w|c,h), C ~ sqrt(V)).
Training: BPTT(tau) ('Backpropagation through time'), exactly per position (`--truncation exact`): the error
of every position's output flows back through `--tau` steps of the recurrence, reaching that position's input
and the tau-1 inputs before it, and the recurrent weights at those steps; the state tau steps back
enters as a constant. tau = 1 is plain back-propagation. The text comes in chunks of `--seq-len`
steps; at a chunk edge the last tau-1 inputs of the previous chunk are run again (from the state
before them, held constant), so the first positions of a chunk reach tau steps back too. (Before
this, `--tau` cut each chunk into pieces of tau steps: a position's error flowed back 1..tau steps.)
`--truncation block` is the cheaper truncation of Mikolov's and faster-rnnlm's toolkits (-bptt-block): the
errors of a whole chunk flow back together through it and the tau-1 re-run inputs before it, so
position k of a chunk reaches k + tau steps back: one backward matmul a step instead of tau-1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from seqlm.config import TrainConfig, choice, dropout_rate, positive
from seqlm.data.batching import Planned, sentence_groups, sentence_rows, stream_batches
from seqlm.data.corpus import TokenStream
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.nn.dropout import ByteDropout
from seqlm.nn.elman import Elman
from seqlm.nn.readout import StateReadout
from seqlm.nn.softmax import VocabLayerConfig, build_embedding, build_output
from seqlm.protocol import Batch, Capabilities, LMBase


def _rnnlm_training() -> TrainConfig:
    # Mini-batched training with the newbob schedule. Plain SGD, the toolkit's choice at one word per
    # update, learns far more slowly with 64 x 20-word batches (PTB valid ppl 410-490 after two epochs at
    # lr 4-16 against 214 for Adam; bench/logs), so Adam is the default here.
    return TrainConfig(optimizer="adam", lr=0.003, batch_size=64, seq_len=20, min_improvement=1.0, halving_epochs=6,
                       clip=1.0, max_epochs=30)


@dataclass
class RNNConfig:
    hidden: int = 200  # size H of the recurrent state s(t)
    embed: int = 0  # 0: the embedding is the input weight matrix itself (the paper's U), size hidden
    activation: str = "sigmoid"  # of the recurrent layer: sigmoid (the paper) | tanh
    output: str = "class"  # class: class-factorised (the paper's speed-up) | full | tree: faster-rnnlm's -hs
    classes: int = 0  # word classes of the class output, by frequency; 0 = round(sqrt(V))
    dropout: float = 0.0  # on the input embedding and the output layer's input; 0 = the paper's model
    tau: int = 5  # BPTT(tau): every position's error flows back through tau steps (1 = plain back-propagation)
    truncation: str = "exact"  # of BPTT: exact, each error flows back tau steps | block, as rnnlm's -bptt-block
    sentence_independent: bool = False  # restart the state at every sentence, in training and scoring (rescoring)
    vocab_layers: VocabLayerConfig = field(default_factory=VocabLayerConfig)  # NCE, sparse codes (full output)
    train: TrainConfig = field(default_factory=_rnnlm_training)

    def __post_init__(self) -> None:
        positive(self, "hidden", "tau")
        if self.embed < 0:
            raise SeqlmError(f"--embed must be 0 (= hidden, no extra projection) or positive, got {self.embed}")
        choice("activation", self.activation, ("sigmoid", "tanh"))
        choice("truncation", self.truncation, ("exact", "block"))
        choice("output", self.output, ("class", "full", "tree"))
        dropout_rate(self.dropout)
        if self.classes < 0:
            raise SeqlmError(f"--classes must be 0 (sqrt of the vocabulary) or positive, got {self.classes}")


class RNNLM(StateReadout, LMBase, nn.Module):
    def __init__(self, vocab: Vocab, hidden: int, embed: int, activation: str, output: str, classes: int,
                 tau: int, sentence_independent: bool, dropout: float = 0.0,
                 vocab_layers: VocabLayerConfig | None = None, truncation: str = "exact"):
        super().__init__()
        self.drop = ByteDropout(dropout)  # torch's CPU dropout cost 38% of the words/s (nn/dropout.py)
        self.vocab, self.tau, self.sentence_independent = vocab, tau, sentence_independent
        self.truncation = truncation
        vl = vocab_layers or VocabLayerConfig()
        self.embedding = build_embedding(vl, vocab, embed or hidden)
        if isinstance(self.embedding, nn.Embedding):
            nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        self.rnn = Elman(embed, hidden, activation)  # embed 0: the lookup already is W_x x(t)
        n_cls = min(classes or round(math.sqrt(len(vocab))), len(vocab))
        self.out = build_output(vl, vocab, hidden, self.embedding, output, n_cls)  # seqlm.nn.softmax

    def capabilities(self) -> Capabilities:
        # a model trained to restart at every sentence never learnt to use a carried state
        return Capabilities(stream=not self.sentence_independent, dynamic=True, quantizable=True,
                            sparse_targets=self.reads_targets())

    def forward(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        """(log-probs (B, T), next state). Training on a stream (autograd on, tau > 1), the state passed
        between chunks is (the state before the last tau-1 inputs, those inputs (B, tau-1)): each
        chunk first re-runs them, so BPTT(tau) reaches across the chunk edge (module docstring)."""
        if bool(batch.resets[:, 1:].any()):
            raise SeqlmError("rnn batches may start a sentence only in their first column")
        B, device = batch.inputs.shape[0], batch.inputs.device
        state, context = state if isinstance(state, tuple) else (state, None)
        if state is None or (self.sentence_independent and bool(batch.resets[:, 0].all())):
            # mid-sentence (the rest of a long line, seqlm.eval.perplexity) even this model carries its state
            state, context = self.rnn.initial_state(B, device), None  # (B, H)
        elif bool(batch.resets[:, 0].any()):
            if context is not None:  # a reset cuts the history: bring the other rows to the chunk edge
                with torch.no_grad():
                    _, state = self.rnn(self.embedding(context), state)  # (B, H)
                context = None
            state = torch.where(batch.resets[:, :1], self.rnn.initial_state(B, device), state)
        inputs = batch.inputs if context is None else torch.cat([context, batch.inputs], dim=1)  # (B, c+T)
        c = inputs.shape[1] - batch.inputs.shape[1]
        # block: one backward pass through all c+T steps, as rnnlm's -bptt-block (one (B, H) x (H, H) matmul a
        # step instead of tau-1); each position then reaches back further than tau, never less
        tau = self.tau if torch.is_grad_enabled() and self.truncation == "exact" else None
        # time first, the recurrence's own order: the batch is never transposed, only the ids and the scores
        x = self.drop(self.embedding(inputs.T))  # (c+T, B, E)
        h, last = self.rnn.forward_time_major(x, state, tau)  # (c+T, B, H), (B, H)
        hs, targets = self.drop(h[c:]).flatten(0, 1), batch.targets.T.flatten()  # (T*B, H), (T*B,)
        if self.training:  # the output layer's own training loss (the contract in seqlm.train.steps)
            loss = self.out.loss(hs, targets).view(-1, B).T  # (B, T)
            return None, self._next_state(inputs, h, state, last), loss.masked_fill(~batch.mask, 0.0)
        logp = self.out.target_log_probs(hs, targets).view(-1, B).T  # (B, T)
        return logp.masked_fill(~batch.mask, 0.0), self._next_state(inputs, h, state, last)

    def _next_state(self, inputs: Tensor, h: Tensor, h0: Tensor, last: Tensor) -> Any:
        """What the next chunk of a stream starts from: the last state, or in training (see forward)
        the state before the last tau-1 inputs and those inputs."""
        keep = min(self.tau - 1, inputs.shape[1])
        if keep == 0 or self.sentence_independent or not (self.training and torch.is_grad_enabled()):
            return last
        start = h[-keep - 1] if keep < inputs.shape[1] else h0  # (B, H); h is (c+T, B, H)
        return start, inputs[:, -keep:]

    def score(self, batch: Batch) -> Tensor:
        return self(batch, None)[0]

    def score_stream(self, batch: Batch, state: Tensor | None) -> tuple[Tensor, Tensor]:
        return self(batch, state)

    def initial_state(self, batch_size: int) -> Tensor:
        return self.rnn.initial_state(batch_size, next(self.parameters()).device)

    def step(self, tokens: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        state = self.recur(tokens, state)  # (B, H)
        return self.out.log_probs(state), state

    def recur(self, tokens: Tensor, state: Tensor) -> Tensor:
        """s(t) after reading tokens (B,), the output layer not computed (nn/readout.py)."""
        return self.rnn(self.embedding(tokens).unsqueeze(1), state)[1]  # (B, H)

    def readout(self, state: Tensor) -> Tensor:
        return state  # (B, H) s(t) is what the output layer reads


def rnn_batches(cfg: RNNConfig, vocab: Vocab):
    """A continuous stream in B rows (state carried), or whole sentences per row when sentence-independent."""

    def batches(stream: TokenStream, rng: np.random.Generator, shard: tuple[int, int]):
        t = cfg.train
        if not cfg.sentence_independent:
            return stream_batches(stream, vocab.bos_id, t.batch_size, t.seq_len, shard=shard)
        # only the (sentence, offset, length) plan is held; each batch is built when its turn comes
        groups = sentence_groups(stream, max_tokens=t.batch_size * t.seq_len, max_len=10**9)
        order = rng.permutation(len(groups))[shard[0] :: shard[1]]
        return Planned(len(order), (sentence_rows(stream, vocab.bos_id, groups[i]).batch for i in order))

    return batches


def build_rnn(cfg: RNNConfig, vocab: Vocab) -> RNNLM:
    return RNNLM(vocab, hidden=cfg.hidden, embed=cfg.embed, activation=cfg.activation, output=cfg.output,
                 classes=cfg.classes, tau=cfg.tau, sentence_independent=cfg.sentence_independent,
                 dropout=cfg.dropout, vocab_layers=cfg.vocab_layers, truncation=cfg.truncation)
