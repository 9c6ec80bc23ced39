"""`seqlm train`: from a family name and a corpus to a model directory with its perplexities.

corpus -> vocabulary (train split only) -> memory-mapped ids -> family.train (the loop, or KN
estimation) -> the best checkpoint, evaluated on valid and test with the one protocol.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from seqlm import checkpoint as ckpt
from seqlm.config import DataConfig, apply_overrides, from_dict, load_yaml, parse_overrides, to_dict
from seqlm.data.corpus import build_vocab, encode_file
from seqlm.data.datasets import resolve_corpus, split_path
from seqlm.data.vocab import Vocab
from seqlm.errors import ERROR_DIR_ENV, SeqlmError
from seqlm.eval.perplexity import evaluate
from seqlm.registry import DEFAULT_FAMILY, CountFamily, Splits, family, new_model


def _configs(name: str, out: Path, config_file: str | None, rest: list[str], resume: bool):
    fam = family(name)
    if resume:
        if not (out / ckpt.CONFIG).exists():
            raise SeqlmError(f"{out}: nothing to resume (no model there yet); train without --resume")
        meta = ckpt.read_json(out / ckpt.CONFIG, "config.json")
        if meta.get("family") != name:
            raise SeqlmError(f"{out} holds a {meta.get('family')!r} model; resume it with --model {meta.get('family')}")
        cfg, data_cfg = from_dict(fam.config, meta["model"]), from_dict(DataConfig, meta.get("data", {}))
        if hasattr(cfg, "train"):  # --max-minutes bounds one invocation: a resumed run gets its own
            cfg.train.max_minutes = fam.config().train.max_minutes
    else:
        cfg, data_cfg = fam.config(), DataConfig()
    saved = _model_settings(cfg, data_cfg)
    overrides = load_yaml(config_file) if config_file else {}
    overrides.update(parse_overrides(rest))
    apply_overrides([cfg, data_cfg], overrides)
    if resume:
        _check_unchanged(out, saved, _model_settings(cfg, data_cfg))
    return cfg, data_cfg


def _model_settings(cfg, data_cfg: DataConfig) -> dict:
    """Every setting that defines the model and its vocabulary (training settings excluded)."""
    model = {k: v for k, v in to_dict(cfg).items() if k != "train"}
    return {**model, **to_dict(data_cfg)}


def _check_unchanged(out: Path, saved: dict, now: dict) -> None:
    """A resumed model keeps its architecture: a changed flag is a one-line error naming it."""
    for key, old in saved.items():
        if now[key] != old:
            flag = "--" + key.replace("_", "-")
            raise SeqlmError(f"{flag} cannot change on --resume: the model in {out} has {key} {old!r}; "
                             f"drop {flag}, or train a new model in another --out")


def _init_source(init_from: str | None, resume: bool):
    """The trained model whose weights start a new run (`--init-from`), read before any work."""
    if not init_from:
        return None
    if resume:
        raise SeqlmError("--init-from starts a new run from another model's weights; drop it with --resume")
    import seqlm

    src = seqlm.load(init_from)
    if not isinstance(src, torch.nn.Module) or not any(True for _ in src.parameters()):
        raise SeqlmError(f"--init-from {init_from}: not a neural model with weights to start from")
    return src


def _init_weights(model, src, init_from: str) -> None:
    """Copy every weight of `src` into the new model: same vocabulary, same parameter names and shapes
    (e.g. an `rnn` model into an `afp` one: the same network under another history rule)."""
    if src.vocab != model.vocab:
        raise SeqlmError(f"--init-from {init_from}: its vocabulary differs from this corpus's; train on the same "
                         "corpus (and --unit, --max-vocab, --min-count)")
    theirs, ours = src.state_dict(), model.state_dict()
    bad = sorted(k for k in ours.keys() | theirs.keys() if k not in ours or k not in theirs
                 or ours[k].shape != theirs[k].shape)
    if bad:
        raise SeqlmError(f"--init-from {init_from}: the networks differ ({', '.join(bad[:4])}"
                         f"{', ...' if len(bad) > 4 else ''}); give the same sizes")
    model.load_state_dict(theirs)


def train_from_cli(name: str | None, data: str, out: str | None, config_file: str | None, rest: list[str],
                   resume: bool = False, nproc: int = 1, session_minutes: float = 0.0,
                   init_from: str | None = None) -> dict:
    name = name or DEFAULT_FAMILY
    out_dir = Path(out or f"runs/{name}")
    if nproc < 1:
        raise SeqlmError(f"--nproc must be at least 1, got {nproc}")
    if out_dir.exists() and not out_dir.is_dir():
        raise SeqlmError(f"--out {out_dir} is a file; give a directory for the model")
    if not resume and (out_dir / ckpt.CONFIG).exists():
        raise SeqlmError(f"{out_dir} already holds a model; use --resume to continue it or choose another --out")
    cfg, data_cfg = _configs(name, out_dir, config_file, rest, resume)  # every flag checked before any work
    src = _init_source(init_from, resume)
    corpus = resolve_corpus(data)
    spawn = nproc > 1 and "WORLD_SIZE" not in os.environ
    if spawn:
        _check_parallel(name, nproc, cfg)
    if resume:
        vocab = Vocab.load(out_dir / ckpt.VOCAB)
    else:  # one streaming pass: counts and ids together (the ids land in the cache encode_file reads)
        vocab = build_vocab(split_path(corpus, "train"), data_cfg.raw, data_cfg.max_vocab, data_cfg.min_count,
                            data_cfg.unit)
    # Every split is read (and cached) now: a bad test file fails before training, not after it, and
    # `--nproc` workers find the vocabulary and the ids cached instead of each reading the corpus again.
    train, valid, _ = (encode_file(split_path(corpus, s), vocab, data_cfg.raw, unit=data_cfg.unit)
                       for s in ("train", "valid", "test"))
    if spawn:
        argv = ["train", "--model", name, "--data", data, "--out", str(out_dir), *rest]
        argv += (["--config", config_file] if config_file else []) + (["--resume"] if resume else [])
        argv += ["--init-from", init_from] if init_from else []
        return _spawn(nproc, argv, out_dir)
    splits = Splits(train, valid)
    model = new_model(name, cfg, vocab)  # seeded: the initial weights depend on --seed only
    if src is not None:
        _init_weights(model, src, init_from)
    model.data_config = data_cfg
    out_dir.mkdir(parents=True, exist_ok=True)
    main_rank = int(os.environ.get("RANK", "0")) == 0

    def save_best(m) -> None:
        import seqlm

        seqlm.save(m, out_dir, data_cfg)

    t0 = time.time()
    model = family(name).train(model, splits, out_dir, save_best, resume, session_minutes)
    seconds = time.time() - t0
    if not main_rank:
        return {}
    return _final_report(name, out_dir, corpus, data_cfg, seconds)


def _final_report(name: str, out_dir: Path, corpus: Path, data_cfg: DataConfig, seconds: float) -> dict:
    import seqlm

    best = seqlm.load(out_dir)  # the checkpoint on disk, exactly what users will load
    result = {"family": name, "out": str(out_dir), "train_seconds": round(seconds, 2)}
    for split in ("valid", "test"):
        r = evaluate(best, encode_file(split_path(corpus, split), best.vocab, data_cfg.raw, unit=data_cfg.unit))
        result[f"{split}_ppl"] = r["ppl"]
        result[f"{split}_tokens"] = r["tokens"]
    ckpt.write_json(out_dir / "results.json", result)
    return result


def _check_parallel(name: str, nproc: int, cfg) -> None:
    """Refuse --nproc where it cannot work, before any worker starts."""
    if isinstance(family(name), CountFamily):
        raise SeqlmError(f"--nproc: {name} is estimated in one process, not trained; drop --nproc")
    device = cfg.train.device
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        if nproc > torch.cuda.device_count():
            raise SeqlmError(f"--nproc {nproc}: only {torch.cuda.device_count()} GPU(s) here; use --nproc "
                             f"{torch.cuda.device_count()} or --device cpu")


def _spawn(nproc: int, argv: list[str], out_dir: Path) -> dict:
    """`seqlm train --nproc N ...`: the same command under torchrun, N workers on this machine.

    torchrun runs inside this process, so the launcher's own traceback and log lines do not bury what
    the workers say. A worker's user error (SeqlmError) goes to a file (see seqlm.cli.main) and is
    reported here once instead of once per rank. The workers' stdout (rank 0's result line) goes to
    torchrun's log files: this process prints the result.
    """
    import logging
    import shutil
    import tempfile

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args
    from torch.distributed.run import run as torchrun

    scratch = Path(tempfile.mkdtemp(prefix="seqlm-nproc-"))
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", ERROR_DIR_ENV)}
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would set, without its banner
    os.environ[ERROR_DIR_ENV] = str(scratch)
    args = parse_args(["--standalone", f"--nproc_per_node={nproc}", "--log-dir", str(scratch / "logs"),
                       "--redirects", "1", "-m", "seqlm", *argv])
    logging.disable(logging.ERROR)
    try:
        torchrun(args)
    except ChildFailedError as e:
        errors = sorted({p.read_text(encoding="utf-8").strip() for p in scratch.glob("rank*.err")})
        if errors:
            raise SeqlmError(" | ".join(errors)) from None
        codes = sorted({f.exitcode for f in e.failures.values()})
        raise SeqlmError(f"distributed training failed (worker exit status {codes}); see the messages above, "
                         "or run without --nproc to see the problem in one process") from None
    finally:
        logging.disable(logging.NOTSET)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(scratch, ignore_errors=True)
    return json.loads((out_dir / "results.json").read_text(encoding="utf-8"))
