"""N-gram language models: interpolated modified Kneser-Ney estimation (as KenLM's lmplz) and ARPA I/O.

    from seqlm.ngram import NGramModel, estimate_model
    model = estimate_model(train_stream, vocab, order=5)    # vocab: the training Vocab (no <s>)
    model.to_arpa("model.arpa.gz")
    model = NGramModel.from_arpa("kenlm.arpa")              # KenLM / SRILM / seqlm files
"""

from __future__ import annotations

from seqlm.ngram.arpa import ArpaData, read_arpa, write_arpa
from seqlm.ngram.counts import NGramCounts, count_ngrams
from seqlm.ngram.kneser_ney import (
    FALLBACK_DISCOUNTS,
    Discount,
    adjust_counts,
    compute_discounts,
    estimate,
    estimate_model,
    initial_probabilities,
    interpolate,
)
from seqlm.ngram.model import NGramModel

__all__ = [
    "FALLBACK_DISCOUNTS",
    "ArpaData",
    "Discount",
    "NGramCounts",
    "NGramModel",
    "adjust_counts",
    "compute_discounts",
    "count_ngrams",
    "estimate",
    "estimate_model",
    "initial_probabilities",
    "interpolate",
    "read_arpa",
    "write_arpa",
]
