"""`make run`: the demo a new user sees, in under ten minutes on a 2-core CPU.

Estimates a Kneser-Ney 5-gram and trains the default neural family on PTB (bounded by a time limit),
prints each one's valid and test perplexity and a few generated sentences. Run it again and it picks
up where it stopped (`--resume`): nothing already trained is thrown away.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import seqlm
from seqlm.errors import SeqlmError
from seqlm.registry import DEFAULT_FAMILY
from seqlm.train.run import train_from_cli

MINUTES = float(os.environ.get("SEQLM_DEMO_MINUTES", "6"))


def _train(family: str, out: Path, options: list[str]) -> dict:
    resume = (out / "resume").exists() or (out / "config.json").exists()
    if resume and not (out / "resume").exists():  # a count-based model: already estimated
        return json.loads((out / "results.json").read_text())
    return train_from_cli(family, "ptb", str(out), None, options, resume=resume)


def main() -> int:
    runs = Path("runs")
    try:
        print("== Kneser-Ney 5-gram (seqlm train --model kn --order 5)", flush=True)
        kn = _train("kn", runs / "demo-kn5", ["--order", "5"])
        print(f"   valid ppl {kn['valid_ppl']:.2f}   test ppl {kn['test_ppl']:.2f}", flush=True)
        print(f"== {DEFAULT_FAMILY} (seqlm train --model {DEFAULT_FAMILY} --max-minutes {MINUTES:g} "
              "--precision bf16)", flush=True)
        nn = _train(DEFAULT_FAMILY, runs / f"demo-{DEFAULT_FAMILY}",
                    ["--max-minutes", str(MINUTES), "--precision", "bf16"])
        print(f"   valid ppl {nn['valid_ppl']:.2f}   test ppl {nn['test_ppl']:.2f}   "
              f"({nn['train_seconds']:.0f} s of training; longer runs do better: see README)", flush=True)
        print(f"== sentences sampled from the {DEFAULT_FAMILY} model (seqlm generate)")
        for line in seqlm.generate(seqlm.load(runs / f"demo-{DEFAULT_FAMILY}"), num=5, seed=1, max_len=30):
            print("   " + line)
    except SeqlmError as e:
        print(f"seqlm: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
