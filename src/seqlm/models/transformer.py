"""Decoder-only Transformer LM (Vaswani et al. 2017; the sequence model of discrete-autoencoders.txt).

Pre-norm blocks (seqlm.nn.transformer) over token embeddings plus learned or sinusoidal positions, a final
layer norm and a softmax whose weights are the input embeddings when `tie_embeddings` is set.

Context window. A prediction attends to at most `context` (W) earlier tokens of its own sentence (sentence
mode) or of the text (stream mode). Text longer than W is read in windows: the first W tokens in one
window, then S = `stride` new tokens at a time, each window re-reading the W - S tokens before them with
positions counted from the window's start. `step` follows the same windows with a key/value cache: when
the cache is full it is rebuilt from the last W - S tokens, so generation costs O(W) a token, never
O(length^2), and gives the probabilities `score` gives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlm.config import TrainConfig, choice, dropout_rate, positive
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.nn.cross_entropy import linear_cross_entropy
from seqlm.nn.dropout import ByteDropout
from seqlm.nn.transformer import Block, segment_layout, sinusoidal_positions
from seqlm.protocol import Batch, Capabilities, LMBase

State = tuple[Tensor, Tensor, Tensor, Tensor]  # step's cache: ids (B, S), keys, values, next position (B,)

SIZES = {  # the paper's configurations (discrete-autoencoders.txt, "Transformer"): layers, d_model, d_ff, heads
    "base": (6, 512, 4096, 8),  # "6 layers, hidden size of 512 and filter size of 4096"
    "small": (3, 384, 2048, 6),  # the noise ablation's "3 layers, hidden size of 384 and filter size of 2048"
}


def _transformer_training() -> TrainConfig:
    # The usual Transformer recipe (AdamW, linear warm-up, cosine decay over the planned epochs) at a CPU size:
    # rows of `context` packed tokens.
    return TrainConfig(optimizer="adamw", lr=1e-3, weight_decay=0.01, schedule="warmup-cosine", warmup_steps=100,
                       min_lr=1e-5, batch_size=16, seq_len=128, clip=1.0, max_epochs=10, precision="bf16")


@dataclass
class TransformerConfig:
    layers: int = 4  # Transformer blocks
    hidden: int = 256  # hidden size, d_model (--d-model: its old name, still accepted)
    heads: int = 4  # attention heads (hidden must be a multiple)
    d_ff: int = 1024  # feed-forward ("filter") size
    # a paper size for the four above: small (3 x 384, filter 2048, 6 heads) | base (6 x 512, 4096, 8 heads);
    # any of the four given with it wins (the size is then recorded as ""); "" = none
    size: str = ""
    context: int = 128  # W: the most tokens a prediction attends to; learned positions go up to W
    stride: int = 0  # S: new tokens per window when a text is longer than W; 0 = W / 2
    positions: str = "learned"  # learned | sinusoidal
    tie_embeddings: bool = True  # output softmax weights = input embeddings (the lstm family's flag too)
    dropout: float = 0.1  # on embeddings, attention weights and sub-layer outputs
    cross_sentence: bool = False  # training: packed sentences attend to earlier ones (a model for stream mode)
    train: TrainConfig = field(default_factory=_transformer_training)

    # What `size` sets. seqlm.config.apply_overrides applies it before the other options and clears the name
    # when one of them changes a field it set, so applying it again here (a size given by keyword) is a no-op
    # for a parsed or saved config: an explicit option is never overridden.
    PRESETS: ClassVar[dict[str, dict[str, dict[str, int]]]] = {
        "size": {name: dict(zip(("layers", "hidden", "d_ff", "heads"), v, strict=True)) for name, v in SIZES.items()}
    }

    def __post_init__(self) -> None:
        choice("size", self.size, ("", *SIZES))
        for key, value in self.PRESETS["size"].get(self.size, {}).items():
            setattr(self, key, value)
        positive(self, "layers", "hidden", "heads", "d_ff", "context")
        choice("positions", self.positions, ("learned", "sinusoidal"))
        dropout_rate(self.dropout)
        if self.hidden % self.heads:
            raise SeqlmError(f"--hidden ({self.hidden}) must be a multiple of --heads ({self.heads})")
        if self.context < 2 or not 0 <= self.stride < self.context:
            raise SeqlmError(f"--context must be at least 2 and --stride in [0, context); got {self.context}, "
                             f"{self.stride}")

    @property
    def d_model(self) -> int:  # the name in the Transformer papers and in config.json files before the rename
        return self.hidden

    @property
    def window_stride(self) -> int:
        return self.stride or self.context // 2


class TransformerLM(LMBase, nn.Module):
    def __init__(self, vocab: Vocab, layers: int, d_model: int, heads: int, d_ff: int, context: int, stride: int,
                 positions: str, tie_embeddings: bool, dropout: float, cross_sentence: bool = False):
        super().__init__()
        self.vocab, self.context, self.stride, self.cross_sentence = vocab, context, stride, cross_sentence
        self.embed = nn.Embedding(len(vocab), d_model)
        if positions == "learned":
            self.pos = nn.Parameter(torch.zeros(context, d_model))
        else:
            self.register_buffer("pos", sinusoidal_positions(context, d_model), persistent=False)
        self.drop = ByteDropout(dropout)  # a byte a mask element, not bernoulli_'s float (nn/dropout.py)
        self.blocks = nn.ModuleList(Block(d_model, heads, d_ff, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        # tied: no separate parameter, so safetensors never sees two names for one tensor
        self.out = None if tie_embeddings else nn.Linear(d_model, len(vocab), bias=False)
        self.apply(_init)
        if positions == "learned":
            nn.init.normal_(self.pos, std=0.02)

    def capabilities(self) -> Capabilities:
        # trained on separate sentences, it never saw a history crossing a `</s>`: no stream mode (scored so,
        # its perplexity more than doubles); beyond `context` positions its history slides
        return Capabilities(stream=self.cross_sentence, window=self.context, dynamic=True, quantizable=True)

    # -- the network ---------------------------------------------------------------------------------------
    def run(self, x: Tensor, resets: Tensor, pos: Tensor | None = None) -> tuple[Tensor, list]:
        """Input vectors (B, L, D) of rows of segments (L <= context) -> final hidden (B, L, D), per-layer K/V.
        `pos` (B, L): positions to use instead of each segment's own 0, 1, ... (a prefix read before a segment)."""
        seg_pos, mask = segment_layout(resets)  # (B, L), (B, 1, L, L)
        pos = seg_pos if pos is None else pos
        h = self.drop(x + self.pos[pos])  # (B, L, D)
        kvs = []
        for block in self.blocks:
            h, kv = block(h, mask)
            kvs.append(kv)
        return self.norm(h), kvs

    def logits(self, h: Tensor) -> Tensor:
        if self.out is not None:
            return self.out(h)  # (..., V) through the module, so that `seqlm quantize` can make it int8
        return h @ self.embed.weight.t()  # (..., V)

    def untie(self) -> bool:
        """Give a tied model its own output matrix, a copy of the embeddings (same function): `seqlm quantize`
        can then make the output product int8 while the lookup stays float. True if it was tied."""
        if self.out is not None:
            return False
        self.out = nn.Linear(self.embed.embedding_dim, self.embed.num_embeddings, bias=False)
        self.out.weight = nn.Parameter(self.embed.weight.detach().clone())  # (V, D)
        return True

    def windows(self, x: Tensor, resets: Tensor, n_hist: int = 0, pos: Tensor | None = None) -> Tensor:
        """Final hidden (B, L - n_hist, D) of columns n_hist.. of (B, L) rows, read in the windows of the module
        docstring: one window [0, W), then windows [e - (W - S), e + S) for e = W, W + S, ...

        All windows of all rows go through the network as one batch.
        """
        B, L, _ = x.shape
        W, S = self.context, self.stride
        if L <= W:
            return self.run(x, resets, pos)[0][:, n_hist:]
        if pos is not None:
            raise SeqlmError(f"a row of {L} positions with given positions does not fit the context ({W})")
        firsts = [0] + [e - (W - S) for e in range(W, L, S)]  # window starts; the last may run past L
        idx = torch.tensor(firsts, device=x.device).unsqueeze(1) + torch.arange(W, device=x.device)  # (N, W)
        idx = idx.clamp(max=L - 1)  # columns past the end repeat the last one; their outputs are dropped
        xw = x[:, idx].flatten(0, 1)  # (B*N, W, D)
        rw = resets[:, idx].flatten(0, 1)  # (B*N, W)
        h = self.run(xw, rw)[0].view(B, len(firsts), W, -1)  # (B, N, W, D)
        parts = [h[:, 0, n_hist:W]] + [h[:, k, W - S :] for k in range(1, len(firsts))]
        return torch.cat(parts, dim=1)[:, : L - n_hist]  # (B, L - n_hist, D)

    def target_logp(self, h: Tensor, batch: Batch) -> Tensor:
        targets = batch.targets.flatten()  # (B*T,)
        weight = self._output_weight()
        if torch.is_grad_enabled() and weight is not None:
            # training: nn/cross_entropy.py's fused loss, log Z in float32 a block of rows at a time and the
            # logits overwritten by their own gradient, where cross_entropy's log-softmax, its backward and the
            # zero-filled gradient were a fifth of a bf16 step (4 x 256, V = 10k: 621 against 771 ms a step)
            nll = linear_cross_entropy(h.flatten(0, 1), weight, None, targets)  # (B*T,)
        else:  # in the logits' own dtype (evaluation runs in float32)
            nll = F.cross_entropy(self.logits(h).flatten(0, 1), targets, reduction="none")  # (B*T,)
        return (-nll.float()).view_as(batch.targets).masked_fill(~batch.mask, 0.0)  # (B, T)

    def _output_weight(self) -> Tensor | None:
        """The (V, D) output matrix where `logits` is a plain product with it; None for another module (int8)."""
        if self.out is None:
            return self.embed.weight
        return self.out.weight if type(self.out) is nn.Linear and self.out.bias is None else None

    # -- the protocol --------------------------------------------------------------------------------------
    def forward(self, batch: Batch, state: None = None) -> tuple[Tensor, None]:
        resets = batch.resets
        if self.training and self.cross_sentence:  # what stream mode shows the model: </s> then the next sentence
            resets = torch.zeros_like(resets)
        h = self.windows(self.embed(batch.inputs), resets)  # (B, T, D)
        return self.target_logp(h, batch), None

    def score(self, batch: Batch) -> Tensor:
        return self(batch)[0]

    def score_stream(self, batch: Batch, state: Tensor | None) -> tuple[Tensor, Tensor]:
        """Stream mode: the state is the inputs of the window the last input was read in (B, <= W), read again
        before the next call, so windows fall where they would in one call over the whole text: the scores do
        not depend on the chunk length."""
        inputs, resets = batch.inputs, batch.resets
        if state is not None and state.shape[1] and not bool(resets[:, 0].all()):
            inputs = torch.cat([state, inputs], dim=1)  # (B, h + T)
            resets = torch.cat([torch.zeros_like(state, dtype=torch.bool), resets], dim=1)
        n_hist = inputs.shape[1] - batch.inputs.shape[1]
        h = self.windows(self.embed(inputs), resets, n_hist)  # (B, T, D)
        L, W, S = inputs.shape[1], self.context, self.stride
        last = 0 if L <= W else ((L - 1 - W) // S + 1) * S  # the start of the last window `windows` read
        return self.target_logp(h, batch), inputs[:, last:]

    # -- generation: the key/value cache ---------------------------------------------------------------------
    # A `step` state is (ids (B, S), keys, values (B, layers, heads, S, head_dim), pos (B,)): column j holds the
    # input whose key and value are at j (-1 marks left padding, masked out of attention), pos is the position
    # of the next input. Rows of different lengths share a batch by left padding (`cat_states`), so lattice
    # expansion can batch histories of any lengths; each row gives what it would give alone.
    def initial_state(self, batch_size: int) -> State:
        dev = self.embed.weight.device
        first = self.blocks[0].attn
        d_head = self.embed.embedding_dim // first.heads
        kv = torch.zeros(batch_size, len(self.blocks), first.heads, 0, d_head, device=dev)
        ids = torch.zeros(batch_size, 0, dtype=torch.long, device=dev)
        return ids, kv, kv.clone(), torch.zeros(batch_size, dtype=torch.long, device=dev)

    def select_state(self, state: State, rows: Tensor) -> State:
        """protocol.select_state: rows (R,) of a cache, left padding they all share dropped."""
        ids, k, v, pos = (t.index_select(0, rows.to(t.device)) for t in state)
        pad = int((ids < 0).sum(1).min()) if len(ids) else 0  # padding is on the left only
        return ids[:, pad:], k[:, :, :, pad:], v[:, :, :, pad:], pos

    def cat_states(self, states: list[State]) -> State:
        """protocol.cat_states: caches of any lengths in one batch, shorter ones padded on the left."""
        S = max(s[0].shape[1] for s in states)
        ids = torch.cat([F.pad(s[0], (S - s[0].shape[1], 0), value=-1) for s in states])  # (B, S)
        k = torch.cat([F.pad(s[1], (0, 0, S - s[1].shape[3], 0)) for s in states])  # (B, layers, heads, S, Dh)
        v = torch.cat([F.pad(s[2], (0, 0, S - s[2].shape[3], 0)) for s in states])
        return ids, k, v, torch.cat([s[3] for s in states])

    def prime(self, x: Tensor, resets: Tensor, pos: Tensor | None = None) -> State:
        """The `step` state after reading input vectors x (B, L, D) (a prefix that is not tokens): the cache of
        their last segment, which must start at the same column in every row. Its positions stand in for
        tokens, so x plus what is generated after it must fit in `context` (the cache is never rebuilt)."""
        starts = resets.clone()
        starts[:, 0] = True
        c = int(starts.any(0).nonzero().max())
        if not bool(starts[:, c].all()):
            raise SeqlmError("prime: rows whose last segments start at different columns")
        _, kvs = self.run(x[:, c:], resets[:, c:], None if pos is None else pos[:, c:])
        B, S = x.shape[0], x.shape[1] - c
        nxt = torch.full((B,), S, device=x.device) if pos is None else pos[:, -1] + 1  # `step` goes on from here
        ids = torch.zeros(B, S, dtype=torch.long, device=x.device)  # stand-ins: not tokens, never re-read
        return ids, torch.stack([kv[0] for kv in kvs], dim=1), torch.stack([kv[1] for kv in kvs], dim=1), nxt

    def _refill(self, state: State, full: Tensor) -> State:
        """Rows whose window is full (`full` (B,)) rebuilt from their last W - S inputs; the others kept."""
        keep, redo = (~full).nonzero().squeeze(1), full.nonzero().squeeze(1)
        ids = state[0][redo][:, self.stride - self.context :]  # (R, W - S): all real (the row is W long)
        _, kvs = self.run(self.embed(ids), torch.zeros_like(ids, dtype=torch.bool))
        k = torch.stack([kv[0] for kv in kvs], dim=1)  # (R, layers, heads, W - S, Dh)
        v = torch.stack([kv[1] for kv in kvs], dim=1)
        fresh = ids, k, v, torch.full_like(redo, self.context - self.stride)
        merged = self.cat_states([self.select_state(state, keep), fresh])
        return self.select_state(merged, torch.cat([keep, redo]).argsort())  # back in the rows' order

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        full = state[3] == self.context  # window full: rebuild the cache from the last W - S inputs
        ids, k, v, pos = self._refill(state, full) if bool(full.any()) else state
        B, S = ids.shape
        h = self.drop(self.embed(tokens) + self.pos[pos]).unsqueeze(1)  # (B, 1, D)
        real = ids >= 0  # (B, S)
        mask = None if bool(real.all()) else torch.cat([real, real.new_ones(B, 1)], 1).view(B, 1, 1, S + 1)
        ks, vs = [], []
        for i, block in enumerate(self.blocks):
            h, (ki, vi) = block(h, mask, (k[:, i], v[:, i]))
            ks.append(ki)
            vs.append(vi)
        logp = F.log_softmax(self.logits(self.norm(h[:, 0])).float(), dim=-1)  # (B, V)
        ids = torch.cat([ids, tokens.view(-1, 1)], dim=1)  # (B, S + 1)
        return logp, (ids, torch.stack(ks, dim=1), torch.stack(vs, dim=1), pos + 1)


def _init(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):  # GPT-2's N(0, 0.02)
        nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


def build_transformer(cfg: TransformerConfig, vocab: Vocab) -> TransformerLM:
    return TransformerLM(vocab, layers=cfg.layers, d_model=cfg.d_model, heads=cfg.heads, d_ff=cfg.d_ff,
                         context=cfg.context, stride=cfg.window_stride, positions=cfg.positions,
                         tie_embeddings=cfg.tie_embeddings, dropout=cfg.dropout, cross_sentence=cfg.cross_sentence)
