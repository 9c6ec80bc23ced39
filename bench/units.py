"""Benchmark: n-gram models of PTB over words, sentencepiece pieces and characters, compared per word.

    python bench/units.py [--rows kn5-word,kn6-sp1k,kn6-sp4k,kn10-char] [--threads 1]

Each row trains one kn model the way `seqlm train` does (train_from_cli: vocabulary from train only, estimation,
model directory) in a private id cache, so the text is read and encoded inside the timing (`wall_seconds`; seqlm's
own `train_seconds` is estimation and saving). The sentencepiece rows first train their tokenizer on PTB train
alone (`seqlm tokenizer train`, unigram, `<unk>` kept whole: `tokenizer_seconds`). Test is scored with the one
evaluation protocol (seqlm.eval.perplexity.evaluate through protocol.encode_text: sentence by sentence, every
token and </s>): `test_ppl` per token of the row's unit and `test_ppl_per_word`, the same total log-probability
over the text's white-space words and one </s> a line. The script checks that every row's `test_words` is the same
number (the word model's tokens) before it writes anything. Size: the model directory's ARPA and binary files and
the n-grams per order. Rows go to bench/results/units.json.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

import seqlm
from seqlm.data.tokenizer_commands import PieceTraining, train_tokenizer
from seqlm.eval.perplexity import evaluate
from seqlm.protocol import encode_text
from seqlm.train.run import train_from_cli

from common import merge_rows, ptb_dir

# name -> (order, unit, sentencepiece vocabulary size or None)
ROWS = {
    "kn5-word": (5, "word", None),
    "kn6-sp1k": (6, "token", 1000),
    "kn6-sp4k": (6, "token", 4000),
    "kn10-char": (10, "char", None),
}


def bench_row(name: str, data: Path, work: Path) -> dict:
    order, unit, pieces = ROWS[name]
    os.environ["SEQLM_CACHE"] = str(work / "cache")  # nothing encoded before: reading the text is timed
    args = ["--order", str(order), "--unit", unit]
    row: dict = {"name": name, "order": order, "unit": unit}
    if pieces:
        tok = train_tokenizer(str(data / "train.txt"), str(work / "tok"), PieceTraining(pieces), False)
        args += ["--tokenizer", tok["tokenizer"]]
        row.update(pieces=tok["pieces"], tokenizer_type=tok["type"], tokenizer_seconds=tok["train_seconds"],
                   tokenizer_hash=tok["hash"])
    t0 = time.perf_counter()
    report = train_from_cli("kn", str(data), str(work / "model"), None, args)
    row.update(wall_seconds=round(time.perf_counter() - t0, 2), train_seconds=report["train_seconds"],
               train_command="seqlm train --model kn --data ptb " + " ".join(args).replace(str(work), "WORK"))
    model = seqlm.load(work / "model")
    for split in ("valid", "test"):
        r = evaluate(model, encode_text(model, data / f"{split}.txt"))
        row.update({f"{split}_ppl": r["ppl"], f"{split}_tokens": r["tokens"], f"{split}_oov": r["oov"],
                    f"{split}_ppl_per_word": r["ppl_per_word"], f"{split}_words": r.get("words", r["tokens"])})
    files = {f: (work / "model" / f).stat().st_size for f in ("model.arpa", "model.bin")}
    row.update(vocab_size=len(model.vocab), ngrams=model.sizes, arpa_bytes=files["model.arpa"],
               binary_bytes=files["model.bin"])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS), help="rows (names of ROWS), comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (scoring)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = ptb_dir()
    words = {split: text_words(data / f"{split}.txt") for split in ("valid", "test")}
    rows = []
    for name in args.rows.split(","):
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="seqlm-units-") as tmp:
            row = {**bench_row(name, data, Path(tmp)), "threads": args.threads, "load_before": load}
        for split, n in words.items():  # every unit's per-word figure over the same words
            if row[f"{split}_words"] != n:
                raise SystemExit(f"{name} counted {row[f'{split}_words']} {split} words, the text has {n}; "
                                 "nothing written")
        rows.append(row)
        print(f"{name}: test ppl {row['test_ppl']:.2f} per {row['unit']}, {row['test_ppl_per_word']:.2f} per word "
              f"({row['test_words']} words), {row['wall_seconds']} s", flush=True)
    print(f"wrote {merge_rows('units', rows)}")


def text_words(path: Path) -> int:
    """White-space words and one </s> per non-blank line, counted here from the text itself."""
    lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line.split()]
    return sum(len(line.split()) for line in lines) + len(lines)


if __name__ == "__main__":
    main()
