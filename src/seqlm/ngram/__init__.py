"""N-gram language models: interpolated modified Kneser-Ney estimation (as KenLM's lmplz), ARPA I/O,
seqlm's memory-mapped binary format, pruning and a KenLM-style query API (docs/ngram.md).

    from seqlm.ngram import NGramModel, NGramQuery, estimate_model, read_binary, write_binary
    model = estimate_model(train_stream, vocab, order=5)    # vocab: the training Vocab (no <s>)
    model.to_arpa("model.arpa.gz")
    write_binary(model, "model.bin")                        # mapped, not parsed, by read_binary
    model = NGramModel.from_arpa("kenlm.arpa")              # KenLM / SRILM / seqlm files
    NGramQuery("model.bin").score("the cat sat")            # kenlm.Model's interface
"""

from __future__ import annotations

from seqlm.ngram.arpa import ArpaData, read_arpa
from seqlm.ngram.arpa_write import write_arpa
from seqlm.ngram.binary import read_binary, write_binary
from seqlm.ngram.counts import NGramCounts, count_ngrams
from seqlm.ngram.discounts import FALLBACK_DISCOUNTS, Discount
from seqlm.ngram.kneser_ney import (
    adjust_counts,
    compute_discounts,
    estimate,
    estimate_model,
    initial_probabilities,
    interpolate,
)
from seqlm.ngram.model import NGramModel
from seqlm.ngram.prune import prune_entropy
from seqlm.ngram.query import NGramQuery, state_attribute

__all__ = [
    "FALLBACK_DISCOUNTS",
    "ArpaData",
    "Discount",
    "NGramCounts",
    "NGramModel",
    "NGramQuery",
    "State",
    "adjust_counts",
    "compute_discounts",
    "count_ngrams",
    "estimate",
    "estimate_model",
    "initial_probabilities",
    "interpolate",
    "prune_entropy",
    "read_arpa",
    "read_binary",
    "write_arpa",
    "write_binary",
]

__getattr__ = state_attribute(__name__)  # State: query.state_type()
