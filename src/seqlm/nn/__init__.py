"""Neural-network layers: output softmaxes and recurrent cells."""

from __future__ import annotations

from seqlm.nn.class_softmax import ClassSoftmax, frequency_classes
from seqlm.nn.elman import Elman, elman_reference
from seqlm.nn.softmax import FullSoftmax

__all__ = ["ClassSoftmax", "Elman", "FullSoftmax", "elman_reference", "frequency_classes"]
