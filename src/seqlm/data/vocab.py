"""Vocabulary: words <-> ids, built from training text only.

Ids are assigned by descending count (ties broken by first occurrence), after the two symbols every
model needs: `</s>` (id 0, sentence end; also the start-of-sentence context, as in Mikolov's rnnlm)
and `<unk>` (id 1, every word outside the vocabulary; PTB's own `<unk>` is the same token).
Frequency order is what class-factorised outputs and the sparse-code families want.
Saved as `vocab.txt`: one `token<TAB>count` per line, in id order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from seqlm.errors import SeqlmError

EOS = "</s>"
UNK = "<unk>"
BOS = "<s>"  # only n-gram models (ARPA files) have a separate start symbol


class Vocab:
    """An ordered list of tokens with their training counts."""

    def __init__(self, tokens: list[str], counts: list[int] | None = None):
        if not tokens:
            raise SeqlmError("empty vocabulary: the training text has no tokens")
        self.itos = list(tokens)
        self.counts = list(counts) if counts is not None else [0] * len(tokens)
        self.stoi = {tok: i for i, tok in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise SeqlmError("vocabulary has duplicate tokens; rebuild it from the training text")
        if UNK not in self.stoi or EOS not in self.stoi:
            raise SeqlmError(f"vocabulary must contain {EOS} and {UNK}")
        self.unk_id = self.stoi[UNK]
        self.eos_id = self.stoi[EOS]
        # Context symbol at a sentence start: <s> where the model has one (ARPA), else </s>.
        self.bos_id = self.stoi.get(BOS, self.eos_id)

    def __len__(self) -> int:
        return len(self.itos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def id(self, token: str) -> int:
        return self.stoi.get(token, self.unk_id)

    def encode(self, words: Iterable[str]) -> list[int]:
        get, unk = self.stoi.get, self.unk_id
        return [get(w, unk) for w in words]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[i] for i in ids]

    def counts_array(self) -> np.ndarray:
        return np.asarray(self.counts, dtype=np.int64)

    @classmethod
    def build(cls, counter: Counter, max_vocab: int | None = None, min_count: int = 1) -> Vocab:
        """Keep words seen at least `min_count` times, the `max_vocab` most frequent (specials included)."""
        if max_vocab is not None and max_vocab < 2:
            raise SeqlmError(f"--max-vocab must be at least 2 (for {EOS} and {UNK}), got {max_vocab}")
        if min_count < 1:
            raise SeqlmError(f"--min-count must be at least 1, got {min_count}")
        counter = Counter(counter)
        eos_count = counter.pop(EOS, 0)
        unk_count = counter.pop(UNK, 0)
        # Counter.most_common is stable for ties (first-inserted first), so ids are reproducible.
        words = [(w, c) for w, c in counter.most_common() if c >= min_count]
        if max_vocab is not None:
            dropped, words = words[max_vocab - 2 :], words[: max_vocab - 2]
        else:
            dropped = []
        dropped_count = sum(c for _, c in dropped) + sum(c for c in counter.values() if c < min_count)
        tokens = [EOS, UNK] + [w for w, _ in words]
        counts = [eos_count, unk_count + dropped_count] + [c for _, c in words]
        return cls(tokens, counts)

    def save(self, path: str | Path) -> None:
        from seqlm.checkpoint import atomic_write_text

        lines = "".join(f"{t}\t{c}\n" for t, c in zip(self.itos, self.counts, strict=True))
        atomic_write_text(Path(path), lines)

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        path = Path(path)
        if not path.is_file():
            raise SeqlmError(f"{path}: vocabulary file missing; is this a seqlm model directory?")
        tokens, counts = [], []
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise SeqlmError(f"{path}: not UTF-8 ({e.reason}); the vocabulary file is corrupt") from None
        for n, line in enumerate(text.splitlines(), 1):
            tok, sep, count = line.partition("\t")
            if not sep or not count.strip().isdigit():
                raise SeqlmError(f"{path}:{n}: expected 'token<TAB>count'; the vocabulary file is corrupt")
            tokens.append(tok)
            counts.append(int(count))
        return cls(tokens, counts)
