"""User-facing errors.

Anything a user can cause (bad file, bad flag, bad model directory) raises `SeqlmError`; the CLI
prints its one-line message and exits with status 2. Bugs stay ordinary exceptions with tracebacks.
"""

from __future__ import annotations


class SeqlmError(Exception):
    """A problem with the user's input, with a message that says how to fix it."""


# Set by `seqlm train --nproc N` for its workers: each writes its SeqlmError to DIR/rank<R>.err instead
# of stderr, and the launcher reports it once (not N times, not under torchrun's failure report).
ERROR_DIR_ENV = "SEQLM_ERROR_DIR"
