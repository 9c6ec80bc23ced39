"""The benchmark helpers that every table relies on: FLOP counts and merging rows into one JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

from fofe_ptb import ROWS, flops_per_token  # noqa: E402

WRITER = """
import sys
from pathlib import Path

import pytest
sys.path.insert(0, {bench!r})
from common import merge_rows
for i in range(15):
    merge_rows("table", [{{"name": f"{{sys.argv[1]}}-{{i}}", "value": i}}])
"""


def test_paper_row_costs_26_mflop_per_token_and_fofe_costs_what_fnn_costs():
    fofe2, shapes = flops_per_token(ROWS["fofe-2"])
    assert abs(fofe2 - 25.92e6) < 1e3  # the issue's "about 26 MFLOP per training token"
    assert fofe2 == flops_per_token(ROWS["fnn-3"])[0]  # [z_t; z_t-1] is as wide as two embeddings
    assert flops_per_token(ROWS["fofe-1"])[0] == flops_per_token(ROWS["fnn-2"])[0]
    assert (200, 400, 10000) in shapes  # the softmax matmul is among the shapes timed for the ceiling


def test_rows_written_by_two_processes_at_once_all_land(tmp_path):
    env = {**os.environ, "SEQLM_BENCH_RESULTS": str(tmp_path)}
    code = WRITER.format(bench=str(ROOT / "bench"))
    procs = [subprocess.Popen([sys.executable, "-c", code, tag], env=env) for tag in ("a", "b")]
    assert [p.wait(timeout=600) for p in procs] == [0, 0]  # generous: a loaded machine imports torch slowly
    doc = json.loads((tmp_path / "table.json").read_text())
    assert sorted(r["name"] for r in doc["rows"]) == sorted(f"{t}-{i}" for t in "ab" for i in range(15))
    assert {"bench", "command", "git_rev", "date", "machine"} <= set(doc)


def test_each_row_records_its_own_runs_and_a_resumed_row_keeps_the_earlier_ones(tmp_path, monkeypatch):
    import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    common.merge_rows("t", [{"name": "r", "v": 1}])
    first = json.loads((tmp_path / "t.json").read_text())["rows"][0]["runs"]
    assert len(first) == 1 and {"command", "git_rev", "started", "ended", "machine"} <= set(first[0])
    row = json.loads((tmp_path / "t.json").read_text())["rows"][0]
    assert {"command", "git_rev", "dirty", "started", "ended", "threads"} <= set(row)
    monkeypatch.setitem(common.RUN, "started", "later")  # a new invocation
    common.merge_rows("t", [{"name": "r", "v": 2, "resumed": True}])
    assert len(json.loads((tmp_path / "t.json").read_text())["rows"][0]["runs"]) == 2
    monkeypatch.setitem(common.RUN, "started", "fresh")
    common.merge_rows("t", [{"name": "r", "v": 3}])  # started over: only this run produced it
    assert len(json.loads((tmp_path / "t.json").read_text())["rows"][0]["runs"]) == 1


def _fake_dae(tmp_path, monkeypatch, calls: list):
    """bench/dae.py with `seqlm train` replaced by a stand-in that writes its epochs to a file."""
    import argparse

    import dae

    import common

    def fake_train(family, data, out, config, flags, resume):  # stands in for seqlm train: epochs in a file
        out = Path(out)
        epochs = int(flags[flags.index("--max-epochs") + 1])
        done = json.loads((out / "status.json").read_text())["epoch"] if (out / "status.json").exists() else 0
        assert resume == (done > 0)
        calls.append((out.name, done, epochs))
        out.mkdir(parents=True, exist_ok=True)
        hist = [{"epoch_seconds": 60.0, "train_tokens": 1000} for _ in range(epochs)]
        (out / "status.json").write_text(json.dumps({"epoch": epochs, "history": hist}))
        (out / "config.json").write_text(json.dumps({"data": {"unit": "char"}, "model": {"bits": 16, "k": 3}}))
        return {"test_ppl": 3.0 - epochs / 100, "valid_ppl": 3.0, "test_tokens": 100}

    def fake_status(out):
        path = Path(out) / "status.json"
        s = json.loads(path.read_text()) if path.exists() else {"epoch": 0, "history": []}
        return {**s, "done": False, "started": path.exists()}

    for module in (common, dae):
        monkeypatch.setattr(module, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(dae, "CHECKPOINTS", tmp_path / "checkpoints")
    monkeypatch.setattr(dae, "train_from_cli", fake_train)
    monkeypatch.setattr(dae, "run_status", fake_status)
    monkeypatch.setattr(dae, "_code_usage", lambda out, data: {})
    monkeypatch.setattr(dae, "ptb_dir", lambda: tmp_path)
    return dae, common, argparse.Namespace(minutes=0.0, precision="fp32", threads=1, device="cpu")


def test_a_chained_row_runs_its_stages_from_nothing_and_records_every_stage(tmp_path, monkeypatch):
    """`--rows char-semhash-12ep-fixedpos-balance` on a fresh checkout (no checkpoints) trains the 3-, 6- and
    12-epoch stages in order, each from the previous one's checkpoint; the row's `runs` lists all three."""
    calls = []
    dae, common, args = _fake_dae(tmp_path, monkeypatch, calls)
    name = "char-semhash-12ep-fixedpos-balance"
    dae.merge_rows("dae", [dae.run_row(name, args)])
    stages = ["char-semhash-3ep-fixedpos-balance", "char-semhash-6ep-fixedpos-balance", name]
    assert calls == [(stages[0], 0, 3), (stages[1], 3, 6), (stages[2], 6, 12)]
    rows = {r["name"]: r for r in json.loads((tmp_path / "results" / "dae.json").read_text())["rows"]}
    assert [x["stage"] for x in rows[name]["runs"]] == stages and rows[name]["chain"] == stages[:2]
    assert [x.get("stage", stages[1]) for x in rows[stages[1]]["runs"]] == stages[:2]
    assert rows[name]["train_minutes"] == 12 and "stage_runs" not in rows[name]
    assert rows[name]["command"] == common.RUN["command"] and not rows[name]["resumed"]
    # run again: every stage is finished, nothing is trained, and no invocation is listed twice
    calls.clear()
    monkeypatch.setitem(common.RUN, "started", "later")
    dae.merge_rows("dae", [dae.run_row(name, args)])
    rows = {r["name"]: r for r in json.loads((tmp_path / "results" / "dae.json").read_text())["rows"]}
    assert calls == [(name, 12, 12)] and [x["stage"] for x in rows[name]["runs"]] == [*stages, name]


def test_a_gcide_word_row_trains_on_gcide_and_is_measured_against_its_own_baseline(tmp_path, monkeypatch):
    """The GCIDE chain reads the gcide corpus beside PTB, with PTB's vocabulary size, and takes p from the
    GCIDE baseline of the same epochs, not from a PTB row."""
    calls, corpora = [], []
    dae, common, args = _fake_dae(tmp_path, monkeypatch, calls)
    monkeypatch.setattr(dae, "ptb_dir", lambda: tmp_path / "ptb")
    train = dae.train_from_cli

    def train_noting_corpus(family, data, *rest, **kwargs):
        corpora.append(data)
        return train(family, data, *rest, **kwargs)

    monkeypatch.setattr(dae, "train_from_cli", train_noting_corpus)
    common.merge_rows("dae", [{"name": "word-baseline-6ep", "test_ppl": 50.0}])  # a PTB row that must not be used
    for name in ("gcide-word-baseline-6ep", "gcide-word-semhash-6ep"):
        dae.merge_rows("dae", [dae.run_row(name, args)])
    assert [c[0] for c in calls] == ["gcide-word-baseline-3ep", "gcide-word-baseline-6ep", "gcide-word-semhash-3ep",
                                     "gcide-word-semhash-6ep"]
    assert set(corpora) == {str(tmp_path / "gcide")}
    rows = {r["name"]: r for r in json.loads((tmp_path / "results" / "dae.json").read_text())["rows"]}
    row = rows["gcide-word-semhash-6ep"]
    assert row["baseline"] == "gcide-word-baseline-6ep" and row["p"] == rows["gcide-word-baseline-6ep"]["test_ppl"]
    assert "--max-vocab 10000" in row["recipe"] and row["chain"] == ["gcide-word-semhash-3ep"]


def test_a_resumed_row_lists_its_own_checkpoints_runs_not_an_older_rows_of_that_name(tmp_path, monkeypatch):
    """A stage stopped mid-way (no row written) and resumed later: its row lists the stopped invocation
    (ended None) and the one that finished it, never the runs of the table's older row of the same name,
    whose checkpoint was another training."""
    calls = []
    dae, common, args = _fake_dae(tmp_path, monkeypatch, calls)
    name = "char-baseline-3ep-fixedpos"
    common.merge_rows("dae", [{"name": name, "test_ppl": 9.0}])  # an older run's row, its checkpoint gone
    monkeypatch.setitem(common.RUN, "started", "stopped")
    out = dae.CHECKPOINTS / "dae" / name
    common.record_runs(out, [{**common.provenance(1), "ended": None}])  # as run_row leaves it when killed
    (out / "status.json").write_text(json.dumps({"epoch": 1, "history": [{"epoch_seconds": 60.0,
                                                                           "train_tokens": 1000}]}))
    monkeypatch.setitem(common.RUN, "started", "resumed")
    dae.merge_rows("dae", [dae.run_row(name, args)])
    row = {r["name"]: r for r in json.loads((tmp_path / "results" / "dae.json").read_text())["rows"]}[name]
    assert calls == [(name, 1, 3)] and row["resumed"]
    assert [(x["started"], x["ended"] is None) for x in row["runs"]] == [("stopped", True), ("resumed", False)]
    assert row["started"] == "stopped" and "earlier_runs" not in row
    assert [x["started"] for x in common.checkpoint_runs(out)] == ["stopped", "resumed"]


def test_recorded_training_lists_a_stopped_invocation_and_yields_the_earlier_ones(tmp_path, monkeypatch):
    """The helper every training bench wraps its training in: a killed block leaves its invocation listed
    with ended None; the next (resumed) one is given it; a fresh run starts the record again."""
    import common

    out = tmp_path / "ckpt"
    monkeypatch.setitem(common.RUN, "started", "first")
    with pytest.raises(KeyboardInterrupt), common.recorded_training(out, resumed=False) as earlier:
        assert earlier == [] and common.checkpoint_runs(out)[0]["ended"] is None
        raise KeyboardInterrupt
    monkeypatch.setitem(common.RUN, "started", "second")
    with common.recorded_training(out, resumed=True) as earlier:
        assert [(x["started"], x["ended"]) for x in earlier] == [("first", None)]
    assert [x["started"] for x in common.checkpoint_runs(out)] == ["first", "second"]
    assert common.checkpoint_runs(out)[1]["ended"] is not None
    assert common.with_earlier_runs({"name": "r"}, earlier)["earlier_runs"] == earlier
    assert common.with_earlier_runs({"name": "r"}, []) == {"name": "r"}
    with common.recorded_training(out, resumed=False) as earlier:  # a new run in the same folder: its own record
        assert earlier == []
    assert [x["started"] for x in common.checkpoint_runs(out)] == ["second"]


def test_a_rows_command_names_the_script_from_the_repository_root(tmp_path):
    """A benchmark started by its absolute path (from a worktree) records the command a checkout repeats."""
    import common

    assert common._command([str(common.ROOT / "bench" / "dae.py"), "--rows", "x"]) == "python bench/dae.py --rows x"
    assert common._command(["bench/dae.py", "--rows", "x"]) == "python bench/dae.py --rows x"
    assert common._command([str(tmp_path / "elsewhere.py")]) == f"python {tmp_path / 'elsewhere.py'}"


def test_a_row_name_used_twice_with_different_figures_is_caught(tmp_path):
    import render

    def write(name: str, rows: list[dict]) -> None:
        (tmp_path / f"{name}.json").write_text(json.dumps({"bench": name, "rows": rows}))

    write("a", [{"name": "gcide-kn5", "test_ppl": 237.14, "command": "x"}, {"name": "mirrored", "v": 1}])
    write("b", [{"name": "gcide-kn5", "test_ppl": 347.9, "command": "y"}, {"name": "mirrored", "v": 1,
                                                                            "command": "z"}])
    clashes = render.name_clashes(sorted(tmp_path.glob("*.json")))
    assert clashes == ["row gcide-kn5 in a.json and b.json with different figures; rename one"]
    assert render.name_clashes(sorted((ROOT / "bench" / "results").glob("*.json"))) == []  # the committed tables
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "render.py")], capture_output=True, text=True,
                       env={**os.environ, "SEQLM_BENCH_RESULTS": str(tmp_path)}, timeout=120)
    assert r.returncode != 0 and "gcide-kn5" in r.stderr and not (tmp_path.parent / "RESULTS.md").exists()


def test_a_training_rows_ceiling_ratio_is_not_shown_as_a_fraction_of_the_ceiling():
    """A training run's ratio (its mean speed over a ceiling sampled afterwards) gets its own label; speed rows,
    timed and measured in the same minute, give their median under fraction_of_ceiling."""
    import render

    doc = {"rows": [{"name": "transformer-ptb", "train_tokens_per_s": 3225.0, "fraction_of_ceiling": 0.673},
                    {"name": "transformer-speed", "train_tokens_per_s": [3893.4, 3875.8, 3829.9],
                     "fraction_of_ceiling": [0.303, 0.290, 0.474], "median_fraction_of_ceiling": 0.303}]}
    lines = render.table(doc).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in lines[2:4]}
    unpaired, paired = header.index("ceiling_fraction_unpaired"), header.index("fraction_of_ceiling")
    assert cells["transformer-ptb"][unpaired] == "0.673" and cells["transformer-ptb"][paired] == ""
    assert cells["transformer-speed"][paired] == "0.303 (median of 3)" and cells["transformer-speed"][unpaired] == ""
    assert "ceiling_fraction_unpaired`: a training run" in render.table(doc)


def test_sparse_bands_put_each_word_in_its_code_class_and_split_the_extra_loss_by_hand():
    import numpy as np

    from seqlm.nn.sparse_code import CodeBook
    from sparse_bands import bands, word_classes

    book = CodeBook(["the", "of"], {"the": [(0, 1.0)], "of": [(1, 1.0)], "cat": [(0, 0.5)],
                                    "dog": [(0, 0.2), (1, 0.3)]})
    assert word_classes(["</s>", "<unk>", "the", "of", "cat", "dog", "emu"], book) == [
        "</s>", "<unk>", "base 1-1000", "base 1-1000", "rare, 1 nonzero", "rare, 2+ nonzeros", "no code"]
    classes = np.asarray(["a", "b", "a"])
    logp_a, logp_e = np.log([0.5, 0.25, 0.5]), np.log([0.25, 0.25, 0.125])
    got = {b["class"]: b for b in bands(classes, logp_a, logp_e)}
    assert got["a"]["tokens"] == 2 and got["a"]["ppl_a"] == pytest.approx(2.0)
    assert got["a"]["ppl_e"] == pytest.approx((4 * 8) ** 0.5)  # exp of the mean of ln 4 and ln 8
    assert got["a"]["extra_nats"] == pytest.approx(np.log(2) + np.log(4))
    assert got["a"]["share_of_extra"] == pytest.approx(1.0) and got["b"]["share_of_extra"] == pytest.approx(0.0)
