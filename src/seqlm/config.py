"""Configuration: dataclasses hold every default; YAML files and `--key value` flags override them.

A family's config dataclass (e.g. `FNNConfig`) holds its model hyperparameters and a nested
`train: TrainConfig` whose defaults are that family's paper settings. `DataConfig` says how text
becomes ids. All three are saved in `config.json` with every checkpoint.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from dataclasses import InitVar, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from seqlm.errors import SeqlmError


@dataclass
class TrainConfig:
    """The one training loop's settings (see seqlm.train.loop and seqlm.train.optim)."""

    optimizer: str = "sgd"  # sgd | adam | adamw
    lr: float = 0.1  # learning rate; the peak rate under warmup-cosine
    momentum: float = 0.0  # SGD momentum
    beta1: float = 0.9  # Adam/AdamW: decay of the gradient's running mean
    beta2: float = 0.999  # Adam/AdamW: decay of the squared gradient's running mean
    eps: float = 1e-8  # Adam/AdamW: added to the denominator
    weight_decay: float = 0.0  # L2 penalty (sgd, adam) or decoupled weight decay (adamw)
    schedule: str = "newbob"  # newbob: halve on stalled valid ppl, per epoch | warmup-cosine: per step
    warmup_steps: int = 0  # warmup-cosine: steps of linear warm-up from 0 to --lr
    min_lr: float = 0.0  # warmup-cosine: the rate reached at the last planned step (max_epochs x batches)
    batch_size: int = 1  # rows per batch
    seq_len: int = 200  # positions per row: packed tokens (FNN/FOFE) or steps per TBPTT chunk (RNN)
    max_epochs: int = 40  # stop after this many epochs even if the schedule has not ended
    min_improvement: float = 1.0  # newbob: keep the rate while valid ppl drops by at least this much ...
    halving_epochs: int = 6  # newbob: ... then halve it every epoch for this many more epochs, then stop
    rollback: bool = False  # newbob: undo that first stalled epoch (weights, optimizer, RNG) and rerun it halved
    clip: float = 0.0  # max gradient norm; 0 = off
    seed: int = 1  # initial weights, data order and dropout masks depend on it alone
    precision: str = "fp32"  # fp32 | bf16 (autocast; float32 master weights and loss)
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    # keep freed big blocks for the next step (glibc): faster where page faults are dear, a higher peak RSS
    keep_memory: bool = True
    max_minutes: float = 0.0  # this invocation stops (evaluates, saves, can --resume) after this long; 0 = no limit
    eval_tokens: int = 4096  # positions per evaluation batch
    # sentence | stream | auto: how each epoch's validation perplexity (schedule, best epoch) is measured;
    # auto = the mode the model trains in: stream for a model trained on a carried stream, else sentence
    valid_mode: str = "auto"
    max_nan_retries: int = 3  # non-finite loss: restore last good state, halve lr, retry
    bptt: InitVar[int | None] = None  # old name of seq_len, still accepted (config.json, --bptt, keyword)

    # Options that one optimiser or schedule alone reads: option -> (the choosing option, those that read
    # it). Given explicitly under another choice they would change nothing, so apply_overrides refuses them.
    USED_BY: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        "momentum": ("optimizer", ("sgd",)),
        "beta1": ("optimizer", ("adam", "adamw")),
        "beta2": ("optimizer", ("adam", "adamw")),
        "eps": ("optimizer", ("adam", "adamw")),
        "warmup_steps": ("schedule", ("warmup-cosine",)),
        "min_lr": ("schedule", ("warmup-cosine",)),
        "min_improvement": ("schedule", ("newbob",)),
        "halving_epochs": ("schedule", ("newbob",)),
    }
    # What a config.json written before a field existed trained with, where that differs from today's
    # default: a resumed old run goes on as it started (validated by sentence).
    OLD_FILES: ClassVar[dict[str, Any]] = {"valid_mode": "sentence"}

    def __post_init__(self, bptt: int | None = None) -> None:
        if bptt is not None:
            self.seq_len = bptt
        _choice("optimizer", self.optimizer, ("sgd", "adam", "adamw"))
        _choice("schedule", self.schedule, ("newbob", "warmup-cosine"))
        _choice("precision", self.precision, ("fp32", "bf16"))
        _choice("device", self.device, ("auto", "cpu", "cuda"))
        _choice("valid_mode", self.valid_mode, ("sentence", "stream", "auto"))
        _positive(self, "lr", "batch_size", "seq_len", "max_epochs", "eval_tokens", "eps")
        if self.rollback and self.schedule != "newbob":
            raise SeqlmError(f"--rollback needs --schedule newbob (an epoch is undone when validation stalls), "
                             f"got --schedule {self.schedule}")
        _non_negative(self, "momentum", "weight_decay", "clip", "threads", "max_minutes", "halving_epochs",
                      "max_nan_retries", "seed", "warmup_steps", "min_lr")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise SeqlmError(f"--{name} must be in [0, 1), got {getattr(self, name)}")


@dataclass
class DataConfig:
    """How text becomes token ids; the vocabulary comes from the training split only."""

    max_vocab: int | None = None  # None = keep every word seen min_count times
    min_count: int = 1  # words seen fewer times in the training text become <unk>
    raw: bool = False  # untokenised text: see seqlm.data.corpus.tokenize_raw
    # word | char: characters, with `_` between words (character-level PTB) | token: --tokenizer's pieces
    unit: str = "word"
    # --unit token: a sentencepiece .model or a Hugging Face tokenizer.json (or a directory holding one); copied
    # into the model directory
    tokenizer: str = ""
    # a fixed vocabulary: a file with one word (unit) a line, any count after a tab ignored (a model's vocab.txt
    # works); words outside it are <unk> (kn: counted, then pruned: lmplz --limit_vocab_file); "" = built from the text
    vocab: str = ""
    unk: str = "map"  # map: a word outside the vocabulary is <unk> | none: a closed vocabulary (kn), it is an error
    # kn --unit token: plain (the pieces as words) | nemo-offset: each piece as chr(tokenizer id + --arpa-offset),
    # the ARPA a NeMo / pyctcdecode token KenLM model holds
    arpa_encoding: str = "plain"
    arpa_offset: int = 100  # nemo-offset: added to the tokenizer's id (NeMo's DEFAULT_TOKEN_OFFSET)

    # Options one encoding alone reads (apply_overrides refuses them, given, under another).
    USED_BY: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {"arpa_offset": ("arpa_encoding", ("nemo-offset",))}

    def __post_init__(self) -> None:
        _choice("unit", self.unit, ("word", "char", "token"))
        _choice("unk", self.unk, ("map", "none"))
        _choice("arpa_encoding", self.arpa_encoding, ("plain", "nemo-offset"))
        self._check_tokens()
        if self.max_vocab is not None and self.max_vocab < 2:
            raise SeqlmError(f"--max-vocab must be at least 2 (</s> and <unk> are always in), got {self.max_vocab}")
        _positive(self, "min_count")
        if self.vocab and (self.max_vocab is not None or self.min_count != 1):
            raise SeqlmError("--vocab gives the vocabulary; --max-vocab and --min-count choose one from the training "
                             "text: give one or the other")

    def _check_tokens(self) -> None:
        """--tokenizer goes with --unit token (and back); NeMo's encoding is of a tokenizer's ids."""
        if (self.unit == "token") != bool(self.tokenizer):
            raise SeqlmError("--unit token reads text through --tokenizer MODEL: give both (--tokenizer is for "
                             f"--unit token only; here --unit {self.unit})")
        if self.unit == "token" and self.raw:
            raise SeqlmError("--raw splits text by seqlm's own rule; under --unit token the tokenizer reads each "
                             "line as it is: drop --raw")
        if self.arpa_encoding != "plain" and self.unit != "token":
            raise SeqlmError(f"--arpa-encoding {self.arpa_encoding} writes tokenizer ids: it needs --unit token "
                             "--tokenizer MODEL")
        _non_negative(self, "arpa_offset")


# Old key -> new key, for config.json files, flags and YAML written before a rename (one name per concept
# across families: seq_len, hidden, tie_embeddings).
RENAMED = {"bptt": "seq_len", "d_model": "hidden", "tied": "tie_embeddings"}


def _choice(name: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise SeqlmError(f"--{name.replace('_', '-')} must be one of {', '.join(options)}; got {value!r}")


def _positive(obj: Any, *names: str) -> None:
    for n in names:
        if getattr(obj, n) <= 0:
            raise SeqlmError(f"--{n.replace('_', '-')} must be positive, got {getattr(obj, n)}")


def _non_negative(obj: Any, *names: str) -> None:
    for n in names:
        if getattr(obj, n) < 0:
            raise SeqlmError(f"--{n.replace('_', '-')} must not be negative, got {getattr(obj, n)}")


def dropout_rate(value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise SeqlmError(f"--dropout must be in [0, 1), got {value}")


positive, non_negative, choice = _positive, _non_negative, _choice


def flat_fields(cfg: Any) -> dict[str, tuple[Any, dataclasses.Field]]:
    """Every settable key of a config, nested dataclasses flattened: name -> (owner object, field)."""
    out: dict[str, tuple[Any, dataclasses.Field]] = {}
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out.update(flat_fields(value))
        else:
            out[f.name] = (cfg, f)
    return out


def _convert(name: str, text: Any, typ: Any) -> Any:
    """Parse a flag value (or a YAML value) to the field's declared type."""
    if isinstance(typ, str):
        typ = {"int": int, "float": float, "str": str, "bool": bool}.get(typ.split(" ")[0], str)
    origin = typing.get_origin(typ)
    if origin in (types.UnionType, typing.Union):
        typ = next(a for a in typing.get_args(typ) if a is not type(None))
    try:
        if typ is bool:
            if isinstance(text, bool):
                return text
            if str(text).lower() in ("1", "true", "yes", "on"):
                return True
            if str(text).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if typ is int and isinstance(text, float) and not text.is_integer():
            raise ValueError
        return typ(text) if typ in (int, float, str) else text
    except (TypeError, ValueError):
        raise SeqlmError(f"--{name.replace('_', '-')} expects {getattr(typ, '__name__', typ)}, got {text!r}") from None


def apply_overrides(configs: list[Any], overrides: dict[str, Any]) -> None:
    """Set `key: value` pairs on whichever config owns the key; unknown keys are an error.

    A preset (a field its config lists in PRESETS, e.g. a Transformer's `size`) is applied before the other
    options, whatever their order: an option given with it wins over it. An option given explicitly that
    the chosen optimiser or schedule does not read (its config's USED_BY) is refused.
    """
    owners: dict[str, tuple[Any, dataclasses.Field]] = {}
    for cfg in configs:
        owners.update(flat_fields(cfg))
    given = {_owned_name(key, owners): value for key, value in overrides.items()}
    before = {name: getattr(owners[name][0], name) for name in given}
    for name in sorted(given, key=lambda n: n not in _presets(owners[n][0])):
        owner, f = owners[name]
        setattr(owner, name, _convert(name, given[name], f.type))
        _apply_preset(owner, name)
    for cfg in configs:
        _unlabel_presets(cfg)
    for name in given:
        _refuse_unread(owners[name][0], name, before[name])
    for cfg in configs:
        revalidate(cfg)


def _owned_name(key: str, owners: dict[str, Any]) -> str:
    name = key.lstrip("-").replace("-", "_")
    name = RENAMED.get(name, name) if name not in owners else name
    if name not in owners:
        known = ", ".join("--" + k.replace("_", "-") for k in sorted(owners))
        raise SeqlmError(f"unknown option --{key.lstrip('-')}; this model takes: {known}")
    return name


def _presets(cfg: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """A config's presets: field -> {preset name -> the values it gives other fields}."""
    return getattr(type(cfg), "PRESETS", {})


def _apply_preset(cfg: Any, name: str) -> None:
    table = _presets(cfg).get(name, {})
    for key, value in table.get(getattr(cfg, name), {}).items():
        setattr(cfg, key, value)


def _unlabel_presets(cfg: Any) -> None:
    """A preset's name stays only while its fields hold its values: an option that changed one leaves the
    name "" (config.json then holds the fields as they are, and no later validation re-applies the preset)."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            _unlabel_presets(value)
    for name, table in _presets(cfg).items():
        chosen = table.get(getattr(cfg, name))
        if chosen is not None and any(getattr(cfg, k) != v for k, v in chosen.items()):
            setattr(cfg, name, "")


def _refuse_unread(cfg: Any, name: str, before: Any) -> None:
    """Refuse an option set (to a new value) under an optimiser or schedule that does not read it."""
    rule = getattr(type(cfg), "USED_BY", {}).get(name)
    if rule is None or getattr(cfg, name) == before:
        return
    chooser, readers = rule
    if getattr(cfg, chooser) not in readers:
        flag, by = "--" + name.replace("_", "-"), "--" + chooser.replace("_", "-")
        read = "reads" if len(readers) == 1 else "read"
        raise SeqlmError(f"{flag} {getattr(cfg, name)} has no effect under {by} {getattr(cfg, chooser)} "
                         f"(only {' and '.join(readers)} {read} it); drop {flag} or give {by} {readers[0]}")


def revalidate(cfg: Any) -> None:
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            revalidate(value)
    if hasattr(cfg, "__post_init__"):
        cfg.__post_init__()


def parse_overrides(tokens: list[str]) -> dict[str, str]:
    """`--key value` pairs (and bare `--flag` meaning true) from the command line."""
    out: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--") or len(tok) == 2:
            raise SeqlmError(f"unexpected argument {tok!r}; options look like --key value")
        key, eq, val = tok[2:].partition("=")
        if eq:
            out[key] = val
            i += 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[key] = tokens[i + 1]
            i += 2
        else:
            out[key] = "true"
            i += 1
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise SeqlmError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise SeqlmError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SeqlmError(f"{path}: expected a mapping of option: value")
    flat: dict[str, Any] = {}
    for k, v in data.items():  # nested sections (train:, data:) are flattened: keys are unique
        if isinstance(v, dict):
            flat.update(v)
        else:
            flat[k] = v
    return flat


def field_help(cls: type) -> dict[str, str]:
    """Each field's one-line description, read from the dataclass source: the comment on the field's
    line, else the comment lines just above it. The comments are the one place options are explained."""
    names = {f.name for f in fields(cls)}
    out: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # no source (e.g. a frozen application): no descriptions
            continue
        comments: dict[int, tuple[str, bool]] = {}  # line -> (text, whether code precedes it)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = (tok.string.lstrip("#").strip(), bool(tok.line[: tok.start[1]].strip()))
        above: list[str] = []
        for i, line in enumerate(source.splitlines(), start=1):
            text, trailing = comments.get(i, ("", False))
            if text and not trailing:
                above.append(text)
                continue
            m = re.match(r"\s+(\w+)\s*:", line)
            if m and m.group(1) in names:
                out[m.group(1)] = text or " ".join(above)
            above = []
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild a (nested) config dataclass from its saved dict; unknown keys are an error."""
    if not isinstance(data, dict):
        raise SeqlmError(f"config for {cls.__name__} must be a JSON object")
    kwargs = {}
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    for k, v in data.items():
        k = RENAMED.get(k, k) if k not in names else k
        if k not in names:
            raise SeqlmError(f"config.json: unknown key {k!r} for {cls.__name__}; was it written by a newer seqlm?")
        t = hints[k]
        if dataclasses.is_dataclass(t):
            kwargs[k] = from_dict(t, v)
        elif _scalar(t):
            kwargs[k] = _saved_scalar(cls, k, v, t)
        else:
            kwargs[k] = tuple(v) if isinstance(v, list) else v
    for k, v in getattr(cls, "OLD_FILES", {}).items():  # a field added since the file was written
        kwargs.setdefault(k, v)
    return cls(**kwargs)


def _scalar(typ: Any) -> tuple[type, bool] | None:
    """(int|float|str|bool, whether None is allowed) for a scalar field type, else None."""
    args = typing.get_args(typ) if typing.get_origin(typ) in (types.UnionType, typing.Union) else (typ,)
    base = [a for a in args if a is not type(None)]
    if len(base) == 1 and base[0] in (int, float, str, bool):
        return base[0], type(None) in args
    return None


def _saved_scalar(cls: type, name: str, value: Any, typ: Any) -> Any:
    """A value from config.json, type-checked: a damaged or hand-edited file must fail with a message."""
    base, optional = _scalar(typ)
    if value is None and optional:
        return value
    if base is bool:
        ok = isinstance(value, bool)
    elif base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, base) and not isinstance(value, bool)
    if not ok:
        raise SeqlmError(f"config.json: {name} of {cls.__name__} must be {base.__name__}, got {value!r}; "
                         "restore the file or retrain")
    return value


__all__ = ["TrainConfig", "DataConfig", "apply_overrides", "parse_overrides", "load_yaml", "to_dict", "from_dict",
           "field"]
