"""`seqlm prune`: shrink an existing back-off model (ARPA, binary or kn directory), as SRILM's
`ngram -lm IN -prune T -order N -write-lm OUT` and KenLM's `filter` do, without the training text.

- entropy: Stolcke pruning (prune.py), the same function `seqlm train --prune-entropy` runs on the estimate,
  so pruning a saved model gives the model pruned at estimation.
- order: the orders above N dropped. The lower orders' back-off weights were fitted for their own level, so
  the result still sums to 1; it is not a KN estimate of order N (whose top order uses raw counts, not
  continuation counts): SRILM's `-order` gives the same model.
- vocabulary: KenLM `filter`'s rule: the n-grams holding a word outside the list are dropped, every number
  kept, so any sentence of listed words scores as before (a smaller model for a known vocabulary; `train
  --vocab` instead renormalises at estimation, lmplz's --limit_vocab_file).
- count pruning needs the counts, which a finished model does not hold: `train --prune` (or `--counts`).
"""

from __future__ import annotations

import numpy as np

from seqlm.data.vocab import BOS, EOS, UNK, Vocab, read_word_list
from seqlm.errors import SeqlmError
from seqlm.ngram.files import load_tables
from seqlm.ngram.model import NGramModel
from seqlm.ngram.prune import prune_entropy


def reduce_order(model: NGramModel, order: int) -> NGramModel:
    """The orders 1..`order` of the model, their numbers as they are."""
    if not 1 <= order <= model.order:
        raise SeqlmError(f"--order {order}: the model has orders 1..{model.order}")
    if order == model.order:
        return model
    return NGramModel(model.vocab, model.keys[:order], model.log10_prob[:order], model.log10_backoff[:order - 1])


def restrict_vocab(model: NGramModel, words: set[str]) -> NGramModel:
    """The n-grams whose words are all in `words` (with <s>, </s> and <unk>), every probability and back-off
    weight as it was; word ids renumbered in their old order, so every key stays sorted."""
    keep_word = np.array([w in words or w in (BOS, EOS, UNK) for w in model.vocab.itos])  # (V,)
    V, new_V = len(model.vocab), int(keep_word.sum())
    new_word = np.cumsum(keep_word) - 1  # (V,) id among the kept words
    keys, probs, backs = [np.arange(new_V, dtype=np.int64)], [model.log10_prob[0][keep_word]], []
    if model.order > 1:
        backs.append(model.log10_backoff[0][keep_word])
    keep_prev, new_prev = keep_word, new_word
    for k in range(2, model.order + 1):
        ctx, last = model.keys[k - 1] // V, model.keys[k - 1] % V  # (M_k,)
        keep = keep_prev[ctx] & keep_word[last]  # (M_k,) its context was kept and its word is listed
        keys.append(new_prev[ctx[keep]] * new_V + new_word[last[keep]])
        probs.append(model.log10_prob[k - 1][keep])
        if k < model.order:
            backs.append(model.log10_backoff[k - 1][keep])
        keep_prev, new_prev = keep, np.cumsum(keep) - 1
    vocab = Vocab([w for w, kept in zip(model.vocab.itos, keep_word, strict=True) if kept],
                  [c for c, kept in zip(model.vocab.counts, keep_word, strict=True) if kept])
    return NGramModel(vocab, keys, probs, backs)


def shrink(src: str, dst: str, entropy: float = 0.0, order: int = 0, vocab: str = "") -> dict:
    """Read `src`, apply order reduction, vocabulary restriction, then entropy pruning (each given one), and
    write `dst` (ARPA when it ends .arpa[.gz], else seqlm's binary)."""
    from seqlm.ngram.binary import write_binary
    from seqlm.ngram.tools import ARPA_OUT

    if not (entropy or order or vocab):
        raise SeqlmError("give what to prune: --entropy T, --order N and/or --vocab FILE")
    if not entropy >= 0:
        raise SeqlmError(f"--entropy must be >= 0 (e.g. 1e-8), got {entropy}")
    words = set(read_word_list(vocab)) if vocab else None
    if words is not None and not words:
        raise SeqlmError(f"--vocab {vocab} lists no words")
    model = load_tables(src)
    before = model.sizes
    if order:
        model = reduce_order(model, order)
    if words is not None:
        model = restrict_vocab(model, words)
    if entropy:
        model = prune_entropy(model, entropy)
    if dst.endswith(ARPA_OUT):
        model.to_arpa(dst)
    else:
        write_binary(model, dst)
    return {"in": src, "out": dst, "order": model.order, "ngrams_before": before, "ngrams": model.sizes}
