"""The posteriors `seqlm decode` reads: `.npy` files (one utterance, frames x labels), folders of them (in name
order) and `.npz` archives (one utterance per array, in the archive's order), checked before any decoding."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from seqlm.errors import SeqlmError


def read_posteriors(paths: list[str], num_labels: int) -> tuple[list[str], list[np.ndarray]]:
    """(names, matrices) of every utterance in `paths`, in order; each matrix (frames, num_labels), finite.
    `.npy` files are memory-mapped, so checking them first costs one read and no copy."""
    names, mats = [], []
    for path in map(Path, paths):
        for name, mat, where in _utterances(path):
            _check(mat, num_labels, where)
            names.append(name)
            mats.append(mat)
    if not mats:
        raise SeqlmError(f"{', '.join(paths)}: no utterances to decode")
    return names, mats


def _utterances(path: Path):
    """(name, matrix, where) of each utterance in one input."""
    if path.is_dir():
        files = sorted(path.glob("*.npy"))
        if not files:
            raise SeqlmError(f"{path}: a folder of posteriors needs .npy files (frames x labels), and it has none")
        for f in files:
            yield f.stem, _load_npy(f), str(f)
    elif path.suffix == ".npz":
        yield from _npz(path)
    elif path.suffix == ".npy":
        yield path.stem, _load_npy(path), str(path)
    elif not path.exists():
        raise SeqlmError(f"{path}: no such file or folder")
    else:
        raise SeqlmError(f"{path}: give .npy files (frames x labels), folders of them, or .npz archives")


def _load_npy(path: Path) -> np.ndarray:
    if not path.is_file():
        raise SeqlmError(f"{path}: no such file")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise SeqlmError(f"{path}: not a NumPy .npy file ({e})") from None


def _npz(path: Path):
    if not path.is_file():
        raise SeqlmError(f"{path}: no such file")
    try:
        archive = np.load(path, allow_pickle=False)
        keys = list(archive.files)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise SeqlmError(f"{path}: not a NumPy .npz archive ({e})") from None
    if not keys:
        raise SeqlmError(f"{path}: the archive holds no arrays")
    for key in keys:
        try:
            yield key, archive[key], f"{path}[{key}]"
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise SeqlmError(f"{path}[{key}]: unreadable ({e})") from None


def _check(mat: np.ndarray, num_labels: int, where: str) -> None:
    if mat.ndim != 2 or not np.issubdtype(mat.dtype, np.floating):
        raise SeqlmError(f"{where}: expected a 2-D float array (frames x labels), got {mat.ndim}-D {mat.dtype}")
    if mat.shape[1] != num_labels:
        raise SeqlmError(f"{where}: {mat.shape[1]} columns, and the labels file has {num_labels} labels; give the "
                         "labels of the model that wrote these posteriors, one per column")
    if mat.shape[0] == 0:
        raise SeqlmError(f"{where}: no frames")
    if not np.isfinite(mat).all():
        raise SeqlmError(f"{where}: holds NaN or infinite values; decode logits or log posteriors as the acoustic "
                         "model wrote them (a -inf log probability: clip it, e.g. at -1e4)")
