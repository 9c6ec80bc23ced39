"""Data-parallel training through torch.distributed (DDP): gloo on CPU, NCCL on GPU.

Launched by `torchrun --nproc_per_node N -m seqlm train ...` (or `seqlm train --nproc N`). Each rank
reads its own shard of the batches; DDP averages gradients; only rank 0 writes files.
Without torchrun's environment this is a no-op context with world size 1.
"""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


@dataclass
class Context:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    wrapped: nn.Module | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def shard(self) -> tuple[int, int]:
        return self.rank, self.world

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.world == 1:
            return model
        self.wrapped = DistributedDataParallel(model, device_ids=[self.local_rank] if torch.cuda.is_available()
                                               and next(model.parameters()).is_cuda else None)
        return self.wrapped

    def log(self, msg: str) -> None:
        if self.is_main:
            print(msg, file=sys.stderr, flush=True)

    def barrier(self) -> None:
        if self.world > 1:
            tdist.barrier()

    def finish(self) -> None:
        """Tear down in the order that keeps gloo workers from aborting at exit (torch 2.13)."""
        if self.world == 1:
            return
        self.wrapped = None
        gc.collect()
        tdist.barrier()
        tdist.destroy_process_group()


def setup(model: nn.Module, device: torch.device) -> Context:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Context()
    if not tdist.is_initialized():
        tdist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        torch.cuda.set_device(local)
        model.to(torch.device("cuda", local))
    return Context(rank=tdist.get_rank(), world=tdist.get_world_size(), local_rank=local)
