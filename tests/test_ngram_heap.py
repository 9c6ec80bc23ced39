"""retained_heap (ngram/heap.py): inside it a freed big block is reused without the kernel faulting its pages
in again; outside, glibc maps each big block afresh. Counted with the process's minor page faults."""

from __future__ import annotations

import resource

import numpy as np

from seqlm.ngram.heap import retained_heap

from conftest import require_env

BLOCK = 64 << 20  # above glibc's largest mmap threshold (32 MB): mapped on its own by default


def _faults_of_a_second_block() -> int:
    """Minor page faults while allocating and filling a block of the size just freed."""
    first = np.ones(BLOCK, dtype=np.uint8)
    del first
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    second = np.ones(BLOCK, dtype=np.uint8)
    del second
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_a_freed_block_is_reused_inside_and_mapped_afresh_outside() -> None:
    with retained_heap() as applied:
        if not applied:
            require_env("glibc's mallopt is not available here")
        inside = _faults_of_a_second_block()
    outside = _faults_of_a_second_block()
    assert inside * 10 < outside, (inside, outside)
