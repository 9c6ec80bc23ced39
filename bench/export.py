"""Benchmark (#43 section 2): PTB test under onnxruntime of a model exported by `seqlm export --onnx`, against
seqlm's own scoring of the same model, on one thread.

    python bench/export.py [--rows export-lstm-ptb,export-transformer-ptb] [--train-minutes 4]
    python bench/export.py --rows export-lstm-ptb --model export-lstm-ptb=DIR     # another trained model

Models (bench/checkpoints/ROW): small models trained here by `seqlm train ... --max-minutes` when absent, not
tuned (their perplexity is in the row: these rows check agreement and measure speed, not quality): a 2 x 200
LSTM, and a 2-layer Transformer (d 128, 4 heads, filter 512) with a 64-token context, so PTB test's few
sentences of more than 63 words are read in sliding windows. Each is exported to bench/checkpoints/ROW.onnx.

Scoring, each sentence from a fresh start (seqlm eval's default), the whole test split, after a short warm-up:
seqlm is `seqlm.eval.perplexity.evaluate` (what `seqlm eval` runs: sentences grouped by length, up to 4096
tokens a batch); onnxruntime is `seqlm.export.runtime.OnnxLM.score` (sentences sorted by length, up to 4096
padded tokens a call, the file's windows for the long ones), one intra-op thread, the CPU provider. Fields:
test_ppl_seqlm, test_ppl_onnx, max_abs_diff (ln p of a token, largest over the split), agree_1e-4 (both the
largest ln p difference and the relative perplexity difference under 1e-4), tokens_per_s_seqlm,
tokens_per_s_onnx (one timed pass each), onnx_over_seqlm (their ratio), load_avg_1min (before and after the
timed passes: the machine is shared), onnx_bytes, export_seconds, versions.
Writes bench/results/export.json.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from common import CHECKPOINTS, ROOT, merge_rows, ptb_dir

NAME = "export"
RECIPES = {  # row -> seqlm train options (PTB)
    "export-lstm-ptb": ["--model", "lstm", "--hidden", "200", "--layers", "2"],
    "export-transformer-ptb": ["--model", "transformer", "--layers", "2", "--hidden", "128", "--heads", "4",
                               "--d-ff", "512", "--context", "64", "--precision", "fp32"],
}
BATCH_TOKENS = 4096


def train(row: str, minutes: float, threads: int) -> tuple[Path, dict]:
    """The row's model directory, trained by the seqlm CLI when absent, and what the row says of it."""
    out = CHECKPOINTS / row
    if not (out / "results.json").exists():
        env = {**os.environ, "SEQLM_DATA": str(ptb_dir().parent)}
        subprocess.run([sys.executable, "-m", "seqlm", "train", *RECIPES[row], "--data", "ptb", "--out", str(out),
                        "--force", "--max-minutes", str(minutes), "--threads", str(threads)],
                       check=True, env=env, cwd=ROOT)
    results = json.loads((out / "results.json").read_text())
    return out, {"model_dir": str(out.relative_to(ROOT)), "train_options": RECIPES[row],
                 "train_max_minutes": minutes, "train_results": results}


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def run_row(row: str, model_dir: Path, record: dict) -> dict:
    import seqlm
    from seqlm.data.corpus import encode_file
    from seqlm.eval.perplexity import evaluate, score_tokens
    from seqlm.export.onnx import export_onnx
    from seqlm.export.runtime import OnnxLM

    onnx = CHECKPOINTS / f"{row}.onnx"
    summary, export_s = timed(lambda: export_onnx(model_dir, onnx, force=True))
    model = seqlm.load(model_dir)
    stream = encode_file(ptb_dir() / "test.txt", model.vocab)
    lm = OnnxLM(onnx, threads=1)
    warm = _first(stream, 20)
    score_tokens(model, warm), lm.score(warm, BATCH_TOKENS)  # warm-up, untimed
    ours = score_tokens(model, stream).logp  # (N,) the reference ln p
    load = [os.getloadavg()[0]]  # the machine is shared: the 1-minute load average around the timed passes
    result, seqlm_s = timed(lambda: evaluate(model, stream, max_tokens=BATCH_TOKENS))
    theirs, onnx_s = timed(lambda: lm.score(stream, BATCH_TOKENS))
    load.append(os.getloadavg()[0])
    ppl_onnx, n = math.exp(-theirs.sum() / len(theirs)), len(theirs)
    diff, rel = float(np.abs(ours - theirs).max()), abs(ppl_onnx / result["ppl"] - 1)
    return {"name": row, **record, "sentences": stream.num_sentences, "tokens": n, "test_ppl_seqlm": result["ppl"],
            "test_ppl_onnx": ppl_onnx, "max_abs_diff": diff, "ppl_rel_diff": rel,
            "agree_1e-4": diff < 1e-4 and rel < 1e-4,
            "tokens_per_s_seqlm": n / seqlm_s, "tokens_per_s_onnx": n / onnx_s, "onnx_over_seqlm": seqlm_s / onnx_s,
            "onnx_bytes": summary["bytes"], "export_seconds": export_s, "export_check": summary["check"],
            "signature": {"inputs": summary["inputs"], "outputs": summary["outputs"]}, "threads": 1,
            "load_avg_1min": load,
            "versions": {p: importlib.metadata.version(p) for p in ("onnx", "onnxscript", "onnxruntime")}}


def _first(stream, n: int):
    from seqlm.data.corpus import TokenStream

    end = int(stream.starts[n])
    return TokenStream(stream.ids[:end], stream.starts[: n + 1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(RECIPES), help="comma-separated row names")
    p.add_argument("--train-minutes", type=float, default=4.0, help="--max-minutes of a row's training")
    p.add_argument("--train-threads", type=int, default=2, help="threads of a row's training (scoring uses 1)")
    p.add_argument("--model", action="append", default=[], help="ROW=DIR: a trained model instead of the recipe")
    args = p.parse_args()
    models = {k: Path(v) for k, v in (m.split("=", 1) for m in args.model)}
    for row in args.rows.split(","):
        if row in models:
            model_dir, record = models[row], {"model_dir": str(models[row])}
        else:
            model_dir, record = train(row, args.train_minutes, args.train_threads)
        torch.set_num_threads(1)  # scoring: one thread for both
        out = run_row(row, model_dir, record)
        print(json.dumps({k: v for k, v in out.items() if k != "train_results"}), flush=True)
        merge_rows(NAME, [out], {"recipe": "seqlm export --onnx; PTB test, sentence mode, seqlm evaluate against "
                                           "onnxruntime (seqlm.export.runtime.OnnxLM), one thread each"})


if __name__ == "__main__":
    main()
