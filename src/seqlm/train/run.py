"""`seqlm train`: from a family name and a corpus to a model directory with its perplexities.

corpus -> vocabulary (train split only) -> memory-mapped ids -> family.train (the loop, or KN
estimation) -> the best checkpoint, evaluated on valid and test with the one protocol.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from seqlm import checkpoint as ckpt
from seqlm.config import DataConfig, apply_overrides, from_dict, load_yaml, parse_overrides
from seqlm.data.corpus import count_words, encode_file
from seqlm.data.datasets import resolve_corpus, split_path
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.eval.perplexity import evaluate
from seqlm.registry import DEFAULT_FAMILY, Splits, family, new_model


def _configs(name: str, out: Path, config_file: str | None, rest: list[str], resume: bool):
    fam = family(name)
    if resume:
        meta = ckpt.read_json(out / ckpt.CONFIG, "config.json")
        if meta.get("family") != name:
            raise SeqlmError(f"{out} holds a {meta.get('family')!r} model; resume it with --model {meta.get('family')}")
        cfg, data_cfg = from_dict(fam.config, meta["model"]), from_dict(DataConfig, meta.get("data", {}))
    else:
        cfg, data_cfg = fam.config(), DataConfig()
    overrides = load_yaml(config_file) if config_file else {}
    overrides.update(parse_overrides(rest))
    apply_overrides([cfg, data_cfg], overrides)
    return cfg, data_cfg


def train_from_cli(name: str | None, data: str, out: str | None, config_file: str | None, rest: list[str],
                   resume: bool = False, nproc: int = 1, session_minutes: float = 0.0) -> dict:
    name = name or DEFAULT_FAMILY
    out_dir = Path(out or f"runs/{name}")
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        return _spawn(nproc)
    if not resume and (out_dir / ckpt.CONFIG).exists():
        raise SeqlmError(f"{out_dir} already holds a model; use --resume to continue it or choose another --out")
    cfg, data_cfg = _configs(name, out_dir, config_file, rest, resume)
    corpus = resolve_corpus(data)
    if resume:
        vocab = Vocab.load(out_dir / ckpt.VOCAB)
    else:
        counts = count_words(split_path(corpus, "train"), data_cfg.raw)
        vocab = Vocab.build(counts, data_cfg.max_vocab, data_cfg.min_count)
    splits = Splits(*(encode_file(split_path(corpus, s), vocab, data_cfg.raw) for s in ("train", "valid")))
    model = new_model(name, cfg, vocab)
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
        r = evaluate(best, encode_file(split_path(corpus, split), best.vocab, data_cfg.raw))
        result[f"{split}_ppl"] = r["ppl"]
        result[f"{split}_tokens"] = r["tokens"]
    ckpt.write_json(out_dir / "results.json", result)
    return result


def _spawn(nproc: int) -> dict:
    """`seqlm train --nproc N ...` re-launches itself under torchrun with N workers."""
    argv = [a for a in sys.argv[1:]]
    if "--nproc" in argv:
        i = argv.index("--nproc")
        del argv[i : i + 2]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "seqlm", *argv]
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        raise SeqlmError(f"distributed training failed (torchrun exit status {proc.returncode})")
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    return json.loads(Path(out, "results.json").read_text()) if out else {}
