"""A KN model on disk: a model directory (`model.arpa`, with seqlm's binary `model.bin` beside it, which
loading prefers) or one file (ARPA from KenLM, SRILM or seqlm; seqlm's binary; KenLM's build_binary file). The
n-gram layer's own loading, so that the query API (query.py) needs nothing from the model families above it."""

from __future__ import annotations

from pathlib import Path

from seqlm import checkpoint as ckpt
from seqlm.errors import SeqlmError
from seqlm.ngram.binary import is_binary, read_binary
from seqlm.ngram.kenlm_binary import is_kenlm_binary, read_kenlm_binary
from seqlm.ngram.model import NGramModel

ARPA = "model.arpa"
BINARY = "model.bin"


def load_kn(model_dir: Path) -> NGramModel:
    """Map model_dir/model.bin when present and not older than the ARPA file; else read model.arpa[.gz]. A model
    trained with --unk none gets its closed vocabulary back (the rule is in config.json, not in the tables)."""
    model_dir = Path(model_dir)
    arpas = [model_dir / name for name in (ARPA, ARPA + ".gz") if (model_dir / name).is_file()]
    binary = model_dir / BINARY
    if binary.is_file() and all(binary.stat().st_mtime >= a.stat().st_mtime for a in arpas):
        model = read_binary(binary)
    elif arpas:
        model = NGramModel.from_arpa(arpas[0])
    else:
        raise SeqlmError(f"{model_dir / ARPA}: ARPA file missing; restore it or retrain (seqlm train --model kn)")
    if (model_dir / ckpt.CONFIG).is_file():
        meta = ckpt.read_json(model_dir / ckpt.CONFIG, "config.json")
        data = meta.get("data") if isinstance(meta, dict) else None
        model.vocab.closed = isinstance(data, dict) and data.get("unk") == "none"
    return model


def load_ngram_file(path: Path) -> NGramModel:
    """A stand-alone model file: seqlm's binary or KenLM's (each recognised by its magic), else ARPA (KenLM, SRILM,
    seqlm)."""
    if is_binary(path):
        return read_binary(path)
    return read_kenlm_binary(path) if is_kenlm_binary(path) else NGramModel.from_arpa(path)


def load_tables(path: str | Path) -> NGramModel:
    """A model directory (binary model.bin when present, else its ARPA), a binary file or an ARPA file."""
    path = Path(path)
    if path.is_dir():
        return load_kn(path)
    if not path.is_file():
        raise SeqlmError(f"{path}: no such model file or directory")
    return load_ngram_file(path)
