"""User-facing errors.

Anything a user can cause (bad file, bad flag, bad model directory) raises `SeqlmError`; the CLI
prints its one-line message and exits with status 2. Bugs stay ordinary exceptions with tracebacks.
"""

from __future__ import annotations


class SeqlmError(Exception):
    """A problem with the user's input, with a message that says how to fix it."""
