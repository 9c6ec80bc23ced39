"""Model directories: `config.json` + `vocab.txt` + `weights.safetensors` (or `model.arpa`).

Every file is written to a temporary name in the same directory and renamed into place, so a crash
or a full disk never leaves a truncated file where a good one was. No pickles anywhere.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from seqlm.errors import SeqlmError

CONFIG = "config.json"
VOCAB = "vocab.txt"
WEIGHTS = "weights.safetensors"


def _new_temp(path: Path) -> Path:
    """A new empty file next to `path` with the permissions of any file the user creates (0666 less the
    umask), not mkstemp's 0600: model files, metrics and results then all read the same way."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {path}")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success fsync it and rename it over `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = _new_temp(path)
        mode = tmp_path.stat().st_mode & 0o777  # 0666 less the umask, as the kernel applied it
    except OSError as e:
        raise SeqlmError(f"{path}: cannot write ({e.strerror}); check the directory or choose another one") from None
    try:
        yield tmp_path
        os.chmod(tmp_path, mode)  # a writer that replaced the file (safetensors does) made it 0600
        with open(tmp_path, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except OSError as e:  # a full disk, a quota: the old file (if any) is still there, untouched
        raise SeqlmError(f"{path}: writing failed ({e.strerror}); the previous version is intact. "
                         "Free some space and run again") from None
    finally:
        tmp_path.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path, what: str = "file") -> Any:
    path = Path(path)
    if not path.is_file():
        raise SeqlmError(f"{path}: {what} missing; is this a seqlm model directory?")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SeqlmError(f"{path}: {what} is not valid JSON ({e}); restore it or retrain") from None


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise SeqlmError(f"{path}: weights file missing; retrain or copy the whole model directory")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise SeqlmError(f"{path}: weights file is corrupt or truncated ({e}); retrain or restore it") from None
