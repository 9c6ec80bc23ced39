"""Estimation from counts made before: count files (`seqlm train --model kn --counts A,B`, SRILM's
`ngram-count -read`), weighted lines (`--text-has-weights`), and `seqlm count` that writes the files
(`ngram-count -text T -order N -write F`).

Counts from several shards merge before estimation (countfile.read_counts sums equal n-grams), and the
vocabulary is built from the merged unigram counts by the rules text gets (--max-vocab, --min-count, --vocab):
a word the vocabulary drops becomes <unk> in every n-gram, whose counts are then summed (countfile.relabel),
which is exactly what counting the text with that vocabulary gives. So the model estimated from the count
files of shards A and B is the one estimated from the text A+B.

Fractional counts (fractional weights, or decimals in a count file) are estimated by the methods defined on
them: Witten-Bell (it reads counts and the number of distinct words after a context) and additive smoothing.
The others need whole counts: modified and original Kneser-Ney, absolute discounting (their discounts come
from the counts of counts n1, n2, ..., and a count below D would go negative) and Katz (Good-Turing's
counts of counts); they refuse fractional counts.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from seqlm.config import DataConfig, apply_overrides, load_yaml, parse_overrides
from seqlm.data.corpus import TokenStream, encode_file
from seqlm.data.vocab import BOS, Vocab
from seqlm.errors import SeqlmError
from seqlm.models.kn import KNConfig, estimate_limited
from seqlm.ngram.countfile import CountFile, is_fractional, read_counts, relabel, write_counts
from seqlm.ngram.counts import NGramCounts, count_ngrams
from seqlm.ngram.kneser_ney import estimate_model
from seqlm.ngram.model import NGramModel
from seqlm.ngram.prune import prune_entropy
from seqlm.ngram.smoothing import estimate_smoothed
from seqlm.ngram.weighted import read_weighted, vocab_of

FRACTIONAL = ("witten-bell", "additive")  # the --smoothing methods that estimate from fractional counts
_WHY_WHOLE = {"katz": "Good-Turing's discounts come from the counts of counts n1, n2, ...",
              "default": "its discounts come from the counts of counts n1, n2, ... (and a count below D would go "
                         "negative)"}


# ---- estimation from counts ----

def estimate_counted(cfg: KNConfig, counts: NGramCounts, vocab: Vocab) -> NGramModel:
    """Estimate from `counts`, numbered over the model's vocabulary (`model_numbering`), with cfg's method."""
    if is_fractional(counts) and cfg.smoothing not in FRACTIONAL:
        why = _WHY_WHOLE.get(cfg.smoothing, _WHY_WHOLE["default"])
        raise SeqlmError(f"--smoothing {cfg.smoothing} needs whole counts ({why}), and these are fractional (a "
                         f"weight or count that is not a whole number): use --smoothing {' or '.join(FRACTIONAL)}")
    if cfg.memory_bytes is not None:
        raise SeqlmError("--memory: weighted lines and count files are counted in memory, so bounded-memory "
                         "estimation does not apply; drop --memory")
    if vocab.limit is not None:
        model = estimate_limited(None, vocab, cfg, counts)
    elif not cfg.lmplz:
        model = estimate_smoothed(None, vocab, cfg.order, cfg.spec, cfg.thresholds, counts)
    else:
        model = estimate_model(None, vocab, cfg.order, cfg.fallback, cfg.thresholds, counts=counts)
    return prune_entropy(model, cfg.prune_entropy) if cfg.prune_entropy > 0 else model


def model_numbering(vocab: Vocab) -> tuple[np.ndarray, int, int]:
    """(lut from vocab ids to model ids, the model's vocabulary size, <s>'s id): <s> after the vocabulary, or,
    under a --vocab file's limit, between the words kept and the others (kn.estimate_limited's numbering)."""
    ids = np.arange(len(vocab), dtype=np.int64)
    if vocab.limit is None:
        return ids, len(vocab) + 1, len(vocab)
    return ids + (ids >= vocab.limit), len(vocab) + 1, vocab.limit


def weighted_model_counts(stream: TokenStream, vocab: Vocab, order: int, weights: np.ndarray) -> NGramCounts:
    """The n-grams of a weighted training text, numbered as the estimators read them (model_numbering)."""
    if BOS in vocab.stoi:
        raise SeqlmError(f"the training text contains {BOS}, which n-gram models reserve; remove it")
    lut, V, bos = model_numbering(vocab)
    return count_ngrams(TokenStream(lut[np.asarray(stream.ids)], stream.starts), bos, V, order, weights)


def counts_vocab(cf: CountFile, data: DataConfig) -> Vocab:
    """The vocabulary of merged count files: their unigram counts, words in the files' order (the text's order of
    first occurrence), by the rules text gets (weighted.vocab_of). --unk none refuses a counted word outside."""
    uni = cf.counts.counts[0].tolist()
    counter = Counter({cf.tokens[i]: uni[i] for i in cf.unigram_order.tolist() if cf.tokens[i] != BOS})
    vocab = vocab_of(counter, data)
    if vocab.closed:
        for word, c in counter.items():
            if c > 0:
                vocab.known(word, "--counts: ")
    return vocab


def counts_over(cf: CountFile, vocab: Vocab) -> NGramCounts:
    """The files' counts numbered as the estimators read them: a word outside `vocab` becomes <unk>."""
    lut, V, bos = model_numbering(vocab)
    ids = np.asarray([bos if w == BOS else lut[vocab.id(w)] for w in cf.tokens], dtype=np.int64)
    return relabel(cf.counts, ids, V, bos)


# ---- seqlm train --counts ----

def train_counts(name: str, files: str, out_dir: Path, config_file: str | None, rest: list[str], force: bool,
                 refused: dict[str, bool]) -> dict:
    """`seqlm train --model kn --counts A[,B...]`: merge, estimate, save into `out_dir`; the report as train's.
    `refused`: the train options that cannot apply to count files, with whether each was given."""
    import seqlm
    from seqlm.data.tokenizers import reading
    from seqlm.outputs import clear_model
    from seqlm.train.run import _claim_out, _configs, _final_report

    if name != "kn":
        raise SeqlmError(f"--counts: n-gram counts are estimated by --model kn, not {name}")
    given = [flag for flag, on in refused.items() if on]
    if given:
        raise SeqlmError(f"{given[0]} does not apply to --counts (the count files are the training data): drop it")
    replace = _claim_out(out_dir, False, force, None)
    cfg, data_cfg = _configs(name, out_dir, config_file, rest, False)  # every option checked before any work
    reading(data_cfg)  # a --tokenizer is loaded (and checked) as train loads it
    paths = [p for p in files.split(",") if p]
    asked = cfg.order if _order_given(config_file, rest) else None
    t0 = time.time()
    cf = read_counts(paths, asked)
    cfg.order = asked or cf.order
    vocab = counts_vocab(cf, data_cfg)
    model = estimate_counted(cfg, counts_over(cf, vocab), vocab)
    model.family, model.config = name, cfg
    seconds = time.time() - t0
    if replace:  # the old model goes only now, when the new one is about to be written
        clear_model(out_dir)
    seqlm.save(model, out_dir, data_cfg)
    report = _final_report(name, out_dir, {"valid": None, "test": None}, data_cfg, seconds)
    return report | {"counts": paths, "order": cfg.order}


def _order_given(config_file: str | None, rest: list[str]) -> bool:
    """Whether --order was given (else the count files' order is the model's)."""
    keys = set(parse_overrides(rest)) | (set(load_yaml(config_file)) if config_file else set())
    return "order" in {k.lstrip("-").replace("-", "_") for k in keys}


# ---- seqlm count ----

def count_main(text: str | None, data: str | None, order: int, dest: str, weighted: bool, force: bool,
               rest: list[str]) -> None:
    """`seqlm count`: count the training text (read as train reads it: --vocab, --unit, --raw, ... as --key value)
    and write its count file; print a JSON report (to stderr when the counts go to standard output)."""
    from seqlm.data.tokenizers import reading
    from seqlm.outputs import claim_output
    from seqlm.train.run import _texts, _vocabulary

    cfg, data_cfg = KNConfig(order=order), DataConfig()
    apply_overrides([data_cfg], parse_overrides(rest))
    units = reading(data_cfg)
    claim_output(dest, force, "--write-counts", inputs=[text, data])
    with tempfile.TemporaryDirectory(prefix="seqlm-count-") as scratch:
        path = _texts(data, text, Path(scratch))["train"]
        if weighted:
            vocab, stream = read_weighted(path, data_cfg, units, Path(scratch))
        else:
            vocab = _vocabulary(path, data_cfg, cfg, None, path.parent != Path(scratch), units)
            stream = encode_file(path, vocab, data_cfg.raw, use_cache=path.parent != Path(scratch), unit=units)
        if BOS in vocab.stoi:
            raise SeqlmError(f"the training text contains {BOS}, which n-gram models reserve; remove it")
        counts = count_ngrams(stream, len(vocab), len(vocab) + 1, order, stream.weights)
        sizes = write_counts(dest, counts, vocab.itos + [BOS], first_seen(stream, len(vocab) + 1, len(vocab)))
    report = {"counts": dest, "order": order, "ngrams": sizes, "sentences": int(stream.num_sentences),
              "fractional": is_fractional(counts)}
    print(json.dumps(report), file=sys.stderr if dest == "-" else sys.stdout)


def first_seen(stream: TokenStream, V: int, bos: int) -> np.ndarray:
    """(V,) each word's place in order of first occurrence in `<s> w1 .. wn </s>`: <s> first, the words never
    seen (count 0) last, by id."""
    seen, first = np.unique(np.asarray(stream.ids), return_index=True)
    order = seen[np.argsort(first, kind="stable")]
    never = np.setdiff1d(np.arange(V), np.append(order, bos))
    rank = np.empty(V, dtype=np.int64)
    rank[np.concatenate([[bos], order, never]).astype(np.int64)] = np.arange(V)
    return rank
