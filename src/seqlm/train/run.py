"""`seqlm train`: from a family name and a corpus to a model directory with its perplexities.

corpus -> vocabulary (train split only) -> memory-mapped ids -> family.train (the loop, or KN
estimation) -> the best checkpoint, evaluated on whichever of valid and test there are, with the one
protocol. The corpus is a dataset, a directory, one file or standard input (KenLM's `lmplz -o 5 < text
> lm.arpa` is `seqlm train --model kn --order 5 --arpa - < text`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from seqlm import checkpoint as ckpt
from seqlm.config import (
    RENAMED,
    DataConfig,
    apply_overrides,
    field_help,
    flat_fields,
    from_dict,
    load_yaml,
    parse_overrides,
    to_dict,
)
from seqlm.data.corpus import build_vocab, encode_file, spool, stdin_is_input
from seqlm.data.datasets import corpus_splits
from seqlm.data.tokenizers import reading, token_hash
from seqlm.data.vocab import Vocab, read_word_list
from seqlm.errors import ERROR_DIR_ENV, SeqlmError
from seqlm.eval.perplexity import evaluate
from seqlm.models.kn import KNConfig
from seqlm.outputs import claim_output, clear_model
from seqlm.protocol import encode_text
from seqlm.registry import DEFAULT_FAMILY, CountFamily, NeuralFamily, Splits, family, new_model
from seqlm.train.loop import fit
from seqlm.train.resume import check_resumable, mark_untrained, run_status


def config_help(name: str | None) -> str:
    """Every `--key value` option of a family, with its default: the fields of its config dataclasses."""
    name = name or DEFAULT_FAMILY
    lines, keys = [], set()
    for cfg in (family(name).config(), DataConfig()):
        for key, (owner, _field) in flat_fields(cfg).items():
            doc = field_help(type(owner)).get(key, "")
            lines.append(f"  --{key.replace('_', '-'):<20} {getattr(owner, key)!r:<10} {doc}")
            keys.add(key)
    old = [f"--{o.replace('_', '-')} = --{n.replace('_', '-')}" for o, n in RENAMED.items()
           if n in keys and o not in keys]
    head = f"options of `seqlm train --model {name}`: --key value, the default, what it does"
    return "\n".join([head + (f" (old names, still accepted: {', '.join(old)})" if old else ""), *lines])


def _configs(name: str, out: Path, config_file: str | None, rest: list[str], resume: bool):
    fam = family(name)
    if resume:
        if not (out / ckpt.CONFIG).exists():
            raise SeqlmError(f"{out}: nothing to resume (no model there yet); train without --resume")
        meta = ckpt.read_json(out / ckpt.CONFIG, "config.json")
        if meta.get("family") != name:
            raise SeqlmError(f"{out} holds a {meta.get('family')!r} model; resume it with --model {meta.get('family')}")
        cfg, data_cfg = from_dict(fam.config, meta["model"]), from_dict(DataConfig, meta.get("data", {}))
        if data_cfg.unit == "token":  # the copy in the model directory, named relative to it
            data_cfg.tokenizer = str(out / data_cfg.tokenizer)
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
    """Every setting that defines the model and its vocabulary (training settings excluded); a tokenizer by its
    content (the model directory holds a copy of the file given)."""
    model = {k: v for k, v in to_dict(cfg).items() if k != "train"}
    return {**model, **to_dict(data_cfg), "tokenizer": token_hash(data_cfg)}


def _check_unchanged(out: Path, saved: dict, now: dict) -> None:
    """A resumed model keeps its architecture: a changed flag is a one-line error naming it."""
    for key, old in saved.items():
        if now[key] != old:
            flag = "--" + key.replace("_", "-")
            raise SeqlmError(f"{flag} cannot change on --resume: the model in {out} has {key} {old!r}; "
                             f"drop {flag}, or train a new model in another --out")


def _init_source(init_from: str | None, resume: bool, name: str):
    """The trained model whose weights start a new run (`--init-from`), read before any work."""
    if not init_from:
        return None
    if resume:
        raise SeqlmError("--init-from starts a new run from another model's weights; drop it with --resume")
    if not isinstance(family(name), NeuralFamily):
        raise SeqlmError(f"--init-from: a {name} model is estimated from counts, not trained from weights; drop it")
    import seqlm

    src = seqlm.load(init_from)
    if not isinstance(src, torch.nn.Module) or not any(True for _ in src.parameters()):
        raise SeqlmError(f"--init-from {init_from}: a {src.family} model has no network weights to start a "
                         f"{name} model from; give a trained {name} model directory (or rnn for afp)")
    return src


def _init_weights(model, src, init_from: str) -> None:
    """Copy every weight of `src` into the new model: same vocabulary, same parameter names and shapes
    (e.g. an `rnn` model into an `afp` one: the same network under another history rule)."""
    theirs, ours = src.state_dict(), model.state_dict()
    if theirs.keys() != ours.keys() and src.family != model.family:
        raise SeqlmError(f"--init-from {init_from}: a {src.family} model's weights cannot start a {model.family} "
                         f"model (different networks); give a {model.family} model directory (or rnn for afp)")
    if src.vocab != model.vocab:
        raise SeqlmError(f"--init-from {init_from}: its vocabulary differs from this corpus's; train on the same "
                         "corpus (and --unit, --max-vocab, --min-count)")
    bad = sorted(k for k in ours.keys() | theirs.keys() if k not in ours or k not in theirs
                 or ours[k].shape != theirs[k].shape)
    if bad:
        raise SeqlmError(f"--init-from {init_from}: the networks differ ({', '.join(bad[:4])}"
                         f"{', ...' if len(bad) > 4 else ''}); give the same sizes")
    model.load_state_dict(theirs)


def _texts(data: str | None, text: str | None, scratch: Path) -> dict[str, Path | None]:
    """The train (and, when there are, valid and test) texts: --data (a dataset, a corpus directory or one
    file), --text FILE (`-`: standard input), or standard input when it is a pipe or a file."""
    if data and text:
        raise SeqlmError("give either --data (a dataset, corpus directory or text file) or --text FILE, not both")
    if data:
        return corpus_splits(data)
    if text is None and not stdin_is_input():
        raise SeqlmError("no training text: give --data ptb (or a corpus directory, or a text file), --text FILE, "
                         "or the text on standard input (seqlm train --model kn --order 5 < text)")
    path = Path(text or "-")
    if str(path) == "-" or not path.is_file():  # standard input or a pipe: read once, so spooled to a file read twice
        path = spool(path, scratch / "train.txt")
    return {"train": path, "valid": None, "test": None}


def _check_exports(name: str, exports: dict[str, str | None], force: bool, resume: bool, out: str | None,
                   inputs: list[str | None]) -> None:
    """--arpa/--binary: kn only, at most one on standard output, no file overwritten without --force."""
    given = {k: v for k, v in exports.items() if v}
    if not given:
        return
    if not isinstance(family(name), CountFamily):
        raise SeqlmError(f"--{'/--'.join(given)} write an n-gram model: only --model kn has one (a {name} model is "
                         "saved in its --out directory)")
    if list(given.values()).count("-") > 1:
        raise SeqlmError("--arpa - and --binary - would both write to standard output; give one of them a file")
    if resume and not out:
        raise SeqlmError("--resume continues the model in --out: give --out")
    for kind, dest in given.items():
        claim_output(dest, force, f"--{kind}", inputs=inputs)


def _export(out_dir: Path, exports: dict[str, str | None]) -> None:
    """Copy the model directory's ARPA / binary to --arpa / --binary (`-`: standard output; `.gz`: compressed)."""
    import gzip
    import sys

    from seqlm.models.kn import ARPA, BINARY

    for kind, name in (("arpa", ARPA), ("binary", BINARY)):
        dest = exports.get(kind)
        if not dest:
            continue
        with open(out_dir / name, "rb") as src:
            if dest == "-":
                shutil.copyfileobj(src, sys.stdout.buffer)
                sys.stdout.buffer.flush()
                continue
            with ckpt.atomic_path(dest) as tmp, (gzip.open if dest.endswith(".gz") else open)(tmp, "wb") as f:
                shutil.copyfileobj(src, f, 1 << 20)


def train_from_cli(name: str | None, data: str | None, out: str | None, config_file: str | None, rest: list[str],
                   resume: bool = False, nproc: int = 1, session_minutes: float = 0.0,
                   init_from: str | None = None, text: str | None = None, arpa: str | None = None,
                   binary: str | None = None, force: bool = False, counts: str | None = None,
                   weighted: bool = False) -> dict:
    """Train `name` on --data / --text / standard input into --out; kn also to --arpa / --binary files, from
    --counts files, or from lines that start with weights. Without --out but with --arpa or --binary, the model
    directory is a temporary one."""
    name = name or DEFAULT_FAMILY
    exports = {"arpa": arpa, "binary": binary}
    _check_exports(name, exports, force, resume, out, [data, text, *(counts.split(",") if counts else [])])
    with tempfile.TemporaryDirectory(prefix="seqlm-train-") as scratch:
        out_dir = Path(out) if out else Path(scratch) / "model" if arpa or binary else Path(f"runs/{name}")
        if counts is not None:  # seqlm.ngram.from_counts: no text to read
            from seqlm.ngram.from_counts import train_counts

            refused = {"--data/--text (a text to count)": bool(data or text), "--resume": resume, "--nproc": nproc > 1,
                       "--init-from": bool(init_from), "--text-has-weights": weighted}
            result = train_counts(name, counts, out_dir, config_file, rest, force, refused)
        else:
            result = _train(name, data, text, out_dir, config_file, rest, resume, nproc, session_minutes, init_from,
                            Path(scratch), force, weighted)
        if result:
            _export(out_dir, exports)
            result.update({k: v for k, v in exports.items() if v})
            if not out and (arpa or binary):
                result["out"] = None  # the model directory was a temporary one
    return result


def _train(name: str, data: str | None, text: str | None, out_dir: Path, config_file: str | None, rest: list[str],
           resume: bool, nproc: int, session_minutes: float, init_from: str | None, scratch: Path,
           force: bool = False, weighted: bool = False) -> dict:
    if nproc < 1:
        raise SeqlmError(f"--nproc must be at least 1, got {nproc}")
    if out_dir.exists() and not out_dir.is_dir():
        raise SeqlmError(f"--out {out_dir} is a file; give a directory for the model")
    replace = _claim_out(out_dir, resume, force, init_from)
    cfg, data_cfg = _configs(name, out_dir, config_file, rest, resume)  # every flag checked before any work
    if data_cfg.arpa_encoding != "plain" and not isinstance(cfg, KNConfig):
        raise SeqlmError(f"--arpa-encoding {data_cfg.arpa_encoding} names the words of an ARPA file: --model kn only")
    if weighted and not isinstance(cfg, KNConfig):
        raise SeqlmError(f"--text-has-weights: weighted lines are counted by --model kn, not {name}; drop it")
    units = reading(data_cfg)  # a tokenizer is loaded (and checked) before any work too
    if resume and isinstance(family(name), NeuralFamily):  # kn re-estimates: the same text, the same model
        check_resumable(out_dir)
    src = _init_source(init_from, resume, name)
    texts = _texts(data, text, scratch)
    if texts["valid"] is None and not isinstance(family(name), CountFamily):
        raise SeqlmError(f"--model {name} needs held-out text (valid.txt) to schedule its learning rate and keep "
                         "its best epoch: give a corpus directory with train.txt and valid.txt (kn needs train "
                         "text only)")
    spawn = nproc > 1 and "WORLD_SIZE" not in os.environ
    if spawn:
        _check_parallel(name, nproc, cfg)
    cache = texts["train"].parent != scratch  # spooled standard input leaves nothing in the cache
    if weighted:  # lines that start with weights: vocabulary and ids of weighted counts (seqlm.ngram.weighted)
        from seqlm.ngram.weighted import read_weighted

        vocab, weighted_train = read_weighted(texts["train"], data_cfg, units, scratch)
    else:
        vocab = _vocabulary(texts["train"], data_cfg, cfg, out_dir if resume else None, cache, units)
    # Every split is read (and cached) now: a bad test file fails before training, not after it, and
    # `--nproc` workers find the vocabulary and the ids cached instead of each reading the corpus again.
    train, valid, _ = (encode_file(path, vocab, data_cfg.raw, unit=units, use_cache=cache)
                       if path and not (weighted and split == "train") else None for split, path in texts.items())
    train = weighted_train if weighted else train
    if replace:  # the old model goes only now, when the new one is about to be written
        clear_model(out_dir)
    if spawn:
        argv = ["train", "--model", name, "--data", str(data), "--out", str(out_dir), *rest]
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

    # The directory holds a model (its config, vocabulary and the initial weights) before the first batch:
    # a run stopped inside its first epoch leaves a mid-epoch state that --resume can read the settings for.
    # A --resume that finds the model but no state (stopped before any) starts it again from those settings,
    # if the weights are still marked as the initial ones: a trained model without its state is refused.
    # A run that fails before its first state (e.g. a precision this machine refuses) leaves the directory as
    # it found it, so that the same command can be given again.
    started = resume and run_status(out_dir)["started"]
    fresh = main_rank and not started and isinstance(family(name), NeuralFamily)
    if fresh and resume:  # started again (check_resumable): rows it logged before belong to no model now
        for stale in ("metrics.jsonl", "results.json"):
            (out_dir / stale).unlink(missing_ok=True)
    before = set(out_dir.iterdir())
    if fresh:
        save_best(model)
        mark_untrained(out_dir)  # until the first best model replaces them, --resume may start them again
    t0 = time.time()
    try:
        model = fit_family(family(name), model, splits, out_dir, save_best, started, session_minutes)
    except BaseException:
        if main_rank and not run_status(out_dir)["started"]:
            _remove_new(out_dir, before)
        raise
    seconds = time.time() - t0
    if not main_rank:
        return {}
    return _final_report(name, out_dir, texts, data_cfg, seconds)


def _vocabulary(train: Path, data: DataConfig, cfg, resumed: Path | None, cache: bool, units) -> Vocab:
    """The training vocabulary: a resumed model's own, else built from the text in one streaming pass (counts
    and ids together; the ids land in the cache encode_file reads) or fixed by --vocab. kn counts the words a
    --vocab file lacks and prunes them (lmplz --limit_vocab_file), so it re-reads the text on --resume too.
    --unk none closes the vocabulary (kn only: kn's loader alone reads the rule back from config.json)."""
    kn = isinstance(cfg, KNConfig)
    if data.unk == "none" and not kn:
        raise SeqlmError("--unk none (a closed vocabulary) is for kn models; other families score a word "
                         "outside their vocabulary as <unk> (--unk map)")
    outside = kn and data.unk == "map" and bool(data.vocab)  # under --unk none kn takes the file's words as given
    if resumed is not None and not outside:
        vocab = Vocab.load(resumed / ckpt.VOCAB)
    else:
        fixed = _fixed_words(data) if data.vocab else None
        vocab = build_vocab(train, data.raw, data.max_vocab, data.min_count, units, cache, fixed, outside)
    vocab.closed = data.unk == "none"
    return vocab


def _fixed_words(data: DataConfig) -> list[str]:
    """The --vocab file's words; under --unit char each must be one character."""
    words = read_word_list(data.vocab)
    long = [w for w in words if data.unit == "char" and len(w) != 1]
    if long:
        raise SeqlmError(f"--vocab {data.vocab}: a character model's vocabulary lists characters (one a line), "
                         f"got {long[0]!r}")
    return words


def fit_family(fam, model, splits: Splits, out_dir: Path, save, resume: bool, session_minutes: float):
    """A neural family through the one loop (its batches, its step); a count-based one is estimated."""
    if isinstance(fam, NeuralFamily):
        fit(model, fam.step, fam.batches(model.config, model.vocab), splits.train, splits.valid, model.config.train,
            out_dir, save, resume, session_minutes)
        return model
    return fam.train(model, splits, out_dir, save, resume, session_minutes)


def _claim_out(out_dir: Path, resume: bool, force: bool, init_from: str | None) -> bool:
    """--out: a directory without a model, or one --force replaces (True: clear it before writing); with
    --resume the model to continue. Rank 0 of a data-parallel run claims it for every rank."""
    if resume:
        if force:
            raise SeqlmError("--resume continues the model in --out and --force would replace it: give one of them")
        return False
    if int(os.environ.get("RANK", "0")) != 0:
        return False
    return claim_output(out_dir, force, "--out", directory=True, inputs=[init_from],
                        also="use --resume to continue it, ")


def _remove_new(out_dir: Path, before: set[Path]) -> None:
    """Remove what this invocation wrote into `out_dir` (files and folders that were not there before)."""
    for p in set(out_dir.iterdir()) - before:
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def _final_report(name: str, out_dir: Path, texts: dict[str, Path | None], data_cfg: DataConfig,
                  seconds: float) -> dict:
    """Perplexity of the saved model on the valid and test texts there are; `evaluated` names them."""
    import seqlm

    best = seqlm.load(out_dir)  # the checkpoint on disk, exactly what users will load
    result = {"family": name, "out": str(out_dir), "train_seconds": round(seconds, 2), "evaluated": []}
    for split in ("valid", "test"):
        if texts[split] is None:
            continue
        r = evaluate(best, encode_text(best, texts[split]))
        result[f"{split}_ppl"] = r["ppl"]
        result[f"{split}_tokens"] = r["tokens"]
        if data_cfg.unit == "token":  # the figure that compares units: per word of the text (and </s>)
            result[f"{split}_ppl_per_word"] = r["ppl_per_word"]
        result["evaluated"].append(split)
    if data_cfg.arpa_encoding != "plain":
        result.update(arpa_encoding=data_cfg.arpa_encoding, arpa_offset=data_cfg.arpa_offset)
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
