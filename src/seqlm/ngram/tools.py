"""Bodies of `seqlm convert` and `seqlm query` (the CLI only parses their arguments).

    seqlm convert kenlm.arpa.gz model.bin     # ARPA (KenLM, SRILM, seqlm) -> seqlm binary
    seqlm convert model.bin model.arpa.gz     # and back
    seqlm query model.bin < text              # KenLM `query` output: word=id length log10 ... Total: OOV:
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import TextIO

from seqlm.errors import SeqlmError
from seqlm.ngram.binary import write_binary
from seqlm.ngram.query import NGramQuery, load_tables

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


def query(model_path: str, text: TextIO, out: TextIO, level: str = "word") -> dict:
    """Score each line of `text` as a sentence; print KenLM `query`'s lines and its perplexity summary."""
    m = NGramQuery(model_path)
    total = total_excl = 0.0
    tokens = oov_count = 0
    for lines in _chunks(text):
        chunk = [line for line in lines if line.split()]  # a blank line is no sentence (protocol.TextSpec)
        scores = m.score_corpus(chunk or ["x"])  # an all-blank chunk: its one stand-in line is never read
        i = 0
        for line in lines:
            if not line.split():
                out.write("\n" if level in ("word", "sentence") else "")  # one output line per input line
                continue
            a, b = scores.starts[i], scores.starts[i + 1]
            logp, oov = scores.log10_prob[a:b], scores.oov[a:b]
            if level in ("word", "sentence"):
                out.write(_sentence_line(m, line.split(), logp, scores.length[a:b], oov, level))
            i += 1
        if not chunk:
            continue
        total += float(scores.log10_prob.sum())
        total_excl += float(scores.log10_prob[~scores.oov].sum())
        tokens += len(scores.log10_prob)
        oov_count += int(scores.oov.sum())
    if tokens == 0:
        raise SeqlmError("query: no input text on stdin (one sentence per line)")
    ppl, ppl_excl = 10 ** (-total / tokens), 10 ** (-total_excl / max(tokens - oov_count, 1))
    out.write(f"Perplexity including OOVs:\t{ppl!r}\nPerplexity excluding OOVs:\t{ppl_excl!r}\n"
              f"OOVs:\t{oov_count}\nTokens:\t{tokens}\n")
    return {"ppl": ppl, "ppl_excl_oov": ppl_excl, "oov": oov_count, "tokens": tokens}


def _sentence_line(m: NGramQuery, words: list[str], logp, length, oov, level: str) -> str:
    total = f"Total: {float(logp.sum()):.8g} OOV: {int(oov.sum())}\n"
    if level == "sentence":
        return total
    names = words + ["</s>"]
    ids = m.vocab.encode(names)
    parts = [f"{w}={i} {n} {p:.8g}" for w, i, n, p in zip(names, ids, length.tolist(), logp.tolist(), strict=True)]
    return "\t".join(parts) + "\t" + total


def query_main(model_path: str, level: str) -> None:
    query(model_path, sys.stdin, sys.stdout, level)
