"""SRILM's `ngram -ppl FILE -debug N` output, for `seqlm query --format srilm` (-v word: -debug 2, sentence: 1,
summary: 0). Per sentence (debug >= 1) the line as read, then (debug 2) one line per token,

    \\tp( sat | cat ...) \\t= [3gram] 0.1986566 [ -0.7018971 ]

(the predicted token, the one before it, `...` when more context precedes, the longest n-gram matched, p and
log10 p), then its statistics and a blank line; the file's statistics close the output:

    1 sentences, 6 words, 0 OOVs
    0 zeroprobs, logprob= -9.123 ppl= 20.07 ppl1= 33.10
    file -: 3761 sentences, 78669 words, 0 OOVs

with ppl = 10^(-logprob / (words - OOVs - zeroprobs + sentences)) and ppl1 the same without the sentences
(the </s> tokens). Numbers have 7 significant digits, as SRILM 1.7 prints a float log probability. As in
SRILM, a token with probability 0 (log10 -99 or below, SRILM's zero) is left out of logprob: it counts as an
OOV when it is <unk> (a model without <unk>) and as a zeroprob otherwise, and prints `[OOV] 0 [ -inf ]`. A
word outside the vocabulary that the model gives <unk>'s non-zero probability is an ordinary word, printed
as `<unk>` (SRILM's open-vocabulary reading, `-unk`). Models without n-gram lengths (every family but kn,
through the protocol's score_tokens) print no `[Ngram]` tag. Unlike SRILM, a blank line is no sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

import numpy as np

ZERO = -99.0  # log10 p at or below this is SRILM's zero probability (it reads -99 as log 0)


@dataclass
class Stats:
    """SRILM's TextStats: counts and the log10 probability of the tokens with a non-zero probability."""

    sentences: int = 0
    words: int = 0
    oovs: int = 0
    zeroprobs: int = 0
    logprob: float = 0.0

    def add(self, other: Stats) -> None:
        for name in ("sentences", "words", "oovs", "zeroprobs", "logprob"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def lines(self) -> str:
        kept = self.words - self.oovs - self.zeroprobs
        ppl, ppl1 = _ppl(self.logprob, kept + self.sentences), _ppl(self.logprob, kept)
        return (f"{self.sentences} sentences, {self.words} words, {self.oovs} OOVs\n"
                f"{self.zeroprobs} zeroprobs, logprob= {_g(self.logprob)} ppl= {ppl} ppl1= {ppl1}\n")


def _g(x: float) -> str:
    return f"{x:.7g}"  # C++ stream output at precision 7, SRILM's LogP_Precision


def _ppl(logprob: float, tokens: int) -> str:
    return _g(10.0 ** (-logprob / tokens)) if tokens > 0 else "undefined"


def sentence_stats(names: list[str], log10_prob: np.ndarray, unk: str, eos: bool) -> Stats:
    """The statistics of one scored sentence: `names` the tokens as the model knows them (<unk> for a word
    outside its vocabulary), </s> last when `eos`."""
    zero = log10_prob <= ZERO  # (n,)
    is_unk = np.array([w == unk for w in names], dtype=bool)  # (n,)
    return Stats(sentences=int(eos), words=len(names) - int(eos), oovs=int((zero & is_unk).sum()),
                 zeroprobs=int((zero & ~is_unk).sum()), logprob=float(log10_prob[~zero].sum()))


def word_lines(names: list[str], log10_prob: np.ndarray, length: np.ndarray | None, unk: str, bos: str) -> str:
    """The -debug 2 lines of one sentence: each token after the one before it (<s> first)."""
    lines = []
    for i, (w, lp) in enumerate(zip(names, log10_prob.tolist(), strict=True)):
        before = f"{names[i - 1]} ..." if i else f"{bos} "
        tag, p = (f"[{length[i]}gram]" if length is not None else ""), 10.0**lp
        if lp <= ZERO:  # SRILM's zero: no n-gram for a missing <unk>, and no log probability
            tag, p, lp = "[OOV]" if w == unk else tag, 0.0, -np.inf
        lines.append(f"\tp( {w} | {before}) \t= {tag} {_g(p)} [ {_g(lp)} ]\n")
    return "".join(lines)


class SrilmWriter:
    """Writes sentence blocks as they are scored and the file's statistics at the end."""

    def __init__(self, out: TextIO, level: str, name: str, unk: str, bos: str):
        self.out, self.level, self.name, self.unk, self.bos = out, level, name, unk, bos
        self.total = Stats()

    def blank(self) -> None:
        """A blank line is no sentence, and SRILM's output has no line per input line to keep."""

    def sentence(self, words: list[str], names: list[str], log10_prob: np.ndarray, length: np.ndarray | None,
                 oov: np.ndarray | None = None) -> None:
        """One sentence: its words as read, its tokens as the model knows them, log10 p, n-gram lengths (None:
        unknown). `oov` (KenLM's flag) is not read: SRILM counts the tokens of probability 0 instead."""
        stats = sentence_stats(names, log10_prob, self.unk, eos=True)
        self.total.add(stats)
        if self.level == "summary":
            return
        body = word_lines(names, log10_prob, length, self.unk, self.bos) if self.level == "word" else ""
        self.out.write(" ".join(words) + "\n" + body + stats.lines() + "\n")

    def finish(self) -> dict:
        t = self.total
        self.out.write(f"file {self.name}: " + t.lines())
        kept = t.words - t.oovs - t.zeroprobs
        return {"ppl": 10.0 ** (-t.logprob / (kept + t.sentences)), "ppl1": 10.0 ** (-t.logprob / kept) if kept
                else None, "logprob": t.logprob, "sentences": t.sentences, "words": t.words, "oov": t.oovs}
