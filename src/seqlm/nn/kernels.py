"""The nn layers' compiled kernels (nn/_gather_dot.cpp, module `_seqlm_nn`): the gather-dot of NCE and the tree
softmax, the tree's inference word scores, ByteDropout's bytes and mask. Each caller keeps a tensor twin for
what these do not take (other dtypes and devices, a machine without a compiler)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from seqlm.data.native import compiled


def compiled_for(*tensors: Tensor):
    """The compiled module where it applies to `tensors`: float32 CPU tensors, the module built; else None."""
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
        return None
    return compiled("_seqlm_nn", [Path(__file__).with_name("_gather_dot.cpp")])


def numpy_view(t: Tensor | None):
    """A contiguous CPU tensor's numpy view (its memory, for the compiled calls), or None."""
    return None if t is None else t.detach().contiguous().numpy()
