"""Neural-network layers: output softmaxes and recurrent cells."""

from __future__ import annotations

from seqlm.nn.elman import Elman, elman_reference
from seqlm.nn.softmax import ClassSoftmax, FullSoftmax, frequency_classes

__all__ = ["ClassSoftmax", "Elman", "FullSoftmax", "elman_reference", "frequency_classes"]
