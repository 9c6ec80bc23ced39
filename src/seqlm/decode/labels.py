"""The labels of a CTC model's outputs: which is the blank, which start a word, what text each adds.

A labels file has one label a line, in the order of the posteriors' last dimension (a line holding one space
is the space label; an empty line is a label with no text), or it is a JSON object {label: index}, as
wav2vec2's vocab.json. The blank is `--blank INDEX|NAME`; by default the empty label, else one named <blank>,
<pad>, [pad] or <eps> (any case), else index 0. `_` is never taken for the blank by default: seqlm's
character models write it between words. The word boundary is `--space LABEL`; by default " ", else "|"
(wav2vec2's). A label that starts with "▁" (sentencepiece) starts a new word with the rest of its text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from seqlm.data.corpus import WORD_SEP
from seqlm.data.vocab import BOS, EOS, UNK
from seqlm.errors import SeqlmError

PIECE = "▁"  # sentencepiece's word start
BLANK_NAMES = ("", "<blank>", "<pad>", "[pad]", "<eps>")
SPACE_NAMES = (" ", "|")
SPECIAL = re.compile(r"^[<\[].+[>\]]$")  # <unk>, <s>, [UNK]: spelled by no word, exempt from the spelling check


@dataclass(frozen=True)
class Labels:
    """The labels, resolved: `texts[i]` is what label i adds to the transcript after a word start (a space
    or ▁ label) or to the word being spelled; `starts[i]`: label i ends the word before it."""

    names: tuple[str, ...]
    blank: int
    space: int | None  # the word-boundary label, if any
    texts: tuple[str, ...]
    starts: tuple[bool, ...]

    def __len__(self) -> int:
        return len(self.names)

    def ordinary(self) -> list[int]:
        """The labels that spell text: neither the blank, nor the boundary, nor a special <...> token."""
        return [i for i, n in enumerate(self.names)
                if i != self.blank and i != self.space and n != PIECE and not SPECIAL.match(n)]

    def render(self, ids: list[int]) -> str:
        """The transcript of a label sequence (blanks and repeats already removed): words joined by one space."""
        return " ".join("".join((" " + self.texts[i]) if self.starts[i] else self.texts[i] for i in ids).split())

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(starts (L,) bool, text length in characters (L,) int64) on `device`."""
        return (torch.tensor(self.starts, device=device),
                torch.tensor([len(t) for t in self.texts], dtype=torch.long, device=device))


def read_labels(path: str | Path, blank: str | None = None, space: str | None = None) -> Labels:
    """The labels file at `path` (see the module docstring), its blank and boundary resolved."""
    return resolve(_read_names(Path(path)), blank, space, str(path))


def resolve(names: list[str], blank: str | None = None, space: str | None = None, where: str = "labels") -> Labels:
    if not names:
        raise SeqlmError(f"{where}: no labels; give one label a line, in the order of the posteriors' columns")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise SeqlmError(f"{where}: label {dup[0]!r} appears more than once; each column needs its own label")
    b = _blank_index(names, blank, where)
    s = _space_index(names, space, b, where)
    texts = tuple("" if i in (b, s) else n.removeprefix(PIECE) for i, n in enumerate(names))
    starts = tuple(i == s or (i != b and n.startswith(PIECE)) for i, n in enumerate(names))
    return Labels(tuple(names), b, s, texts, starts)


def _read_names(path: Path) -> list[str]:
    if not path.is_file():
        raise SeqlmError(f"{path}: no such labels file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SeqlmError(f"{path}: the labels file is not UTF-8 text") from None
    if path.suffix == ".json":
        return _json_names(text, path)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line.removesuffix("\r") for line in lines]


def _json_names(text: str, path: Path) -> list[str]:
    """{label: index} (wav2vec2's vocab.json) or a list of labels."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise SeqlmError(f"{path}: not valid JSON ({e})") from None
    if isinstance(obj, list) and all(isinstance(n, str) for n in obj):
        return obj
    if not isinstance(obj, dict) or not all(isinstance(i, int) for i in obj.values()):
        raise SeqlmError(f"{path}: a JSON labels file is an object {{label: index}} or a list of labels")
    if sorted(obj.values()) != list(range(len(obj))):
        raise SeqlmError(f"{path}: the indices must be 0..{len(obj) - 1}, each once")
    return sorted(obj, key=obj.__getitem__)


def _blank_index(names: list[str], blank: str | None, where: str) -> int:
    if blank is None:
        lowered = [n.lower() for n in names]
        return next((lowered.index(b) for b in BLANK_NAMES if b in lowered), 0)
    if blank in names:
        return names.index(blank)
    try:
        i = int(blank)
    except ValueError:
        raise SeqlmError(f"--blank {blank!r}: no such label in {where}; give a label or its index") from None
    if not -len(names) <= i < len(names):
        raise SeqlmError(f"--blank {i}: {where} has {len(names)} labels (indices 0..{len(names) - 1}, or -1 the last)")
    return i % len(names)


def _space_index(names: list[str], space: str | None, blank: int, where: str) -> int | None:
    if space is not None and space not in names:
        raise SeqlmError(f"--space {space!r}: no such label in {where}")
    found = space if space is not None else next((s for s in SPACE_NAMES if s in names), None)
    if found is None:
        return None
    if names.index(found) == blank:
        raise SeqlmError(f"{where}: {found!r} cannot be both the blank and the word boundary; set --blank or --space")
    return names.index(found)


def check_spelling(labels: Labels, words: list[str], what: str) -> None:
    """Word-level decoding: refuse labels whose text occurs in no word of the LM (labels and LM spelled
    differently, e.g. upper-case labels and a lower-case LM): the LM would read every word holding them as
    unknown."""
    joined = "\n".join(words)
    bad = [labels.names[i] for i in labels.ordinary() if labels.texts[i] and labels.texts[i] not in joined]
    if bad:
        raise SeqlmError(f"labels {', '.join(map(repr, bad[:5]))}{' ...' if len(bad) > 5 else ''} occur in no word of "
                         f"{what}: the labels and the LM's words are spelled differently (letter case? another "
                         "alphabet?); decode with labels the LM's words are made of")


def token_ids(labels: Labels, vocab_stoi: dict[str, int], unit: str, what: str) -> list[int]:
    """Token-level decoding: the LM's token for each label (-1 for the blank). A character model reads `_`
    between words, so the boundary label is its `_`; a special label (<s>, <unk>, [UNK]) that is not a token is
    read as <unk>; every other label must be one of the LM's tokens."""
    ids, bad = [], []
    for i, name in enumerate(labels.names):
        token = WORD_SEP if i == labels.space and unit == "char" else name
        if i == labels.blank:
            ids.append(-1)
        elif token not in (BOS, EOS) and token in vocab_stoi:
            ids.append(vocab_stoi[token])
        elif SPECIAL.match(name):
            ids.append(vocab_stoi[UNK])
        else:
            bad.append(name)
    if bad:
        raise SeqlmError(f"labels {', '.join(map(repr, bad[:5]))}{' ...' if len(bad) > 5 else ''} are not tokens of "
                         f"{what} ({unit} units); token-level decoding needs labels that are the LM's own tokens "
                         "(or --lm-unit word with an LM of words)")
    return ids
