"""`seqlm tokenizer train | encode | decode`: the subword tokenizers `--unit token` reads text with
(seqlm.data.tokenizers). `train` makes a sentencepiece model; `encode` and `decode` take any tokenizer seqlm
reads (a sentencepiece .model, a Hugging Face tokenizer.json, or a directory holding one, a model's included).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from seqlm.data.corpus import _text_blocks, spool
from seqlm.data.tokenizers import SP_FILE, Tokenizer, first_line, library, load_tokenizer
from seqlm.data.vocab import UNK
from seqlm.errors import SeqlmError


@dataclass
class PieceTraining:
    """sentencepiece training, as `seqlm tokenizer train` runs it."""

    vocab_size: int  # pieces in the tokenizer, <unk>, <s> and </s> included
    type: str = "unigram"  # unigram | bpe: sentencepiece's model_type
    character_coverage: float = 1.0  # share of the text's characters kept as pieces; the rarest others are <unk>
    # pieces never split, comma-separated (user_defined_symbols): a corpus's own <unk> (PTB's) stays one token, read
    # as seqlm's <unk> (sentencepiece otherwise spells it out and drops its < and > as unknown characters)
    whole: str = "<unk>"

    def __post_init__(self) -> None:
        if self.type not in ("unigram", "bpe"):
            raise SeqlmError(f"--type must be one of unigram, bpe; got {self.type!r}")
        if self.vocab_size < 4:
            raise SeqlmError(f"--vocab-size must be at least 4 (<unk>, <s>, </s> and a piece), got {self.vocab_size}")
        if not 0 < self.character_coverage <= 1:
            raise SeqlmError(f"--character-coverage must be in (0, 1], got {self.character_coverage}")


def train_tokenizer(text: str, out: str, cfg: PieceTraining, force: bool) -> dict:
    """A sentencepiece model of `text` into out/tokenizer.model (refused over an existing one unless `force`)."""
    from seqlm.checkpoint import atomic_path
    from seqlm.outputs import claim_output

    dest = Path(out) / SP_FILE
    claim_output(dest, force, "--out", inputs=[text])
    spm = library("sentencepiece")
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="seqlm-spm-") as tmp:
        src = Path(text)
        if str(src) == "-" or not src.is_file() or src.suffix == ".gz":  # sentencepiece reads a plain file
            src = spool(src, Path(tmp) / "text")
        symbols = [w for w in cfg.whole.split(",") if w]
        try:  # sentencepiece's own unknown piece may not be <unk> when <unk> is a piece of the text
            spm.SentencePieceTrainer.train(input=str(src), model_prefix=str(Path(tmp) / "m"),
                                           vocab_size=cfg.vocab_size, model_type=cfg.type,
                                           character_coverage=cfg.character_coverage, user_defined_symbols=symbols,
                                           unk_piece="<UNK>" if UNK in symbols else UNK, minloglevel=2)
        except RuntimeError as e:
            raise SeqlmError(f"sentencepiece: {first_line(e)}") from None
        with atomic_path(dest) as part:
            shutil.copyfile(Path(tmp) / "m.model", part)
    tok = load_tokenizer(dest)
    return {"tokenizer": str(dest), "hash": tok.hash, "pieces": len(tok), **asdict(cfg),
            "train_seconds": round(time.time() - t0, 2)}


def _lines(text: str | None) -> Iterator[list[str]]:
    """The input's lines a block at a time (standard input without --text), blank ones included."""
    for _, block in _text_blocks(Path(text or "-")):
        lines = block.split("\n")
        yield lines[:-1] if lines and lines[-1] == "" else lines


def encode_lines(tok: Tokenizer, text: str | None) -> Iterator[str]:
    """Each line's pieces, separated by spaces; a blank line stays blank."""
    for lines in _lines(text):
        pieces = iter(tok.pieces_batch([line for line in lines if line.split()]))
        yield from (" ".join(next(pieces)) if line.split() else "" for line in lines)


def decode_lines(tok: Tokenizer, text: str | None) -> Iterator[str]:
    """Each line of pieces back to text by the tokenizer's decode."""
    for lines in _lines(text):
        yield from (tok.decode(line.split()) for line in lines)


TRAIN_ONLY = ("vocab_size", "out", "type", "character_coverage", "whole", "force")


def cmd_tokenizer(args: argparse.Namespace, rest: list[str]) -> None:
    """Train a sentencepiece tokenizer, or encode / decode text with a tokenizer."""
    _check_options(args)
    if args.action == "train":
        given = {k: getattr(args, k) for k in ("type", "character_coverage", "whole") if getattr(args, k) is not None}
        print(json.dumps(train_tokenizer(args.text, args.out, PieceTraining(args.vocab_size, **given), args.force)))
        return
    tok = load_tokenizer(args.tokenizer)
    for line in (encode_lines if args.action == "encode" else decode_lines)(tok, args.text):
        sys.stdout.write(line + "\n")


def _check_options(args: argparse.Namespace) -> None:
    """One parser for the three actions (one option list): each action's own options, checked here."""
    train = args.action == "train"
    needed = ("text", "vocab_size", "out") if train else ("tokenizer",)
    missing = [n for n in needed if getattr(args, n) is None]
    if missing:
        raise SeqlmError(f"seqlm tokenizer {args.action} needs --{missing[0].replace('_', '-')}")
    stray = [n for n in (("tokenizer",) if train else TRAIN_ONLY) if getattr(args, n) not in (None, False)]
    if stray:
        raise SeqlmError(f"--{stray[0].replace('_', '-')} is not an option of seqlm tokenizer {args.action}")


def add_tokenizer_commands(sub) -> None:
    """`seqlm tokenizer train|encode|decode` (training defaults: PieceTraining)."""
    tp = sub.add_parser("tokenizer", help=cmd_tokenizer.__doc__, description="train: a sentencepiece model into "
                        "DIR/tokenizer.model (prints JSON); encode: text -> pieces; decode: pieces -> text (one "
                        "output line per input line)")
    tp.add_argument("action", choices=["train", "encode", "decode"], help="train a sentencepiece model, or encode "
                    "text into pieces, or decode pieces into text")
    tp.add_argument("--text", metavar="FILE", help="input text (- or none: standard input, except for train); train: "
                    "one sentence a line")
    tp.add_argument("--tokenizer", metavar="MODEL", help="encode/decode: a sentencepiece .model, a tokenizer.json, "
                    "or a directory holding one (a model directory)")
    tp.add_argument("--vocab-size", type=int, metavar="N", help="train: pieces, <unk> <s> </s> included")
    tp.add_argument("--out", metavar="DIR", help="train: directory to write tokenizer.model into")
    tp.add_argument("--type", choices=["unigram", "bpe"], help="train: sentencepiece model type (default unigram)")
    tp.add_argument("--character-coverage", type=float, metavar="F", help="train: share of characters kept "
                    "(default 1)")
    tp.add_argument("--whole", metavar="P,P", help="train: pieces never split (default <unk>: a corpus's own "
                    "unknown-word token stays whole, read as seqlm's <unk>; '' for none)")
    tp.add_argument("--force", action="store_true", help="train: replace an existing DIR/tokenizer.model")
    tp.set_defaults(func=cmd_tokenizer)
