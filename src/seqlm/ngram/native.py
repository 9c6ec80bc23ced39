"""seqlm.ngram's compiled loops (SOURCES): the per-token scorer (scalar.py) and ARPA text (arpa_write.py), each with a Python or numpy twin that gives the same results.

Built on first use in a process by torch.utils.cpp_extension (a C++ compiler and ninja are needed;
the build is cached under ~/.cache/torch_extensions, or $TORCH_EXTENSIONS_DIR, and takes seconds).
Where it cannot be built, a warning says so once and the twins run; SEQLM_NATIVE=0 chooses them.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from pathlib import Path

SOURCES = ("_native.cpp", "_arpa_text.cpp")
_MODULE: object = None  # the compiled module once loaded; False when it cannot be


def extension():
    """The compiled module, or None where it cannot be built or SEQLM_NATIVE=0."""
    global _MODULE
    if _MODULE is None:
        _MODULE = False
        if os.environ.get("SEQLM_NATIVE", "1") != "0":
            try:
                from torch.utils.cpp_extension import load

                if shutil.which("ninja") is None:  # the `ninja` wheel (a dependency) sits beside this interpreter
                    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
                _MODULE = load("_seqlm_native", [str(Path(__file__).with_name(f)) for f in SOURCES],
                               extra_cflags=["-O2"], verbose=False)
            except Exception as e:  # noqa: BLE001 (no compiler, no ninja: the twins give the same results)
                warnings.warn(f"seqlm: n-gram loops run in Python/numpy ({type(e).__name__}: {e})", stacklevel=2)
    return _MODULE or None
