"""One rule for every command that writes: an output that is already there is kept unless --force.

A file output is there when the file exists; it is replaced by an atomic rename (seqlm.checkpoint), so
a forced write is whole or not at all. A model directory is there when it holds any file of a model
(MODEL_FILES); a directory without one (new, empty, or the user's own notes) is a place to write into.
--force replaces a model directory whole: `clear_model` removes the old model's files before the new
ones are written, so that a directory never mixes two models. Standard output (`-`) is always fine.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from seqlm import checkpoint as ckpt
from seqlm.errors import SeqlmError

# Everything seqlm writes into a model directory: the model (any family), its training record and state.
MODEL_FILES = (ckpt.CONFIG, ckpt.VOCAB, ckpt.WEIGHTS, "model.arpa", "model.arpa.gz", "model.bin", "metrics.jsonl",
               "results.json", "resume", "tokenizer.model", "tokenizer.json")


def claim_output(path: str | Path | None, force: bool, what: str, *, directory: bool = False,
                 inputs: Iterable[str | Path | None] = (), ours: Callable[[Path], bool] | None = None,
                 also: str = "") -> bool:
    """Refuse `path`, the output of option `what`, if something is there and neither `force` nor `ours`
    (the command recognises the file as its own earlier output) allows replacing it. True when something is
    there to replace: a directory's old model must then go (`clear_model`) before the new one is written.
    `inputs` are what the command reads: never an output, even with --force. `also` is another remedy."""
    if path is None or str(path) == "-":
        return False
    path = Path(path)
    if any(_same(path, p) for p in inputs if p is not None):
        raise SeqlmError(f"{what} {path} is also an input of this command; write the output somewhere else")
    held = _model_files(path, what) if directory else _file(path, what)
    if not held or force or (ours is not None and ours(path)):
        return bool(held)
    if not directory:
        raise SeqlmError(f"{what} {path} exists; {also}choose another name or add --force to replace it")
    if ckpt.CONFIG in held:
        raise SeqlmError(f"{path} already holds a model; {also}choose another {what} or add --force to replace it")
    raise SeqlmError(f"{path} holds files of a model ({', '.join(held)}); {also}choose another {what} or add "
                     "--force to replace them")


def clear_model(path: str | Path) -> None:
    """Remove the model files in directory `path` (and temporary files an interrupted write left of them);
    anything else there is the user's and stays."""
    path = Path(path)
    for name in MODEL_FILES:
        for p in [path / name, *path.glob(f".{name}.*.tmp")]:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()


def made_by_matplotlib(path: Path) -> bool:
    """A PNG that matplotlib wrote (it names itself in the file's text chunk): a plot seqlm made."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(b"\x89PNG\r\n\x1a\n") and b"matplotlib" in head


def _model_files(path: Path, what: str) -> list[str]:
    if not path.exists():
        return []
    if not path.is_dir():
        raise SeqlmError(f"{what} {path} is a file; give a directory for the model")
    return [name for name in MODEL_FILES if (path / name).exists()]


def _file(path: Path, what: str) -> bool:
    if path.is_dir():
        raise SeqlmError(f"{what} {path} is a directory; give the name of the file to write")
    return path.exists() or path.is_symlink()


def _same(a: Path, b: str | Path) -> bool:
    try:
        return a.resolve() == Path(b).resolve()
    except OSError:
        return False
