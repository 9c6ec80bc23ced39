"""What --precision bf16 can do on this machine: refuse it where the model cannot run in it, warn where it
runs but slowly (CPU bf16 without native instructions is emulated), before any training starts."""

from __future__ import annotations

import functools
import sys

import torch
from torch import nn

from seqlm.errors import SeqlmError


class PrecisionUnsupported(SeqlmError):
    """--precision asks for what this machine cannot run (the demo falls back to fp32 on it)."""


def check_precision(model: nn.Module, precision: str, device: torch.device) -> None:
    """Refuse bf16 where a module of the model cannot run in it here: oneDNN has no bf16 LSTM kernel on
    CPUs without native bf16 instructions (AVX2-only ones), where the first step would otherwise fail with
    an opaque primitive-descriptor error. Warn where it runs without them: every bf16 matmul is then
    converted to fp32 and back (the FOFE model of bench/fofe_ptb.py trained 16x slower than in fp32 on an
    AVX2 EPYC: 90 against 1,489 tokens/s), which a user choosing bf16 for speed would not expect."""
    if precision != "bf16" or device.type != "cpu":
        return
    for kind in {type(m) for m in model.modules() if isinstance(m, nn.RNNBase)}:
        if not cpu_bf16_runs(kind):
            raise PrecisionUnsupported(f"--precision bf16: this CPU cannot run torch's {kind.__name__} in bf16 "
                                       "(oneDNN has no kernel for it here); use --precision fp32")
    if not native_bf16():
        print(f"seqlm: warning: --precision bf16 on a CPU without bf16 instructions "
              f"({torch.backends.cpu.get_cpu_capability()}, no AVX512-BF16 or AMX): bf16 is emulated here and "
              "usually several times slower than --precision fp32", file=sys.stderr, flush=True)


def fast_precision(wanted: str) -> str:
    """`wanted`, or fp32 in place of a bf16 that would run emulated here (a CPU without bf16 instructions
    and no GPU): what benchmark recipes written for bf16 use on such a machine."""
    return "fp32" if wanted == "bf16" and not native_bf16() and not torch.cuda.is_available() else wanted


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX tiles)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


@functools.cache
def cpu_bf16_runs(kind: type[nn.RNNBase]) -> bool:
    """Whether a tiny module of this kind runs forward and backward under CPU bf16 autocast here."""
    probe = kind(4, 4, batch_first=True)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = probe(torch.zeros(1, 2, 4))  # (1, 2, 4)
        out.float().sum().backward()
    except RuntimeError:
        return False
    return True
