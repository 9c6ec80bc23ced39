"""Family `kn`: interpolated modified Kneser-Ney n-gram model, estimated exactly as KenLM's lmplz.

The estimator and the model live in seqlm.ngram; this file is the glue the registry and CLI use:
the config (`seqlm train --model kn --order 5`), estimation from an encoded corpus, and the model
directory's `model.arpa` (a plain ARPA file any KenLM/SRILM tool reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from seqlm.data.corpus import TokenStream
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.ngram.kneser_ney import estimate_model
from seqlm.ngram.model import NGramModel

ARPA = "model.arpa"
MAX_ORDER = 9


@dataclass
class KNConfig:
    order: int = 5  # n: predicts from the previous n-1 words
    # D1 D2 D3+ used for an order whose count-of-counts are too sparse (lmplz --discount_fallback)
    discount_fallback: str = "0.5 1 1.5"

    def __post_init__(self) -> None:
        if not 1 <= self.order <= MAX_ORDER:
            raise SeqlmError(f"--order must be between 1 and {MAX_ORDER} for kn, got {self.order}")
        _ = self.fallback  # validate now, not at estimation time

    @property
    def fallback(self) -> tuple[float, float, float]:
        """The three fallback discounts; D_j must lie in (0, j] so no probability goes negative."""
        try:
            d = tuple(float(x) for x in str(self.discount_fallback).replace(",", " ").split())
        except ValueError:
            d = ()
        if len(d) != 3 or not all(0 < dj <= j for j, dj in zip((1, 2, 3), d)):
            got = self.discount_fallback
            raise SeqlmError(f"--discount-fallback must be three numbers D1 D2 D3, 0 < Dj <= j; got {got!r}")
        return d  # type: ignore[return-value]


def estimate_kn(cfg: KNConfig, train: TokenStream, vocab: Vocab) -> NGramModel:
    """Estimate from the encoded training text; `vocab` is the training vocabulary (OOVs already <unk>)."""
    return estimate_model(train, vocab, cfg.order, cfg.fallback)


def save_kn(model: NGramModel, out_dir: Path) -> None:
    """Write out_dir/model.arpa (atomically)."""
    model.to_arpa(Path(out_dir) / ARPA)


def load_kn(model_dir: Path) -> NGramModel:
    """Read model_dir/model.arpa (or model.arpa.gz)."""
    model_dir = Path(model_dir)
    for name in (ARPA, ARPA + ".gz"):
        if (model_dir / name).is_file():
            return NGramModel.from_arpa(model_dir / name)
    raise SeqlmError(f"{model_dir / ARPA}: ARPA file missing; restore it or retrain (seqlm train --model kn)")


def load_arpa_file(path: Path) -> NGramModel:
    """A stand-alone ARPA file (KenLM, SRILM or seqlm), plain or gzipped."""
    return NGramModel.from_arpa(path)
