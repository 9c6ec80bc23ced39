"""Shared fixtures: tiny corpora the tests make themselves, and a private id cache per test."""

from __future__ import annotations

import importlib
import math
import os
import random
from collections import Counter
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


def write_chain_corpus(d: Path, n_train: int = 300, n_eval: int = 40, seed: int = 0) -> Path:
    """A corpus with a known bigram structure: each word is followed by the next or the one after in WORDS
    (cyclically), so a model that learns anything beats the unigram perplexity (about 12.8) by far."""
    rng = random.Random(seed)
    d.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_eval), ("test", n_eval)):
        lines = []
        for _ in range(n):
            i, words = rng.randrange(len(WORDS)), []
            for _ in range(rng.randint(3, 10)):
                words.append(WORDS[i])
                i = (i + rng.choice((1, 2))) % len(WORDS)
            lines.append(" ".join(words))
        (d / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def unigram_ppl(corpus: Path, split: str = "valid") -> float:
    """Perplexity of `split` (every word and </s>) under the add-one unigram model of train.txt: the
    reference a trained model must beat. Computed here by hand, independently of seqlm."""
    def sentences(name: str) -> list[list[str]]:
        return [line.split() + ["</s>"] for line in (corpus / f"{name}.txt").read_text().splitlines() if line.split()]

    counts = Counter(w for s in sentences("train") for w in s)
    total, types = sum(counts.values()), len(counts) + 1  # + 1: one slot for every unseen word
    tokens = [w for s in sentences(split) for w in s]
    return math.exp(-sum(math.log((counts[w] + 1) / (total + types)) for w in tokens) / len(tokens))


def _seq_len_flag() -> str:
    """The training option for positions per row (`--seq-len`, formerly `--bptt`)."""
    from dataclasses import fields

    from seqlm.config import TrainConfig

    return "--seq-len" if "seq_len" in {f.name for f in fields(TrainConfig)} else "--bptt"


SEQ_LEN = _seq_len_flag()
SEQ_KEY = SEQ_LEN[2:].replace("-", "_")  # its config field


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SEQLM_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "corpus")


def shared_data() -> Path | None:
    """The shared data folder: $SEQLM_DATA when set, else ../shared/data; None when it is not there."""
    env = os.environ.get("SEQLM_DATA")
    cand = Path(env) if env else ROOT.parent / "shared" / "data"
    return cand if cand.is_dir() else None


# A test that needs the shared data skips without it, saying so with one of these words; under CI=true
# such a skip is a failure (pytest_runtest_makereport below): a CI run must not pass by skipping. A test that
# needs something of the environment (a compiled extension, an optional module such as kenlm or pyctcdecode)
# calls require_env / require_module instead of pytest.skip / importorskip: the same rule, in one place.
DATA_SKIP_WORDS = ("shared", "oracle", "ptb", "seqlm_data", "gcide", "lattice")


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_env(reason: str) -> None:
    """Skip this test because the environment lacks something it needs (a compiled extension that could not be
    built, an optional module not installed); under CI=true fail instead: CI must have it all."""
    if _ci():
        pytest.fail(f"CI=true: {reason} -- CI must provide it (make test installs the peers and builds the "
                    f"compiled loops)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)  # inside a test it skips that test; at import, the module


def require_module(name: str, reason: str):
    """`pytest.importorskip(name)`, except that under CI=true a missing module is a failure (require_env)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        require_env(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (_ci() and report.skipped) or getattr(report, "wasxfail", None) is not None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(w in reason.lower() for w in DATA_SKIP_WORDS):
        report.outcome = "failed"
        report.longrepr = (f"CI=true: {reason} -- the shared data must be present in CI "
                           f"(set SEQLM_DATA, or put it in {ROOT.parent / 'shared' / 'data'})")


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


def train_families(root: Path, runs: dict[str, list[str]], n_train: int, n_eval: int) -> dict[str, Path]:
    """Each family of `runs` ({family: extra train options}) trained by the CLI on one chain corpus written under
    `root`: {"corpus": its directory, family: model directory}."""
    import warnings

    from seqlm.cli import main

    corpus = write_chain_corpus(root / "corpus", n_train=n_train, n_eval=n_eval)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kn on a tiny corpus falls back to default discounts
        for name, extra in runs.items():
            assert main(["train", "--model", name, "--data", str(corpus), "--out", str(root / name), *extra]) == 0
    return {"corpus": corpus, **{name: root / name for name in runs}}


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of one `seqlm` command run in this process (arguments made strings)."""
    from seqlm.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err
