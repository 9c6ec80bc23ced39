"""`--help-config`: every option with its default and the one-line description written next to the field
in its config dataclass (seqlm.config.field_help reads the source: one place explains each option)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pytest

from seqlm.cli import main
from seqlm.config import DataConfig, TrainConfig, field_help, flat_fields
from seqlm.registry import FAMILIES


@dataclass
class _Example:
    plain: int = 1  # on the field's line
    # above the field,
    # over two lines
    above: str = "#not a comment"
    bare: float = 0.5
    nested: TrainConfig = field(default_factory=TrainConfig)  # the training settings


def test_field_help_reads_comments_on_and_above_each_field():
    assert field_help(_Example) == {"plain": "on the field's line", "above": "above the field, over two lines",
                                    "bare": "", "nested": "the training settings"}


def test_every_training_and_rnn_option_is_described():
    for cls in (TrainConfig, DataConfig, FAMILIES["rnn"].config):
        described = field_help(cls)
        missing = [f.name for f in fields(cls) if f.name != "train" and not described.get(f.name)]
        assert not missing, f"{cls.__name__}: no comment for {missing}"


@pytest.mark.parametrize("name", list(FAMILIES))
def test_help_config_describes_every_option_of_every_family(name, capsys):
    """Every registered family, every field of every config it holds (nested ones included): a description."""
    assert main(["train", "--model", name, "--help-config"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    described = {line.split()[0]: line.split(None, 2)[2:] for line in lines}
    cfg = FAMILIES[name].config()
    want = {"--" + k.replace("_", "-") for k in [*flat_fields(cfg), *flat_fields(DataConfig())]}
    assert set(described) == want
    assert not [k for k, rest in described.items() if not rest], f"{name}: options without a description"


def test_help_config_explains_tau_seq_len_and_sentence_independent(capsys):
    assert main(["train", "--model", "rnn", "--help-config"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "flows back through tau steps" in lines["--tau"] and " 5 " in lines["--tau"]
    assert "TBPTT chunk" in lines["--seq-len"] and " 20 " in lines["--seq-len"]
    assert "restart the state at every sentence" in lines["--sentence-independent"]
    rnn = FAMILIES["rnn"].config()
    assert set(lines) == {"--" + k.replace("_", "-") for k in [*flat_fields(rnn), *flat_fields(DataConfig())]}


def test_old_bptt_name_still_reads():
    from seqlm.config import apply_overrides, from_dict

    cfg = TrainConfig()
    apply_overrides([cfg], {"bptt": "33"})
    assert cfg.seq_len == 33 and TrainConfig(bptt=7).seq_len == 7
    assert from_dict(TrainConfig, {"bptt": 12, "lr": 0.5}).seq_len == 12  # a config.json from before the rename
