"""Keeping freed memory for reuse while bounded-memory estimation runs (glibc's malloc; elsewhere nothing).

Bounded estimation allocates and frees arrays of tens to hundreds of megabytes chunk after chunk. glibc
serves every block above 32 MB with a fresh mmap and unmaps it on free, so each array's pages are faulted
in and zeroed by the kernel again: 20% of counting's time at 100M tokens (perf: clear_page_erms under
page faults), and more on a virtual machine that hands freed pages back to its host. Inside
`retained_heap()` malloc takes big blocks from its heap and keeps what is freed (up to 2 GB above the
top), so the next chunk reuses pages already there. The peak grows a little where freed blocks do not fit
the next requests (100M-token KN5 within 4G: 2.9 -> 3.0 GB). On leaving, the settings go back to glibc's
defaults and the free memory is returned (malloc_trim).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Iterator

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameters (malloc.h)
DEFAULTS = {M_TRIM_THRESHOLD: 128 * 1024, M_MMAP_MAX: 65536}  # glibc's (mallopt(3))
KEPT = {M_TRIM_THRESHOLD: 2**31 - 1, M_MMAP_MAX: 0}  # no block mapped on its own; free memory kept


def _glibc():
    """libc with mallopt and malloc_trim, or None (musl, macOS, Windows)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


@contextlib.contextmanager
def retained_heap() -> Iterator[bool]:
    """Within: freed blocks stay in the process for the next allocation. Yields whether it applies here."""
    libc = _glibc()
    applied = libc is not None and all(libc.mallopt(p, v) == 1 for p, v in KEPT.items())
    try:
        yield applied
    finally:
        if libc is not None:
            for p, v in DEFAULTS.items():
                libc.mallopt(p, v)
            libc.malloc_trim(0)
