"""The forgetting-factor sweep of fofe-fnnlm.txt Fig. 4: PTB perplexity of 1st- and 2nd-order FOFE-FNNLMs
for alpha in {0, 0.1, ..., 1.0}.

    python bench/fofe_alpha.py [--orders 1,2] [--alphas 0,0.1,...,1] [--fraction 0.5] [--epochs 1]

A shortened schedule, stated in the JSON: each point trains the paper's model (200-d projection, 2 x 400
ReLU, full softmax, SGD with mini-batches of 200 words, lr 0.4) for `--epochs` epochs at the initial
rate on the first `--fraction` of PTB train (vocabulary from that part), then reports valid and test
perplexity. The full schedule takes about an hour per point on this CPU; the sweep compares alphas, not
absolute perplexities. `--precision fp32` rows (named -fp32) check that bf16 keeps the perplexity.
Points already in bench/results/fofe_alpha.json with the same settings are kept.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from seqlm.train.run import train_from_cli

from common import CHECKPOINTS, RESULTS, merge_rows, ptb_dir


def subset_corpus(fraction: float) -> str:
    """PTB with the first `fraction` of the training sentences (valid and test unchanged)."""
    out = CHECKPOINTS / "fofe_alpha" / f"ptb-{fraction:g}"
    if not (out / "test.txt").exists():
        out.mkdir(parents=True, exist_ok=True)
        lines = (ptb_dir() / "train.txt").read_text().splitlines(keepends=True)
        (out / "train.txt").write_text("".join(lines[: int(len(lines) * fraction)]))
        for split in ("valid", "test"):
            (out / f"{split}.txt").write_text((ptb_dir() / f"{split}.txt").read_text())
    return str(out)


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for (order, prec) in sorted({(r["order"], r["precision"]) for r in rows}):
        pts = sorted((r["alpha"], r["test_ppl"]) for r in rows if (r["order"], r["precision"]) == (order, prec))
        ax.plot([a for a, _ in pts], [p for _, p in pts], marker="o" if prec == "bf16" else "x",
                label=f"FOFE order {order}" + ("" if prec == "bf16" else f" ({prec})"))
    r = rows[0]
    ax.set(xlabel="forgetting factor alpha", ylabel="PTB test perplexity",
           title=f"FOFE-FNNLM vs alpha: {r['epochs']} epoch(s) at lr 0.4 on {r['fraction']:g} of PTB train")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "fofe_alpha.png", dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--orders", default="1,2")
    p.add_argument("--alphas", default=",".join(f"{a / 10:g}" for a in range(11)))
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    corpus = subset_corpus(args.fraction)
    path = RESULTS / "fofe_alpha.json"
    done = {r["name"]: r for r in json.loads(path.read_text())["rows"]} if path.exists() else {}
    setting = {"fraction": args.fraction, "epochs": args.epochs, "precision": args.precision}
    for order in (int(o) for o in args.orders.split(",")):
        for alpha in (float(a) for a in args.alphas.split(",")):
            name = f"fofe-{order}-a{alpha:g}" + ("-fp32" if args.precision == "fp32" else "")
            if name in done and all(done[name].get(k) == v for k, v in setting.items()):
                continue
            out = CHECKPOINTS / "fofe_alpha" / f"{name}-f{args.fraction:g}-e{args.epochs}"
            t = time.time()
            res = train_from_cli("fofe", corpus, str(out), None,
                                 ["--order", str(order), "--alpha", str(alpha), "--max-epochs", str(args.epochs),
                                  "--precision", args.precision, "--threads", str(args.threads)],
                                 resume=(out / "config.json").exists())
            row = {"name": name, "order": order, "alpha": alpha, "valid_ppl": res["valid_ppl"],
                   "test_ppl": res["test_ppl"], "seconds": time.time() - t, **setting}
            done[name] = row
            merge_rows("fofe_alpha", [row], {"schedule": "shortened: " + json.dumps(setting)})
            print(json.dumps(row), flush=True)
    plot(list(done.values()))


if __name__ == "__main__":
    main()
