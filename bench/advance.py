"""Benchmark (#40): a decoder's whole-vocabulary step, `advance` (seqlm.protocol), against the kenlm module's
loop of BaseScore over the vocabulary, in the same run.

    python bench/advance.py [--rows advance-kn5-ptb,advance-kn5-gcide,...] [--threads 1] [--device cpu]

The kenlm module has no whole-vocabulary call; its maintainer's answer to users asking for one is a loop of
BaseScore over the vocabulary from one State (kpu/kenlm#284, #367: "no fast path", the data structure is a
reverse trie keyed by the predicted word). From Python that loop is what a user has (#367 suggests the loop
in C++, which this does not measure).

Each row: B histories drawn from the test split (a random sentence, cut at a random point, `<s>` first),
B = 1, 64, 1024. A (state, word) score is one log-probability of one word after one history, so a call of
`advance` on B prefixes gives B * V of them; the rate is B * V over the seconds a call takes (calls repeated
for --seconds after one untimed call, in --rounds rounds that go through every measurement of the row in
turn; the best round is kept, as bench/kn_speed.py does). `advance` alone is the n-gram rows' figure;
`step` (extend B rows by their next word, then advance) is a decoder's whole step, and the neural rows'
only one (their distribution is computed with the state). kenlm: BaseScore(state, w, out) for every w of
the vocabulary, from the kenlm States of 64 other test histories one after another (as many as --seconds
takes, at least 2; best of --rounds), on the model's ARPA file; `max_abs_diff_vs_kenlm` compares advance on
those histories (log10) with those loops, `<s>` left out.

Run with THP_MEM_ALLOC_ENABLE=1 in the environment (PyTorch's switch for 2 MB pages under its CPU tensors of
2 MB and more), a row is named NAME-thp: at B = 1024 the (B, V) output is 41 MB (PTB) and faulting it in
4 kB pages on every call is a large part of the call; the default rows run without it.

Models (bench/checkpoints/ROW): advance-kn5-ptb and advance-kn5-gcide are `seqlm train --model kn --order 5`
on the corpus (GCIDE with --min-count 2: V = 61k); advance-lstm-ptb and advance-transformer-ptb are small
models trained here for --train-minutes, not tuned (their perplexity is in the row: these rows measure speed,
not quality). --device cuda runs advance there (the kenlm loop stays on the CPU). Writes
bench/results/advance.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from seqlm.protocol import Prefixes, begin

from common import CHECKPOINTS, ROOT, merge_rows, ptb_dir

NAME = "advance"
BATCHES = (1, 64, 1024)
LN10 = math.log(10.0)
RECIPES = {  # row -> (corpus, seqlm train options)
    "advance-kn5-ptb": ("ptb", ["--model", "kn", "--order", "5"]),
    "advance-kn5-gcide": ("gcide", ["--model", "kn", "--order", "5", "--min-count", "2"]),
    "advance-lstm-ptb": ("ptb", ["--model", "lstm", "--hidden", "200", "--layers", "2"]),
    "advance-transformer-ptb": ("ptb", ["--model", "transformer", "--layers", "2", "--hidden", "128", "--heads", "4",
                                "--d-ff", "512", "--context", "64", "--precision", "fp32"]),
}


def train_argv(row: str, args) -> list[str]:
    """`seqlm train ...` for the row's model (neural ones for --train-minutes on --threads)."""
    corpus, options = RECIPES[row]
    limit = [] if row.startswith("advance-kn") else ["--max-minutes", str(args.train_minutes),
                                                     "--threads", str(args.threads)]
    return ["train", *options, "--data", corpus, "--out", str(CHECKPOINTS / row), "--force", *limit]


def train(row: str, args) -> tuple[Path, bool]:
    """The row's model directory, trained when absent, and whether this invocation trained it."""
    out = CHECKPOINTS / row
    if (out / "results.json").exists():
        return out, False
    env = {**os.environ, "SEQLM_DATA": str(ptb_dir().parent)}
    subprocess.run([sys.executable, "-m", "seqlm", *train_argv(row, args)], check=True, env=env, cwd=ROOT)
    return out, True


def histories(model, corpus: str, n: int, rng: random.Random) -> tuple[list[list[int]], list[int]]:
    """n word-id histories (after <s>) from the test split, and the word that follows each."""
    from seqlm.data.corpus import read_sentences

    test = ptb_dir().parent / corpus / ("test.txt.gz" if corpus == "gcide" else "test.txt")
    lines = [s for s in read_sentences(test) if s]
    stoi, unk = model.vocab.stoi, model.vocab.unk_id
    out, nxt = [], []
    for _ in range(n):
        ids = [stoi.get(w, unk) for w in rng.choice(lines)] + [model.vocab.eos_id]
        t = rng.randrange(len(ids))
        out.append(ids[:t])
        nxt.append(ids[t])
    return out, nxt


@torch.no_grad()
def prefixes_of(model, hists: list[list[int]], device: torch.device) -> Prefixes:
    """The prefixes after <s> + each history: equal lengths extended together, then their states joined."""
    by_length: dict[int, list[int]] = {}
    for i, h in enumerate(hists):
        by_length.setdefault(len(h), []).append(i)
    order, states = [], []
    for length, rows in by_length.items():
        p = begin(model, len(rows))
        for t in range(length):
            p = model.extend(p, torch.arange(len(rows)), torch.tensor([hists[i][t] for i in rows], device=device))
        order += rows
        states.append(p.state)
    state = model.cat_states(states)
    return Prefixes(model.select_state(state, torch.tensor(np.argsort(order))))


def timed(fn, seconds: float, device: torch.device) -> float:
    """Seconds per call of fn: one untimed call, then calls for about `seconds`."""
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        calls += 1
        if time.perf_counter() - start >= seconds:
            return (time.perf_counter() - start) / calls


def kenlm_loop(arpa: Path, vocab, hists: list[list[int]], args) -> tuple[float, np.ndarray]:
    """(scores/s, (n, V) log10 of the n states scored) of BaseScore over the vocabulary, state after state,
    for about --seconds, best of --rounds (the states, reached by BaseScore along each history, made first)."""
    import kenlm

    lm = kenlm.Model(str(arpa))
    states = []
    for h in hists:
        state, nxt = kenlm.State(), kenlm.State()
        lm.BeginSentenceWrite(state)
        for t in h:
            lm.BaseScore(state, vocab.itos[t], nxt)
            state, nxt = nxt, state
        states.append(state)
    words, out, best, first = list(vocab.itos), kenlm.State(), 0.0, None
    for _ in range(args.rounds):
        rows, start = [], time.perf_counter()
        for state in states:
            rows.append([lm.BaseScore(state, w, out) for w in words])
            if len(rows) >= 2 and time.perf_counter() - start >= args.seconds:
                break
        best = max(best, len(rows) * len(words) / (time.perf_counter() - start))
        first = rows if first is None else first
    return best, np.array(first)


def measure(row: str, args) -> dict:
    import seqlm

    device = torch.device(args.device)
    out, trained_here = train(row, args)
    model = seqlm.load(out)
    if isinstance(model, torch.nn.Module):
        model.to(device).eval()
    corpus = RECIPES[row][0]
    V, rng = len(model.vocab), random.Random(0)
    thp = os.environ.get("THP_MEM_ALLOC_ENABLE", "")
    result = {"name": row + ("-thp" if thp else ""), "model": str(out.relative_to(ROOT)), "vocab_size": V,
              "device": args.device, "threads": args.threads, "rounds": args.rounds, "seconds": args.seconds,
              "THP_MEM_ALLOC_ENABLE": thp,
              "load_average_1min": os.getloadavg()[0], "trained_by_this_run": trained_here,
              "train_command": " ".join(["seqlm", *train_argv(row, args)]).replace(str(ROOT) + "/", "")}
    if not row.startswith("advance-kn"):
        result["trained_minutes"] = args.train_minutes
        result["test_ppl"] = json.loads((out / "results.json").read_text()).get("test_ppl")
    cases = []  # (figure, B, one call), measured round after round, the best rate kept
    for B in BATCHES:
        hists, nxt = histories(model, corpus, B, rng)
        p = prefixes_of(model, hists, device)
        if row.startswith("advance-kn"):  # an n-gram model computes where its windows are
            p = Prefixes(p.state.to(device))
        tokens, rows = torch.tensor(nxt, device=device), torch.arange(B)
        step = lambda p=p, r=rows, t=tokens: model.advance(model.extend(p, r, t))  # noqa: E731
        cases.append((f"step_scores_per_s_b{B}", B, step))
        if row.startswith("advance-kn"):
            cases.append((f"advance_scores_per_s_b{B}", B, lambda p=p: model.advance(p)))
    for _ in range(args.rounds):
        for figure, B, call in cases:
            result[figure] = max(result.get(figure, 0.0), B * V / timed(call, args.seconds, device))
    if row.startswith("advance-kn"):
        hists, _ = histories(model, corpus, 64, random.Random(1))
        rate, theirs = kenlm_loop(out / "model.arpa", model.vocab, hists, args)
        mine = model.advance(prefixes_of(model, hists[: len(theirs)], torch.device("cpu"))).double().numpy() / LN10
        keep = np.array([w != "<s>" for w in model.vocab.itos])
        result.update(kenlm_base_score_loop_scores_per_s=rate, kenlm_states_scored=len(theirs),
                      max_abs_diff_vs_kenlm=float(np.abs(mine[:, keep] - theirs[:, keep]).max()))
        for B in BATCHES:
            result[f"advance_vs_kenlm_b{B}"] = result[f"advance_scores_per_s_b{B}"] / rate
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(RECIPES))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--seconds", type=float, default=1.0, help="timing window of each measurement in a round")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every measurement; the best is kept")
    p.add_argument("--train-minutes", type=float, default=3.0, help="training time of the neural rows' models")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for row in args.rows.split(","):
        if row not in RECIPES:
            raise SystemExit(f"unknown row {row!r}; rows: {', '.join(RECIPES)}")
        result = measure(row, args)
        print(result, flush=True)
        merge_rows(NAME, [result])


if __name__ == "__main__":
    main()
