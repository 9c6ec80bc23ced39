"""`seqlm rescore`: n-best rescoring with any model (the paper's use of an RNN LM in speech recognition).

Input, Kaldi style: a text file of hypotheses, one per line, `uttid-N word word ...` (N = 1, 2, ...
within an utterance; the utterance id may itself contain '-'), with the acoustic and old LM scores
in companion files of `uttid-N score` lines; or one TSV file with columns key, acoustic, lm, text
(an optional first line starting with `key` is a header).

Score convention: every score is a natural-log likelihood, higher is better, unless `costs=True`
(`--costs`), which reads and writes costs = negative natural-log likelihoods, lower is better, as
Kaldi's n-best files store them (nbest-to-linear's ac/lm cost files). The new LM score is
ln P(w_1 .. w_n </s> | <s>) from the model, sentence by sentence (no history across hypotheses).

    lm    = W * new_lm + (1 - W) * old_lm       W = --new-lm-weight (default 1: the new LM alone)
    total = acoustic_scale * acoustic + lm_scale * lm - word_penalty * n_words - oov_penalty * n_oov

(`Combination`: the same names and meanings for lattices, seqlm.eval.lattice_rescore.)

n_oov counts the hypothesis' words outside the model's vocabulary (scored as `<unk>`, the one OOV
definition of seqlm.eval.perplexity). A model trained on text with many `<unk>` (PTB) can give an
unknown word more probability than a rare known one and so prefer "higher prophets" to "higher
profits"; the `oov` column shows it, and `--oov-penalty P` (in nats, like SRILM's and Kaldi's fixed
log-probability for unknown words) charges P per such word.

The best hypothesis of an utterance has the highest total (the lowest total cost); ties go to the
one listed first. All hypotheses are scored in one batched pass (`score_tokens`), not one at a time.
"""

from __future__ import annotations

import gzip
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqlm import checkpoint as ckpt
from seqlm.errors import SeqlmError
from seqlm.eval.perplexity import oov_mask, score_tokens
from seqlm.protocol import LanguageModel, encode_lines

_KEY = re.compile(r"^(.+)-(\d+)$")  # uttid-N


@dataclass
class NBest:
    """Hypotheses in file order, with their scores as log-likelihoods (whatever the file convention)."""

    keys: list[str]  # (H,) uttid-N
    sentences: list[list[str]]  # (H,) words
    acoustic: np.ndarray  # (H,) float64
    old_lm: np.ndarray  # (H,) float64, nan where no old LM score was given

    def utterance(self, i: int) -> str:
        return _KEY.match(self.keys[i]).group(1)  # type: ignore[union-attr]


@dataclass
class Combination:
    """How `seqlm rescore` combines the scores; one convention for n-best lists and lattices (docs/combination.md)."""

    lm_scale: float | None = None  # LM scale (HTK lmscale=, Kaldi --lm-scale); None: 1, or the lattice's lmscale=
    acoustic_scale: float | None = None  # acoustic scale (HTK acscale=, Kaldi --acoustic-scale); None: 1 / lattice's
    word_penalty: float | None = None  # subtracted per word (Kaldi's word-ins-penalty; HTK wdpenalty= is -P); None: 0
    new_lm_weight: float = 1.0  # the new LM's share: lm = W new + (1 - W) old (Kaldi rnnlm rescoring's --weight)
    oov_penalty: float = 0.0  # nats subtracted per word the model scores as <unk> (SRILM/Kaldi unknown-word penalty)

    def check(self) -> None:
        if not 0.0 <= self.new_lm_weight <= 1.0:
            raise SeqlmError(f"--new-lm-weight is the new LM's share, between 0 and 1, got {self.new_lm_weight}")
        for name in ("lm_scale", "acoustic_scale", "word_penalty", "oov_penalty"):
            x = getattr(self, name)
            if x is not None and not math.isfinite(x):
                raise SeqlmError(f"--{name.replace('_', '-')} must be a finite number, got {x}")

    def lm(self, new: np.ndarray, old: np.ndarray) -> np.ndarray:
        """W new + (1 - W) old; the new LM alone when W = 1 (old may then be unknown: nan)."""
        w = self.new_lm_weight
        return new if w == 1.0 else w * new + (1.0 - w) * old


@dataclass
class Rescored:
    nbest: NBest
    new_lm: np.ndarray  # (H,) ln P(hypothesis </s>) under the model
    total: np.ndarray  # (H,) combined score, higher is better
    oov: np.ndarray  # (H,) words of each hypothesis outside the model's vocabulary
    best: list[int]  # index of the best hypothesis of each utterance, in order of first appearance


def _lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file (.gz ok); blank lines skipped; errors name file:line."""
    path = Path(path)
    if not path.is_file():
        raise SeqlmError(f"{path}: no such file")
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            for n, data in enumerate(f, 1):
                try:
                    line = data.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as e:
                    raise SeqlmError(f"{path}:{n}: invalid UTF-8 ({e.reason}); convert the file to UTF-8") from None
                if line.strip():
                    yield n, line
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise SeqlmError(f"{path}: cannot read ({e})") from None


def _key(path: str | Path, n: int, key: str) -> str:
    if not _KEY.match(key):
        raise SeqlmError(f"{path}:{n}: hypothesis key {key!r} is not uttid-N (e.g. utt1-3)")
    return key


def _number(path: str | Path, n: int, text: str, what: str, costs: bool) -> float:
    """A score as a log-likelihood: negated when the file holds costs."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise SeqlmError(f"{path}:{n}: {what} {text!r} is not a finite number")
    return -x if costs else x


def _scores(path: str | Path, keys: list[str], what: str, costs: bool) -> np.ndarray:
    """(H,) the `uttid-N score` lines of `path`, in the order of `keys`; every key exactly once."""
    index = {k: i for i, k in enumerate(keys)}
    out = np.full(len(keys), np.nan)
    for n, line in _lines(path):
        fields = line.split()
        if len(fields) != 2:
            raise SeqlmError(f"{path}:{n}: expected 'uttid-N {what}', got {len(fields)} fields")
        key = _key(path, n, fields[0])
        if key not in index:
            raise SeqlmError(f"{path}:{n}: {key} is not in the n-best list")
        if not math.isnan(out[index[key]]):
            raise SeqlmError(f"{path}:{n}: {key} appears twice")
        out[index[key]] = _number(path, n, fields[1], what, costs)
    missing = [k for k, v in zip(keys, out, strict=True) if math.isnan(v)]
    if missing:
        raise SeqlmError(f"{path}: no {what} for {missing[0]} (and {len(missing) - 1} more hypotheses)")
    return out


def _check_new(path: str | Path, n: int, key: str, seen: set[str]) -> None:
    if key in seen:
        raise SeqlmError(f"{path}:{n}: {key} appears twice")
    seen.add(key)


def read_nbest(nbest: str | Path, acoustic: str | Path, lm_scores: str | Path | None = None,
               costs: bool = False) -> NBest:
    """A Kaldi-style n-best text file plus its acoustic (and, optionally, old LM) score files."""
    keys, sentences, seen = [], [], set()
    for n, line in _lines(nbest):
        key, *words = line.split()
        _check_new(nbest, n, _key(nbest, n, key), seen)
        keys.append(key)
        sentences.append(words)
    if not keys:
        raise SeqlmError(f"{nbest}: no hypotheses (the file is empty)")
    ac = _scores(acoustic, keys, "acoustic score", costs)
    old = _scores(lm_scores, keys, "LM score", costs) if lm_scores else np.full(len(keys), np.nan)
    return NBest(keys, sentences, ac, old)


def read_tsv(path: str | Path, costs: bool = False) -> NBest:
    """One TSV file: key <TAB> acoustic <TAB> lm <TAB> text (an optional `key...` header line)."""
    keys, sentences, ac, old, seen = [], [], [], [], set()
    for n, line in _lines(path):
        fields = line.split("\t")
        if not keys and fields[0].strip().lower() == "key":
            continue  # header
        if len(fields) != 4:
            raise SeqlmError(f"{path}:{n}: expected 4 tab-separated columns (key, acoustic, lm, text), "
                             f"got {len(fields)}")
        key = _key(path, n, fields[0].strip())
        _check_new(path, n, key, seen)
        keys.append(key)
        ac.append(_number(path, n, fields[1], "acoustic score", costs))
        old.append(_number(path, n, fields[2], "LM score", costs))
        sentences.append(fields[3].split())
    if not keys:
        raise SeqlmError(f"{path}: no hypotheses (the file is empty)")
    return NBest(keys, sentences, np.asarray(ac), np.asarray(old))


def rescore(model: LanguageModel, nbest: NBest, comb: Combination | None = None, max_tokens: int = 4096) -> Rescored:
    """New LM scores for every hypothesis (one batched pass) and the combined totals (module docstring)."""
    comb = comb or Combination()
    comb.check()
    if comb.new_lm_weight != 1.0 and np.isnan(nbest.old_lm).any():
        raise SeqlmError("--new-lm-weight below 1 (or --interpolate-old) needs the old LM scores: give --lm-scores "
                         "FILE or a --tsv file")
    stream = encode_lines(model, nbest.sentences)  # as the model reads text: a character model spells them
    new_lm = score_tokens(model, stream, max_tokens=max_tokens).sentence_totals()  # (H,)
    oov = np.add.reduceat(oov_mask(stream, model.vocab).astype(np.int64), np.asarray(stream.starts[:-1]))  # (H,)
    n_words = np.array([len(s) for s in nbest.sentences], dtype=np.float64)  # (H,)
    ac_scale = 1.0 if comb.acoustic_scale is None else comb.acoustic_scale
    lm_scale = 1.0 if comb.lm_scale is None else comb.lm_scale
    total = (ac_scale * nbest.acoustic + lm_scale * comb.lm(new_lm, nbest.old_lm)
             - (comb.word_penalty or 0.0) * n_words - comb.oov_penalty * oov)  # (H,)
    best: dict[str, int] = {}
    for i in range(len(nbest.keys)):
        utt = nbest.utterance(i)
        if utt not in best or total[i] > total[best[utt]]:
            best[utt] = i
    return Rescored(nbest, new_lm, total, oov, list(best.values()))


def format_table(keys: list[str], acoustic, old_lm, new_lm, total, oov, costs: bool = False) -> str:
    """TSV with a header: key, acoustic, old_lm, new_lm, total (costs if `costs`), oov (a word count)."""
    sign = -1.0 if costs else 1.0
    rows = ["key\tacoustic\told_lm\tnew_lm\ttotal\toov"]
    for i, key in enumerate(keys):
        vals = (acoustic[i], old_lm[i], new_lm[i], total[i])
        rows.append(key + "".join(f"\t{sign * v:.6f}" for v in vals) + f"\t{int(oov[i])}")
    return "\n".join(rows) + "\n"


def format_scores(r: Rescored, costs: bool = False) -> str:
    """The score table of `seqlm rescore --out` (format_table)."""
    return format_table(r.nbest.keys, r.nbest.acoustic, r.nbest.old_lm, r.new_lm, r.total, r.oov, costs)


def format_best(r: Rescored) -> str:
    """Kaldi `text` format: `uttid word word ...`, one line per utterance."""
    return "".join(" ".join([r.nbest.utterance(i), *r.nbest.sentences[i]]) + "\n" for i in r.best)


def rescore_files(model_dir: str | Path, nbest: str | None = None, tsv: str | None = None,
                  acoustic: str | None = None, lm_scores: str | None = None, costs: bool = False,
                  comb: Combination | None = None, out: str | None = None, best: str | None = None) -> Rescored:
    """What `seqlm rescore` does with an n-best list: read, rescore, write the scores (stdout if no `out`)
    and the 1-best."""
    import seqlm

    if (nbest is None) == (tsv is None):
        raise SeqlmError("give the hypotheses as --nbest FILE (with --acoustic FILE) or as --tsv FILE")
    if tsv is not None and (acoustic or lm_scores):
        raise SeqlmError("--acoustic and --lm-scores go with --nbest; a --tsv file has its own score columns")
    if nbest is not None and acoustic is None:
        raise SeqlmError("--nbest needs the acoustic scores: --acoustic FILE (lines 'uttid-N score')")
    comb = comb or Combination()
    hyps = read_tsv(tsv, costs) if tsv is not None else read_nbest(nbest, acoustic, lm_scores, costs)
    result = rescore(seqlm.load(model_dir), hyps, comb)
    n_with = int((result.oov > 0).sum())
    if n_with:
        print(f"seqlm: {n_with} of {len(result.oov)} hypotheses have words outside the model's vocabulary "
              f"(scored as <unk>; column `oov`)"
              f"{'' if comb.oov_penalty else '; --oov-penalty P charges P per such word'}", file=sys.stderr)
    text = format_scores(result, costs)
    if out is None:
        sys.stdout.write(text)
    else:
        ckpt.atomic_write_text(out, text)
    if best is not None:
        ckpt.atomic_write_text(best, format_best(result))
    return result
