"""Vocabulary: words <-> ids, built from training text only.

Ids are assigned by descending count (ties broken by first occurrence), after the two symbols every
model needs: `</s>` (id 0, sentence end; also the start-of-sentence context, as in Mikolov's rnnlm)
and `<unk>` (id 1, every word outside the vocabulary; PTB's own `<unk>` is the same token).
Frequency order is what class-factorised outputs and the sparse-code families want.
Saved as `vocab.txt`: one `token<TAB>count` per line, in id order.

A fixed vocabulary (`--vocab FILE`, `Vocab.fixed`) keeps the same order: `</s>`, `<unk>`, the file's words
seen in training by count (ties by first occurrence), then its words never seen, in the file's order. A
closed vocabulary (`--unk none`) has no `<unk>` for unknown words: the text readers (seqlm.data.corpus
`encode_file`, `encode_sentences`) refuse them through `known`; `encode` maps them to `<unk>` whatever the
rule, as KenLM's query API does (seqlm.ngram.query).
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

    def __init__(self, tokens: list[str], counts: list[int] | None = None, limit: int | None = None):
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
        # Ids from `limit` on are training words outside a fixed vocabulary that an estimator counts before it
        # prunes them (kn, as lmplz --limit_vocab_file: `Vocab.fixed(..., outside=True)`); None: no such words.
        self.limit = limit
        self.closed = False  # --unk none sets it: to the text readers, a word outside the vocabulary is an error

    def __len__(self) -> int:
        return len(self.itos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def id(self, token: str) -> int:
        return self.stoi.get(token, self.unk_id)

    def encode(self, words: Iterable[str]) -> list[int]:
        get, unk = self.stoi.get, self.unk_id
        return [get(w, unk) for w in words]

    def known(self, word: str, where: str = "") -> int:
        """The id of a word of a closed vocabulary; an unknown word is an error naming it (and `where`)."""
        i = self.stoi.get(word)
        if i is None:
            raise SeqlmError(f"{where}{word!r} is not in the vocabulary, which is closed (--unk none); a model "
                             "trained with --unk map scores such a word as <unk>")
        return i

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

    @classmethod
    def fixed(cls, counter: Counter, words: Iterable[str], outside: bool = False) -> Vocab:
        """The vocabulary of a word list (`--vocab`) in the module's order, with the training `counter` (in order
        of first occurrence, as count_words gives it). Training words outside the list count as <unk>; with
        `outside` (lmplz --limit_vocab_file) they follow the list's words instead, from `limit` on, for the
        estimator to count and then prune, and the list's words never seen are left out, as lmplz leaves them."""
        counter = Counter(counter)
        eos_count, unk_count = counter.pop(EOS, 0), counter.pop(UNK, 0)
        listed = dict.fromkeys(w for w in words if w not in (EOS, UNK, BOS))  # in file order, once each
        ranked = [(w, c) for w, c in counter.most_common() if c > 0]  # stable: ties by first occurrence
        seen = [(w, c) for w, c in ranked if w in listed]
        rest = [(w, c) for w, c in ranked if w not in listed]
        if outside and rest:
            head = [(EOS, eos_count), (UNK, unk_count)] + seen
            tokens, counts = zip(*(head + rest), strict=True)
            return cls(list(tokens), list(counts), limit=len(head))
        unseen = [] if outside else [(w, 0) for w in listed if counter.get(w, 0) == 0]
        tokens, counts = zip(*[(EOS, eos_count), (UNK, unk_count + sum(c for _, c in rest)), *seen, *unseen],
                             strict=True)
        return cls(list(tokens), list(counts))

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


def read_word_list(path: str | Path) -> list[str]:
    """The words of a `--vocab` file: one a line, optionally followed by a tab and a count (a model's vocab.txt,
    a unigram count file); blank lines are skipped. Anything else is an error naming the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SeqlmError(f"--vocab {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SeqlmError(f"--vocab {path}: cannot read it as UTF-8 text ({e})") from None
    words = []
    for n, line in enumerate(text.split("\n"), 1):
        word, tab, count = line.strip().partition("\t")
        if len(word.split()) > 1 or (tab and not count.strip().isdigit()):
            raise SeqlmError(f"--vocab {path}:{n}: expected one word a line (optionally a tab and its count), got "
                             f"{line.strip()[:60]!r}; a list on one line splits with `tr -s ' ' '\\n'`")
        words += word.split()
    return words
