"""The Transformer LM alone on PTB (issue 12): word-level test perplexity in sentence and stream mode,
character-level bits per character, wall time, and training speed as a fraction of the bf16 matmul ceiling
measured by this script at the model's own matmul shapes.

    python bench/transformer_ptb.py --rows transformer-ptb --threads 1
    python bench/transformer_ptb.py --rows transformer-ptb-char --threads 1
    python bench/transformer_ptb.py --rows transformer-speed,transformer-speed-small,transformer-speed-base --threads 1

Shortened recipes (this CPU, one thread): each row trains for a fixed number of minutes (RECIPES), not to
convergence; the row states its recipe. A row resumes from its checkpoint in bench/checkpoints/ when run again.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict

import torch

from seqlm.data.corpus import encode_file
from seqlm.data.datasets import split_path
from seqlm.eval.perplexity import char_rates, evaluate
from seqlm.train.loop import run_status
from seqlm.train.run import train_from_cli

from common import CHECKPOINTS, matmul_gflops, merge_rows, ptb_dir, recorded_training, row_parser, with_earlier_runs

# Model flags after the family defaults (4 x 256, filter 1024, 4 heads, dropout 0.1, tied embeddings).
RECIPES = {
    # AdamW, linear warm-up then cosine decay planned over 8 epochs (about 50 minutes here); dropout 0.2
    # because 8 passes over PTB overfit a 4 x 256 model at 0.1; the hour limit may cut the last epoch short
    "transformer-ptb": ["--context", "128", "--seq-len", "128", "--batch-size", "16", "--optimizer", "adamw",
                        "--weight-decay", "0.01", "--schedule", "warmup-cosine", "--warmup-steps", "100",
                        "--lr", "0.001", "--min-lr", "0.00001", "--dropout", "0.2", "--max-epochs", "8",
                        "--max-minutes", "58"],
    # the first, shorter recipe (cosine planned over 3 epochs, dropout 0.1): kept to show what time buys
    "transformer-ptb-3ep": ["--context", "128", "--seq-len", "128", "--batch-size", "16", "--optimizer", "adamw",
                        "--weight-decay", "0.01", "--schedule", "warmup-cosine", "--warmup-steps", "100",
                        "--lr", "0.001", "--min-lr", "0.00001", "--max-epochs", "3", "--max-minutes", "19"],
    # the same, trained with packed sentences attending to earlier ones: the model for stream mode
    "transformer-ptb-cross": ["--cross-sentence", "true", "--context", "128", "--seq-len", "128", "--batch-size",
                              "16", "--optimizer", "adamw", "--weight-decay", "0.01", "--schedule", "warmup-cosine",
                              "--warmup-steps", "100", "--lr", "0.001", "--min-lr", "0.00001", "--max-epochs", "3",
                              "--max-minutes", "19"],
    # 5 minutes: about a third of an epoch, so the cosine (planned over one epoch) is cut short at lr ~ 9e-4
    "transformer-ptb-char": ["--unit", "char", "--context", "256", "--seq-len", "256", "--batch-size", "16",
                             "--optimizer", "adam", "--lr", "0.001", "--schedule", "warmup-cosine", "--warmup-steps",
                             "100", "--min-lr", "0.00001", "--max-epochs", "1", "--max-minutes", "5"],
}


def flops_per_token(cfg: dict, vocab: int) -> tuple[float, list[tuple[int, int, int]]]:
    """Training FLOPs per token (6 per multiply-add: forward 2, backward 4) and the matmul shapes of a batch.

    Attention scores and their weighted sum cost 2 x (context / 2) x d multiply-adds a token on average
    (causal: a token sees half the window on average)."""
    d, ff, L, W = cfg.get("hidden", cfg.get("d_model")), cfg["d_ff"], cfg["layers"], cfg["context"]
    macs = L * (4 * d * d + 2 * d * ff + 2 * (W // 2) * d) + d * vocab
    rows = cfg["train"]["batch_size"] * W
    shapes = [(rows, d, 3 * d), (rows, d, d), (rows, d, ff), (rows, ff, d), (rows, d, vocab)]
    return 6.0 * macs, shapes


def _tokens_per_s(cfg, vocab, stream, seconds: float) -> float:
    """Training tokens/s of the recipe's model from scratch: its batches, its step, bf16 autocast, AdamW."""
    import numpy as np

    from seqlm.registry import family, new_model
    from seqlm.train.optim import build_optimizer

    fam = family("transformer")
    model = new_model("transformer", cfg, vocab)
    opt = build_optimizer(model, cfg.train)
    tokens, t0 = 0, None
    for i, batch in enumerate(fam.batches(cfg, vocab)(stream, np.random.default_rng(0), (0, 1))):
        if i == 3:  # warm-up steps excluded
            t0, tokens = time.perf_counter(), 0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _, n = fam.step(model, batch, None)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip)
        opt.step()
        tokens += n
        if t0 is not None and time.perf_counter() - t0 > seconds:
            return tokens / (time.perf_counter() - t0)
    raise SystemExit("the training text ran out before the timing did")


# speed rows: the word recipe's model, and the paper's two sizes trained with the same recipe (batches of 16 x 128)
SPEED_SIZES = {"transformer-speed": "", "transformer-speed-small": "small", "transformer-speed-base": "base"}


def run_speed(name: str, args: argparse.Namespace, rounds: int = 3, seconds: float = 20.0) -> dict:
    """A model's training speed against the bf16 matmul ceiling, each ceiling measured right after its
    timing (the machine's load changes by the minute: only a ratio taken in the same minute means something).

    The ceiling is per shape, so a bigger model, whose time goes to bigger matmuls and less to the per-token
    element-wise work (layer norms, dropout masks, the softmax over V), reaches a larger fraction of it."""
    from seqlm.config import DataConfig, apply_overrides
    from seqlm.data.corpus import build_vocab
    from seqlm.models.transformer import TransformerConfig

    cfg = TransformerConfig()
    apply_overrides([cfg, DataConfig()], {k.lstrip("-"): v for k, v in zip(RECIPES["transformer-ptb"][::2],
                                                                           RECIPES["transformer-ptb"][1::2])}
                    | ({"size": SPEED_SIZES[name]} if SPEED_SIZES[name] else {}))
    path = split_path(ptb_dir(), "train")
    vocab = build_vocab(path)
    stream = encode_file(path, vocab)
    fpt, shapes = flops_per_token(asdict(cfg), len(vocab))
    fractions, speeds, ceilings = [], [], []
    for _ in range(rounds):
        speeds.append(_tokens_per_s(cfg, vocab, stream, seconds))
        ceilings.append(matmul_gflops(shapes, torch.bfloat16))
        fractions.append(fpt * speeds[-1] / 1e9 / ceilings[-1])
    return {"name": name, "recipe": " ".join(RECIPES["transformer-ptb"]), "size": SPEED_SIZES[name] or "recipe",
            "layers": cfg.layers, "d_model": cfg.d_model, "d_ff": cfg.d_ff, "heads": cfg.heads, "rounds": rounds,
            "seconds_per_round": seconds, "train_tokens_per_s": speeds, "matmul_ceiling_gflops": ceilings,
            "flops_per_token": fpt, "fraction_of_ceiling": fractions,
            "median_fraction_of_ceiling": sorted(fractions)[rounds // 2], "threads": args.threads}


def run_row(name: str, args: argparse.Namespace) -> dict:
    out = CHECKPOINTS / "transformer_ptb" / name
    status = run_status(out)
    resumed = status["started"]  # a run cut inside its first epoch is resumed too
    recipe = list(RECIPES[name])
    if args.minutes:
        recipe[recipe.index("--max-minutes") + 1] = str(args.minutes)
    flags = recipe + ["--precision", args.precision, "--threads", str(args.threads), "--device", args.device]
    t0 = time.time()
    with recorded_training(out, resumed, args.threads) as earlier:
        result = train_from_cli("transformer", str(ptb_dir()), str(out), None, flags, resume=resumed)
    wall = time.time() - t0
    import seqlm

    model = seqlm.load(out)
    unit = model.data_config.unit
    test = encode_file(split_path(ptb_dir(), "test"), model.vocab, unit=unit)
    total = -math.log(result["test_ppl"]) * result["test_tokens"]  # the sentence-mode test run of train_from_cli
    # stream mode for word rows only: on characters it would cost two more passes of the test set (minutes)
    stream = evaluate(model, test, stream_mode=True) if unit == "word" else {"ppl": None}
    hist = run_status(out)["history"]
    info = json.loads((out / "config.json").read_text())["model"]
    fpt, shapes = flops_per_token(info, len(model.vocab))
    ceiling = matmul_gflops(shapes, torch.bfloat16 if args.precision == "bf16" else torch.float32)
    train_seconds = sum(h["epoch_seconds"] for h in hist)
    tok_s = sum(h["train_tokens"] for h in hist) / max(train_seconds, 1e-9)
    row = {
        "name": name, "unit": unit, "recipe": " ".join(recipe), "valid_ppl": result["valid_ppl"],
        "test_ppl": result["test_ppl"], "test_ppl_stream": stream["ppl"], "epochs_run": len(hist),
        "valid_curve": [h["valid_ppl"] for h in hist], "train_minutes": train_seconds / 60,
        "wall_minutes": wall / 60, "params": sum(p.numel() for p in model.parameters()),
        "precision": args.precision, "train_tokens_per_s": tok_s, "flops_per_token": fpt,
        "train_gflops": fpt * tok_s / 1e9, "matmul_ceiling_gflops": ceiling,
        "fraction_of_ceiling": fpt * tok_s / 1e9 / ceiling, "config": info, "threads": args.threads,
        "resumed": resumed,
    }
    row = with_earlier_runs(row, earlier)
    if unit == "char":
        rates = char_rates(test, model.vocab, total)
        row.update({"test_bpc": rates["bpc"], "test_word_ppl": rates["word_ppl"],
                    "test_bits_per_word": rates["bits_per_word"]})
    return row


def main() -> None:
    p = row_parser(__doc__, "transformer-ptb,transformer-ptb-char", "bf16")
    p.add_argument("--minutes", type=float, default=0.0, help="replace the recipe's --max-minutes (stated in the row)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.rows.split(","):
        if name not in RECIPES and name not in SPEED_SIZES:
            sys.exit(f"unknown row {name}; choose from {', '.join([*RECIPES, *SPEED_SIZES])}")
        row = run_speed(name, args) if name in SPEED_SIZES else run_row(name, args)
        merge_rows("transformer_ptb", [row])
        if name in RECIPES:
            merge_rows("dae", [row])  # the table reads these two rows next to the autoencoder rows
        print(json.dumps({k: row[k] for k in row if k not in ("config", "valid_curve")}), flush=True)


if __name__ == "__main__":
    main()
