"""Packaging: `python -m build` makes an sdist holding the compiled loops' sources and, from that sdist, a wheel
holding them built; the wheel installed into a clean venv, run with no compiler on PATH, uses them (seqlm
--version says so) and estimates and scores a KN model, the scores equal to this checkout's (an independent run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, require_env, require_module, write_corpus

PACKAGE_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "src")


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """sdist and wheel built from a copy of the checkout's package files (the checkout gets no build/ folder)."""
    require_module("build", "the `build` package (the test extra) builds the wheel")
    if shutil.which("c++") is None and shutil.which("g++") is None:
        require_env("no C++ compiler here to build the wheel's modules with")
    src = tmp_path_factory.mktemp("checkout")
    for name in PACKAGE_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"))
        else:
            shutil.copy(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_sdist_has_sources_and_wheel_has_modules(dist):
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {Path(n).name for n in t.getnames()}
    assert {"_native.cpp", "_arpa_text.cpp", "_sort.cpp", "_buffers.h", "_tokens.cpp", "_search.cpp", "_dense.cpp",
            "_gather_dot.cpp", "setup.py"} <= names
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    built = {Path(n).name.split(".")[0] for n in names if n.endswith((".so", ".pyd"))}
    assert built == {"_seqlm_native", "_seqlm_tokens", "_seqlm_decode", "_seqlm_nn"}
    assert not [n for n in names if n.endswith((".cpp", ".h"))]  # the wheel runs what it was built with


def _clean_venv(where: Path, wheel: Path) -> Path:
    """A new venv holding the wheel alone (no editable seqlm); torch and the other dependencies are read from
    this interpreter's site-packages through a .pth line (installing them again would take minutes)."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    py = where / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   env={**os.environ, "PIP_CONSTRAINT": ""})
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return where / "bin"


def test_wheel_in_clean_venv_without_compiler(dist, tmp_path):
    (wheel,) = dist.glob("*.whl")
    bindir = _clean_venv(tmp_path / "venv", wheel)
    corpus = write_corpus(tmp_path / "corpus")
    # PATH holds the venv alone: no c++, cc or ninja, so nothing can be compiled; no torch extension cache
    env = {"PATH": str(bindir), "HOME": str(tmp_path), "TORCH_EXTENSIONS_DIR": str(tmp_path / "no-cache"),
           "SEQLM_CACHE": str(tmp_path / "cache"), "CC": "/nonexistent", "CXX": "/nonexistent"}
    run = lambda *a: subprocess.run([str(bindir / "seqlm"), *a], capture_output=True, text=True, env=env,  # noqa: E731
                                    cwd=tmp_path)
    version = run("--version")
    assert version.returncode == 0, version.stderr
    assert "ngram compiled (installed with the package), tokenizer compiled (installed with the package)" \
        in version.stdout
    where = subprocess.run([str(bindir / "python"), "-c", "import seqlm; print(seqlm.__file__)"],
                           capture_output=True, text=True, env=env).stdout
    assert str(tmp_path / "venv") in where  # the wheel's seqlm, not this checkout's
    train = run("train", "--model", "kn", "--order", "3", "--data", str(corpus), "--out", str(tmp_path / "kn"))
    assert train.returncode == 0, train.stderr
    assert "runs in Python" not in train.stderr  # no fallback warning: the compiled loops ran
    score = run("score", str(tmp_path / "kn"), "--text", str(corpus / "test.txt"))
    assert score.returncode == 0, score.stderr
    here = subprocess.run([sys.executable, "-m", "seqlm", "score", str(tmp_path / "kn"), "--text",
                           str(corpus / "test.txt")], capture_output=True, text=True,
                          env={**os.environ, "SEQLM_NATIVE": "0", "SEQLM_CACHE": str(tmp_path / "cache2")})
    assert here.returncode == 0, here.stderr
    assert score.stdout == here.stdout and score.stdout.count("\n") == 40  # the Python twins agree


def test_an_edited_source_is_built_again_not_the_stale_installed_module(tmp_path):
    """In a checkout, the module built at install time runs only while no source beside it is newer."""
    from seqlm.data.native import installed

    module = require_module("seqlm.ngram._seqlm_native", "the install-time module (setup.py) was not built here")
    src = tmp_path / "ngram" / "_native.cpp"
    src.parent.mkdir()
    shutil.copy(ROOT / "src/seqlm/ngram/_native.cpp", src)
    built = Path(module.__file__).stat().st_mtime
    os.utime(src, (built - 60, built - 60))
    assert installed("_seqlm_native", [src]) is not None
    os.utime(src, (built + 60, built + 60))  # edited after the install
    assert installed("_seqlm_native", [src]) is None
