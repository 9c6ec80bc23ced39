"""Weighted lines (SRILM's `ngram-count -text-has-weights`): each line of the training text starts with a number,
its weight, and every n-gram of the line counts that weight instead of 1 (the counts are summed weights).

A whole weight w counts as the line repeated w times, exactly: the vocabulary is built from the weighted word
counts (ties broken by first occurrence, as for plain text) and the n-grams are counted with the weights
(counts.count_ngrams), so the estimate is the repeated text's, byte for byte. A weight of 0 drops its line;
a negative or non-numeric one is an error naming the line. Fractional weights give fractional counts, which
only some smoothing methods estimate from (seqlm.ngram.from_counts.FRACTIONAL).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np

from seqlm.config import DataConfig
from seqlm.data.corpus import TokenStream, encode_file, id_blocks, sentences_per_line
from seqlm.data.vocab import EOS, UNK, Vocab
from seqlm.errors import SeqlmError
from seqlm.ngram.counts import weighted_counts

_WEIGHT = re.compile(r"\+?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")  # no sign (a negative weight), no nan or inf


def read_weighted(src: Path, data: DataConfig, units, scratch: Path) -> tuple[Vocab, TokenStream]:
    """The vocabulary and the encoded text (its `weights` set) of the weighted training text `src`, read through a
    copy without the weights in `scratch`; an error about the copy (a word outside a closed vocabulary) names `src`
    and its line."""
    dest, weights = strip_weights(src, scratch, data.raw)
    try:
        vocab = weighted_vocab(dest, data, units, weights)
        stream = encode_file(dest, vocab, data.raw, use_cache=False, unit=units)
    except SeqlmError as e:
        raise SeqlmError(str(e).replace(str(dest), str(src))) from None
    return vocab, TokenStream(stream.ids, stream.starts, stream.words, weights)


def strip_weights(src: Path, scratch: Path, raw: bool) -> tuple[Path, np.ndarray]:
    """Copy the training text `src` into `scratch` without the weight that starts each line, a line of weight 0 (or
    of no words) left blank so that lines keep their numbers; return the copy and the weight of each of its
    sentences (S,) (a --raw line may hold several)."""
    from seqlm.data.corpus import _text_blocks

    dest, weights, lineno = Path(scratch) / "train.unweighted.txt", [], 0
    with open(dest, "w", encoding="utf-8", newline="\n") as out:
        for _, text in _text_blocks(src):
            lines = text.split("\n")
            if lines[-1] == "":
                lines.pop()  # the empty piece after the block's last newline is no line
            kept = []
            for n, line in enumerate(lines, lineno + 1):
                fields = line.split(None, 1)
                w = _weight(fields[0], f"{src}:{n}") if fields else 0.0  # a blank line is no sentence
                kept.append(fields[1].strip() if w > 0 and len(fields) > 1 else "")
                weights.append(w if kept[-1] else 0.0)
            out.write("".join(line + "\n" for line in kept))
            lineno += len(lines)
    if not any(weights):
        raise SeqlmError(f"{src}: no weighted lines with words (the file is empty, blank, or every weight is 0); "
                         "with --text-has-weights each line is 'WEIGHT w1 w2 ...'")
    per_line = sentences_per_line(dest, raw)  # (L,) 0 for a blank line, 1 for another, or a --raw line's sentences
    return dest, np.repeat(np.asarray(weights, dtype=np.float64), per_line)


def _weight(text: str, where: str) -> float:
    if not _WEIGHT.fullmatch(text) or not np.isfinite(float(text)):
        raise SeqlmError(f"{where}: --text-has-weights: the line starts with {text[:40]!r}, not a weight (a number "
                         ">= 0, e.g. 2 or 0.5, before the words)")
    return float(text)


def weighted_vocab(path: Path, data: DataConfig, units, sentence_weights: np.ndarray) -> Vocab:
    """The training vocabulary of a weighted text: data/corpus.build_vocab's rules (words by count, ties by first
    occurrence; --max-vocab, --min-count, --vocab), each word counted as the weights of its sentences summed."""
    prov: dict[str, int] = {EOS: 0}  # first-appearance ids, as build_vocab numbers them
    totals, done = np.zeros(1), 0
    for ids, ends in id_blocks(path, data.raw, units, prov, True, -1, 0):
        w = np.repeat(sentence_weights[done:done + len(ends)], np.diff(ends, prepend=0))  # (n,) each token's
        done += len(ends)
        totals = np.pad(totals, (0, len(prov) - len(totals))) + np.bincount(ids, w, len(prov))
    return vocab_of(Counter(dict(zip(prov, weighted_counts(totals).tolist(), strict=True))), data)


def vocab_of(counter: Counter, data: DataConfig) -> Vocab:
    """Vocab.build or, with --vocab, Vocab.fixed (lmplz's --limit_vocab_file under --unk map) of `counter` (words
    in order of first occurrence), as train's _vocabulary makes it from text; fractional counts are rounded in
    vocab.txt (which holds whole numbers; the estimate reads the n-gram counts)."""
    from seqlm.train.run import _fixed_words

    if data.vocab:
        vocab = Vocab.fixed(counter, _fixed_words(data), outside=data.unk == "map")
    elif all(float(c).is_integer() for c in counter.values()):
        vocab = Vocab.build(counter, data.max_vocab, data.min_count)
    else:
        vocab = _fractional_build(counter, data.max_vocab, data.min_count)
    vocab.counts = [int(round(c)) for c in vocab.counts]
    vocab.closed = data.unk == "none"
    return vocab


def _fractional_build(counter: Counter, max_vocab: int | None, min_count: int) -> Vocab:
    """Vocab.build for fractional counts: the default --min-count 1 keeps every word that occurs (a summed weight
    below 1 too: the default drops nothing), a larger one compares the summed weights."""
    counter = Counter(counter)
    eos, unk = counter.pop(EOS, 0), counter.pop(UNK, 0)
    kept = [(w, c) for w, c in counter.most_common() if c > 0 and (min_count == 1 or c >= min_count)]
    kept = kept if max_vocab is None else kept[:max_vocab - 2]
    dropped = sum(counter.values()) - sum(c for _, c in kept)
    return Vocab([EOS, UNK] + [w for w, _ in kept], [eos, unk + dropped] + [c for _, c in kept])
