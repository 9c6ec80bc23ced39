"""Render bench/RESULTS.md (tables) and bench/results/*.png (plots) from bench/results/*.json."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

from common import RESULTS
from common import ROOT as REPO

ROOT = RESULTS.parent
COLUMNS = ["name", "order", "alpha", "epsilon", "colliding", "sequences", "prefixes", "valid_ppl", "test_ppl",
           "test_ppl_stream", "paper_test_ppl", "params", "epochs",
           "finished", "precision", "train_seconds", "train_tokens_per_s", "tokens_per_s", "eval_tokens_per_s",
           "fraction_of_ceiling", "ceiling_fraction_unpaired", "estimate_seconds"]
UNPAIRED = ("`ceiling_fraction_unpaired`: a training run's average speed over its whole run divided by a "
            "matmul ceiling sampled for 1.5 s once the run ended, under whatever load the shared machine had "
            "then (the transformer recipe's shapes measured from 168 to 468 GFLOP/s on different minutes), so "
            "it does not measure the model's efficiency. `fraction_of_ceiling` is only given for speed rows, "
            "whose every timing is paired with a ceiling measured right after it (the median of the rounds "
            "where a row has several).")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    if isinstance(v, list) and v and all(isinstance(x, int | float) for x in v):  # rounds of a speed row
        return f"{sorted(v)[len(v) // 2]:.4g} (median of {len(v)})"
    return "" if v is None else str(v)


def _shown(r: dict) -> dict:
    """The row as the table shows it: a fraction of the ceiling only where the speed and the ceiling were
    measured moments apart (speed rows); a training row's ratio under its own label (UNPAIRED)."""
    if "fraction_of_ceiling" not in r or "median_fraction_of_ceiling" in r or "fraction_of_ceiling_rounds" in r:
        return r
    return {**{k: v for k, v in r.items() if k != "fraction_of_ceiling"},
            "ceiling_fraction_unpaired": r["fraction_of_ceiling"]}


def table(doc: dict) -> str:
    rows = [_shown(r) for r in doc["rows"]]
    cols = [c for c in COLUMNS if any(c in r for r in rows)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines + (["", UNPAIRED] if "ceiling_fraction_unpaired" in cols else []))


def _code(text) -> str:
    return f"`{str(text).replace('|', '/')}`" if text else ""


def provenance(doc: dict) -> str:
    """Each row's own command and revision (the run that started it; `runs` when it was resumed)."""
    lines = ["| row | command | git_rev | dirty | started | ended | threads | runs |", "|" + "---|" * 8]
    notes = []
    for r in doc["rows"]:
        runs = r.get("runs") or []
        revs = ", ".join(dict.fromkeys(x.get("git_rev", "?") for x in runs)) if len(runs) > 1 else ""
        lines.append(f"| {r['name']} | {_code(r.get('command'))} | {_code(r.get('git_rev', 'unrecorded'))} | "
                     f"{_fmt(r.get('dirty'))} | {_fmt(r.get('started'))} | {_fmt(r.get('ended'))} | "
                     f"{_fmt(r.get('threads'))} | {len(runs) or ''}{f' ({revs})' if revs else ''} |")
        if r.get("provenance_note"):
            notes.append(f"- {r['name']}: {r['provenance_note']}")
        audit = r.get("provenance_audit", "no contradiction")
        if not audit.startswith("no contradiction"):
            notes.append(f"- {r['name']}: **cannot have been produced at its recorded revision**: {audit}")
    return "\n".join(lines + ([""] + notes if notes else []))


def plot_curves(doc: dict, path: Path) -> bool:
    rows = [r for r in doc["rows"] if r.get("valid_curve")]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # a table can hold dozens of curves: the legend goes beside the axes, in as many columns as it needs
    cols = 1 + (len(rows) - 1) // 25
    fig, ax = plt.subplots(figsize=(7 + 3.5 * cols, max(4.0, 0.18 * min(len(rows), 25) + 1)))
    for i, r in enumerate(rows):  # the colour cycle repeats every 10 curves: the line style tells them apart
        ax.plot(range(1, len(r["valid_curve"]) + 1), r["valid_curve"], marker="o", ms=3, label=r["name"],
                ls=("-", "--", ":")[i // 10 % 3])
    ax.set(xlabel="epoch", ylabel="valid perplexity", title=doc["bench"])
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, ncol=cols, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# ---- provenance audit of rows written before per-row provenance (python bench/render.py --backfill) ----------

PROVENANCE = ("command", "git_rev", "dirty", "started", "ended", "runs", "threads", "provenance_note",
              "recorded_in_file_header", "provenance_audit")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)


def _content(row: dict) -> str:
    return json.dumps({k: v for k, v in row.items() if k not in PROVENANCE}, sort_keys=True)


def file_writers(path: Path) -> dict[str, dict]:
    """Row name -> the file header (command, git_rev, date) of the committed version where the row last changed,
    with that commit: what the file recorded when the row's current figures were written."""
    rel = f"bench/results/{path.name}"  # the history of the file in the repository
    commits = _git("log", "--reverse", "--format=%h", "--", rel).stdout.split()
    seen: dict[str, str] = {}
    out: dict[str, dict] = {}
    for c in commits:
        doc = json.loads(_git("show", f"{c}:{rel}").stdout or "{}")
        header = {"command": doc.get("command"), "git_rev": doc.get("git_rev"), "date": doc.get("date")}
        for r in doc.get("rows", []):
            changed = seen.get(r["name"]) != _content(r)
            previous = out.get(r["name"], {})
            # a new invocation that named this row in --rows and reproduced its figures
            rerun = _names_row(header["command"], r["name"]) is True and {**previous, **header} != previous
            if changed or rerun:
                seen[r["name"]] = _content(r)
                out[r["name"]] = {**header, "results_commit": c}
    return out


def _keys(config: dict) -> set[str]:
    return {k for k, v in config.items() for k in ([k] + sorted(_keys(v)) if isinstance(v, dict) else [k])}


def cannot_have_produced(row: dict, rev: str, script: str) -> list[str]:
    """Why revision `rev` cannot have produced `row` (empty: no contradiction found)."""
    rev = rev.removesuffix("-dirty")
    if _git("cat-file", "-e", f"{rev}^{{commit}}").returncode:
        return [f"revision {rev} is not in this repository"]
    why = []
    if _git("cat-file", "-e", f"{rev}:bench/{script}.py").returncode:
        why.append(f"bench/{script}.py does not exist at {rev}")
    for fam in ("fofe", "fnn", "rnn"):
        if fam in row["name"] and _git("grep", "-q", f'"{fam}"', rev, "--", "src/seqlm").returncode:
            why.append(f"family {fam} is not registered at {rev}")
    missing = [k for k in sorted(_keys(row.get("config") or {}))
               if _git("grep", "-q", "-w", k, rev, "--", "src/seqlm").returncode]
    if missing:
        why.append(f"its config has {', '.join(missing)}, which {rev} does not know")
    return why


def _names_row(command: str | None, name: str) -> bool | None:
    """Whether `command` ran row `name` by its --rows list; None when it has no --rows (not recorded)."""
    words = (command or "").split()
    return name in words[words.index("--rows") + 1].split(",") if "--rows" in words else None


def _legacy(r: dict, w: dict, bench: str) -> None:
    """What is truthfully known of a row written before per-row provenance: never a revision as its own."""
    own = _names_row(w["command"], r["name"])
    note = ("written before rows carried their own provenance: the file header saved with these figures "
            f"(results commit {w['results_commit']}) names `{w['command']}` at {w['git_rev']}, a revision taken "
            "when the file was written, without a dirty flag")
    if own is False:  # another invocation wrote it: give the documented command for the row
        r["command"] = f"python bench/{bench}.py --rows {r.get('renamed_from', r['name'])} --threads 1"
        note += "; that command does not run this row, so `command` is the documented one for it (README)"
    else:
        r["command"] = w["command"]
        note += "" if own else "; whether that invocation computed this row is not recorded"
    r.update({"git_rev": "unrecorded", "recorded_in_file_header": w, "provenance_note": note})


def _started_too_early(r: dict, bench: str) -> list[str]:
    """A legacy row with its wall time: main's newest commit when it started (at the latest: the time it was
    written less its wall time, more if it was resumed across sessions) must be able to produce it."""
    written, wall = r["recorded_in_file_header"].get("date"), r.get("wall_seconds") or r.get("train_seconds")
    if not written or not wall:
        return []
    from datetime import datetime, timedelta

    start = (datetime.fromisoformat(written) - timedelta(seconds=float(wall))).isoformat(timespec="seconds")
    rev = _git("rev-list", "-1", f"--before={start}", "HEAD").stdout.strip()[:7]
    if not rev:
        return [f"started by {start}, before the first commit"]
    return [f"started by {start}, when main's newest commit was {rev}: {x}"
            for x in cannot_have_produced(r, rev, bench)]


def _script(row: dict, bench: str) -> str:
    """The script that wrote the row: the one its command names (a table may hold rows another script
    mirrors into it, e.g. transformer_ptb's rows in dae.json), else the table's own."""
    words = (row.get("command") or "").split()
    named = [w for w in words if w.startswith("bench/") and w.endswith(".py")]
    return named[0][len("bench/"):-len(".py")] if named else bench


def backfill(path: Path) -> list[tuple[str, str]]:
    """Give every legacy row of `path` what is known of its provenance, audit every row; return the audit lines."""
    with open(RESULTS / f".{path.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # benchmarks merge rows into the same file
        doc = json.loads(path.read_text())
        writers, lines = file_writers(path), []
        for r in doc["rows"]:
            if "runs" not in r:
                _legacy(r, writers.get(r["name"], {"command": doc.get("command"), "git_rev": doc.get("git_rev"),
                                                   "date": doc.get("date"), "results_commit": "uncommitted"}),
                        doc["bench"])
            rev = r["git_rev"] if "runs" in r else r["recorded_in_file_header"]["git_rev"]
            why = [f"{rev}: {x}" for x in cannot_have_produced(r, str(rev), _script(r, doc["bench"]))] if rev else []
            if "runs" not in r:
                why += _started_too_early(r, doc["bench"])
            r["provenance_audit"] = "; ".join(why) if why else f"no contradiction found at {rev}"
            lines += [(r["name"], x) for x in why]
        if any("runs" not in r for r in doc["rows"]):  # files of new-schema rows only are audited, not rewritten
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=2) + "\n")
            os.replace(tmp, path)
    return lines


def name_clashes(paths: list[Path]) -> list[str]:
    """A row name used by two rows (in one file or in two) whose figures differ: a reader quoting the name
    cannot tell which row it means. Rows mirrored into another table with the same figures are fine."""
    seen: dict[str, list[tuple[str, str]]] = {}
    for path in paths:
        for r in json.loads(path.read_text())["rows"]:
            seen.setdefault(r["name"], []).append((path.name, _content(r)))
    return [f"row {name} in {' and '.join(f for f, _ in rows)} with different figures; rename one"
            for name, rows in seen.items() if len({c for _, c in rows}) > 1]


def main() -> None:
    clashes = name_clashes(sorted(RESULTS.glob("*.json")))
    if clashes:
        sys.exit("bench/render.py: " + "\n".join(clashes))
    if "--backfill" in sys.argv[1:]:
        for path in sorted(RESULTS.glob("*.json")):
            grouped: dict[str, list[str]] = {}
            for name, why in backfill(path):
                grouped.setdefault(why, []).append(name)
            for why, names in grouped.items():
                shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
                print(f"{path.stem}: {len(names)} rows ({shown}): cannot have been produced: {why}")
    parts = ["# Benchmark results", "",
             "Generated by `python bench/render.py` from `bench/results/*.json`. Every row carries its own",
             "provenance: the command and git revision of the run that started it (with a dirty flag for the",
             "whole tree), its start and end, threads, and every invocation (`runs`) when it was resumed. Rows",
             "from before per-row provenance say `unrecorded` and why (`provenance_note`). Rows with",
             "`finished: False` stopped before their schedule ended (they resume from their checkpoints).", ""]
    for path in sorted(RESULTS.glob("*.json")):
        doc = json.loads(path.read_text())
        parts += [f"## {doc['bench']}", "", f"Last written by `{doc['command']}` at `{doc['git_rev']}`, "
                  f"{doc['date']}, {doc['machine'].get('cpu')} (torch {doc['machine'].get('torch')}).", "",
                  table(doc), "", "Provenance of each row:", "", provenance(doc), ""]
        for key in ("class_speedup", "simulation", "summary", "schedule"):
            if key in doc:
                parts += [f"`{key}`: `{json.dumps(doc[key])}`", ""]
        png = RESULTS / f"{doc['bench']}_curves.png"
        if plot_curves(doc, png):
            parts += [f"![{doc['bench']}](results/{png.name})", ""]
        own = RESULTS / f"{doc['bench']}.png"  # a plot the benchmark drew itself (e.g. the alpha sweep)
        if own.exists():
            parts += [f"![{doc['bench']}](results/{own.name})", ""]
    (ROOT / "RESULTS.md").write_text("\n".join(parts))
    print(ROOT / "RESULTS.md")


if __name__ == "__main__":
    main()
