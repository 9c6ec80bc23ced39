"""Keep a training process's freed big blocks for its next step.

glibc's malloc hands every block above its mmap threshold (at most 32 MB by its own rule) to the kernel when it
is freed, and trims the heap's free top. A training step allocates the same big buffers every step (a (V, H)
gradient of a 61k-word embedding or output matrix is 49 MB, (N, V) logits several times that), so each step
maps them again and faults every page in; where page faults are dear (a VM, a sandbox) that is a large part of
the step. Raising both thresholds keeps freed memory in the heap for reuse, at the cost of a higher peak RSS
(blocks of different sizes do not always fit the holes others left): bench/results/sparse.json's gcide-nce-zreg
(GCIDE, V = 61k, NCE) trains 1.36x faster with them for 1.39x the peak RSS, against gcide-nce-zreg-nokeep in
the same run. `--keep-memory false` (TrainConfig.keep_memory) leaves glibc's defaults. Nothing happens off
glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
KEEP = 1 << 30  # blocks up to 1 GB come from the heap, and up to 1 GB of free heap top is kept


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True where they were set."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to set
        return False
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, KEEP)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP))
