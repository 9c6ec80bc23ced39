"""PTB table of the RNNLM paper (rnnlm-extensions.txt) and the class-output speed-up.

    python bench/rnnlm_ptb.py --rows rnn-bptt [--session-minutes 60]
    python bench/rnnlm_ptb.py --rows rnn+kn5,rnn-x4        # combinations of finished rows
    python bench/rnnlm_ptb.py --rows bptt-cost-h200,bptt-cost-h400 --threads 1   # BPTT(tau) cost A/B

Rows train into bench/checkpoints/rnnlm_ptb/ROW/ (rows named `-ref`, with the rollback of the shared
schedule, into ~/.cache/seqlm/bench-checkpoints/rnnlm_ptb/ROW/ or $SEQLM_BENCH_CHECKPOINTS, outside the
work tree) and resume from their last epoch checkpoint when run again; each invocation merges its rows
into bench/results/rnnlm_ptb.json ("finished" says whether the schedule ran to its end). Every RNN row
is evaluated both ways: `test_ppl` sentence by sentence (the seqlm protocol, comparable with KN and
FOFE) and `test_ppl_stream` with the state carried across sentences (the rnnlm toolkit's default and
the setting of the paper's figures).

BPTT: rows record `bptt_method`. "per-position" (seqlm.models.rnn since commit 5823701): every
position's error flows back through tau steps, across chunk edges too. Rows named `...-tau-chunked`
(and every row without `bptt_method`'s "per-position") come from the earlier code, where --tau cut each
20-step chunk into pieces of tau steps, so a position's error flowed back 1..tau steps; tau = 1 (rnn-bp)
is plain back-propagation in both. "block": rnnlm's truncation (`--truncation block`, docs/training.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

import seqlm
from seqlm.cli import main as seqlm_main
from seqlm.data.corpus import encode_file
from seqlm.eval.perplexity import evaluate
from seqlm.train.loop import run_status
from seqlm.train.run import train_from_cli

from common import CHECKPOINTS, merge_rows, ptb_dir, recorded_training, row_parser, with_earlier_runs

BPTT_METHOD = "per-position"  # see the module docstring
PAPER_TEST_PPL = {"kn5": 141.2, "rnn-bptt": 124.7, "rnn+kn5": 105.7, "rnn-x4": 102.0}
# The paper's model has no dropout; without it the mini-batched RNN overfits (rnn-bptt-nodropout: train
# ppl 63, valid 153), so the main rows use dropout 0.3 and that row keeps the plain model for reference.
DROP = ["--dropout", "0.3"]
RNN_ROWS = {
    "rnn-bptt-nodropout": ["--tau", "5"],
    "rnn-bp": ["--tau", "1", *DROP],
    "rnn-bptt": ["--tau", "5", *DROP],
    "rnn-bptt-full": ["--tau", "5", "--output", "full", *DROP],
    "rnn-bptt-h400": ["--tau", "5", "--hidden", "400", *DROP],
    "rnn-bptt-h400-drop5": ["--tau", "5", "--hidden", "400", "--dropout", "0.5"],
    # h400's valid ppl still fell ~1 an epoch when its 6 halving epochs ran out: the same model, 10 of them
    "rnn-bptt-h400-long": ["--tau", "5", "--hidden", "400", *DROP, "--halving-epochs", "10"],
    "rnn-bptt-h400-tanh": ["--tau", "5", "--hidden", "400", "--activation", "tanh", *DROP],
    # short recipes for equal-wall-time comparisons (bench/rnn_speed.py runs faster-rnnlm beside them): tanh
    # learns faster early, and without dropout a third epoch overfits
    "rnn-fast": ["--tau", "5", "--activation", "tanh", "--max-epochs", "2"],
    "rnn-fast-b128": ["--tau", "5", "--activation", "tanh", "--max-epochs", "3", "--batch-size", "128"],
    "rnn-bptt-s2": ["--tau", "5", "--seed", "2", *DROP],  # extra seeds: members of rnn-x4
    "rnn-bptt-s3": ["--tau", "5", "--seed", "3", *DROP],
    "rnn-bptt-s4": ["--tau", "5", "--seed", "4", *DROP],
}
# `-ref`: the same rows with --rollback (an epoch after which validation stalls is undone and run again at
# the halved rate; rnnlm restores the previous weights when validation gets worse: docs/training.md)
RNN_ROWS["rnn-bptt-ref"] = [*RNN_ROWS["rnn-bptt"], "--rollback", "true"]
RNN_ROWS["rnn-bptt-h400-long-ref"] = [*RNN_ROWS["rnn-bptt-h400-long"], "--rollback", "true"]
# the same with rnnlm's own truncation (--truncation block: a chunk's errors flow back together through the chunk
# and the tau-1 inputs before it, as its -bptt-block), which its toolkit trains the paper's models with
RNN_ROWS["rnn-bptt-h400-long-block-ref"] = [*RNN_ROWS["rnn-bptt-h400-long-ref"], "--truncation", "block"]
# the block-ref recipe at other sizes, dropouts and output layers, keyed (hidden, dropout in tenths, output layer)
# -> name tag. Sizes above 400 go beyond the paper's RNNs; h600 with dropout 0.3 overfit by epoch 7 (train ppl
# 108, valid 151), hence the higher dropouts. `full`: the paper's Table 2 predates its class output ("a small cost
# of accuracy"), so those rows (name suffix -full) keep the whole 10k softmax; h400-d0 is the paper's own model
# (no dropout) with it, h200 the smaller size of the -ref rows
BLOCK_REF_RNNS = {(600, 3, "class"): "h600", (800, 3, "class"): "h800", (800, 4, "class"): "h800-d4",
               (800, 5, "class"): "h800-d5", (800, 6, "class"): "h800-d6", (600, 5, "class"): "h600-d5",
               (1000, 5, "class"): "h1000-d5", (400, 3, "full"): "h400", (800, 5, "full"): "h800-d5",
               (400, 0, "full"): "h400-d0", (200, 3, "full"): "h200"}


def _block_ref_name(tag: str, output: str) -> str:
    return f"rnn-bptt-{tag}-long-block-ref" + ("-full" if output == "full" else "")


for (_h, _d, _out), _tag in BLOCK_REF_RNNS.items():
    RNN_ROWS[_block_ref_name(_tag, _out)] = ["--tau", "5", "--hidden", str(_h), "--dropout", f"0.{_d}",
                                          "--halving-epochs", "10", "--rollback", "true",
                                          "--truncation", "block", *(["--output", "full"] if _out == "full" else [])]
REF_CHECKPOINTS = Path(os.environ.get("SEQLM_BENCH_CHECKPOINTS",
                                      Path.home() / ".cache" / "seqlm" / "bench-checkpoints"))
# rnn-x4 combines the four differently configured RNNs of this table (the paper combines RNNs that
# differ in size and training); the -s2..-s4 seed rows are an alternative set of members.
MIXTURES = {"rnn+kn5": ["rnn-bptt", "kn5"], "rnn400+kn5": ["rnn-bptt-h400", "kn5"],
            "rnn400d5+kn5": ["rnn-bptt-h400-drop5", "kn5"], "rnn400long+kn5": ["rnn-bptt-h400-long", "kn5"],
            "rnn-x4": ["rnn-bptt", "rnn-bptt-h400", "rnn-bptt-nodropout", "rnn-bp"],
            "rnn-x4+kn5": ["rnn-bptt", "rnn-bptt-h400", "rnn-bptt-nodropout", "rnn-bp", "kn5"]}
# every finished RNN of the table (seven configurations), with and without KN5
ALL_RNNS = ["rnn-bptt", "rnn-bptt-h400", "rnn-bptt-h400-long", "rnn-bptt-nodropout", "rnn-bp", "rnn-bptt-h400-tanh",
            "rnn-bptt-h400-drop5"]
MIXTURES.update({"rnn-all": ALL_RNNS, "rnn-all+kn5": [*ALL_RNNS, "kn5"]})
# -sw: the same mixtures with EM weights fitted in stream mode (run with --stream-weights)
MIXTURES.update({"rnn400long+kn5-sw": MIXTURES["rnn400long+kn5"], "rnn-all+kn5-sw": MIXTURES["rnn-all+kn5"]})
MIXTURES.update({"rnn-ref+kn5": ["rnn-bptt-ref", "kn5"], "rnn400long-ref+kn5": ["rnn-bptt-h400-long-ref", "kn5"],
                 "rnn400long-block-ref+kn5": ["rnn-bptt-h400-long-block-ref", "kn5"]})
# each of those RNNs with KN5 (rnn600long-..., rnn800d5long-...), and the same fitted in stream mode (-sw): with dropout
# 0.5 the sentence and stream figures part (h800-d5: valid 144.9 / 131.1), so weights fitted sentence by sentence
# undervalue the RNN in stream mode
for (_h, _d, _out), _tag in BLOCK_REF_RNNS.items():
    _mix = f"rnn{_tag[1:].replace('-', '')}long-block-ref" + ("-full" if _out == "full" else "") + "+kn5"
    MIXTURES[_mix] = MIXTURES[f"{_mix}-sw"] = [_block_ref_name(_tag, _out), "kn5"]


def bptt_method(row: str) -> str:
    """How the row's RNN was trained (module docstring): "block" for --truncation block, else per-position."""
    opts = RNN_ROWS.get(row, [])
    return "block" if "--truncation" in opts and opts[opts.index("--truncation") + 1] == "block" else BPTT_METHOD


def checkpoint_dir(name: str) -> Path:
    return (REF_CHECKPOINTS if "-ref" in name else CHECKPOINTS) / "rnnlm_ptb" / name


def _eval_words_per_s(model, stream) -> float:
    t = time.perf_counter()
    evaluate(model, stream)
    return len(stream.ids) / (time.perf_counter() - t)


def run_rnn(name: str, args: argparse.Namespace) -> dict:
    out = checkpoint_dir(name)
    resumed = run_status(out)["started"]
    opts = RNN_ROWS[name] + ["--precision", args.precision, "--threads", str(args.threads), "--device", args.device]
    with recorded_training(out, resumed, args.threads) as earlier:
        result = train_from_cli("rnn", str(ptb_dir()), str(out), None, opts, resume=resumed,
                                session_minutes=args.session_minutes)
    status = run_status(out)
    hist = [h for h in status["history"] if not h.get("partial")]  # complete epochs (a cut one is redone)
    model = seqlm.load(out)
    test = encode_file(ptb_dir() / "test.txt", model.vocab)
    valid = encode_file(ptb_dir() / "valid.txt", model.vocab)
    train_seconds = sum(h["epoch_seconds"] for h in hist)
    words_s = sum(h["train_tokens"] for h in hist) / max(train_seconds, 1e-9)
    stream_test = evaluate(model, test, stream_mode=True)["ppl"]
    return with_earlier_runs({
        "name": name, "valid_ppl": result["valid_ppl"], "test_ppl": result["test_ppl"],
        "valid_ppl_stream": evaluate(model, valid, stream_mode=True)["ppl"], "test_ppl_stream": stream_test,
        "params": sum(p.numel() for p in model.parameters()), "epochs": status["epoch"],
        "finished": status["done"], "precision": args.precision, "train_seconds": train_seconds,
        "wall_seconds": hist[-1]["wall_seconds"] if hist else 0.0, "train_tokens_per_s": words_s,
        "eval_tokens_per_s": _eval_words_per_s(model, test),
        "config": json.loads((out / "config.json").read_text())["model"],
        "valid_curve": [h["valid_ppl"] for h in hist],
        "threads": args.threads, "resumed": resumed, "bptt_method": bptt_method(name),
        **({"checkpoints": str(out), "rolled_back_epochs": [h["epoch"] for h in status["history"]
                                                            if h.get("rolled_back")]} if "-ref" in name else {}),
    }, earlier)


def run_kn5() -> str:
    out = CHECKPOINTS / "rnnlm_ptb" / "kn5"
    if not (out / "model.arpa").exists():
        train_from_cli("kn", str(ptb_dir()), str(out), None, ["--order", "5"])
    return str(out)


def run_mixture(name: str, args: argparse.Namespace) -> dict:
    members = [run_kn5() if m == "kn5" else str(checkpoint_dir(m)) for m in MIXTURES[name]]
    out = checkpoint_dir(name)
    # rebuilt every run: a member may have changed, or (kn5 lives in the work tree, the -ref rows outside it)
    # a saved mixture may point at a member of a checkout that is gone
    shutil.rmtree(out, ignore_errors=True)
    code = seqlm_main(["interpolate", *members, "--valid", str(ptb_dir() / "valid.txt"), "--out", str(out),
                       *(["--stream"] if args.stream_weights else [])])
    if code != 0:
        raise SystemExit(f"interpolate failed for {name}")
    mix = seqlm.load(out)
    test = encode_file(ptb_dir() / "test.txt", mix.vocab)
    valid = encode_file(ptb_dir() / "valid.txt", mix.vocab)
    return {"name": name, "members": MIXTURES[name], "bptt_method": bptt_method(MIXTURES[name][0]),
            "weights": json.loads((out / "config.json").read_text())["model"],
            "valid_ppl": evaluate(mix, valid)["ppl"], "test_ppl": evaluate(mix, test)["ppl"],
            "valid_ppl_stream": evaluate(mix, valid, stream_mode=True)["ppl"],
            "test_ppl_stream": evaluate(mix, test, stream_mode=True)["ppl"],
            "members_finished": [run_status(checkpoint_dir(m))["done"] for m in MIXTURES[name] if m != "kn5"]}


def class_speedup(rows: dict) -> dict | None:
    f = rows.get("rnn-bptt-full")
    same = [r for r in (rows.get("rnn-bptt"), rows.get("rnn-bptt-tau-chunked"))  # trained by the same BPTT code
            if r and f and r.get("bptt_method") == f.get("bptt_method")]
    if not same:
        return None
    c = same[0]
    k = min(len(c["valid_curve"]), len(f["valid_curve"]))
    return {"class_row": c["name"],
            "train_words_per_s_class": c["train_tokens_per_s"], "train_words_per_s_full": f["train_tokens_per_s"],
            "train_speedup": c["train_tokens_per_s"] / f["train_tokens_per_s"],
            "eval_words_per_s_class": c["eval_tokens_per_s"], "eval_words_per_s_full": f["eval_tokens_per_s"],
            "eval_speedup": c["eval_tokens_per_s"] / f["eval_tokens_per_s"],
            # the full-softmax row may stop early (--session-minutes): compare perplexity after equal epochs
            "valid_ppl_after_equal_epochs": {"epochs": k, "class": c["valid_curve"][k - 1],
                                             "full": f["valid_curve"][k - 1]} if k else None}


def _chunk_cut_step(model, batch, state):
    """The method per-position BPTT(tau) replaced, re-implemented here for timing only: each chunk cut
    into pieces of tau steps, so a position's error flows back 1..tau steps."""
    h = model.rnn.initial_state(batch.inputs.shape[0]) if state is None else state  # (B, H)
    x = model.drop(model.embedding(batch.inputs))  # (B, T, H)
    outs = []
    for t0 in range(0, x.shape[1], model.tau):
        o, h = model.rnn(x[:, t0 : t0 + model.tau], h.detach())  # (B, tau, H)
        outs.append(o)
    hs = model.drop(torch.cat(outs, dim=1))  # (B, T, H)
    logp = model.out.target_log_probs(hs.flatten(0, 1), batch.targets.flatten())  # (B*T,)
    return -logp.sum() / batch.num_tokens, h.detach(), batch.num_tokens


def bptt_cost(hidden: int, args: argparse.Namespace, batches: int = 40, rounds: int = 3) -> dict:
    """Training words/s of per-position BPTT(tau 5) and of the chunk-cut method on the same PTB batches,
    alternating in rounds in one process (the same load for both); the best round of each."""
    from itertools import islice

    import numpy as np

    from seqlm.data.corpus import build_vocab
    from seqlm.models.rnn import RNNConfig, build_rnn, rnn_batches
    from seqlm.train.optim import build_optimizer
    from seqlm.train.steps import tbptt_step

    vocab = build_vocab(ptb_dir() / "train.txt")
    cfg = RNNConfig(hidden=hidden, dropout=0.3)
    data = list(islice(rnn_batches(cfg, vocab)(encode_file(ptb_dir() / "train.txt", vocab),
                                               np.random.default_rng(0), (0, 1)), batches))
    torch.manual_seed(1)
    model = build_rnn(cfg, vocab)
    opt = build_optimizer(model, cfg.train)
    best = {"per-position": 0.0, "chunk-cut": 0.0}
    for method in (tbptt_step, _chunk_cut_step):  # warm-up: first calls allocate
        for batch in data[:3]:
            method(model, batch, None)[0].backward()
    for _ in range(rounds):
        for method, step in (("per-position", tbptt_step), ("chunk-cut", _chunk_cut_step)):
            state, t = None, time.perf_counter()
            for batch in data:
                loss, state, n = step(model, batch, state)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            best[method] = max(best[method], sum(b.num_tokens for b in data) / (time.perf_counter() - t))
    return {"name": f"bptt-cost-h{hidden}", "hidden": hidden, "tau": cfg.tau, "seq_len": cfg.train.seq_len,
            "batches_per_round": batches, "rounds": rounds, "train_words_per_s_per_position": best["per-position"],
            "train_words_per_s_chunk_cut": best["chunk-cut"],
            "per_position_cost_ratio": best["chunk-cut"] / best["per-position"], "threads": args.threads}


def main() -> None:
    p = row_parser(__doc__, "rnn-bptt,rnn-bp,rnn-bptt-full,rnn-bptt-h400,rnn+kn5", "fp32")
    p.add_argument("--stream-weights", action="store_true", help="fit mixture weights in stream mode")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.rows.split(","):
        if name in RNN_ROWS:
            row = run_rnn(name, args)
        elif name in MIXTURES:
            row = run_mixture(name, args)
        elif name in ("bptt-cost-h200", "bptt-cost-h400"):
            row = bptt_cost(int(name[-3:]), args)
        else:
            sys.exit(f"unknown row {name}; choose from {', '.join([*RNN_ROWS, *MIXTURES])}, bptt-cost-h200/-h400")
        path = merge_rows("rnnlm_ptb", [row])
        doc = json.loads(path.read_text())
        speed = class_speedup({r["name"]: r for r in doc["rows"]})
        if speed:
            path = merge_rows("rnnlm_ptb", [], {"class_speedup": speed})
        print(json.dumps({k: row.get(k) for k in ("name", "test_ppl", "test_ppl_stream", "epochs", "finished")}),
              flush=True)


if __name__ == "__main__":
    main()
