"""Shared fixtures: tiny corpora the tests make themselves, and a private id cache per test."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the cat dog sat on mat a ran fast slow big red".split()


def write_corpus(d: Path, n_train: int = 300, n_eval: int = 40, seed: int = 0) -> Path:
    """A small corpus with some structure (alternating word groups) so models can learn something."""
    rng = random.Random(seed)
    d.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_eval), ("test", n_eval)):
        lines = []
        for _ in range(n):
            length = rng.randint(3, 10)
            lines.append(" ".join(rng.choice(WORDS[:6]) if i % 2 else rng.choice(WORDS) for i in range(length)))
        (d / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SEQLM_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "corpus")


def shared_data() -> Path | None:
    env = os.environ.get("SEQLM_DATA")
    for cand in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "data"]:
        if cand.is_dir():
            return cand
    return None


TINY = ["--hidden", "16", "--embed", "8", "--threads", "1"]
