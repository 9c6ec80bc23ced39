"""Dynamic evaluation on PTB, each family alone (issue 44, item 5): today's plain SGD rule beside Krause et
al.'s (2018) RMS rule with a global prior (seqlm.eval.dynamic_rms), for rnn, lstm and transformer.

    python bench/dynamic_eval.py --threads 1                        # trains what is missing, then every row
    python bench/dynamic_eval.py --rows lstm-static,lstm-sgd,lstm-rms --threads 1

Each family trains one model on PTB train for the same budget (--train-minutes of one thread, fp32; RECIPES)
into bench/checkpoints/dynamic_eval/FAMILY (SEQLM_BENCH_CHECKPOINTS/dynamic_eval moves it); a trained one is
reused, one cut short resumes. Every row is scored in stream mode (segments of --segment tokens of the text as
one stream, the state carried on; the Transformer is trained across sentences so that it can), and gives
`valid_tune_ppl` (the first whole sentences of PTB valid holding at least --tune-tokens tokens: the part the
settings are picked on), `valid_ppl` (all of valid) and `test_ppl` (all of test). Rows per family:
- FAMILY-static: the trained weights, no updates;
- FAMILY-sgd: plain SGD, the rate of --sgd-grid with the lowest valid_tune_ppl;
- FAMILY-rms: the RMS rule, the (rate, decay) of --rms-grid x --decay-grid with the lowest valid_tune_ppl,
  the gradient statistics collected on the first --stats-tokens tokens of PTB train (once per model).
A dynamic row records its whole grid (`grid`: every variant tried with its valid_tune_ppl, null where the
weights diverged) and `variants_tried`. Picking is on valid only, never on test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

import seqlm
from seqlm.data.corpus import encode_file
from seqlm.eval.dynamic import dynamic_logp
from seqlm.eval.dynamic_rms import RmsRule, first_tokens
from seqlm.eval.perplexity import score_tokens
from seqlm.train.loop import run_status
from seqlm.train.run import train_from_cli

from common import CHECKPOINTS, merge_rows, ptb_dir

WORK = Path(os.environ.get("SEQLM_BENCH_CHECKPOINTS", CHECKPOINTS)) / "dynamic_eval"
FAMILIES = ("rnn", "lstm", "transformer")
RECIPES = {  # modest sizes; --max-epochs is a ceiling, --train-minutes the budget that ends each run
    "rnn": ["--hidden", "200", "--tau", "5", "--dropout", "0.3", "--max-epochs", "40"],
    "lstm": ["--hidden", "200", "--layers", "1", "--dropout", "0.3", "--max-epochs", "40"],
    "transformer": ["--layers", "2", "--d-model", "128", "--heads", "4", "--d-ff", "512", "--context", "64",
                    "--seq-len", "64", "--batch-size", "16", "--optimizer", "adamw", "--weight-decay", "0.01",
                    "--schedule", "warmup-cosine", "--warmup-steps", "100", "--lr", "0.001", "--min-lr", "0.00001",
                    "--dropout", "0.2", "--max-epochs", "2", "--cross-sentence", "true"],
}
KRAUSE_TEST_GAIN = "about 11% (an LSTM on PTB with their rule; Krause et al. 2018)"


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def ppl(logp: np.ndarray) -> float | None:
    """exp of the mean -ln p; None where the weights diverged (a NaN or infinite score)."""
    value = float(math.exp(min(-logp.mean(), 700.0))) if np.isfinite(logp).all() else math.inf
    return value if math.isfinite(value) else None


def tune_key(variant: dict) -> float:
    return math.inf if variant["valid_tune_ppl"] is None else variant["valid_tune_ppl"]


def train(family: str, args: argparse.Namespace) -> dict:
    """Train the family's model for --train-minutes unless done (a run cut short resumes); its record."""
    out = WORK / family
    done = out / "bench_trained.json"
    if not done.exists():
        status = run_status(out)
        flags = [*RECIPES[family], "--max-minutes", str(args.train_minutes), "--threads", str(args.threads),
                 "--precision", "fp32"]
        result = train_from_cli(family, str(ptb_dir()), str(out), None, flags, resume=status["started"])
        done.write_text(json.dumps({"result": result, "flags": flags}))
    status = run_status(out)
    record = json.loads(done.read_text())
    return {"train_minutes": sum(h["epoch_seconds"] for h in status["history"]) / 60, "epochs": status["epoch"],
            "recipe": record["flags"], "checkpoint": f"bench/checkpoints/dynamic_eval/{family}"}


class Family:
    """One trained model, its texts, and its dynamic passes (each timed)."""

    def __init__(self, family: str, args: argparse.Namespace):
        self.name, self.args = family, args
        self.training = train(family, args)
        self.model = seqlm.load(WORK / family)
        vocab = self.model.vocab
        valid = encode_file(ptb_dir() / "valid.txt", vocab)
        self.texts = {"valid_tune": first_tokens(valid, args.tune_tokens), "valid": valid,
                      "test": encode_file(ptb_dir() / "test.txt", vocab)}
        self.rule = RmsRule(ptb_dir() / "train.txt", decay=0.0, stats_tokens=args.stats_tokens)
        self.seconds: dict[str, float] = {}

    def score(self, split: str, lr: float | None = None, decay: float | None = None) -> float | None:
        """Perplexity of a split: static (lr None), plain SGD (decay None) or the RMS rule."""
        text, t = self.texts[split], time.perf_counter()
        if lr is None:
            logp = score_tokens(self.model, text, True, max_tokens=self.args.segment).logp
        else:
            rule = None if decay is None else self.rule.with_decay(decay)
            logp = dynamic_logp(self.model, text, True, lr, self.args.segment, rule)
        key = f"{split} {'static' if lr is None else 'sgd' if decay is None else 'rms'}"
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t
        print(json.dumps({"family": self.name, "split": split, "lr": lr, "decay": decay, "ppl": ppl(logp),
                          "seconds": round(time.perf_counter() - t, 1)}), flush=True)
        return ppl(logp)

    def row(self, rule: str) -> dict:
        a = self.args
        if rule == "static":
            grid, lr, decay = [], None, None
        elif rule == "sgd":
            grid = [{"lr": lr, "valid_tune_ppl": self.score("valid_tune", lr)} for lr in a.sgd_grid]
            lr, decay = min(grid, key=tune_key)["lr"], None
        else:
            grid = [{"lr": lr, "decay": d, "valid_tune_ppl": self.score("valid_tune", lr, d)}
                    for d in a.decay_grid for lr in a.rms_grid]
            best = min(grid, key=tune_key)
            lr, decay = best["lr"], best["decay"]
        tuned = {"valid_tune_ppl": min(grid, key=tune_key)["valid_tune_ppl"]} if grid else {}
        seconds, self.seconds = self.seconds, {}  # the grid's time, then the chosen variant's passes
        figures = tuned | {f"{split}_ppl": self.score(split, lr, decay)
                           for split in ("valid_tune", "valid", "test") if f"{split}_ppl" not in tuned}
        row = {"name": f"{self.name}-{rule}", "family": self.name, "rule": rule, "mode": "stream",
               "segment": a.segment, **figures, "variants_tried": len(grid), "grid": grid,
               "tune_tokens": len(self.texts["valid_tune"].ids), "valid_tokens": len(self.texts["valid"].ids),
               "test_tokens": len(self.texts["test"].ids), "pass_seconds": self.seconds,
               "grid_seconds": sum(seconds.values()),
               "params": sum(p.numel() for p in self.model.parameters()), **self.training, "threads": a.threads}
        if rule != "static":
            row["dynamic_lr"] = lr
        if rule == "rms":
            row |= {k: v for k, v in self.rule.with_decay(decay).settings().items() if k != "dynamic_rule"}
            row["dynamic_stats"] = "PTB train.txt"
        return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(f"{f}-{r}" for f in FAMILIES for r in ("static", "sgd", "rms")),
                   help="comma-separated row names, FAMILY-RULE (rules: static, sgd, rms)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--train-minutes", type=float, default=8.0, help="each family's training budget")
    p.add_argument("--segment", type=int, default=20, help="tokens per segment of dynamic evaluation")
    p.add_argument("--tune-tokens", type=int, default=5000, help="the settings are picked on this much of valid")
    p.add_argument("--stats-tokens", type=int, default=20000, help="the RMS rule's statistics: this much of train")
    p.add_argument("--sgd-grid", type=floats, default="0.01,0.03,0.1,0.3,1", help="plain SGD rates tried")
    p.add_argument("--rms-grid", type=floats, default="0.0001,0.0003,0.001,0.003,0.01", help="RMS rule rates tried")
    p.add_argument("--decay-grid", type=floats, default="0,0.002,0.01,0.05", help="RMS rule decays tried")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    families: dict[str, Family] = {}
    for name in args.rows.split(","):
        family, _, rule = name.partition("-")
        if family not in FAMILIES or rule not in ("static", "sgd", "rms"):
            raise SystemExit(f"unknown row {name}: FAMILY-RULE, FAMILY one of {', '.join(FAMILIES)}, "
                             "RULE one of static, sgd, rms")
        if family not in families:
            families[family] = Family(family, args)
        row = families[family].row(rule)
        merge_rows("dynamic_eval", [row], {"krause_2018_gain": KRAUSE_TEST_GAIN})
        print(json.dumps({k: row[k] for k in ("name", "valid_tune_ppl", "valid_ppl", "test_ppl")}), flush=True)


if __name__ == "__main__":
    main()
