"""seqlm's compiled loops. Each is an extension module of the package, built at install time (setup.py: in the
wheel, or in place for a checkout's editable install), and each has a Python or numpy twin that gives the same
results. The installed module runs; in a checkout whose .cpp is newer than its built module (an edit since the
install), torch.utils.cpp_extension builds the sources on first use instead (a C++ compiler and ninja; cached
under ~/.cache/torch_extensions or $TORCH_EXTENSIONS_DIR). Where neither works, a warning says so once and the
twins run; SEQLM_NATIVE=0 chooses them.

- `tokens()`: _tokens.cpp, text lines to word ids (corpus.py);
- seqlm.ngram.native: the n-gram scorer and ARPA text.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import threading
import warnings
from pathlib import Path

_MODULES: dict[str, object] = {}  # name -> the compiled module once loaded; False when it cannot be
# a second thread asking while the first builds waits for the module, rather than taking the twins for good
_BUILDING = threading.Lock()


def compiled(name: str, sources: list[Path]):
    """The module `name` built from `sources`, or None where it cannot be built or SEQLM_NATIVE=0."""
    if name not in _MODULES:
        with _BUILDING:
            if name not in _MODULES:
                _MODULES[name] = _build(name, sources)
    return _MODULES[name] or None


def installed(name: str, sources: list[Path]):
    """The module built at install time beside its sources (seqlm.ngram._seqlm_native), or None where there is
    none or the sources beside it are newer (a checkout edited since it was installed)."""
    package = sources[0].parent.name  # ngram or data
    try:
        module = importlib.import_module(f"seqlm.{package}.{name}")
    except ImportError:
        return None
    headers = {*sources[0].parent.glob("*.h"), *(sources[0].parent.parent / "data").glob("*.h")}  # + data's shared
    here = [s for s in {*sources, *headers} if s.exists()]  # a wheel holds no sources
    built = Path(module.__file__).stat().st_mtime
    return None if here and max(s.stat().st_mtime for s in here) > built else module


def _build(name: str, sources: list[Path]):
    """The module, or False (with a warning saying why) where it cannot be built; False too when SEQLM_NATIVE=0."""
    if os.environ.get("SEQLM_NATIVE", "1") == "0":
        return False
    if (module := installed(name, sources)) is not None:
        return module
    try:
        from torch.utils.cpp_extension import load

        if shutil.which("ninja") is None:  # the `ninja` wheel (a dependency) sits beside this interpreter
            os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
        return load(name, [str(s) for s in sources], extra_cflags=["-O2"], verbose=False)
    except Exception as e:  # noqa: BLE001 (no compiler, no ninja: the twins give the same results)
        warnings.warn(f"seqlm: {name} runs in Python/numpy ({type(e).__name__}: {e})", stacklevel=3)
        return False


def tokens():
    """The compiled tokenizer (_tokens.cpp), or None."""
    return compiled("_seqlm_tokens", [Path(__file__).with_name("_tokens.cpp")])
