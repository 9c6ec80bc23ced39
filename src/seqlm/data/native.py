"""seqlm's compiled loops, built on first use in a process by torch.utils.cpp_extension (a C++ compiler and
ninja are needed; the build is cached under ~/.cache/torch_extensions, or $TORCH_EXTENSIONS_DIR, and
takes seconds). Each has a Python or numpy twin that gives the same results: where a module cannot be
built, a warning says so once and the twins run; SEQLM_NATIVE=0 chooses them.

- `tokens()`: _tokens.cpp, text lines to word ids (corpus.py);
- seqlm.ngram.native: the n-gram scorer and ARPA text.
"""

from __future__ import annotations

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


def _build(name: str, sources: list[Path]):
    """The module, or False (with a warning saying why) where it cannot be built; False too when SEQLM_NATIVE=0."""
    if os.environ.get("SEQLM_NATIVE", "1") == "0":
        return False
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
