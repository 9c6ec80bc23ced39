"""`make run`: the demo a new user sees, in under ten minutes on a 2-core CPU.

Estimates a Kneser-Ney 5-gram and trains the default neural family on PTB (bounded by a time limit),
prints each one's valid and test perplexity and a few generated sentences. The models land in
runs/demo-kn5 and runs/demo-FAMILY. Run it again and it shows the same results in seconds: a model
whose run finished (results.json) is not trained again; one interrupted before the end (Ctrl-C) picks up
where it stopped (`--resume`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import seqlm
from seqlm.errors import SeqlmError
from seqlm.registry import DEFAULT_FAMILY
from seqlm.train.precision import PrecisionUnsupported
from seqlm.train.resume import RESUME
from seqlm.train.run import train_from_cli

MINUTES = float(os.environ.get("SEQLM_DEMO_MINUTES", "6"))
DATA = "ptb"  # the demo's corpus, named: `seqlm train` has no default one


def _train(family: str, out: Path, options: list[str]) -> dict:
    """The model's results: read back when a previous run finished, else trained (or resumed) now."""
    if (out / "results.json").exists():
        print(f"   already trained in {out} (its results.json); not trained again", flush=True)
        return json.loads((out / "results.json").read_text())
    resume = (out / RESUME).exists()  # an earlier run stopped before its end (e.g. Ctrl-C)
    return train_from_cli(family, DATA, str(out), None, options, resume=resume)


def _train_neural(out: Path) -> dict:
    """The neural model in bf16 where this CPU runs it (faster), else in fp32."""
    for precision in ("bf16", "fp32"):
        print(f"== {DEFAULT_FAMILY} (seqlm train --model {DEFAULT_FAMILY} --data {DATA} --max-minutes {MINUTES:g} "
              f"--precision {precision})", flush=True)
        try:
            return _train(DEFAULT_FAMILY, out, ["--max-minutes", str(MINUTES), "--precision", precision])
        except PrecisionUnsupported as e:
            print(f"   {str(e).split(';')[0]}: training in fp32 instead", flush=True)
    raise AssertionError("unreachable: fp32 is always supported")


def main(runs: Path = Path("runs")) -> int:
    nn_dir = runs / f"demo-{DEFAULT_FAMILY}"
    try:
        print(f"== Kneser-Ney 5-gram (seqlm train --model kn --order 5 --data {DATA})", flush=True)
        kn = _train("kn", runs / "demo-kn5", ["--order", "5"])
        print(f"   valid ppl {kn['valid_ppl']:.2f}   test ppl {kn['test_ppl']:.2f}", flush=True)
        nn = _train_neural(nn_dir)
        print(f"   valid ppl {nn['valid_ppl']:.2f}   test ppl {nn['test_ppl']:.2f}   "
              f"({nn['train_seconds']:.0f} s of training; longer runs do better: see README)", flush=True)
        print(f"== sentences sampled from the {DEFAULT_FAMILY} model (seqlm generate {nn_dir} --seed 1)")
        for line in seqlm.generate(seqlm.load(nn_dir), num=5, seed=1, max_len=30):
            print("   " + line)
    except SeqlmError as e:
        print(f"seqlm: error: {e}", file=sys.stderr)
        return 2
    print(f"== the models are in {runs / 'demo-kn5'} and {nn_dir} (any seqlm command takes them). Train the "
          f"{DEFAULT_FAMILY} one further: seqlm train --model {DEFAULT_FAMILY} --data {DATA} --out {nn_dir} --resume "
          f"--max-minutes {MINUTES:g}; start the demo afresh: rm -r {runs}/demo-*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
