"""Bodies of `seqlm convert` and `seqlm query` (the CLI only parses their arguments).

    seqlm convert kenlm.arpa.gz model.bin     # ARPA (KenLM, SRILM, seqlm) -> seqlm binary
    seqlm convert model.bin model.arpa.gz     # and back
    seqlm query model.bin < text              # KenLM `query` output: word=id length log10 ... Total: OOV:
    seqlm query model.bin -n < text           # KenLM `query -n`: no <s> before a line, no </s> after it
    seqlm query model.bin --format srilm < text   # SRILM `ngram -ppl - -debug 2` (srilm_format.py)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import TextIO

import numpy as np

from seqlm.data.vocab import BOS, EOS, UNK
from seqlm.errors import SeqlmError
from seqlm.ngram.binary import write_binary
from seqlm.ngram.model import LN10
from seqlm.ngram.query import NGramQuery, load_tables
from seqlm.ngram.srilm_format import SrilmWriter

ARPA_OUT = (".arpa", ".arpa.gz", ".lm", ".lm.gz")
CHUNK = 20_000  # sentences scored per batched call: bounded memory on any input size


def convert(src: str, dst: str) -> dict:
    """Read a model (ARPA file, binary file or model directory) and write it as binary, or as ARPA when
    `dst` ends in .arpa[.gz]. Returns sizes and timings."""
    t0 = time.perf_counter()
    model = load_tables(src)
    t1 = time.perf_counter()
    if Path(dst).is_dir():
        raise SeqlmError(f"{dst} is a directory; give the output file name (e.g. {dst}/model.bin)")
    if dst.endswith(ARPA_OUT):
        model.to_arpa(dst)
    else:
        write_binary(model, dst)
    t2 = time.perf_counter()
    return {"in": src, "out": dst, "order": model.order, "ngrams": model.sizes,
            "read_seconds": round(t1 - t0, 3), "write_seconds": round(t2 - t1, 3), "bytes": Path(dst).stat().st_size}


def _chunks(lines: Iterable[str]) -> Iterator[list[str]]:
    it = iter(lines)
    while chunk := list(islice(it, CHUNK)):
        yield chunk


def query(model_path: str, text: TextIO, out: TextIO, level: str = "word", fmt: str = "kenlm",
          null_context: bool = False, name: str = "-", load: str | None = None) -> dict:
    """Score each line of `text` as a sentence and print KenLM `query`'s lines and perplexity summary, or
    (fmt "srilm") SRILM `ngram -ppl -debug N`'s (srilm_format.py; any model family there). null_context:
    no <s> before a line and no </s> after it (KenLM query's -n). load: KenLM query's -l; "lazy" leaves out
    the per-call entry tables (seqlm.ngram.scalar), the others build them where they take at most 2 GB
    (query.entries_by_default; None: the default, populate)."""
    if null_context and fmt == "srilm":
        raise SeqlmError("-n: SRILM's output counts a sentence per </s>; -n goes with the KenLM format only")
    if fmt == "srilm" and not is_ngram(model_path):
        if load is not None:
            raise SeqlmError(f"-l {load}: a load method is for n-gram models; {model_path} is not one")
        return _query_any(model_path, text, out, level, name)
    m = NGramQuery(model_path, entries=False if load == "lazy" else None)
    writer = SrilmWriter(out, level, name, UNK, BOS) if fmt == "srilm" else KenlmWriter(out, level, m)
    for line, scored in (_null_context(m, text) if null_context else _with_context(m, text)):
        if scored is None:
            writer.blank()
        else:
            writer.sentence(line.split(), *scored)
    return writer.finish()


def is_ngram(path: str) -> bool:
    """An ARPA or binary file, or a kn model directory (the paths NGramQuery opens)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return True
    from seqlm.checkpoint import read_json

    meta = read_json(config, "config.json")
    return not isinstance(meta, dict) or meta.get("family") in (None, "kn")


def _with_context(m: NGramQuery, text: TextIO) -> Iterator[tuple[str, tuple | None]]:
    """(line, (names, log10 p, matched length, OOV flags) or None for a blank line), each line from <s>
    with </s> scored last: score_corpus over chunks of lines."""
    for lines in _chunks(text):
        chunk = [line for line in lines if line.split()]  # a blank line is no sentence (protocol.TextSpec)
        scores = m.score_corpus(chunk or ["x"])  # an all-blank chunk: its one stand-in line is never read
        i = 0
        for line in lines:
            if not line.split():
                yield line, None
                continue
            a, b = scores.starts[i], scores.starts[i + 1]
            yield line, (_names(m, line.split()) + [EOS], scores.log10_prob[a:b], scores.length[a:b], scores.oov[a:b])
            i += 1


def _null_context(m: NGramQuery, text: TextIO) -> Iterator[tuple[str, tuple | None]]:
    """As _with_context, each line scored from no context and without </s> (KenLM's -n), line by line."""
    for line in text:
        words = line.split()
        if not words:
            yield line, None
            continue
        p, n, oov = (np.array(x) for x in zip(*m.full_scores(words, bos=False, eos=False), strict=True))
        yield line, (_names(m, words), p.astype(np.float64), n.astype(np.int64), oov.astype(bool))


def _names(m: NGramQuery, words: list[str]) -> list[str]:
    return [w if w in m else UNK for w in words]


class KenlmWriter:
    """KenLM query's lines: `word=id length log10p` per token, `Total: OOV:` per sentence, the perplexities."""

    def __init__(self, out: TextIO, level: str, m: NGramQuery):
        self.out, self.level, self.m = out, level, m
        self.total = self.total_excl = 0.0
        self.tokens = self.oov = 0

    def blank(self) -> None:
        self.out.write("\n" if self.level in ("word", "sentence") else "")  # one output line per input line

    def sentence(self, words: list[str], names: list[str], logp: np.ndarray, length: np.ndarray,
                 oov: np.ndarray) -> None:
        if self.level in ("word", "sentence"):
            self.out.write(_sentence_line(self.m, words + names[len(words):], logp, length, oov, self.level))
        self.total += float(logp.sum())
        self.total_excl += float(logp[~oov].sum())
        self.tokens += len(logp)
        self.oov += int(oov.sum())

    def finish(self) -> dict:
        if self.tokens == 0:
            raise SeqlmError("query: no input text on stdin (one sentence per line)")
        ppl, ppl_excl = 10 ** (-self.total / self.tokens), 10 ** (-self.total_excl / max(self.tokens - self.oov, 1))
        self.out.write(f"Perplexity including OOVs:\t{ppl!r}\nPerplexity excluding OOVs:\t{ppl_excl!r}\n"
                       f"OOVs:\t{self.oov}\nTokens:\t{self.tokens}\n")
        return {"ppl": ppl, "ppl_excl_oov": ppl_excl, "oov": self.oov, "tokens": self.tokens}


def _sentence_line(m: NGramQuery, names: list[str], logp, length, oov, level: str) -> str:
    total = f"Total: {float(logp.sum()):.8g} OOV: {int(oov.sum())}\n"
    if level == "sentence":
        return total
    ids = m.vocab.encode(names)
    parts = [f"{w}={i} {n} {p:.8g}" for w, i, n, p in zip(names, ids, length.tolist(), logp.tolist(), strict=True)]
    return "\t".join(parts) + "\t" + total


def _query_any(model_path: str, text: TextIO, out: TextIO, level: str, name: str) -> dict:
    """--format srilm for a model of any family, through the protocol's score_tokens: no n-gram lengths."""
    import seqlm
    from seqlm.eval.perplexity import score_tokens
    from seqlm.models.dae import refuse_peeking
    from seqlm.protocol import encode_lines

    refuse_peeking([model_path], False)
    model = seqlm.load(model_path)
    itos = model.vocab.itos
    writer = SrilmWriter(out, level, name, UNK, BOS)
    for lines in _chunks(text):
        sentences = [line.split() for line in lines if line.split()]
        stream = encode_lines(model, sentences)
        logp = score_tokens(model, stream).logp / LN10  # (N,) log10
        for i, words in enumerate(sentences):
            a, b = stream.starts[i], stream.starts[i + 1]
            writer.sentence(words, [itos[t] for t in stream.ids[a:b]], logp[a:b], None)
    return writer.finish()


def query_main(model_path: str, level: str, fmt: str = "kenlm", null_context: bool = False,
               load: str | None = None) -> None:
    query(model_path, sys.stdin, sys.stdout, level, fmt, null_context, load=load)
