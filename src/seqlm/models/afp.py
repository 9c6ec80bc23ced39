"""Family `afp`: the Elman RNN LM with approximate fixed-point histories (approximate-fixed-points-rnn.txt).

The model is the `rnn` family's model — same embedding, Elman layer and output layer (class or full),
same parameter names, so checkpoints of either family load into the other — with another history rule:
h^(K), K fixed-point iterations over the whole batch (seqlm.nn.fixed_point), trained by back-propagating
through those K parallel iterations (autograd; no sequential BPTT, so `tau` does not apply).
An AFP-K model predicts from its last K input tokens only: it is a finite-context model of order K + 1
and declares so (Capabilities.context_order, protocol.py), which the lattice rescorer reads.

`with_iterations(model, K)` puts another history rule on any Elman LM (an `rnn` or an `afp` model, sharing
its weights): `seqlm eval --iterations K|exact`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
from torch import Tensor, nn

from seqlm.config import TrainConfig, positive
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.models.rnn import RNNLM, RNNConfig, build_rnn, rnn_batches
from seqlm.nn.elman import Elman
from seqlm.nn.fixed_point import fixed_point, window_state
from seqlm.protocol import Batch, Capabilities, LMBase


def _rnn_training() -> TrainConfig:
    return RNNConfig().train  # the rnn family's recipe (Adam, 64 x 20 batches, newbob): a like-for-like comparison


@dataclass
class AFPConfig:
    iterations: int = 4  # K fixed-point iterations: the history is the last K words (an order K+1 model)
    hidden: int = 200  # Elman state size H
    embed: int = 0  # 0: the embedding is the input weight matrix itself (the paper's V), size hidden
    activation: str = "sigmoid"  # sigmoid | tanh (phi)
    output: str = "class"  # class | full softmax
    classes: int = 0  # 0: round(sqrt(V))
    dropout: float = 0.0  # on the input embedding and the output layer's input
    sentence_independent: bool = False  # training batches of whole sentences instead of a carried stream
    train: TrainConfig = field(default_factory=_rnn_training)

    def __post_init__(self) -> None:
        positive(self, "iterations")
        self.as_rnn()  # the Elman fields are validated by the rnn family's own config

    def as_rnn(self) -> RNNConfig:
        """The rnn family's config of the same network (tau is moot: AFP does not back-propagate in time)."""
        shared = {f.name: getattr(self, f.name) for f in fields(RNNConfig) if hasattr(self, f.name)}
        return RNNConfig(**shared)


class AFPLM(LMBase, nn.Module):
    """An Elman LM whose history is h^(K) (iterations K) or the exact recurrence (iterations None).

    The modules are passed in (composition): `build_afp` takes them from a freshly built rnn-family model,
    `with_iterations` from a loaded one.
    """

    def __init__(self, vocab: Vocab, embedding: nn.Embedding, rnn: Elman, out: nn.Module, drop: nn.Module,
                 iterations: int | None, sentence_independent: bool):
        super().__init__()
        self.vocab, self.iterations, self.sentence_independent = vocab, iterations, sentence_independent
        self.drop, self.embedding, self.rnn, self.out = drop, embedding, rnn, out

    def capabilities(self) -> Capabilities:
        # AFP-K is a finite-context model of order K + 1 (exact lattice expansion); exact: unbounded
        order = None if self.iterations is None else self.iterations + 1
        return Capabilities(stream=not self.sentence_independent, context_order=order, dynamic=True,
                            quantizable=True)

    def describe(self) -> dict[str, str]:
        if self.iterations is None:
            return {"history": "exact (sequential Elman recurrence, unbounded history)"}
        return {"history": f"fixed-point, K={self.iterations} iterations (finite context: order "
                           f"{self.iterations + 1})"}

    def _states(self, x: Tensor, h_first: Tensor, resets: Tensor) -> Tensor:
        """Hidden states (B, T, H) of inputs x (B, T, E) under this model's history rule."""
        if self.iterations is not None:
            return fixed_point(self.rnn, x, h_first, resets, self.iterations)  # (B, T, H)
        if bool(resets[:, 1:].any()):
            raise SeqlmError("exact Elman batches may start a sentence only in their first column")
        h0 = self.rnn.initial_state(x.shape[0], x.device)  # (B, H)
        return self.rnn(x, torch.where(resets[:, :1], h0, h_first))[0]  # (B, T, H)

    def forward(self, batch: Batch, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        B = batch.inputs.shape[0]
        if state is None or (self.sentence_independent and bool(batch.resets[:, 0].all())):
            # mid-sentence (the rest of a long line, seqlm.eval.perplexity) even this model carries its state
            state = self.rnn.initial_state(B, batch.inputs.device)  # (B, H)
        h = self._states(self.drop(self.embedding(batch.inputs)), state, batch.resets)  # (B, T, H)
        logp = self.out.target_log_probs(self.drop(h).flatten(0, 1), batch.targets.flatten()).view(B, -1)  # (B, T)
        return logp.masked_fill(~batch.mask, 0.0), h[:, -1]

    def score(self, batch: Batch) -> Tensor:
        return self(batch, None)[0]

    def score_stream(self, batch: Batch, state: Tensor | None) -> tuple[Tensor, Tensor]:
        """Stream mode (`eval --stream`). Exact rule: the hidden state is carried. AFP-K: the state is the
        window of the last K input ids (B, K) (-1 before the text's or the last sentence start's first
        input, as in `step`), read again before each chunk, so every position's history is its last K inputs
        whatever the chunk length. (TBPTT training instead carries h^(K) of the previous chunk's last position
        into its first K positions: `forward`.)"""
        if self.iterations is None:
            return self(batch, state)
        K, (B, T) = self.iterations, batch.inputs.shape
        window = self.initial_state(B) if state is None else state  # (B, K)
        ids = torch.cat([window, batch.inputs], dim=1)  # (B, K + T)
        prev_gone = torch.cat([torch.ones_like(ids[:, :1], dtype=torch.bool), ids[:, :-1] < 0], dim=1)
        resets = prev_gone | torch.cat([torch.zeros_like(window, dtype=torch.bool), batch.resets], dim=1)  # (B, K+T)
        x = self.drop(self.embedding(ids.clamp(min=0)))  # (B, K + T, E)
        h = fixed_point(self.rnn, x, self.rnn.initial_state(B, x.device), resets, K)[:, K:]  # (B, T, H)
        logp = self.out.target_log_probs(self.drop(h).flatten(0, 1), batch.targets.flatten()).view(B, T)  # (B, T)
        col = torch.arange(K, device=ids.device)
        last = torch.where(resets[:, -K:], col, -1).max(dim=1, keepdim=True).values  # (B, 1) last start in it
        return logp.masked_fill(~batch.mask, 0.0), torch.where(col >= last, ids[:, -K:], -1)  # (B, K)

    def initial_state(self, batch_size: int) -> Tensor:
        """Exact: s(0) (B, H). AFP-K: the window of the last K token ids (B, K), -1 before the start."""
        device = self.embedding.weight.device
        if self.iterations is None:
            return self.rnn.initial_state(batch_size, device)
        return torch.full((batch_size, self.iterations), -1, dtype=torch.long, device=device)

    def _read(self, tokens: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """(hidden state (B, H) after reading tokens (B,), the new protocol state)."""
        if self.iterations is None:
            _, state = self.rnn(self.embedding(tokens).unsqueeze(1), state)  # (B, H)
            return state, state
        window = torch.cat([state[:, 1:], tokens.view(-1, 1)], dim=1)  # (B, K) the last K inputs
        return window_state(self.rnn, self.embedding(window.clamp(min=0)), window >= 0), window  # (B, H)

    def step(self, tokens: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        h, state = self._read(tokens, state)  # (B, H)
        return self.out.log_probs(h), state

    def step_targets(self, tokens: Tensor, state: Tensor, rows: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """`step`, but only ln p of targets (N,) after rows (N,): no (B, V) distribution (lattice rescoring)."""
        h, state = self._read(tokens, state)  # (B, H)
        return self.out.pair_log_probs(h, rows, targets), state  # (N,) each row's class distribution once


def with_iterations(model: nn.Module, iterations: int | None) -> AFPLM:
    """The same Elman LM (shared weights) under another history rule: K iterations, or None = exact."""
    if not isinstance(model, (RNNLM, AFPLM)):
        raise SeqlmError("--iterations applies to Elman RNN models (families rnn and afp) only")
    view = AFPLM(model.vocab, model.embedding, model.rnn, model.out, model.drop, iterations,
                 model.sentence_independent)
    view.family, view.data_config = model.family, model.data_config
    if "config" in vars(model):  # set by seqlm.load / new_model, absent on a bare build
        view.config = model.config
    view.train(model.training)
    return view


def parse_iterations(text: str) -> int | None:
    """`--iterations` value: a positive K, or `exact`."""
    if text == "exact":
        return None
    if not text.isdigit() or int(text) < 1:
        raise SeqlmError(f"--iterations must be a positive number of fixed-point iterations or 'exact', got {text!r}")
    return int(text)


def afp_batches(cfg: AFPConfig, vocab: Vocab):
    """The rnn family's batches (a carried stream in rows, or whole sentences) for the same comparison."""
    return rnn_batches(cfg.as_rnn(), vocab)


def build_afp(cfg: AFPConfig, vocab: Vocab) -> AFPLM:
    rnn = build_rnn(cfg.as_rnn(), vocab)  # same layers and initialisation as the rnn family
    return AFPLM(vocab, rnn.embedding, rnn.rnn, rnn.out, rnn.drop, cfg.iterations, cfg.sentence_independent)
