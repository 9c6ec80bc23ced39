"""Discrete autoencoders on PTB and GCIDE (discrete-autoencoders.txt, Tables 1-2; issues 12, 44): DSAE of
improved semantic hashing (global and local c(s)) and Gumbel-softmax against an equal-capacity baseline, the
noise ablation, and the diversity of sampled-c(s) + beam decoding against plain sampling.

    python bench/dae.py --rows char-baseline,char-semhash,char-gumbel --threads 1
    python bench/dae.py --rows diversity --threads 1        # after char-baseline and char-semhash
    python bench/dae.py --rows synthetic-baseline,synthetic-semhash --threads 1   # the mechanism, ~4 minutes
    python bench/dae.py --rows code-usage --threads 1       # distinct symbols / constant bits of the trained codes
    python bench/dae.py --rows noise-0-3ep-fixedpos-balance,noise-1.5-3ep-fixedpos-balance --threads 1
    python bench/dae.py --rows word-baseline-20ep,word-semhash-20ep --threads 1   # ~2 hours: 10 epochs, then 20
    python bench/dae.py --rows word-baseline-30ep --threads 1 &   # ~2 hours each, side by side: 10, 20, then 30
    python bench/dae.py --rows word-semhash-30ep --threads 1
    python bench/dae.py --rows char-baseline-24ep-fixedpos --threads 1 &   # ~2.5 hours each: 3, 6, 12, then 24
    python bench/dae.py --rows char-semhash-24ep-fixedpos-balance --threads 1
    python bench/dae.py --rows gcide-word-baseline-9ep --threads 1 &   # ~1.5 hours each, side by side: 3, 6, 9
    python bench/dae.py --rows gcide-word-semhash-9ep --threads 1
    python bench/dae.py --rows dsae-check-gcide-word-9ep --threads 1   # after both: `seqlm dsae`, <unk> left out

Shortened recipe (this CPU, one thread): a small Transformer (2 x 128, filter 512), K = 8, b = 16, every row
trained for the same number of minutes (COMMON's --max-minutes) at a constant rate after a short warm-up,
not to convergence. The baseline is the same network with `--peek false` (c(s) masked out): equal capacity,
as in the paper. DSAE = (log2 p - log2 p') / (b / K) with p, p' the test perplexities per token.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import shutil
import sys
from collections import Counter
from pathlib import Path

import torch

from seqlm.eval.dsae import dsae_report
from seqlm.train.loop import run_status
from seqlm.train.run import train_from_cli

from common import (
    CHECKPOINTS,
    RESULTS,
    RUNS_FILE,
    merge_rows,
    ptb_dir,
    recorded_training,
    row_parser,
    with_earlier_runs,
)

COMMON = ["--layers", "2", "--d-model", "128", "--heads", "4", "--d-ff", "512", "--filter-size", "512",
          "--k", "3", "--bits", "16", "--pretrain-steps", "40", "--optimizer", "adamw", "--schedule",
          "warmup-cosine", "--warmup-steps", "50", "--lr", "0.001", "--min-lr", "0.001", "--max-epochs", "1",
          "--max-minutes", "3.5"]
ROWS = {
    "char-baseline": ["--unit", "char", "--peek", "false"],
    "char-semhash": ["--unit", "char"],
    "char-semhash-local": ["--unit", "char", "--local", "true"],
    "char-gumbel": ["--unit", "char", "--bottleneck", "gumbel"],
    "word-baseline": ["--peek", "false"],
    "word-semhash": [],
    "word-gumbel": ["--bottleneck", "gumbel"],
    "noise-0": ["--unit", "char", "--noise-std", "0"],
    "noise-0.5": ["--unit", "char", "--noise-std", "0.5"],
    "noise-1.0": ["--unit", "char", "--noise-std", "1.0"],  # = char-semhash's settings, its own run
    "noise-1.5": ["--unit", "char", "--noise-std", "1.5"],
    # the character pair again with 15 minutes each instead of 3.5: does the code start to pay with time?
    "char-baseline-15m": ["--unit", "char", "--peek", "false", "--max-minutes", "15"],
    "char-semhash-15m": ["--unit", "char", "--max-minutes", "15"],
    # the same with a longer side path before the bottleneck (the paper pre-trains 10,000 steps; an epoch is ~1,250)
    "char-semhash-15m-pre600": ["--unit", "char", "--max-minutes", "15", "--pretrain-steps", "600"],
    "char-semhash-15m-pre1200": ["--unit", "char", "--max-minutes", "15", "--pretrain-steps", "1200"],
    # s at the same positions whatever the length of c(s) (`--code-positions fixed`), baseline and DAE alike
    "char-baseline-15m-fixedpos": ["--unit", "char", "--peek", "false", "--max-minutes", "15", "--code-positions",
                                   "fixed"],
    "char-semhash-15m-fixedpos": ["--unit", "char", "--max-minutes", "15", "--code-positions", "fixed"],
    # the same pair over 3 epochs
    "char-baseline-3ep-fixedpos": ["--unit", "char", "--peek", "false", "--max-epochs", "3", "--max-minutes", "25",
                                   "--code-positions", "fixed"],
    "char-semhash-3ep-fixedpos": ["--unit", "char", "--max-epochs", "3", "--max-minutes", "25", "--code-positions",
                                  "fixed"],
    # the code collapses in the rows above (see `code-usage`): batch-normalised bits (`--balance-bits`), with the
    # default 40 and with 600 side-path steps
    "char-semhash-15m-fixedpos-balance": ["--unit", "char", "--max-minutes", "15", "--code-positions", "fixed",
                                          "--balance-bits", "true"],
    "char-semhash-15m-fixedpos-pre600-balance": ["--unit", "char", "--max-minutes", "15", "--code-positions",
                                                 "fixed", "--balance-bits", "true", "--pretrain-steps", "600"],
    "char-semhash-3ep-fixedpos-balance": ["--unit", "char", "--max-epochs", "3", "--max-minutes", "25",
                                          "--code-positions", "fixed", "--balance-bits", "true"],
    "word-semhash-balance": ["--balance-bits", "true"],
}
# word level over 10 epochs, plain and balanced bits (one epoch each: +3.7% / -6.9%)
WORD_10EP = ["--max-epochs", "10", "--max-minutes", "40"]
ROWS |= {"word-baseline-10ep": ["--peek", "false", *WORD_10EP], "word-semhash-10ep": WORD_10EP,
         "word-semhash-10ep-balance": ["--balance-bits", "true", *WORD_10EP]}
# GCIDE at word level (issue 44 item 1: "on PTB and on GCIDE"): the same network and recipe on 3.8 times PTB's
# training text. The vocabulary is cut to PTB's size (the 10,000 most frequent training words, the rest <unk>):
# min-count 2 keeps 61k words, an output layer six times larger, and that layer is most of a step at this size
GCIDE_WORD = ["--max-vocab", "10000", "--max-epochs", "3", "--max-minutes", "40"]
ROWS |= {"gcide-word-baseline-3ep": ["--peek", "false", *GCIDE_WORD], "gcide-word-semhash-3ep": GCIDE_WORD}
# the noise ablation again where the code no longer collapses: char-semhash-3ep-fixedpos-balance (std 1.0) at
# std 0 / 0.5 / 1.5, each against char-baseline-3ep-fixedpos
for _std in ("0", "0.5", "1.5"):
    ROWS[f"noise-{_std}-3ep-fixedpos-balance"] = [*ROWS["char-semhash-3ep-fixedpos-balance"], "--noise-std", _std]
# the 3-epoch pair continued to 6, then 12 epochs from its checkpoints (the rate is constant, so each is one
# longer run); row -> (the row whose run it continues, epochs, minutes allowed per call). Running a continued
# row runs the stages before it that have no finished checkpoint here (a fresh checkout: all of them), and
# its `runs` lists every stage's invocations, each marked with its `stage`.
CONTINUED = {"char-baseline-6ep-fixedpos": ("char-baseline-3ep-fixedpos", 6, 25),
             "char-semhash-6ep-fixedpos-balance": ("char-semhash-3ep-fixedpos-balance", 6, 25),
             "char-baseline-12ep-fixedpos": ("char-baseline-6ep-fixedpos", 12, 45),
             "char-semhash-12ep-fixedpos-balance": ("char-semhash-6ep-fixedpos-balance", 12, 45),
             # word level, still climbing at 10 epochs (issue 44 item 1): the 10-epoch pair continued to 20
             "word-baseline-20ep": ("word-baseline-10ep", 20, 60),
             "word-semhash-20ep": ("word-semhash-10ep", 20, 60),
             # and still climbing at 20 (31.7%): both continued to 30
             "word-baseline-30ep": ("word-baseline-20ep", 30, 60),
             "word-semhash-30ep": ("word-semhash-20ep", 30, 60),
             # char level at 43.8% after 12 epochs (+7 to +10 points a doubling), the goal 50%: on to 24
             "char-baseline-24ep-fixedpos": ("char-baseline-12ep-fixedpos", 24, 90),
             "char-semhash-24ep-fixedpos-balance": ("char-semhash-12ep-fixedpos-balance", 24, 90),
             "gcide-word-baseline-6ep": ("gcide-word-baseline-3ep", 6, 40),
             "gcide-word-semhash-6ep": ("gcide-word-semhash-3ep", 6, 40),
             "gcide-word-baseline-9ep": ("gcide-word-baseline-6ep", 9, 40),
             "gcide-word-semhash-9ep": ("gcide-word-semhash-6ep", 9, 40)}
for _name, (_src, _epochs, _minutes) in CONTINUED.items():
    ROWS[_name] = [*ROWS[_src], "--max-epochs", str(_epochs), "--max-minutes", str(_minutes)]


# A check of the mechanism at a size this CPU trains in a minute: sentences of 7 random letters from
# {a, b, c, d} (2 bits a letter: nothing to learn but the code), K = 8, b = 16 (2 bits a token of capacity).
SYNTHETIC = ["--layers", "1", "--d-model", "64", "--heads", "2", "--d-ff", "128", "--filter-size", "256",
             "--k", "3", "--bits", "16", "--pretrain-steps", "400", "--dropout", "0", "--latent-share", "0.1",
             "--batch-size", "16", "--seq-len", "64", "--optimizer", "adamw", "--schedule", "warmup-cosine",
             "--warmup-steps", "20", "--lr", "0.001", "--min-lr", "0.001", "--max-epochs", "50"]  # 31 steps an epoch
ROWS["synthetic-baseline"] = ["--peek", "false"]
ROWS["synthetic-semhash"] = []
# the same task with the character rows' network (2 x 128, filter 512): is the decoder what limits the code?
BIG = ["--layers", "2", "--d-model", "128", "--d-ff", "512", "--filter-size", "512"]
ROWS["synthetic-baseline-big"] = ["--peek", "false", *BIG]
ROWS["synthetic-semhash-big"] = BIG


def _family(name: str) -> str:
    """A row's corpus and unit, the prefix of its baseline's name."""
    return next((p for p in ("gcide-word", "word", "synthetic") if name.startswith(p)), "char")


def _baseline(name: str) -> str:
    # a variant's baseline ran the same recipe
    for tag in ("-15m-fixedpos", "-3ep-fixedpos", "-6ep-fixedpos", "-12ep-fixedpos", "-24ep-fixedpos", "-15m",
                "-10ep", "-20ep", "-30ep", "-3ep", "-6ep", "-9ep"):
        if tag in name:
            return _family(name) + "-baseline" + tag
    if name.startswith("synthetic") and name.endswith("-big"):
        return "synthetic-baseline-big"
    return _family(name) + "-baseline"


def corpus(name: str) -> Path:
    """The corpus directory a row trains and tests on."""
    family = _family(name)
    if family == "synthetic":
        return synthetic_corpus()
    return ptb_dir().parent / "gcide" if family == "gcide-word" else ptb_dir()


def synthetic_corpus() -> Path:
    import random

    d = CHECKPOINTS / "dae" / "synthetic-corpus"
    d.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for split, n in (("train", 4000), ("valid", 200), ("test", 400)):
        lines = [" ".join(rng.choice("abcd") for _ in range(7)) for _ in range(n)]
        (d / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def _last_wins(flags: list[str]) -> list[str]:
    """--flag value pairs with a row's own value replacing the common recipe's (first position kept)."""
    pairs = dict(zip(flags[::2], flags[1::2], strict=True))
    return [x for k, v in pairs.items() for x in (k, v)]


def _saved_rows() -> dict[str, dict]:
    path = RESULTS / "dae.json"
    return {r["name"]: r for r in json.loads(path.read_text())["rows"]} if path.exists() else {}


STAGE_RUNS = "stage_runs.json"  # in a continued row's checkpoint: the runs of the stages it was copied from


def _epochs(name: str) -> int:
    recipe = _last_wins(COMMON + ROWS[name])
    return int(recipe[recipe.index("--max-epochs") + 1])


def _chain(name: str) -> list[str]:
    """The rows whose runs `name` continues, first stage first."""
    return [*_chain(CONTINUED[name][0]), CONTINUED[name][0]] if name in CONTINUED else []


def _stage(src: str, args: argparse.Namespace) -> list[dict]:
    """Row `src` run to its end (its finished checkpoint reused, else trained or resumed now, its row written):
    its runs, each marked with the stage it ran."""
    status, saved = run_status(CHECKPOINTS / "dae" / src), _saved_rows().get(src)
    if saved is None or not (status["done"] or status["epoch"] >= _epochs(src)):
        print(f"dae: running stage {src} first", file=sys.stderr, flush=True)
        row = run_row(src, args)
        merge_rows("dae", [row])
        print(json.dumps({k: v for k, v in row.items() if k not in ("config", "stage_runs")}), flush=True)
        saved = _saved_rows()[src]
    return [{**x, "stage": x.get("stage", src)} for x in saved["runs"]]


def run_row(name: str, args: argparse.Namespace) -> dict:
    out = CHECKPOINTS / "dae" / name
    copied, stage_runs = False, None
    if name in CONTINUED and not out.exists():  # continue the previous stage's run, running it first if needed
        stage_runs = _stage(CONTINUED[name][0], args)
        shutil.copytree(CHECKPOINTS / "dae" / CONTINUED[name][0], out, ignore=shutil.ignore_patterns(RUNS_FILE))
        (out / STAGE_RUNS).write_text(json.dumps(stage_runs))
        copied = True
    elif name in CONTINUED and (out / STAGE_RUNS).exists():
        stage_runs = json.loads((out / STAGE_RUNS).read_text())
    resumed = run_status(out)["started"]  # a stage cut inside its first epoch is resumed too
    recipe = _last_wins((SYNTHETIC if name.startswith("synthetic") else COMMON) + ROWS[name])
    if args.minutes and "--max-minutes" in recipe:
        recipe[recipe.index("--max-minutes") + 1] = str(args.minutes)
    flags = recipe + ["--precision", args.precision, "--threads", str(args.threads), "--device", args.device]
    data = corpus(name)
    with recorded_training(out, resumed, args.threads) as earlier:  # this stage's invocations before (stopped too)
        result = train_from_cli("dae", str(data), str(out), None, flags, resume=resumed)
    hist = run_status(out)["history"]
    cfg = json.loads((out / "config.json").read_text())
    unit = cfg["data"]["unit"]
    row = {"name": name, "unit": unit, "recipe": " ".join(recipe), "test_ppl": result["test_ppl"],
           "valid_ppl": result["valid_ppl"], "test_tokens": result["test_tokens"],
           "train_minutes": sum(h["epoch_seconds"] for h in hist) / 60,
           "train_tokens": sum(h["train_tokens"] for h in hist), "threads": args.threads,
           "resumed": resumed and not copied, "config": cfg["model"]}  # copied: a new run of this stage
    row = with_earlier_runs(row, earlier)
    if stage_runs is not None:
        row.update(chain=_chain(name), stage_runs=stage_runs)
    row["train_tokens_per_s"] = row["train_tokens"] / max(row["train_minutes"] * 60, 1e-9)
    if unit == "char":
        row["test_bpc"] = math.log2(result["test_ppl"])
    base = _saved_rows().get(_baseline(name))
    if "baseline" in name.split("-"):
        row["dsae"] = None
    elif base is None:
        row["dsae"], row["note"] = None, f"run {_baseline(name)} first: DSAE needs its p"
    else:
        rep = dsae_report(base["test_ppl"], result["test_ppl"], cfg["model"]["bits"], 2 ** cfg["model"]["k"])
        row.update({"dsae": rep["dsae"], "baseline": base["name"], "p": rep["p"], "p_prime": rep["p_prime"],
                    "code_bits_per_token": rep["code_bits_per_token"], "log2_p": rep["log2_p"]})
        if "caveat" in rep:
            row["caveat"] = rep["caveat"]
    if "baseline" not in name.split("-"):
        row["code"] = _code_usage(out, data)
    return row


def _code_usage(out: Path, data: Path) -> dict:
    """Distinct symbols, entropy and constant bits of a trained dae model's code on the test split."""
    import seqlm
    from seqlm.data.corpus import encode_file
    from seqlm.data.datasets import split_path
    from seqlm.eval.dsae import code_usage

    model = seqlm.load(out)
    return code_usage(model, encode_file(split_path(data, "test"), model.vocab, unit=model.data_config.unit))


def run_code_usage(args: argparse.Namespace) -> dict:
    """`code-usage`: the code statistics of every trained dae row with a code (its checkpoint in CHECKPOINTS/dae)."""
    models = {}
    for name in ROWS:
        out = CHECKPOINTS / "dae" / name
        if "baseline" in name.split("-") or not (out / "config.json").exists():
            continue
        models[name] = _code_usage(out, corpus(name))
    return {"name": "code-usage", "split": "test", "models": models, "threads": args.threads}


# `seqlm dsae` on a pair's checkpoints: p and p' again through the user's command and, since GCIDE read with a
# 10k vocabulary has many <unk> tokens, DSAE over the in-vocabulary tokens alone
DSAE_CHECKS = {"dsae-check-gcide-word-9ep": ("gcide-word-baseline-9ep", "gcide-word-semhash-9ep")}


def run_dsae_check(args: argparse.Namespace, name: str) -> dict:
    from seqlm.eval.dsae import dsae_from_dirs

    base, dae = DSAE_CHECKS[name]
    rep = dsae_from_dirs(CHECKPOINTS / "dae" / base, CHECKPOINTS / "dae" / dae, str(corpus(dae)), None, "test")
    return {"name": name, "baseline": base, "dae": dae, "split": "test", **rep, "threads": args.threads}


# -- diversity ---------------------------------------------------------------------------------------------
def distinct_2(sentences: list[list[str]]) -> float:
    """Distinct bigrams over all bigrams of a set of sentences (Li et al. 2016)."""
    grams = [tuple(s[i : i + 2]) for s in sentences for i in range(len(s) - 1)]
    return len(set(grams)) / max(len(grams), 1)


def _bleu(hyp: list[str], refs: list[list[str]], n_max: int = 4) -> float:
    """Sentence BLEU-4 against several references, add-one smoothing for n > 1 (self-BLEU's building block)."""
    if not hyp:
        return 0.0
    logs = 0.0
    for n in range(1, n_max + 1):
        h = Counter(tuple(hyp[i : i + n]) for i in range(len(hyp) - n + 1))
        best: Counter = Counter()
        for r in refs:
            for g, c in Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1)).items():
                best[g] = max(best[g], c)
        match = sum(min(c, best[g]) for g, c in h.items())
        total = max(sum(h.values()), 0)
        add = 0 if n == 1 else 1
        if match + add == 0 or total + add == 0:
            return 0.0
        logs += math.log((match + add) / (total + add)) / n_max
    ref_len = min((abs(len(r) - len(hyp)), len(r)) for r in refs)[1]
    bp = 1.0 if len(hyp) > ref_len else math.exp(1 - ref_len / len(hyp))
    return bp * math.exp(logs)


def self_bleu(sentences: list[list[str]]) -> float:
    """Mean BLEU of each sentence against all the others: lower = more diverse (Zhu et al. 2018)."""
    return sum(_bleu(s, sentences[:i] + sentences[i + 1 :]) for i, s in enumerate(sentences)) / len(sentences)


# diversity row -> (dae row, baseline row): the first pair's code had collapsed (see `code-usage`), the second's not
DIVERSITY = {"diversity": ("char-semhash", "char-baseline"),
             "diversity-6ep": ("char-semhash-6ep-fixedpos-balance", "char-baseline-6ep-fixedpos"),
             "diversity-12ep": ("char-semhash-12ep-fixedpos-balance", "char-baseline-12ep-fixedpos")}


def run_diversity(args: argparse.Namespace, name: str = "diversity", n: int = 12, beam: int = 4) -> dict:
    import seqlm
    from seqlm.eval.generate import beam_search, decode_code, detokenize, sample

    dae_row, base_row = DIVERSITY[name]
    dae = seqlm.load(CHECKPOINTS / "dae" / dae_row)
    base = seqlm.load(CHECKPOINTS / "dae" / base_row)
    gen = torch.Generator().manual_seed(0)
    codes = dae.sample_codes(n, gen, dae.latent.context - 1)
    latent_beam = [detokenize(dae.vocab.decode(decode_code(dae, c, beam, 300)[0].ids), "char") for c in codes]
    sampled = [detokenize(s, "char") for s in sample(base, n, seed=0, max_len=300)]
    start = base.step(torch.tensor([base.vocab.bos_id]), base.initial_state(1))
    beams = [detokenize(base.vocab.decode(h.ids), "char") for h in beam_search(base, n, 300, start=start)]
    sets = {"latent_then_beam": latent_beam, "baseline_sampling": sampled, "baseline_beam": beams}
    row = {"name": name, "n": n, "beam": beam, "models": f"{dae_row} (codes from its latent model, beam-decoded) "
           f"vs {base_row} (ancestral sampling; and its n-best beam)", "threads": args.threads}
    for key, lines in sets.items():
        words = [s.split() for s in lines]
        row[f"{key}_distinct_2"] = distinct_2(words)
        row[f"{key}_self_bleu"] = self_bleu(words)
        row[f"{key}_samples"] = lines
    row["codes"] = codes
    return row


EPOCH_CURVES = {  # DSAE against epochs: rows of one recipe trained longer (CONTINUED chains), per unit
    "PTB word": ["word-semhash-10ep", "word-semhash-20ep", "word-semhash-30ep"],
    "GCIDE word": ["gcide-word-semhash-3ep", "gcide-word-semhash-6ep", "gcide-word-semhash-9ep"],
    "PTB char": ["char-semhash-3ep-fixedpos-balance", "char-semhash-6ep-fixedpos-balance",
             "char-semhash-12ep-fixedpos-balance", "char-semhash-24ep-fixedpos-balance"],
}


def plot(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    saved = _saved_rows()
    rows = [r for r in saved.values() if r.get("dsae") is not None and r["name"] not in DSAE_CHECKS]
    if not rows:
        return
    fig, (ax, curve) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 1.3]})
    ax.bar([r["name"] for r in rows], [100 * r["dsae"] for r in rows], color="tab:blue")
    ax.axhline(40, color="gray", ls="--", lw=1, label="issue 44's goals: word level 40%")
    ax.axhline(50, color="gray", ls=":", lw=1, label="character level 50%")
    ax.set_ylabel("DSAE (%)")
    ax.set_title("DSAE on the test sets (PTB; gcide-*: GCIDE; synthetic: random letters), shortened CPU recipes",
                 fontsize=10)
    ax.legend(fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=7)
    for unit, names in EPOCH_CURVES.items():
        points = [(_epochs(n), 100 * saved[n]["dsae"]) for n in names if saved.get(n, {}).get("dsae") is not None]
        if points:
            curve.plot(*zip(*points), marker="o", label=f"{unit} level")
    curve.set_xlabel("epochs planned (time limits cut some stages short)", fontsize=8)
    curve.set_ylabel("DSAE (%)")
    curve.set_title("the same recipe, trained longer", fontsize=10)
    curve.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = row_parser(__doc__, "char-baseline,char-semhash,char-gumbel", "bf16")
    p.add_argument("--minutes", type=float, default=0.0, help="replace the recipe's --max-minutes (stated in the row)")
    p.add_argument("--plot", action="store_true", help="only draw dae.png again from dae.json")
    args = p.parse_args()
    if args.plot:
        return plot(RESULTS / "dae.png")
    torch.set_num_threads(args.threads)
    for name in args.rows.split(","):
        extra = {"code-usage": run_code_usage} | {d: functools.partial(run_diversity, name=d) for d in DIVERSITY} \
            | {c: functools.partial(run_dsae_check, name=c) for c in DSAE_CHECKS}
        if name not in ROWS and name not in extra:
            sys.exit(f"unknown row {name}; choose from {', '.join([*ROWS, *extra])}")
        row = extra[name](args) if name in extra else run_row(name, args)
        merge_rows("dae", [row])
        print(json.dumps({k: v for k, v in row.items() if k not in ("config", "stage_runs")}), flush=True)
    plot(RESULTS / "dae.png")


if __name__ == "__main__":
    main()
