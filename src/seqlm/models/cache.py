"""Family `cache`: a unigram cache over the recent history (Kuhn & De Mori 1990; the cache of Mikolov's
thesis combinations), meant as a mixture component (`seqlm interpolate ... runs/cache`).

    P(w | h) = (c_h(w) + alpha / S) / (M_h + alpha),   c_h(w) = sum_{k < N, h_k = w} decay^k,  M_h = sum_w c_h(w)

where h_0 is the most recent token read, N the window, S the number of words the model can predict (the
vocabulary less `<s>` where it has one) and alpha a pseudo-count spread evenly over them: the floor that
keeps every word possible, so the distribution sums to 1 over the vocabulary exactly and an empty history
gives the uniform one. decay 1 counts the last N tokens plainly; decay < 1 weighs them down exponentially.

The history is what the protocol gives as context: every input since the last sentence start, the start
symbol excluded. Sentence by sentence the cache starts empty at every sentence; in stream mode (`eval
--stream`, `interpolate --stream`) it runs on across sentences and counts each `</s>` read. Nothing is
learnt from the training text: `seqlm train --model cache --data CORPUS` only takes its vocabulary. A
sentence longer than the scorer's pieces (512 tokens) sees at most 64 tokens before each piece.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from seqlm import checkpoint as ckpt
from seqlm.data.corpus import TokenStream
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.protocol import Batch, Capabilities, LMBase, Prefixes

CHUNK = 1 << 22  # history entries compared at a time when scoring: (rows x positions x window) per piece


@dataclass
class CacheConfig:
    window: int = 500  # N: the cache holds the last N tokens read (within the sentence, or the stream)
    decay: float = 1.0  # a token k tokens back counts decay^k; 1 = plain counts over the window
    alpha: float = 1.0  # pseudo-counts spread evenly over the vocabulary: the floor under every word

    def __post_init__(self) -> None:
        if self.window < 1:
            raise SeqlmError(f"--window must be at least 1 token, got {self.window}")
        if not 0.0 < self.decay <= 1.0:
            raise SeqlmError(f"--decay must be in (0, 1], got {self.decay}")
        if not self.alpha > 0.0:
            raise SeqlmError(f"--alpha must be positive (it keeps unseen words possible), got {self.alpha}")


class CacheModel(LMBase):
    """The LanguageModel and StreamingModel protocols over a window of recent inputs.

    A state is (window (B, N) of token ids, oldest first, -1 where empty; fresh (B,) True until the start
    symbol has been read). Scoring and stepping both read the same windows, so they agree exactly.
    """

    family = "cache"

    def __init__(self, config: CacheConfig, vocab: Vocab):
        self.config, self.vocab = config, vocab
        n = config.window
        self.weights = torch.tensor([config.decay**k for k in range(n - 1, -1, -1)], dtype=torch.float64)  # (N,)
        self.excluded = vocab.bos_id if vocab.bos_id != vocab.eos_id else None  # <s> is context, never predicted
        self.floor = config.alpha / (len(vocab) - (self.excluded is not None))  # alpha / S

    def capabilities(self) -> Capabilities:
        # it has no weights to adapt (it adapts by construction) and nothing to quantize
        return Capabilities(stream=True)

    def _counted(self, ids: Tensor) -> Tensor:
        return ids if self.excluded is None else ids.masked_fill(ids == self.excluded, -1)

    def _logp(self, hist: Tensor, targets: Tensor) -> Tensor:
        """ln P(target) (...) from history windows (..., N) (-1 = empty) and targets (...)."""
        w = self.weights.to(hist.device)  # (N,)
        count = ((hist == targets.unsqueeze(-1)) * w).sum(-1)  # (...) c_h(target)
        mass = ((hist >= 0) * w).sum(-1)  # (...) M_h
        logp = torch.log(count + self.floor) - torch.log(mass + self.config.alpha)
        return logp if self.excluded is None else logp.masked_fill(targets == self.excluded, -torch.inf)

    def score_stream(self, batch: Batch, state: Tensor | None) -> tuple[Tensor, Tensor]:
        """(B, T) ln p of the targets, and the window (B, N) the next chunk of each row continues from."""
        B, T = batch.inputs.shape
        N, dev = self.config.window, batch.inputs.device
        carry = torch.full((B, N), -1, dtype=torch.long, device=dev) if state is None else state.to(dev)
        read = self._counted(batch.inputs.masked_fill(batch.resets, -1))  # the start symbol is not counted
        seq = torch.cat([carry, read], dim=1)  # (B, N + T)
        pos = torch.arange(N + T, device=dev)
        resets = torch.cat([torch.zeros_like(carry, dtype=torch.bool), batch.resets], dim=1)  # (B, N + T)
        cut = torch.where(resets, pos, -1).cummax(dim=1).values  # (B, N + T) the last reset at or before
        windows = seq.unfold(1, N, 1)[:, 1:]  # (B, T, N) position t sees seq[t+1 : t+N+1]
        out = torch.empty(B, T, dtype=torch.float64, device=dev)
        step = max(1, CHUNK // max(1, B * N))
        for t0 in range(0, T, step):
            t1 = min(T, t0 + step)
            idx = pos[t0 + 1 : t1 + 1, None] + torch.arange(N, device=dev)  # (t, N) seq index of each entry
            live = idx.unsqueeze(0) > cut[:, N + t0 : N + t1, None]  # (B, t, N) after the sentence start
            hist = torch.where(live, windows[:, t0:t1], -1)
            out[:, t0:t1] = self._logp(hist, batch.targets[:, t0:t1])
        last = torch.where(pos[-N:] > cut[:, -1:], seq[:, -N:], -1)  # (B, N) what the next chunk sees
        return out.masked_fill(~batch.mask, 0.0), last

    def score(self, batch: Batch) -> Tensor:
        return self.score_stream(batch, None)[0]

    def initial_state(self, batch_size: int) -> tuple[Tensor, Tensor]:
        return (torch.full((batch_size, self.config.window), -1, dtype=torch.long),
                torch.ones(batch_size, dtype=torch.bool))

    def step(self, tokens: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        read = self.extend(Prefixes(state), torch.arange(len(tokens), device=tokens.device), tokens)
        return self.advance(read), read.state

    def extend(self, prefixes: Prefixes, rows: Tensor, tokens: Tensor) -> Prefixes:
        """The windows shifted by one token; the counts wait for `advance`."""
        window, fresh = prefixes.state
        dev = tokens.device
        window, fresh = window.to(dev)[rows.to(dev)], fresh.to(dev)[rows.to(dev)]  # (R, N), (R,)
        tokens = self._counted(tokens.masked_fill(fresh, -1))  # (R,) the start symbol: not counted
        return Prefixes((torch.cat([window[:, 1:], tokens.unsqueeze(1)], dim=1), torch.zeros_like(fresh)))

    def advance(self, prefixes: Prefixes) -> Tensor:
        """(B, V) float64 ln P(w | window) of every word, on the window's device."""
        window = prefixes.state[0]  # (B, N)
        B, V = window.shape[0], len(self.vocab)
        w = self.weights.to(window.device) * (window >= 0)  # (B, N)
        counts = torch.zeros(B, V, dtype=torch.float64, device=window.device).scatter_add_(1, window.clamp(min=0), w)
        logp = torch.log(counts + self.floor) - torch.log(w.sum(-1, keepdim=True) + self.config.alpha)  # (B, V)
        if self.excluded is not None:
            logp[:, self.excluded] = -torch.inf
        return logp


def estimate_cache(cfg: CacheConfig, train: TokenStream, vocab: Vocab) -> CacheModel:
    """Nothing is counted from the training text: the cache only fills up at test time."""
    return CacheModel(cfg, vocab)


def save_cache(model: CacheModel, out_dir: Path) -> None:
    """Nothing to write beyond config.json and vocab.txt (seqlm.save writes those)."""


def load_cache(model_dir: Path) -> CacheModel:
    from seqlm.config import from_dict

    meta = ckpt.read_json(Path(model_dir) / ckpt.CONFIG, "config.json")
    return CacheModel(from_dict(CacheConfig, meta["model"]), Vocab.load(Path(model_dir) / ckpt.VOCAB))
