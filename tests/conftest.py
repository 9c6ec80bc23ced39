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


def free_port() -> int:
    """A TCP port nobody listens on right now (bind port 0 on loopback and let the kernel choose)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for a `python -m seqlm` subprocess: this test's cache, one thread, loopback-only gloo."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1", **extra})
    return env


def seqlm_cli(*argv, timeout: float = 120, **env: str):
    """Run the real command line (`python -m seqlm ...`) in a subprocess; returns the CompletedProcess."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "seqlm", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=cli_env(**env))
