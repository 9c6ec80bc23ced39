"""seqlm.ngram's compiled loops (SOURCES): the per-token scorer (scalar.py), ARPA text (arpa_write.py),
the radix sort of n-gram keys (counts.py) and whole-vocabulary rows on the CPU (advance.py), each with a
Python, numpy or torch twin that gives the same results. Built and loaded as seqlm.data.native builds every
compiled module (SEQLM_NATIVE=0 chooses the twins)."""

from __future__ import annotations

from pathlib import Path

from seqlm.data.native import compiled

SOURCES = ("_native.cpp", "_kenlm_calls.cpp", "_lexicon.cpp", "_state.cpp", "_arpa_text.cpp", "_sort.cpp", "_count.cpp",
           "_dense.cpp")


def extension():
    """The compiled module, or None where it cannot be built or SEQLM_NATIVE=0."""
    return compiled("_seqlm_native", [Path(__file__).with_name(f) for f in SOURCES])
