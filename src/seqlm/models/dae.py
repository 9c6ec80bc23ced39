"""Discrete sequence autoencoder (Kaiser & Bengio 2018, discrete-autoencoders.txt): a Transformer LM that
peeks at a discrete code c(s) of the sentence it predicts.

Each sentence s (its tokens and `</s>`) is embedded, shortened K = 2^k times and discretised to c(s)
(seqlm.nn.compress, seqlm.nn.bottleneck: b bits a symbol). The sequence model reads the dense c(s) reversed,
a separator, then s, and is scored on s only (Sec. 2.3, Figure 2). A separate latent model with its own
parameters predicts the symbols of c(s) (trained on them at the same time, on detached symbols), so a code
can be sampled and then decoded by beam search (Sec. 4).

`peek false` builds the same network with the prefix cut off by the attention mask: the baseline of equal
capacity, against which `seqlm dsae` measures how many of the b / K bits per token the code saves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from seqlm import checkpoint as ckpt
from seqlm.config import TrainConfig, choice, dropout_rate, non_negative, positive
from seqlm.data.batching import Planned, sentence_groups, sentence_rows
from seqlm.data.corpus import TokenStream
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.models.transformer import TransformerLM
from seqlm.nn.bottleneck import GumbelBottleneck, SemanticHashing
from seqlm.nn.compress import Compress
from seqlm.protocol import Batch, Capabilities, LMBase


def _dae_training() -> TrainConfig:
    # rows of whole sentences, about batch_size x seq_len tokens a batch (seq_len is not a row length here)
    return TrainConfig(optimizer="adamw", lr=1e-3, weight_decay=0.01, schedule="warmup-cosine", warmup_steps=100,
                       min_lr=1e-5, batch_size=16, seq_len=256, clip=1.0, max_epochs=10, precision="bf16")


@dataclass
class DAEConfig:
    layers: int = 2  # sequence model: Transformer blocks
    d_model: int = 256  # sequence model: hidden size (also c(s)'s)
    heads: int = 4  # sequence model: attention heads
    d_ff: int = 1024  # sequence model: feed-forward size
    context: int = 640  # positions a window reads: c(s), the separator, s (a longer s slides on, out of sight of c(s))
    dropout: float = 0.1  # sequence model dropout
    bottleneck: str = "semhash"  # semhash (improved semantic hashing) | gumbel (Gumbel-softmax)
    k: int = 3  # c(s) is K = 2^k times shorter than s
    bits: int = 16  # b: bits per latent symbol (2^b symbols)
    local: bool = False  # c(s) from strided convolutions only: symbol j sees only its own K tokens
    filter_size: int = 1024  # semhash decompression network width (paper 4096 at d_model 512)
    noise_std: float = 1.0  # semhash: std of the training noise on the pre-activation (paper 1.0)
    hard_fraction: float = 0.5  # semhash: share of sequences fed hard bits in training (paper 1/2)
    hard_warmup: int = 0  # semhash: steps over which that share rises from 0 (0: from the first step, the paper)
    balance_bits: bool = False  # semhash: batch-normalise each bit (not in the paper; keeps bits from going constant)
    pretrain_steps: int = 200  # training steps with c(s) = s' (no discretisation; paper 10000)
    tau_start: float = 1.0  # gumbel: initial temperature
    tau_min: float = 0.1  # gumbel: lowest temperature
    anneal_rate: float = 1e-3  # gumbel: tau = max(tau_min, tau_start exp(-rate step))
    peek: bool = True  # false: the sequence model cannot see c(s) (the equal-capacity baseline)
    code_positions: str = "segment"  # segment: s's positions follow c(s)'s | fixed: s starts at one position always
    latent_layers: int = 1  # latent model (predicts c(s) for sampling): Transformer blocks
    latent_d_model: int = 64  # latent model: hidden size
    latent_share: float = 0.125  # share of a batch's rows the latent model learns from (it is costly, and only samples)
    train: TrainConfig = field(default_factory=_dae_training)

    def __post_init__(self) -> None:
        positive(self, "layers", "d_model", "heads", "d_ff", "context", "bits", "filter_size", "latent_layers",
                 "latent_d_model", "tau_start", "tau_min")
        non_negative(self, "k", "noise_std", "pretrain_steps", "anneal_rate", "hard_warmup")
        choice("bottleneck", self.bottleneck, ("semhash", "gumbel"))
        choice("code_positions", self.code_positions, ("segment", "fixed"))
        dropout_rate(self.dropout)
        if self.d_model % self.heads:
            raise SeqlmError(f"--d-model ({self.d_model}) must be a multiple of --heads ({self.heads})")
        if self.bits > 20 or (self.bottleneck == "gumbel" and self.bits > 16):
            raise SeqlmError(f"--bits {self.bits}: at most 20 (16 with gumbel: it keeps 2^b embeddings)")
        if not 0.0 < self.latent_share <= 1.0:
            raise SeqlmError(f"--latent-share must be in (0, 1], got {self.latent_share}")
        if not 0.0 <= self.hard_fraction <= 1.0:
            raise SeqlmError(f"--hard-fraction must be in [0, 1], got {self.hard_fraction}")

    @property
    def K(self) -> int:
        return 2**self.k


def latent_vocab(bits: int) -> Vocab:
    """Latent symbol i is token i + 2 (after </s> and <unk>)."""
    return Vocab(["</s>", "<unk>"] + [str(i) for i in range(2**bits)])


class DAELM(LMBase, nn.Module):
    """The sequence model `lm` reading c(s) from `code`, and the `latent` model of the symbols."""

    def __init__(self, vocab: Vocab, lm: TransformerLM, code: Compress, latent: TransformerLM, bits: int, peek: bool,
                 latent_share: float = 1.0, fixed_start: int = 0):
        super().__init__()
        self.vocab, self.lm, self.code, self.latent, self.bits, self.peek = vocab, lm, code, latent, bits, peek
        self.latent_share = latent_share
        self.fixed_start = fixed_start  # > 0: the separator's position, whatever c(s)'s length (s follows it)
        self.sep = nn.Parameter(torch.randn(lm.embed.embedding_dim) * 0.02)

    def capabilities(self) -> Capabilities:
        return Capabilities(peeks=bool(self.peek), quantizable=True)

    def _prefixed(self, dense: Tensor, m: Tensor, tail: Tensor) -> tuple[Tensor, Tensor]:
        """[reversed c(s), separator, tail] (B, M + 1 + T, D) and its resets. Rows with fewer symbols are padded
        on the left; the padding is a segment of its own, so nobody attends to it (nor, without peek, to c(s))."""
        B, M, _ = dense.shape
        prefix = dense.flip(1)  # (B, M, D) row b: M - M_b padding columns, then c_{M_b - 1} ... c_0
        resets = torch.zeros(B, M + 1 + tail.shape[1], dtype=torch.bool, device=dense.device)
        resets[torch.arange(B), M - m.sum(1)] = True  # the first symbol of each row starts its segment
        if not self.peek:
            resets[:, M] = True  # the separator starts a new segment: c(s) is invisible
        sep = self.sep.to(tail.dtype).expand(B, 1, -1)
        return torch.cat([prefix.to(tail.dtype), sep, tail], dim=1), resets

    def _positions(self, x: Tensor, m_max: int) -> Tensor | None:
        """(B, L) positions of [c(s) left-padded to m_max symbols, separator, s] with the separator at
        `fixed_start` in every row, so a token of s has the same position whatever the length of c(s)."""
        if not self.fixed_start:
            return None
        if m_max > self.fixed_start:  # positions would go negative, into the learned table from its end
            raise SeqlmError(f"a code of {m_max} symbols does not fit before the separator's fixed position "
                             f"({self.fixed_start}, --code-positions fixed): give at most {self.fixed_start} symbols")
        pos = self.fixed_start - m_max + torch.arange(x.shape[1], device=x.device)  # (L,) >= 0: m_max <= start
        return pos.unsqueeze(0).expand(x.shape[0], -1)

    def encode(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """c(s) of each row's sentence (its targets): dense (B, M, D), symbols (B, M), mask (B, M)."""
        if not bool(batch.resets[:, 0].all()) or bool(batch.resets[:, 1:].any()):
            raise SeqlmError("dae rows must hold one whole sentence each (sentence mode)")
        return self.code(self.lm.embed(batch.targets), batch.mask)

    def forward(self, batch: Batch, state: None = None):
        dense, symbols, m = self.encode(batch)
        x, resets = self._prefixed(dense, m, self.lm.embed(batch.inputs))
        pos = self._positions(x, dense.shape[1])
        # Without peek nobody attends to c(s): read from the separator on, a sentence longer than the context
        # slides its windows where `step`, which starts at the separator, slides them.
        skip = 0 if self.peek else dense.shape[1]
        h = self.lm.windows(x[:, skip:], resets[:, skip:], pos=None if pos is None else pos[:, skip:])
        h = h[:, dense.shape[1] + 1 - skip :]  # (B, T, D)
        logp = self.lm.target_logp(h, batch)  # (B, T)
        if not self.training:
            return logp, None
        loss = -logp
        n = max(1, round(self.latent_share * len(symbols)))  # the latent model learns from the first n rows
        loss[:n, 0] += self._latent_nll(symbols[:n], m[:n])  # each row's code loss rides on its first token
        return logp, None, loss

    def _latent_nll(self, symbols: Tensor, m: Tensor) -> Tensor:
        """(B,) -ln p(c(s)) under the latent model, </s> after the last symbol (its own parameters)."""
        B = symbols.shape[0]
        tgt = torch.where(m, symbols.detach() + 2, 0)  # (B, M) tokens; padding reads as </s>
        tgt = torch.cat([tgt, tgt.new_zeros(B, 1)], dim=1)  # (B, M + 1)
        inp = torch.cat([tgt.new_zeros(B, 1), tgt[:, :-1]], dim=1)
        mask = torch.cat([m.new_ones(B, 1), m], dim=1)  # symbols and the </s> after them
        resets = torch.zeros_like(mask)
        resets[:, 0] = True
        return -self.latent(Batch(inp, tgt, mask, resets))[0].sum(1)

    def score(self, batch: Batch) -> Tensor:
        return self(batch)[0]

    # -- generation --------------------------------------------------------------------------------------
    def start_state(self, symbols: Tensor) -> tuple:
        """The state after reading reversed c(s) (symbols (B, M)) and the separator: a sentence start."""
        dense = self.code.bottleneck.embed_symbols(symbols)  # (B, M, D)
        m = torch.ones_like(symbols, dtype=torch.bool)
        x, resets = self._prefixed(dense, m, dense.new_zeros(symbols.shape[0], 0, dense.shape[-1]))
        return self.lm.prime(x, resets, self._positions(x, symbols.shape[1]))

    def initial_state(self, batch_size: int) -> tuple:
        """A sentence start with an empty code (the sequence model after the separator alone)."""
        return self.start_state(torch.zeros(batch_size, 0, dtype=torch.long, device=self.sep.device))

    def step(self, tokens: Tensor, state: tuple) -> tuple[Tensor, tuple]:
        return self.lm.step(tokens, state)

    def select_state(self, state: tuple, rows: Tensor) -> tuple:
        return self.lm.select_state(state, rows)

    def cat_states(self, states: list[tuple]) -> tuple:
        return self.lm.cat_states(states)

    def sample_codes(self, num: int, gen: torch.Generator, max_symbols: int) -> list[list[int]]:
        from seqlm.eval.generate import sample_ids

        return [[t - 2 for t in ids if t >= 2] for ids in sample_ids(self.latent, num, gen, max_len=max_symbols)]

    def generate_lines(self, args) -> list[str]:
        from seqlm.eval.generate import run_dae_generate

        return run_dae_generate(self, args)


PEEK_NOTE = ("p(s|c(s)): c(s) is computed from the very text scored (a dae model peeks at it); not a language "
             "model's p(s)")


def saved_model_peeks(path: str | Path, depth: int = 0) -> bool:
    """Whether the model saved at `path` peeks at the text it scores: a dae model with peek (its default), or
    a mixture holding one. Read from config.json alone, before loading; a file it cannot read is `load`'s to
    report, so it says False then."""
    cfg = Path(path) / ckpt.CONFIG
    try:
        meta = json.loads(cfg.read_text(encoding="utf-8"))
        if meta["family"] == "dae":
            return bool(meta["model"].get("peek", DAEConfig.peek))
        if meta["family"] == "mix" and depth < 8:
            return any(saved_model_peeks(Path(path) / str(c), depth + 1) for c in meta["model"]["components"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return False


def refuse_peeking(paths: list[str], allow: bool) -> str | None:
    """`eval/score/rescore/interpolate`: refuse a model that peeks unless `--allow-peek`; then the note to print."""
    peeking = [p for p in paths if saved_model_peeks(p)]
    if peeking and not allow:
        raise SeqlmError(f"{peeking[0]} peeks at the text it scores: its figure would be p(s|c(s)) with c(s) "
                         "computed from that very text, not p(s); compare it with `seqlm dsae BASELINE DAE`, or "
                         "pass --allow-peek to get that figure")
    return PEEK_NOTE if peeking else None


def dae_batches(cfg: DAEConfig, vocab: Vocab):
    """Whole sentences, one per row (c(s) is a code of one sentence), rows grouped by length."""

    def batches(stream: TokenStream, rng: np.random.Generator, shard: tuple[int, int]):
        t = cfg.train
        groups = sentence_groups(stream, max_tokens=t.batch_size * t.seq_len, max_len=10**9)
        order = rng.permutation(len(groups))[shard[0] :: shard[1]]
        return Planned(len(order), (sentence_rows(stream, vocab.bos_id, groups[i]).batch for i in order))

    return batches


def build_dae(cfg: DAEConfig, vocab: Vocab) -> DAELM:
    lm = TransformerLM(vocab, layers=cfg.layers, d_model=cfg.d_model, heads=cfg.heads, d_ff=cfg.d_ff,
                       context=cfg.context, stride=cfg.context // 2, positions="learned", tie_embeddings=True,
                       dropout=cfg.dropout)
    if cfg.bottleneck == "semhash":
        neck: nn.Module = SemanticHashing(cfg.d_model, cfg.bits, cfg.filter_size, cfg.noise_std, cfg.hard_fraction,
                                           cfg.hard_warmup, cfg.balance_bits)
    else:
        neck = GumbelBottleneck(cfg.d_model, cfg.bits, cfg.tau_start, cfg.tau_min, cfg.anneal_rate)
    code = Compress(cfg.d_model, cfg.k, neck, local=cfg.local, pretrain_steps=cfg.pretrain_steps)
    # the code of a sentence longer than the context is longer than the latent model's: it slides windows too
    latent_context = cfg.context // cfg.K + 2
    latent = TransformerLM(latent_vocab(cfg.bits), layers=cfg.latent_layers, d_model=cfg.latent_d_model,
                           heads=max(1, cfg.latent_d_model // 32), d_ff=4 * cfg.latent_d_model,
                           context=latent_context, stride=latent_context // 2, positions="learned",
                           tie_embeddings=True, dropout=0.0)
    # fixed positions: the separator after the most symbols a sentence that fits the context can have
    fixed_start = cfg.context // cfg.K + 1 if cfg.code_positions == "fixed" else 0
    return DAELM(vocab, lm, code, latent, bits=cfg.bits, peek=cfg.peek, latent_share=cfg.latent_share,
                 fixed_start=fixed_start)
