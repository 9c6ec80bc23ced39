"""seqlm: train, evaluate and use neural and n-gram language models.

    import seqlm
    lm = seqlm.load("runs/fnn")                   # any family, or a KenLM/SRILM .arpa(.gz) file
    lm_score = seqlm.score_sentence(lm, "the cat sat")   # log10 probability, like KenLM's score()
    print(seqlm.generate(lm, num=3, seed=1))
"""

from __future__ import annotations

from seqlm import forking  # noqa: F401 (forked workers start with one torch thread: forking.py says why)
from seqlm._version import __version__
from seqlm.api import generate, load, save, score_sentence, score_text
from seqlm.ngram.query import NGramQuery  # KenLM-style query API over n-gram models (docs/ngram.md)

__all__ = ["load", "save", "score_sentence", "score_text", "generate", "NGramQuery", "__version__"]
