"""Approximate fixed-point RNNs on PTB (approximate-fixed-points-rnn.txt): AFP-K against BPTT.

    python bench/afp_ptb.py --rows timing,bptt,afp-k2,afp-k4,convergence --threads 1

Rows:
- `bptt`: the rnn family's `rnn-bptt` model (H 200, class output, tau 5, dropout 0.3), trained by truncated
  BPTT, evaluated exactly and with K fixed-point iterations (`test_ppl_at_k`).
- `afp-k1` .. `afp-k8`: the same network trained through K fixed-point iterations (family `afp`), evaluated at
  its own K (`test_ppl`, `test_ppl_stream`) and exactly (`test_ppl_exact`, `test_ppl_exact_stream`).
- `convergence`: mean ||h^(K) - h_exact|| over PTB valid positions against K, with the spectral norm of W,
  for the bptt row's model and each AFP model trained.
- `cross-k`: every trained afp-kK model evaluated at each K (sentence mode): how a model trained at one K
  does at another.
- `valid-modes`: every trained row's saved model on PTB valid, sentence and stream mode (rows' own `valid_ppl`
  is by sentence before 5a4bc0a, in stream mode since).
- `timing`: wall time of one sequence (B = 1) against T, forward and forward + backward, AFP-K against the
  sequential Elman layer (its own BPTT), one process, one run; and tokens/s at the training batch size.

RECIPE: the rnn family's `rnn-bptt` recipe in full (Adam lr 0.003, 64 x 20 batches, clip 1, newbob halving
until valid stops improving, at most 30 epochs: rnn-bptt stopped after 18), for bptt and every afp row alike.
`bptt-3ep`, `afp-kK-3ep` are the earlier shortened rows (3 epochs of the same recipe) and `bptt-e5`,
`afp-k4-e5` continue two of them to 5 epochs; `afp-k4-drop0.1`, `afp-k4-drop0.5` are AFP-4 with another dropout
rate, `afp-k4-lr0.001` / `-lr0.006` / `-lr0.01` and `bptt-lr0.006` / `-lr0.01` at other Adam rates; `afp-k4-from-bptt`
/ `-from-afp-k6` / `-from-afp-k8` start from that row's trained model (run it first).
Rows resume from their epoch checkpoints in bench/checkpoints/afp_ptb/ROW.
"""

from __future__ import annotations

import json
import shutil
import sys
import time

import numpy as np
import torch

import seqlm
from seqlm.cli import main as seqlm_main
from seqlm.data.batching import sentence_batches
from seqlm.data.corpus import encode_file
from seqlm.eval.perplexity import evaluate
from seqlm.models.afp import with_iterations
from seqlm.nn.elman import Elman
from seqlm.nn.fixed_point import fixed_point
from seqlm.train.loop import run_status

from common import CHECKPOINTS, RESULTS, merge_rows, ptb_dir, recorded_training, row_parser, with_earlier_runs

EPOCHS = 30  # an upper bound: newbob ends the run when valid stops improving
SHORT_EPOCHS = 3
MODEL = ["--hidden", "200", "--output", "class", "--dropout", "0.3"]
KS = (1, 2, 3, 4, 6, 8)
FULL = {"bptt": ("rnn", ["--tau", "5"])} | {f"afp-k{k}": ("afp", ["--iterations", str(k)]) for k in KS}
ROWS = FULL | {f"{name}-3ep": spec for name, spec in FULL.items()}
# two more epochs for the BPTT model and AFP-4, continuing their 3-epoch checkpoints: does the gap close?
LONGER = {"bptt-e5": ("bptt-3ep", 5), "afp-k4-e5": ("afp-k4-3ep", 5)}
ROWS |= {name: ROWS[src] for name, (src, _) in LONGER.items()}
# AFP-4 with another dropout rate (the recipe's 0.3 was tuned for BPTT): does the K = 4 gap close?
TUNED = {f"afp-k4-drop{p}": ("afp", ["--iterations", "4", "--dropout", p]) for p in ("0.1", "0.5")}
ROWS |= TUNED
# AFP-4 from scratch at another Adam rate (the recipe's 0.003 was tuned for BPTT), #44 item 4
SCRATCH_LR = {f"afp-k4-lr{lr}": ("afp", ["--iterations", "4", "--lr", lr]) for lr in ("0.001", "0.006", "0.01")}
# and BPTT at the same rates, so that each side is picked on valid from a grid of rates (equal terms)
SCRATCH_LR |= {f"bptt-lr{lr}": ("rnn", ["--tau", "5", "--lr", lr]) for lr in ("0.006", "0.01")}
ROWS |= SCRATCH_LR
# AFP-4 started from the trained BPTT network (`seqlm train --init-from`), then trained through its 4 iterations
# at a fine-tuning rate: does a network trained with the full history make a better 4-word model?
# The same from the AFP-6 and AFP-8 models (a curriculum in K: no BPTT anywhere).
FROM = {"afp-k4-from-bptt": ("bptt", "0.001"), "afp-k4-from-afp-k6": ("afp-k6", "0.001"),
        "afp-k4-from-afp-k8": ("afp-k8", "0.001")}
FROM |= {f"afp-k4-from-afp-k8-lr{lr}": ("afp-k8", lr) for lr in ("0.0005", "0.002", "0.003")}  # the fine-tuning rate
ROWS |= {name: ("afp", ["--iterations", "4", "--lr", lr]) for name, (_, lr) in FROM.items()}
RECIPE = ("full: the rnn-bptt recipe on full PTB train (Adam lr 0.003, 64 x 20 batches, clip 1, newbob, at most "
          f"{EPOCHS} epochs), H 200, class output, sigmoid, dropout 0.3; the same for bptt and every afp row")
SHORT_RECIPE = (f"shortened: {SHORT_EPOCHS} epochs of full PTB train (rnn recipe: Adam lr 0.003, 64 x 20 batches, "
                "clip 1), H 200, class output, sigmoid, dropout 0.3; the same for bptt and every afp row")


def _epochs(name: str) -> tuple[int, str]:
    if name in FROM:
        src, lr = FROM[name]
        return EPOCHS, RECIPE.replace("Adam lr 0.003", f"started from the {src} row's model, Adam lr {lr}")
    if name in TUNED:
        return EPOCHS, RECIPE.replace("dropout 0.3", f"dropout {TUNED[name][1][-1]}")
    if name in SCRATCH_LR:
        return EPOCHS, RECIPE.replace("Adam lr 0.003", f"Adam lr {SCRATCH_LR[name][1][-1]}")
    if name in LONGER:
        src, epochs = LONGER[name]
        return epochs, SHORT_RECIPE.replace(f"{SHORT_EPOCHS} epochs", f"{epochs} epochs (continuing {src})")
    return (SHORT_EPOCHS, SHORT_RECIPE) if name.endswith("-3ep") else (EPOCHS, RECIPE)


def _out(name: str):
    return CHECKPOINTS / "afp_ptb" / name


def train_row(name: str, args) -> tuple[object, dict]:
    fam, opts = ROWS[name]
    out = _out(name)
    src = LONGER.get(name, (None,))[0]
    epochs, recipe = _epochs(name)
    if src and not out.exists():
        shutil.copytree(_out(src), out)  # continue the 3-epoch row's run (its checkpoint and record) for more epochs
    status = run_status(out)
    resumed, earlier = status["started"], []  # a run cut inside its first epoch is resumed too
    if not status["done"]:
        argv = ["train", "--model", fam, "--data", str(ptb_dir()), "--out", str(out), *MODEL, *opts,
                "--max-epochs", str(epochs), "--threads", str(args.threads), "--device", args.device,
                *(["--resume"] if resumed else []),
                *(["--init-from", str(_out(FROM[name][0]))] if name in FROM and not resumed else [])]
        with recorded_training(out, resumed, args.threads) as earlier:
            if seqlm_main(argv) != 0:
                sys.exit(f"training {name} failed")
    status = run_status(out)
    hist = status["history"]
    secs = sum(h["epoch_seconds"] for h in hist)
    info = {"epochs": status["epoch"], "finished": status["done"], "train_seconds": secs,
            "train_tokens_per_s": sum(h["train_tokens"] for h in hist) / max(secs, 1e-9),
            "valid_curve": [h["valid_ppl"] for h in hist], "resumed": resumed,
            "recipe": recipe,
            "config": json.loads((out / "config.json").read_text())["model"]}
    return seqlm.load(out), with_earlier_runs(info, earlier)


def ppl(model, stream, stream_mode=False) -> float:
    return evaluate(model, stream, stream_mode=stream_mode)["ppl"]


def run_model_row(name: str, args) -> dict:
    model, info = train_row(name, args)
    test = encode_file(ptb_dir() / "test.txt", model.vocab)
    exact = with_iterations(model, None)
    row = {"name": name, "iterations": model.iterations if not name.startswith("bptt") else "exact",
           "test_ppl": ppl(model, test), "test_ppl_stream": ppl(model, test, True),
           "test_ppl_exact": ppl(exact, test), "test_ppl_exact_stream": ppl(exact, test, True),
           "valid_ppl": info["valid_curve"][-1] if info["valid_curve"] else None, **info,
           "params": sum(p.numel() for p in model.parameters()), "threads": args.threads}
    if name.startswith("bptt"):  # the BPTT model under every K the afp rows use
        row["test_ppl_at_k"] = {str(k): ppl(with_iterations(model, k), test) for k in KS}
        row["test_ppl_stream_at_k"] = {str(k): ppl(with_iterations(model, k), test, True) for k in KS}
    return row


def cross_k(args) -> dict:
    """`cross-k`: every full-recipe AFP model (trained at its K) evaluated at each K of KS, sentence mode."""
    table = {}
    for name in FULL:
        if name.startswith("afp") and (_out(name) / "config.json").exists():
            model = seqlm.load(_out(name))
            test = encode_file(ptb_dir() / "test.txt", model.vocab)
            table[name] = {str(k): ppl(with_iterations(model, k), test) for k in KS}
    return {"name": "cross-k", "data": "PTB test, sentence mode", "test_ppl_at_k": table, "threads": args.threads}


def valid_modes(args) -> dict:
    """`valid-modes`: every trained row's model on PTB valid in sentence and stream mode. Training validates by
    sentence before 5a4bc0a and in stream mode since (--valid-mode auto), so rows' `valid_ppl` from either side
    of it do not compare; these do."""
    table = {}
    for name in ROWS:
        if (_out(name) / "config.json").exists():
            model = seqlm.load(_out(name))
            valid = encode_file(ptb_dir() / "valid.txt", model.vocab)
            table[name] = {"sentence": ppl(model, valid), "stream": ppl(model, valid, True)}
    return {"name": "valid-modes", "data": "PTB valid, each row's saved (best on valid) model", "valid_ppl": table,
            "threads": args.threads}


@torch.no_grad()
def convergence(args, max_sentences: int = 1000) -> dict:
    """Mean ||h^(K) - h_exact|| over the first PTB valid sentences, per trained model, with ||W||_2."""
    curves = {}
    ks = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    for name in FULL:  # the full-recipe models
        if not (_out(name) / "config.json").exists():
            continue
        model = seqlm.load(_out(name))
        valid = encode_file(ptb_dir() / "valid.txt", model.vocab)
        rnn: Elman = model.rnn
        w_norm = float(torch.linalg.matrix_norm(rnn.weight_hh, ord=2))
        err, n, positions = np.zeros(len(ks)), 0, 0
        for rows in sentence_batches(valid, model.vocab.bos_id, max_tokens=4096):
            if n >= max_sentences:
                break
            b = rows.batch
            x = model.embedding(b.inputs)  # (B, T, E)
            h0 = rnn.initial_state(x.shape[0])
            exact = rnn(x, h0)[0]  # (B, T, H)
            for i, k in enumerate(ks):
                d = (fixed_point(rnn, x, h0, b.resets, k) - exact).norm(dim=-1)  # (B, T)
                err[i] += float(d[b.mask].sum())
            n, positions = n + x.shape[0], positions + int(b.mask.sum())
        curves[name] = {"spectral_norm_W": w_norm,
                        # sigmoid' <= 1/4: f is a contraction when ||W||_2 / 4 < 1 (Banach: geometric convergence)
                        "lipschitz_bound": w_norm / 4 if rnn.activation == "sigmoid" else w_norm,
                        "mean_error": dict(zip(map(str, ks), (err / positions).tolist(), strict=True)),
                        "sentences": n, "positions": positions}
    return {"name": "convergence", "data": "PTB valid, first sentences", "ks": ks, "models": curves,
            "threads": args.threads}


def _time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def timing(args) -> dict:
    """Elman layer (H 200, sigmoid) on one sequence: AFP-K (K parallel iterations) vs the sequential loop."""
    torch.manual_seed(0)
    H = 200
    rnn = Elman(0, H).to(args.device if args.device != "auto" else "cpu")
    lengths = [10, 20, 50, 100, 200, 400]
    kinds = {"sequential": None, **{f"afp-k{k}": k for k in (1, 2, 4, 8)}}
    out = {kind: {"forward_ms": [], "forward_backward_ms": []} for kind in kinds}

    def run(kind, x, backward):
        k = kinds[kind]
        h0 = rnn.initial_state(x.shape[0])
        resets = torch.zeros(x.shape[:2], dtype=torch.bool)
        h = rnn(x, h0)[0] if k is None else fixed_point(rnn, x, h0, resets, k)
        if backward:
            h.sum().backward()

    for T in lengths:
        x = torch.randn(1, T, H, requires_grad=True)
        for kind in kinds:
            with torch.no_grad():
                out[kind]["forward_ms"].append(1e3 * _time(lambda kd=kind, x=x: run(kd, x, False), 20))
            out[kind]["forward_backward_ms"].append(1e3 * _time(lambda kd=kind, x=x: run(kd, x, True), 20))
    B, T = 64, 20  # the training batch: AFP does K times the recurrent FLOPs of the sequential loop
    x = torch.randn(B, T, H, requires_grad=True)
    batch = {kind: B * T / _time(lambda kd=kind: run(kd, x, True), 20) for kind in kinds}
    return {"name": "timing", "hidden": H, "batch_size": 1, "lengths": lengths, "layer": "Elman recurrence only "
            "(input projection included, output layer excluded: the same for both)", **{k: v for k, v in out.items()},
            "train_batch_tokens_per_s": {"batch": [B, T], **batch}, "repeats": "best of 20", "threads": args.threads}


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = RESULTS / "afp_ptb.json"
    rows = {r["name"]: r for r in json.loads(path.read_text())["rows"]}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    afp = sorted((r["iterations"], r) for n, r in rows.items() if n in FULL and n != "bptt")
    if afp:
        ks = [k for k, _ in afp]
        ax.plot(ks, [r["test_ppl"] for _, r in afp], "o-", label="AFP-K trained, eval at K")
        ax.plot(ks, [r["test_ppl_exact"] for _, r in afp], "s--", label="AFP-K trained, eval exact")
    if "bptt" in rows:
        b = rows["bptt"]
        ax.axhline(b["test_ppl"], color="k", label="BPTT trained, eval exact")
        ax.axhline(b["test_ppl"] * 1.03, color="k", ls=":", label="BPTT + 3%")
        at = b.get("test_ppl_at_k", {})
        ax.plot([int(k) for k in at], list(at.values()), "^-", label="BPTT trained, eval at K")
    ax.set(xlabel="K (fixed-point iterations)", ylabel="PTB test ppl (sentence)", yscale="log",
           title="Perplexity against K")
    ax.legend(fontsize=7)
    if "convergence" in rows:
        c = rows["convergence"]
        for name, m in c["models"].items():
            axes[1].plot(c["ks"], list(m["mean_error"].values()), "o-",
                         label=f"{name} (||W||={m['spectral_norm_W']:.2f})")
        axes[1].set(xlabel="K", ylabel="mean ||h^(K) - h_exact||", yscale="log", title="Convergence on PTB valid")
        axes[1].legend(fontsize=7)
    if "timing" in rows:
        t = rows["timing"]
        for kind in ("sequential", "afp-k1", "afp-k2", "afp-k4", "afp-k8"):
            axes[2].plot(t["lengths"], t[kind]["forward_backward_ms"], "o-", label=f"{kind} fwd+bwd")
        axes[2].plot(t["lengths"], t["sequential"]["forward_ms"], "k--", label="sequential fwd")
        axes[2].set(xlabel="T (B = 1)", ylabel="ms", xscale="log", yscale="log", title="One sequence, H 200")
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "afp_ptb.png", dpi=110)


def main() -> None:
    p = row_parser(__doc__, "timing,bptt,afp-k2,afp-k4,convergence", "fp32")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.rows.split(","):
        if name in ROWS:
            row = run_model_row(name, args)
        elif name == "convergence":
            row = convergence(args)
        elif name == "cross-k":
            row = cross_k(args)
        elif name == "valid-modes":
            row = valid_modes(args)
        elif name == "timing":
            row = timing(args)
        else:
            extra = ["convergence", "cross-k", "valid-modes", "timing"]
            sys.exit(f"unknown row {name}; choose from {', '.join([*ROWS, *extra])}")
        merge_rows("afp_ptb", [row])
        plot()
        print(json.dumps({k: row.get(k) for k in ("name", "test_ppl", "test_ppl_stream", "test_ppl_exact")}),
              flush=True)


if __name__ == "__main__":
    main()
