"""The model families, in one explicit dict. The CLI's `--model` choices come from here (and a test
checks they agree). Nothing outside this file asks which family a model is.

A neural family is a config dataclass, a builder, how its training text is cut into batches and the
step function the one training loop (seqlm.train.run) calls. The count-based `kn` family is estimated, not
trained. What each model can do and how it reads text is declared by its model class (`capabilities`,
`text_spec`: seqlm.protocol), in its family's file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from seqlm import checkpoint as ckpt
from seqlm.data.batching import Batches, packed_batches
from seqlm.data.corpus import TokenStream
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.models import kn
from seqlm.models.afp import AFPConfig, afp_batches, build_afp
from seqlm.models.cache import CacheConfig, estimate_cache, load_cache, save_cache
from seqlm.models.dae import DAEConfig, build_dae, dae_batches
from seqlm.models.fnn import FNNConfig, build_fnn
from seqlm.models.fofe import FOFEConfig, build_fofe
from seqlm.models.lstm import LSTMConfig, build_lstm, lstm_batches
from seqlm.models.mixture import NOT_TRAINED, MixtureConfig, load_mixture, save_mixture
from seqlm.models.rnn import RNNConfig, build_rnn, rnn_batches
from seqlm.models.transformer import TransformerConfig, build_transformer
from seqlm.train.steps import StepFn, sentence_step, tbptt_step


@dataclass
class Splits:
    train: TokenStream
    valid: TokenStream


def packed(cfg: Any, vocab: Vocab) -> Batches:
    """Whole shuffled sentences packed into (batch_size, seq_len) batches (FNN and FOFE training)."""

    def batches(stream: TokenStream, rng: np.random.Generator, shard: tuple[int, int]):
        return packed_batches(stream, vocab.bos_id, cfg.train.seq_len, cfg.train.batch_size, rng, shard)

    return batches


@dataclass(frozen=True)
class NeuralFamily:
    summary: str
    config: type
    build: Callable[[Any, Vocab], nn.Module]
    batches: Callable[[Any, Vocab], Batches]
    step: StepFn

    def save(self, model: nn.Module, out: Path) -> None:
        ckpt.save_tensors(out / ckpt.WEIGHTS, model.state_dict())

    def shapes(self, cfg: Any, vocab: Vocab) -> dict[str, torch.Size]:
        """Parameter and buffer shapes of the model `cfg` describes, without allocating it."""
        try:
            with torch.device("meta"):
                return {k: t.shape for k, t in self.build(cfg, vocab).state_dict().items()}
        except (RuntimeError, TypeError, OverflowError, ValueError) as e:  # "Storage size calculation
            # overflowed"; TypeError, OverflowError: an edited config.json's size beyond int64
            raise SeqlmError(f"this configuration's layers are too large to allocate ({str(e).splitlines()[0]}); "
                             "make --hidden/--embed smaller") from None

    def check_fits(self, cfg: Any, vocab: Vocab) -> None:
        """Refuse, before allocating anything, a model whose training state cannot fit in memory."""
        n = sum(s.numel() for s in self.shapes(cfg, vocab).values())
        need = 16 * n  # float32 weights, gradients and two Adam moments
        avail = _available_bytes()
        if avail is not None and need > avail:
            raise SeqlmError(f"this configuration has {n:,} parameters: training needs about {need / 2**30:.1f} GiB "
                             f"but {avail / 2**30:.1f} GiB of memory is available; make --hidden/--embed smaller "
                             "or cap the vocabulary with --max-vocab")

    def load(self, model_dir: Path, cfg: Any, vocab: Vocab) -> nn.Module:
        weights = ckpt.load_tensors(model_dir / ckpt.WEIGHTS)
        # shapes first, from a meta-device build: an edited config.json cannot make us allocate a huge model
        expected = self.shapes(cfg, vocab)
        for name, t in expected.items():
            if name not in weights or weights[name].shape != t:
                got = tuple(weights[name].shape) if name in weights else "missing"
                raise SeqlmError(f"{model_dir}: weights do not match config.json/vocab.txt ({name}: expected "
                                 f"{tuple(t)}, found {got}); the directory mixes files of different models")
        model = self.build(cfg, vocab)
        model.load_state_dict(weights)
        model.eval()
        return model


@dataclass(frozen=True)
class CountFamily:
    summary: str
    config: type
    estimate: Callable[[Any, TokenStream, Vocab], Any]
    save_model: Callable[[Any, Path], None]
    load_model: Callable[[Path], Any]

    def build(self, cfg: Any, vocab: Vocab) -> Any:
        raise SeqlmError("count-based models are estimated from a corpus: use `seqlm train --model kn`")

    def train(self, model: Any, splits: Splits, out: Path, save: Callable, resume: bool,
              session_minutes: float = 0.0) -> Any:
        fitted = self.estimate(model.config, splits.train, model.vocab)
        fitted.family, fitted.config = model.family, model.config
        save(fitted)
        return fitted

    def save(self, model: Any, out: Path) -> None:
        self.save_model(model, out)

    def load(self, model_dir: Path, cfg: Any, vocab: Vocab) -> Any:
        return self.load_model(model_dir)


@dataclass(frozen=True)
class MixtureFamily:
    """Models combined from saved ones (`seqlm interpolate`): loaded and saved like any model, never trained."""

    summary: str
    config: type
    save_model: Callable[[Any, Path], None]
    load_model: Callable[[Path, Any], Any]

    def build(self, cfg: Any, vocab: Vocab) -> Any:
        raise SeqlmError(NOT_TRAINED)

    def train(self, model: Any, splits: Splits, out: Path, save: Callable, resume: bool,
              session_minutes: float = 0.0) -> Any:
        raise SeqlmError(NOT_TRAINED)

    def save(self, model: Any, out: Path) -> None:
        self.save_model(model, out)

    def load(self, model_dir: Path, cfg: Any, vocab: Vocab) -> Any:
        return self.load_model(model_dir, cfg)


class _Unbuilt:
    """A count-based model before estimation: just its config and vocabulary."""

    def __init__(self, config: Any, vocab: Vocab):
        self.config, self.vocab = config, vocab


Family = NeuralFamily | CountFamily | MixtureFamily

FAMILIES: dict[str, Family] = {
    "kn": CountFamily(
        summary="n-gram model: interpolated modified Kneser-Ney (KenLM-exact) or, with --smoothing, Witten-Bell, "
                "Katz, absolute, additive or original KN; ARPA in and out",
        config=kn.KNConfig, estimate=kn.estimate_kn, save_model=kn.save_kn, load_model=kn.load_kn,
    ),
    "fnn": NeuralFamily(
        summary="n-gram feed-forward LM (Bengio style), the FOFE paper's baseline",
        config=FNNConfig, build=build_fnn, batches=packed, step=sentence_step,
    ),
    "fofe": NeuralFamily(
        summary="FOFE feed-forward LM (Zhang et al. 2015): the whole history as a forgetting-factor code",
        config=FOFEConfig, build=build_fofe, batches=packed, step=sentence_step,
    ),
    "rnn": NeuralFamily(
        summary="Elman RNN LM (Mikolov et al. 2011): truncated BPTT, class-factorised output",
        config=RNNConfig, build=build_rnn, batches=rnn_batches, step=tbptt_step,
    ),
    "transformer": NeuralFamily(
        summary="decoder-only Transformer LM (pre-norm, causal attention, key/value cache for generation)",
        config=TransformerConfig, build=build_transformer, batches=packed, step=sentence_step,
    ),
    "afp": NeuralFamily(
        summary="Elman RNN LM with approximate fixed-point histories: K parallel iterations, order K+1 context",
        config=AFPConfig, build=build_afp, batches=afp_batches, step=tbptt_step,
    ),
    "lstm": NeuralFamily(
        summary="LSTM LM (torch's fused LSTM): full, NCE-trained or sparse-code compressed vocabulary layers",
        config=LSTMConfig, build=build_lstm, batches=lstm_batches, step=tbptt_step,
    ),
    "dae": NeuralFamily(
        summary="discrete sequence autoencoder (Kaiser & Bengio 2018): a Transformer that peeks at c(s)",
        config=DAEConfig, build=build_dae, batches=dae_batches, step=sentence_step,
    ),
    "cache": CountFamily(
        summary="unigram cache over the last N tokens read (window or decay), a mixture component",
        config=CacheConfig, estimate=estimate_cache, save_model=save_cache, load_model=load_cache,
    ),
    "mix": MixtureFamily(
        summary="linear interpolation of saved models (rnnlm-extensions.txt); built by `seqlm interpolate`",
        config=MixtureConfig, save_model=save_mixture, load_model=load_mixture,
    ),
}
DEFAULT_FAMILY = "fofe"  # `seqlm train` without --model; chosen early, kept: transformer-ptb, lstm-ptb (stream) beat it


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise SeqlmError(f"unknown model family {name!r}; choose one of: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def _available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def new_model(name: str, cfg: Any, vocab: Vocab) -> Any:
    """A fresh model of family `name`, tagged with its family and config so `seqlm.save` needs nothing else."""
    fam = family(name)
    if isinstance(fam, NeuralFamily):
        fam.check_fits(cfg, vocab)
        torch.manual_seed(cfg.train.seed)  # the initial weights depend on the seed alone
    model = _Unbuilt(cfg, vocab) if isinstance(fam, CountFamily) else fam.build(cfg, vocab)
    model.family, model.config = name, cfg
    return model
