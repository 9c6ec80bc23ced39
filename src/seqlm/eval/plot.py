"""Learning curves from `metrics.jsonl`: valid perplexity against epoch and against wall time."""

from __future__ import annotations

import json
from pathlib import Path

from seqlm.checkpoint import atomic_path
from seqlm.errors import SeqlmError


def read_metrics(model_dir: Path) -> list[dict]:
    path = model_dir / "metrics.jsonl"
    if not path.is_file():
        raise SeqlmError(f"{model_dir}: no metrics.jsonl (only neural training runs log learning curves)")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise SeqlmError(f"{path}:{n}: not a JSON line") from None
    return rows


def _check_out(out: Path, force: bool) -> None:
    """Replace a plot (a PNG that matplotlib wrote, as this command does), never another file unless forced."""
    if not out.exists() or force:
        return
    if out.is_dir():
        raise SeqlmError(f"--out {out} is a directory; give a file name such as {out}/curves.png")
    with open(out, "rb") as f:
        head = f.read(4096)
    if not (head.startswith(b"\x89PNG\r\n\x1a\n") and b"matplotlib" in head):
        raise SeqlmError(f"--out {out} exists and is not a plot; choose another name or add --force to overwrite it")


def plot_runs(model_dirs: list[Path], out: Path, force: bool = False) -> None:
    """Valid perplexity by epoch and by wall time; then, where any run logged them, the training loss per
    token and the log-normaliser log Z_h (NCE runs: mean +- spread of the true one at validation, and
    ZRegression's prediction) by epoch: the panels of sparse-word-representations.txt Fig. 5."""
    _check_out(out, force)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(d, read_metrics(d)) for d in model_dirs]
    has_z = any("log_z_mean" in r for _, rows in runs for r in rows)
    fig, axes = plt.subplots(1, 4 if has_z else 2, figsize=(22 if has_z else 11, 4.2))
    ax_e, ax_t = axes[0], axes[1]
    for d, rows in runs:
        ep = [r["epoch"] for r in rows]
        wall = [r["wall_seconds"] / 60 for r in rows]
        ppl = [r["valid_ppl"] for r in rows]
        line = ax_e.plot(ep, ppl, marker="o", ms=3, label=d.name)[0]
        ax_t.plot(wall, ppl, marker="o", ms=3, color=line.get_color(), label=d.name)
        halved = [i for i, r in enumerate(rows) if r.get("lr_halved")]
        ax_e.scatter([ep[i] for i in halved], [ppl[i] for i in halved], marker="v", s=40, color=line.get_color())
        ax_t.scatter([wall[i] for i in halved], [ppl[i] for i in halved], marker="v", s=40, color=line.get_color())
        if has_z:
            _nce_panels(axes[2], axes[3], d.name, rows, line.get_color())
    ax_e.set(xlabel="epoch", ylabel="valid perplexity", title="by epoch (▼ = learning rate halved)")
    ax_t.set(xlabel="wall time (min)", ylabel="valid perplexity", title="by wall time")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def _nce_panels(ax_loss, ax_z, name: str, rows: list[dict], color) -> None:
    import math

    ep = [r["epoch"] for r in rows]
    ax_loss.plot(ep, [math.log(r["train_ppl"]) for r in rows], marker="o", ms=3, color=color, label=name)
    ax_loss.set(xlabel="epoch", ylabel="training loss per token", title="training loss (NCE rows: the NCE loss)")
    z = [r for r in rows if "log_z_mean" in r]
    if z:
        zep, mean, std = [r["epoch"] for r in z], [r["log_z_mean"] for r in z], [r["log_z_std"] for r in z]
        ax_z.errorbar(zep, mean, yerr=std, marker="o", ms=3, capsize=3, color=color, label=f"{name}: true")
        if "log_z_pred_mean" in z[0]:
            ax_z.plot(zep, [r["log_z_pred_mean"] for r in z], ls="--", color=color, label=f"{name}: ZRegression")
    ax_z.set(xlabel="epoch", ylabel="log Z_h", title="log-normaliser at validation (mean +- std)")
