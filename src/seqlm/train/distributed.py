"""Data-parallel training through torch.distributed (DDP): gloo on CPU, NCCL on GPU.

Launched by `torchrun --nproc_per_node N -m seqlm train ...` (or `seqlm train --nproc N`, which runs
that torchrun for you). Each rank reads its own shard of every epoch's batches (`Context.shard`);
DDP averages the gradients, so N ranks x batch B take the same step as one process with batch N*B.
Only rank 0 writes files and logs. Without torchrun's environment this is a no-op context with world
size 1 and every method costs nothing.
"""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass, field

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


@dataclass
class Context:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False  # setup() created the process group, so finish() tears it down

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def shard(self) -> tuple[int, int]:
        return self.rank, self.world

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module the training steps call: DDP's wrapper under torchrun, else `model` itself."""
        if self.world == 1:
            return model
        ids = [self.local_rank] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def agree(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag OR-ed over all ranks (one tiny all-reduce), so every rank takes the same branch.

        A decision one rank takes alone (out of batches, out of time, a non-finite loss) would leave the
        others waiting forever in the next gradient all-reduce.
        """
        if self.world == 1:
            return tuple(bool(f) for f in flags)
        t = torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32, device=self.device)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return tuple(bool(v) for v in t.tolist())

    def broadcast(self, value: float) -> float:
        """Rank 0's `value` on every rank (decisions taken once, on rank 0)."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        tdist.broadcast(t, src=0)
        return float(t.item())

    def log(self, msg: str) -> None:
        if self.is_main:
            print(msg, file=sys.stderr, flush=True)

    def barrier(self) -> None:
        if self.world > 1:
            tdist.barrier()

    def finish(self, clean: bool = True) -> None:
        """Leave the process group. The caller must have dropped its DDP wrapper and optimiser first.

        torch 2.13 + gloo on CPU: a worker that exits while a DDP reducer is still alive, or without
        a final barrier, often aborts ("terminate called without an active exception"). So: collect
        the garbage (frees the reducer), meet at a barrier, then destroy the group. `clean=False`
        (an unexpected error on this rank) skips the barrier, which the other ranks may never reach.
        """
        if self.world == 1 or not tdist.is_initialized():
            return
        gc.collect()
        if clean:
            tdist.barrier()
        if self.owns_group:  # a caller that brought its own group (a test, a notebook) keeps it
            tdist.destroy_process_group()


def setup(device: torch.device) -> Context:
    """Join the process group torchrun describes in the environment (RANK, WORLD_SIZE, MASTER_ADDR ...).

    Call it before anything touches CUDA: on GPUs it binds this rank to its own device (LOCAL_RANK),
    which `Context.device` then names; otherwise every rank would open a context on GPU 0 first.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Context(device=device)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        torch.cuda.set_device(local)  # one GPU per rank; before init so NCCL binds the right one
        device = torch.device("cuda", local)
    owns = not tdist.is_initialized()
    if owns:
        tdist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Context(rank=tdist.get_rank(), world=tdist.get_world_size(), local_rank=local, device=device,
                   owns_group=owns)
