"""Benchmark: n-gram and LSTM models over words, sentencepiece pieces and characters, compared per word.

    python bench/units.py [--rows kn5-word,kn6-sp1k,kn6-sp4k,kn10-char] [--threads 1]
    python bench/units.py --rows kn20-char --threads 1       # in bounded memory (--memory 2G): peak RSS measured
    python bench/units.py --rows lstm-word,lstm-sp1k,lstm-sp4k,lstm-sp8k --threads 1
    python bench/units.py --rows kn5-word-gcide,kn6-sp10k-gcide,lstm-word-gcide,lstm-sp10k-gcide --threads 1

The LSTM rows (2 x 200) get the same minutes of training per corpus whatever their unit (LSTM_MINUTES, one
thread), so a unit's row shows what it buys in a fixed budget; GCIDE rows read ../shared/data/gcide.

Each row trains one kn model the way `seqlm train` does (train_from_cli: vocabulary from train only, estimation,
model directory) in a private id cache, so the text is read and encoded inside the timing (`wall_seconds`; seqlm's
own `train_seconds` is estimation and saving, or
training). The sentencepiece rows first train their tokenizer on the corpus's train
text alone (`seqlm tokenizer train`, unigram, `<unk>` kept whole: `tokenizer_seconds`). Test is scored with the one
evaluation protocol (seqlm.eval.perplexity.evaluate through protocol.encode_text: sentence by sentence, every
token and </s>): `test_ppl` per token of the row's unit and `test_ppl_per_word`, the same total log-probability
over the text's white-space words and one </s> a line. The script checks that every row's `test_words` is the same
number (the word model's tokens) before it writes anything. A word model scores a word outside its vocabulary
as one `<unk>` event where a piece model spells it out, so `test_ppl_per_word_in_vocab` sums every row over the
words the corpus's word rows know (and </s>), a piece model's pieces grouped into words at sentencepiece's ▁.
Size: the model directory's ARPA and binary files and
the n-grams per order. Rows go to bench/results/units.json.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import seqlm
from _kn_common import run_measured
from seqlm.data.datasets import split_path
from seqlm.data.tokenizer_commands import PieceTraining, train_tokenizer
from seqlm.data.vocab import EOS
from seqlm.eval.perplexity import evaluate, score_tokens
from seqlm.protocol import encode_text
from seqlm.train.loop import run_status
from seqlm.train.run import train_from_cli

from common import CHECKPOINTS, merge_rows, ptb_dir

# name -> (family, corpus, unit, kn order, sentencepiece vocabulary size or None)
ROWS = {
    "kn5-word": ("kn", "ptb", "word", 5, None),
    "kn6-sp1k": ("kn", "ptb", "token", 6, 1000),
    "kn6-sp4k": ("kn", "ptb", "token", 6, 4000),
    "kn10-char": ("kn", "ptb", "char", 10, None),
    "kn20-char": ("kn", "ptb", "char", 20, None),
    "lstm-word": ("lstm", "ptb", "word", None, None),
    "lstm-word-class": ("lstm", "ptb", "word", None, None),  # class-factorised output (OUTPUT_FLAGS)
    "lstm-word-tree": ("lstm", "ptb", "word", None, None),  # the Huffman tree output (OUTPUT_FLAGS)
    "lstm-sp1k": ("lstm", "ptb", "token", None, 1000),
    "lstm-sp4k": ("lstm", "ptb", "token", None, 4000),
    # 8k, not 10k: sentencepiece's unigram trainer refuses more than 8,626 pieces on PTB train
    "lstm-sp8k": ("lstm", "ptb", "token", None, 8000),
    "kn5-word-gcide": ("kn", "gcide", "word", 5, None),
    "kn6-sp10k-gcide": ("kn", "gcide", "token", 6, 10000),
    "lstm-word-gcide": ("lstm", "gcide", "word", None, None),
    "lstm-sp10k-gcide": ("lstm", "gcide", "token", None, 10000),
}
# The LSTM rows: 2 x 200, sentence by sentence (the protocol every row is scored with), Adam, newbob, one
# thread, fp32; each unit gets the same minutes of training on a corpus (the budget), not the same epochs
LSTM_FLAGS = ["--layers", "2", "--hidden", "200", "--sentence-independent", "true", "--threads", "1",
              "--precision", "fp32", "--max-epochs", "20"]
LSTM_MINUTES = {"ptb": 10.0, "gcide": 20.0}
# rows whose output layer is not the full softmax: bench/decode.py's LSTM read word by word from its state
OUTPUT_FLAGS = {"lstm-word-class": ["--output", "class"], "lstm-word-tree": ["--output", "tree"]}
# rows estimated in bounded memory (lmplz -S): trained by `seqlm train` in its own process, its peak RSS measured
MEMORY = {"kn20-char": "2G"}
# GCIDE's word vocabulary: words seen twice (61k; its README's split)
CORPUS_FLAGS = {"ptb": [], "gcide": ["--min-count", "2"]}


def bench_row(name: str, data: Path, work: Path, minutes: float | None) -> dict:
    """Train row `name` (its tokenizer first), score valid and test. LSTM rows keep their model directory in
    bench/checkpoints/units/NAME and continue it when run again (`resumed` in the row)."""
    family, corpus, unit, order, pieces = ROWS[name]
    os.environ["SEQLM_CACHE"] = str(work / "cache")  # nothing encoded before: reading the text is timed
    args = ["--unit", unit] + (["--order", str(order)] if order else []) + (CORPUS_FLAGS[corpus] if unit == "word"
                                                                         else [])
    row: dict = {"name": name, "model": family, "corpus": corpus, "order": order, "unit": unit}
    model_dir = work / "model"
    if pieces:
        tok = _tokenizer(split_path(data, "train"), work / "tok", pieces)
        args += ["--tokenizer", tok.pop("tokenizer")]
        row.update(tok)
    if family == "lstm":
        minutes = minutes or LSTM_MINUTES[corpus]
        args += LSTM_FLAGS + OUTPUT_FLAGS.get(name, []) + ["--max-minutes", str(minutes)]
        row.update(train_minutes_budget=minutes, resumed=run_status(model_dir)["started"])
    trained = work / "trained.json"  # a finished LSTM row run again is scored again, not trained further
    if name in MEMORY:
        args += ["--memory", MEMORY[name]]
        row["memory_budget"] = MEMORY[name]
    if not trained.exists() and name in MEMORY:
        wall, rss, out = run_measured([sys.executable, "-m", "seqlm", "train", "--model", family, "--data", str(data),
                                       "--out", str(model_dir), *args])
        report = json.loads(out.strip().splitlines()[-1])
        trained.write_text(json.dumps({"wall_seconds": round(wall, 2), "train_seconds": report["train_seconds"],
                                       "train_peak_rss_mb": round(rss, 1)}))
    if not trained.exists():
        t0 = time.perf_counter()
        report = train_from_cli(family, str(data), str(model_dir), None, args, resume=bool(row.get("resumed")))
        report = {"wall_seconds": round(time.perf_counter() - t0, 2), "train_seconds": report["train_seconds"]}
        trained.write_text(json.dumps(report))
    row.update(json.loads(trained.read_text()), train_command=f"seqlm train --model {family} --data {corpus} "
               + " ".join(args).replace(str(work), "WORK"))
    model = seqlm.load(model_dir)
    for split in ("valid", "test"):
        r = evaluate(model, encode_text(model, split_path(data, split)))
        row.update({f"{split}_ppl": r["ppl"], f"{split}_tokens": r["tokens"], f"{split}_oov": r["oov"],
                    f"{split}_ppl_per_word": r["ppl_per_word"], f"{split}_words": r.get("words", r["tokens"])})
    row.update(vocab_size=len(model.vocab), **_size(model, model_dir))
    row.update(in_vocab_figures(model, data, corpus))
    if name in MEMORY:  # this process: the scoring above with the model's binary mapped (and this script)
        row["score_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if family == "lstm":
        hist = run_status(model_dir)["history"]
        row.update(epochs_run=len(hist), valid_curve=[h["valid_ppl"] for h in hist],
                   train_tokens=sum(h["train_tokens"] for h in hist))
    return row


def in_vocab_figures(model, data: Path, corpus: str) -> dict:
    """Test perplexity per word over the words the corpus's word model knows (and </s>): a word model scores an
    unknown word as one `<unk>` event, a piece model spells it out, so `ppl_per_word` favours the word model by
    the text's OOV rate; here both are summed over the same in-vocabulary words (pieces summed per word)."""
    if model.text_spec().unit == "char":
        return {}
    stream = encode_text(model, split_path(data, "test"))
    per_word = word_logp(model, stream, score_tokens(model, stream).logp)
    known = word_vocabulary(data, corpus)
    words = [w for line in _lines(split_path(data, "test")) for w in [*line.split(), EOS]]
    if per_word is None or len(per_word) != len(words):
        raise SystemExit(f"pieces of {model.text_spec().unit} units did not group into the text's words")
    keep = np.array([w in known or w == EOS for w in words])  # (W,)
    return {"test_words_in_vocab": int(keep.sum()),
            "test_ppl_per_word_in_vocab": math.exp(-float(per_word[keep].sum()) / int(keep.sum()))}


def word_logp(model, stream, logp: np.ndarray) -> np.ndarray | None:
    """(W,) ln p of each white-space word and each </s>, in text order: a word model's tokens, or a piece model's
    pieces summed from each piece that starts a word (sentencepiece's ▁) to the next."""
    if model.text_spec().unit == "word":
        return logp
    pieces = np.array(model.vocab.itos, dtype=object)[np.asarray(stream.ids)]  # (N,)
    first = np.array([p.startswith("▁") for p in pieces]) | (np.asarray(stream.ids) == model.vocab.eos_id)
    first[np.asarray(stream.starts[:-1])] = True  # a sentence's first piece starts its first word
    return np.add.reduceat(logp, np.flatnonzero(first))


def word_vocabulary(data: Path, corpus: str) -> set[str]:
    """The words of the corpus's word rows: train words (GCIDE: seen at least twice, --min-count 2)."""
    counts = collections.Counter(w for line in _lines(split_path(data, "train")) for w in line.split())
    least = 2 if "--min-count" in CORPUS_FLAGS[corpus] else 1
    return {w for w, c in counts.items() if c >= least}


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line for line in f.read().split("\n") if line.split()]


def _tokenizer(train: Path, tok_dir: Path, pieces: int) -> dict:
    """A unigram sentencepiece model of the training text alone (kept with an LSTM row: resuming needs it)."""
    info = tok_dir / "info.json"
    if not info.exists():
        tok = train_tokenizer(str(train), str(tok_dir), PieceTraining(pieces), True)
        info.write_text(json.dumps({"tokenizer": tok["tokenizer"], "pieces": tok["pieces"],
                                    "tokenizer_type": tok["type"], "tokenizer_seconds": tok["train_seconds"],
                                    "tokenizer_hash": tok["hash"]}))
    return json.loads(info.read_text())


def _size(model, model_dir: Path) -> dict:
    if model_dir.joinpath("model.arpa").exists():
        return {"ngrams": model.sizes, "arpa_bytes": (model_dir / "model.arpa").stat().st_size,
                "binary_bytes": (model_dir / "model.bin").stat().st_size}
    return {"params": sum(p.numel() for p in model.parameters()),
            "model_bytes": sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))}


def corpus_dir(corpus: str) -> Path:
    if corpus == "ptb":
        return ptb_dir()
    path = ptb_dir().parent / corpus
    if not (path / "train.txt.gz").exists() and not (path / "train.txt").exists():
        raise SystemExit(f"{corpus} not found beside PTB ({path})")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS), help="rows (names of ROWS), comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (scoring)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="LSTM rows: replace the corpus's training minutes (stated in the row)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.rows.split(","):
        if name not in ROWS:
            raise SystemExit(f"unknown row {name}; choose from {', '.join(ROWS)}")
        data = corpus_dir(ROWS[name][1])
        words = {split: text_words(split_path(data, split)) for split in ("valid", "test")}
        load = os.getloadavg()[0]
        if ROWS[name][0] == "lstm":
            work = CHECKPOINTS / "units" / name
            work.mkdir(parents=True, exist_ok=True)
            row = bench_row(name, data, work, args.minutes)
        else:
            with tempfile.TemporaryDirectory(prefix="seqlm-units-") as tmp:
                row = bench_row(name, data, Path(tmp), None)
        row.update(threads=args.threads, load_before=load)
        for split, n in words.items():  # every unit's per-word figure over the same words
            if row[f"{split}_words"] != n:
                raise SystemExit(f"{name} counted {row[f'{split}_words']} {split} words, the text has {n}; "
                                 "nothing written")
        rows.append(row)
        print(f"{name}: test ppl {row['test_ppl']:.2f} per {row['unit']}, {row['test_ppl_per_word']:.2f} per word "
              f"({row['test_words']} words), {row['wall_seconds']} s", flush=True)
        merge_rows("units", [row])  # each row lands as it finishes
    print(f"wrote {len(rows)} rows into bench/results/units.json")


def text_words(path: Path) -> int:
    """White-space words and one </s> per non-blank line, counted here from the text itself."""
    lines = _lines(path)
    return sum(len(line.split()) for line in lines) + len(lines)


if __name__ == "__main__":
    main()
