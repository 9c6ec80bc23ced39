"""The `-ref` benchmark rows (the FOFE authors' recipe, and the RNN rows with rollback): their flags make
the configs they claim, and their checkpoints live outside the work tree while older rows' do not move."""

from __future__ import annotations

import sys

import pytest

from seqlm.config import DataConfig, apply_overrides, parse_overrides
from seqlm.registry import family

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import rnnlm_ptb  # noqa: E402

import fofe_ptb  # noqa: E402


def _config(args: list[str]):
    name, rest = (args[1], args[2:]) if args[:1] == ["--model"] else ("rnn", args)
    cfg = family(name).config()
    apply_overrides([cfg, DataConfig()], parse_overrides(rest))
    return name, cfg


@pytest.mark.parametrize("row", ["fnn-2-ref", "fnn-6-ref", "fofe-1-ref", "fofe-2-ref", "fofe-2-ref-mom"])
def test_fofe_table_ref_rows_train_the_authors_recipe(row):
    name, cfg = _config(fofe_ptb.ROWS[row])
    t = cfg.train
    assert (t.rollback, cfg.param_init, cfg.dropout, t.lr, t.batch_size * t.seq_len) == (True, "incml", 0.0, 0.4, 200)
    assert (cfg.embed, cfg.hidden, cfg.layers, t.min_improvement, t.halving_epochs) == (200, 400, 2, 1.0, 6)
    assert name != "fofe" or cfg.start_pad == "bos"
    assert (t.momentum, t.weight_decay) == ((0.9, 4e-5) if row.endswith("-mom") else (0.0, 0.0))
    assert fofe_ptb.PAPER_TEST_PPL[row] == fofe_ptb.PAPER_TEST_PPL[row.split("-ref")[0]]


def test_ref_rows_keep_checkpoints_outside_the_work_tree_and_older_rows_stay():
    for mod, row, old in ((fofe_ptb, "fofe-2-ref", "fofe-2"), (rnnlm_ptb, "rnn-bptt-ref", "rnn-bptt")):
        assert not mod.checkpoint_dir(row).is_relative_to(ROOT)
        assert mod.checkpoint_dir(old) == ROOT / "bench" / "checkpoints" / mod.__name__ / old
    assert rnnlm_ptb.MIXTURES["rnn400long-ref+kn5"] == ["rnn-bptt-h400-long-ref", "kn5"]
    for row in ("rnn-bptt-ref", "rnn-bptt-h400-long-ref"):
        _, cfg = _config(rnnlm_ptb.RNN_ROWS[row])
        _, old = _config(rnnlm_ptb.RNN_ROWS[row[:-4]])
        old.train.rollback = True
        assert cfg == old  # the existing row, rollback on
