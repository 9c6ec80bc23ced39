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


def plot_runs(model_dirs: list[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_e, ax_t) = plt.subplots(1, 2, figsize=(11, 4.2))
    for d in model_dirs:
        rows = read_metrics(d)
        ep = [r["epoch"] for r in rows]
        wall = [r["wall_seconds"] / 60 for r in rows]
        ppl = [r["valid_ppl"] for r in rows]
        line = ax_e.plot(ep, ppl, marker="o", ms=3, label=d.name)[0]
        ax_t.plot(wall, ppl, marker="o", ms=3, color=line.get_color(), label=d.name)
        halved = [i for i, r in enumerate(rows) if r.get("lr_halved")]
        ax_e.scatter([ep[i] for i in halved], [ppl[i] for i in halved], marker="v", s=40, color=line.get_color())
        ax_t.scatter([wall[i] for i in halved], [ppl[i] for i in halved], marker="v", s=40, color=line.get_color())
    ax_e.set(xlabel="epoch", ylabel="valid perplexity", title="by epoch (▼ = learning rate halved)")
    ax_t.set(xlabel="wall time (min)", ylabel="valid perplexity", title="by wall time")
    for ax in (ax_e, ax_t):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
