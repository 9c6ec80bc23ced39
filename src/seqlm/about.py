"""`seqlm --version`: seqlm's version, torch's, and whether seqlm's compiled loops run or their Python twins.

The loops are normally built at install time (setup.py) and load at once. A checkout edited since its install
builds them on first use, which takes a compiler many seconds, too long for --version: a module already built
that way and no older than its sources is loaded, and one not built yet is reported as such, unbuilt.
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

from seqlm._version import __version__

NOT_BUILT = "not built yet (the first use builds it; the Python fallback runs until then)"


def version_text() -> str:
    import torch

    loops = ", ".join(f"{what} {status}" for what, status in loop_status().items())
    lines = [f"seqlm {__version__}", f"torch {torch.__version__}, python {platform.python_version()}",
             f"compiled loops: {loops}"]
    return "\n".join(lines)


def loop_status() -> dict[str, str]:
    """'compiled' or why the Python fallback runs, for the n-gram loops, the tokenizer, the CTC decoder's frame
    step and the gather-dot of NCE and the tree softmax (data/native.py; the decoder's fallback is its tensor
    search)."""
    from seqlm.ngram import native as ngram_native

    ngram = [Path(ngram_native.__file__).with_name(f) for f in ngram_native.SOURCES]
    tokens = [Path(__file__).parent / "data" / "_tokens.cpp"]
    search = [Path(__file__).parent / "decode" / "_search.cpp"]
    gather = [Path(__file__).parent / "nn" / "_gather_dot.cpp"]
    return {"ngram": _status("_seqlm_native", ngram), "tokenizer": _status("_seqlm_tokens", tokens),
            "decoder": _status("_seqlm_decode", search), "gather-dot": _status("_seqlm_nn", gather)}


def _status(name: str, sources: list[Path]) -> str:
    from seqlm.data.native import compiled, installed

    if os.environ.get("SEQLM_NATIVE", "1") == "0":
        return "python fallback (SEQLM_NATIVE=0)"
    if installed(name, sources) is not None:
        return "compiled (installed with the package)"
    if not _built(name, sources):
        return NOT_BUILT
    if compiled(name, sources) is None:
        return "python fallback (it failed to load)"
    return "compiled (built on first use)"


def _built(name: str, sources: list[Path]) -> bool:
    """Whether torch's extension folder holds the module no older than its sources and headers (then loading
    it builds nothing)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory
    except ImportError:  # a torch without it: load and see
        return True
    built = Path(_get_build_directory(name, verbose=False)) / f"{name}.so"
    inputs = {*sources, *(h for s in sources for h in s.parent.glob("*.h"))}
    return built.is_file() and built.stat().st_mtime >= max(p.stat().st_mtime for p in inputs)


class VersionAction(argparse.Action):
    """--version, computed only when asked for (argparse's own takes the text when the parser is built)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, help: str | None = None):
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_text())
        parser.exit()
