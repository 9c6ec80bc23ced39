"""Where the sparse-code model (e) loses to the full softmax (a): the test log-loss of both, word class by class.

    python bench/sparse_bands.py --rows gcide-all-4ep --threads 1

Reads the two trained full-corpus rows of bench/sparse.py (their checkpoints under ~/.cache/seqlm/bench-checkpoints/
sparse-all: run `python bench/sparse.py --rows gcide-all-full-4ep,gcide-all-codes-ibias-4ep` first; this script
refuses to start without them) and scores the whole GCIDE test split with each, one sentence at a time as `seqlm
eval` does (the row's total perplexity is printed beside the table's, and they agree). Every test token falls in
one class of the codes (sparse-word-representations.txt, Sec. 3): a base word (one of the B most frequent, its own
one-hot code; split into the first 1,000 and the rest), a rare word whose code has a single nonzero (its output
vector is a scaled copy of one base word's, so only its own bias tells the two apart), a rare word mixing several
base words, `<unk>`, and `</s>`. Per class: tokens, each model's perplexity over that class, and the share of
(e)'s extra test log-loss the class accounts for.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

import seqlm
from seqlm.data.corpus import encode_file
from seqlm.data.datasets import resolve_corpus, split_path
from seqlm.eval.perplexity import score_tokens
from seqlm.nn.sparse_code import CodeBook
from sparse import ALL_WORK

from common import RESULTS, merge_rows

PAIRS = {"gcide-all-4ep": ("gcide-all-full-4ep", "gcide-all-codes-ibias-4ep")}
CODES = ALL_WORK / "gcide-codes.txt"
TOP = 1000  # the base words are split at this frequency rank


def word_classes(words: list[str], book: CodeBook) -> list[str]:
    """The class of each vocabulary word under the codes (module docstring)."""
    rank = {w: i for i, w in enumerate(book.base)}
    out = []
    for w in words:
        if w in ("</s>", "<unk>"):
            out.append(w)
        elif w in rank:
            out.append(f"base 1-{TOP}" if rank[w] < TOP else f"base {TOP + 1}-{len(book.base)}")
        elif w in book.codes:
            out.append("rare, 1 nonzero" if len(book.codes[w]) == 1 else "rare, 2+ nonzeros")
        else:
            out.append("no code")  # a model word the embeddings never saw: its own base word in (e)
    return out


def bands(classes: np.ndarray, logp_a: np.ndarray, logp_e: np.ndarray) -> list[dict]:
    """Per class of the tokens (`classes`, one per token): token count, both perplexities over it, and its share
    of (e)'s extra log-loss over (a)'s (shares sum to 1)."""
    extra = float(logp_a.sum() - logp_e.sum())
    out = []
    for c in dict.fromkeys(classes.tolist()):
        m = classes == c
        n, loss_a, loss_e = int(m.sum()), float(-logp_a[m].sum()), float(-logp_e[m].sum())
        out.append({"class": c, "tokens": n, "ppl_a": float(np.exp(loss_a / n)), "ppl_e": float(np.exp(loss_e / n)),
                    "extra_nats": loss_e - loss_a, "share_of_extra": (loss_e - loss_a) / extra if extra else None})
    return out


def run(name: str) -> dict:
    rows = PAIRS[name]
    dirs = [ALL_WORK / r for r in rows]
    missing = [str(d) for d in dirs if not (d / "config.json").exists()]
    if missing:
        raise SystemExit(f"{name}: no trained model in {', '.join(missing)}: run bench/sparse.py --rows "
                         f"{','.join(rows)} first")
    book = CodeBook.read(CODES)
    test = split_path(resolve_corpus("gcide"), "test")
    logps, seconds = [], []
    for d in dirs:
        model = seqlm.load(d)
        t = time.time()
        stream = encode_file(test, model.vocab)
        logps.append(score_tokens(model, stream).logp)  # (N,) ln p, each sentence alone
        seconds.append(round(time.time() - t, 1))
    words = model.vocab.decode(list(range(len(model.vocab))))
    classes = np.asarray(word_classes(words, book))[np.asarray(stream.ids)]  # (N,)
    table = {r["name"]: r for r in json.loads((RESULTS / "sparse.json").read_text())["rows"]} \
        if (RESULTS / "sparse.json").exists() else {}
    return {"name": name, "rows": list(rows), "test_tokens": int(len(stream.ids)),
            "test_ppl_a": float(np.exp(-logps[0].mean())), "test_ppl_e": float(np.exp(-logps[1].mean())),
            "table_test_ppl": [table.get(r, {}).get("test_ppl") for r in rows],  # sparse.json's, from `seqlm eval`
            "codes": str(CODES.name), "base_words": len(book.base), "score_seconds": seconds,
            "bands": bands(classes, *logps)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="gcide-all-4ep", help=f"comma-separated: {', '.join(PAIRS)}")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.rows.split(","):
        if name not in PAIRS:
            raise SystemExit(f"unknown row {name}; rows: {', '.join(PAIRS)}")
        row = run(name)
        merge_rows("sparse_bands", [{**row, "threads": args.threads}])
        print(f"{name}: (a) {row['test_ppl_a']:.2f}, (e) {row['test_ppl_e']:.2f} "
              f"(sparse.json: {row['table_test_ppl']})")
        for b in row["bands"]:
            print(f"  {b['class']:18s} {b['tokens']:7d} tokens  (a) {b['ppl_a']:10.2f}  (e) {b['ppl_e']:10.2f}  "
                  f"(e)'s extra nats {b['extra_nats']:+.0f}")


if __name__ == "__main__":
    main()
