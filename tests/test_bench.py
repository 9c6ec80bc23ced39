"""The benchmark helpers that every table relies on: FLOP counts and merging rows into one JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

from fofe_ptb import ROWS, flops_per_token  # noqa: E402

WRITER = """
import sys
sys.path.insert(0, {bench!r})
from common import merge_rows
for i in range(15):
    merge_rows("table", [{{"name": f"{{sys.argv[1]}}-{{i}}", "value": i}}])
"""


def test_paper_row_costs_26_mflop_per_token_and_fofe_costs_what_fnn_costs():
    fofe2, shapes = flops_per_token(ROWS["fofe-2"])
    assert abs(fofe2 - 25.92e6) < 1e3  # the "about 26 MFLOP per training token"
    assert fofe2 == flops_per_token(ROWS["fnn-3"])[0]  # [z_t; z_t-1] is as wide as two embeddings
    assert flops_per_token(ROWS["fofe-1"])[0] == flops_per_token(ROWS["fnn-2"])[0]
    assert (200, 400, 10000) in shapes  # the softmax matmul is among the shapes timed for the ceiling


def test_rows_written_by_two_processes_at_once_all_land(tmp_path):
    env = {**os.environ, "SEQLM_BENCH_RESULTS": str(tmp_path)}
    code = WRITER.format(bench=str(ROOT / "bench"))
    procs = [subprocess.Popen([sys.executable, "-c", code, tag], env=env) for tag in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
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
