"""CTC beam search over label posteriors, with any seqlm model as the language model (`seqlm decode`)."""

from seqlm.decode.decoder import CTCDecoder, DecodeConfig
from seqlm.decode.finish import Hypothesis
from seqlm.decode.labels import Labels, read_labels, resolve

__all__ = ["CTCDecoder", "DecodeConfig", "Hypothesis", "Labels", "read_labels", "resolve"]
