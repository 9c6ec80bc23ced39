"""What a process forked from one that has seqlm loaded needs (os.fork, multiprocessing's "fork" context).

GNU OpenMP, which runs torch's CPU kernels, keeps the threads of its last parallel region for the next one; a
forked child inherits that bookkeeping but not the threads, and its next parallel region waits for them for
ever (an LSTM forward in a worker hangs in gomp_team_barrier_wait_end once the parent has run one on two
threads). A region of one thread starts no team, so a forked child starts with one torch thread, as torch's
own DataLoader workers do. A parent that never ran torch in parallel before forking leaves its children free
to call torch.set_num_threads again; spawned workers start fresh and need none of this.
"""

from __future__ import annotations

import os

import torch


def _one_thread() -> None:
    torch.set_num_threads(1)


os.register_at_fork(after_in_child=_one_thread)
