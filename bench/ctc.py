"""CTC beam search with seqlm language models (seqlm.kenlm.ctc in pyctcdecode), on simulated posteriors.

    python bench/ctc.py --rows greedy,kn5-kenlm,kn5-seqlm,lstm,lstm-kn5 --threads 1
    python bench/ctc.py --rows greedy,kn5-seqlm --utterances 20 --model kn5=DIR      # a quick look
    python bench/ctc.py --rows rnn,rnn-kn5 --threads 1     # the Elman RNN in place of the LSTM
    python bench/ctc.py --rows kn5-kenlm,lstm-kn5 --tune-alpha 0.3,0.5,0.7 --tune-beta 0.5,1,2   # tuned on valid

Posteriors: the first UTTERANCES sentences of PTB test, as characters (alphabet: CTC blank, space and every
character of the PTB training vocabulary, `<unk>` spelled out). Each character takes 1 or 2 frames (even
odds) and is followed by one blank frame; every frame's logits are N(0, NOISE) noise over all labels plus
PEAK on the true one (seed SEED). Greedy decoding (frame argmax, repeats merged, blanks dropped) then has
the character error rate of the `greedy` row. Rows: `greedy`; pyctcdecode's beam search (width BEAM, the
same alpha and beta everywhere, PTB training vocabulary as unigrams) with the KN5 through the kenlm module
(`kn5-kenlm`) and through seqlm (`kn5-seqlm`), with the LSTM (`lstm`) and with the LSTM and KN5 interpolated
by EM on PTB valid (`lstm-kn5`). Fields: wer, cer, seconds (decoding only), utterances. With --tune-alpha
and --tune-beta, every beam-search row picks its own (alpha, beta) from that grid by its WER on the first
--tune-utterances sentences of PTB valid (posteriors simulated the same way, seed SEED + 1), then decodes
test with it; the grid's valid WERs are in the row's `tuning`.
Models: KN5 trained on PTB train here unless --model kn5=DIR; the LSTM is bench/combination.py's component
`lstm` (the recipe of bench/sparse.py's lstm-ptb), trained first when missing, unless --model lstm=DIR;
rows `rnn` and `rnn-kn5` do the same with its component `rnn` (rnnlm_ptb.py's rnn-bptt-h400-long).
Writes bench/results/ctc.json.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import torch

import seqlm.kenlm as seqlm_kenlm
from combination import component_dir
from seqlm.cli import main as seqlm_main
from seqlm.decode.tune import edits
from seqlm.kenlm.ctc import build_ctcdecoder

from common import CHECKPOINTS, merge_rows, ptb_dir, row_parser

WORK = CHECKPOINTS / "ctc"
NEURAL = ("lstm", "rnn")  # rows NAME and NAME-kn5: bench/combination.py's component NAME
PEAK, NOISE, SEED = 5.0, 1.2, 0  # greedy CER about 10% on the first 100 PTB test sentences


def simulate(text: str, labels: list[str], rng: np.random.Generator, peak: float, noise: float) -> np.ndarray:
    """(frames, len(labels)) logits for `text` (the recipe in the module docstring)."""
    index = {c: i for i, c in enumerate(labels)}
    frames = []
    for c in text:
        frames += [index[c]] * int(rng.integers(1, 3)) + [index[""]]
    logits = rng.normal(0.0, noise, (len(frames), len(labels)))  # (F, C)
    logits[np.arange(len(frames)), frames] += peak
    return logits


def greedy(logits: np.ndarray, labels: list[str]) -> str:
    best = logits.argmax(axis=1)  # (F,)
    keep = np.concatenate([[True], best[1:] != best[:-1]])  # (F,) the first frame of each run
    return " ".join("".join(labels[i] for i in best[keep]).split())


def error_rates(hyps: list[str], refs: list[str]) -> tuple[float, float]:
    pairs = list(zip(hyps, refs, strict=True))
    words = sum(edits(h.split(), r.split()) for h, r in pairs) / sum(len(r.split()) for r in refs)
    chars = sum(edits(list(h), list(r)) for h, r in pairs) / sum(len(r) for r in refs)
    return words, chars


def kn5_dir(models: dict) -> Path:
    if "kn5" in models:
        return models["kn5"]
    out = WORK / "kn5"
    if not (out / "model.arpa").is_file():
        assert seqlm_main(["train", "--model", "kn", "--order", "5", "--data", str(ptb_dir()), "--out", str(out)]) == 0
    return out


def mixture_dir(models: dict, neural: str) -> Path:
    out = WORK / f"{neural}-kn5"  # rebuilt every run: the members may have changed
    shutil.rmtree(out, ignore_errors=True)
    assert seqlm_main(["interpolate", str(models[neural]), str(kn5_dir(models)), "--out", str(out),
                       "--valid", str(ptb_dir() / "valid.txt")]) == 0
    return out


def decoder_for(row: str, labels: list[str], unigrams: list[str], models: dict, args):
    opts = {"unigrams": unigrams, "alpha": args.alpha, "beta": args.beta}
    if row == "kn5-kenlm":
        import pyctcdecode

        return pyctcdecode.build_ctcdecoder(labels, str(kn5_dir(models) / "model.arpa"), **opts)
    neural = row.removesuffix("-kn5")
    path = kn5_dir(models) if row == "kn5-seqlm" else mixture_dir(models, neural) if row.endswith("-kn5") \
        else models[neural]
    return build_ctcdecoder(labels, str(path), **opts)


def tune(decoder, row: str, args, valid: tuple[list[np.ndarray], list[str]]) -> dict:
    """Set the decoder's (alpha, beta) to the grid point with the lowest WER on `valid` (the first on ties)."""
    grid = []
    for alpha in (float(a) for a in args.tune_alpha.split(",")):
        for beta in (float(b) for b in args.tune_beta.split(",")):
            decoder.reset_params(alpha=alpha, beta=beta)
            wer, _ = error_rates([decoder.decode(x, beam_width=args.beam) for x in valid[0]], valid[1])
            grid.append({"alpha": alpha, "beta": beta, "valid_wer": wer})
            print({"row": row, **grid[-1]}, flush=True)
    best = min(grid, key=lambda g: g["valid_wer"])
    decoder.reset_params(alpha=best["alpha"], beta=best["beta"])
    return {"alpha": best["alpha"], "beta": best["beta"], "valid_wer": best["valid_wer"],
            "tuning": {"split": "PTB valid", "utterances": len(valid[1]), "seed": SEED + 1, "points": len(grid),
                       "grid": grid}}


def simulated(split: str, count: int, labels: list[str], seed: int, args) -> tuple[list[np.ndarray], list[str]]:
    """The first `count` sentences of a PTB split and their simulated posteriors."""
    refs = [" ".join(line.split()) for line in (ptb_dir() / split).read_text().splitlines() if line.split()]
    rng = np.random.default_rng(seed)
    return [simulate(r, labels, rng, args.peak, args.noise) for r in refs[:count]], refs[:count]


def main() -> None:
    p = row_parser(__doc__, "greedy,kn5-kenlm,kn5-seqlm,lstm,lstm-kn5", "fp32")
    p.add_argument("--model", action="append", default=[], help="kn5=DIR or lstm=DIR: use this model")
    p.add_argument("--utterances", type=int, default=200)
    p.add_argument("--beam", type=int, default=32)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--peak", type=float, default=PEAK)
    p.add_argument("--noise", type=float, default=NOISE)
    p.add_argument("--tune-alpha", default="", help="comma-separated alphas: pick (alpha, beta) on valid per row")
    p.add_argument("--tune-beta", default="", help="comma-separated betas of the tuning grid")
    p.add_argument("--tune-utterances", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    models = {k: Path(v) for k, v in (m.split("=", 1) for m in args.model)}
    neural = {k: {"model_dir": str(v)} for k, v in models.items() if k in NEURAL}
    for name in NEURAL:
        if name not in models and {name, f"{name}-kn5"} & set(args.rows.split(",")):
            models[name], neural[name] = component_dir(name, args.threads)  # trained first when missing
    if bool(args.tune_alpha) != bool(args.tune_beta):
        p.error("--tune-alpha and --tune-beta go together")
    vocab = seqlm_kenlm.Model(str(kn5_dir(models))).vocab.itos
    unigrams = [w for w in vocab if w not in ("<s>", "</s>")]
    # PTB's characters all occur in its training vocabulary (<unk> spelled out), so test's are covered
    labels = ["", " ", *sorted({c for w in unigrams for c in w} - {" "})]
    logits, refs = simulated("test.txt", args.utterances, labels, SEED, args)
    assert {c for r in refs for c in r} <= set(labels), "a test character outside the training vocabulary"
    valid = simulated("valid.txt", args.tune_utterances, labels, SEED + 1, args) if args.tune_alpha else None
    recipe = {"peak": args.peak, "noise": args.noise, "seed": SEED, "frames_per_char": "1 or 2, then a blank",
              "beam": args.beam, "alpha": args.alpha, "beta": args.beta, "labels": len(labels)}
    for row in args.rows.split(","):
        t, tuned = time.perf_counter(), {}
        if row == "greedy":
            hyps = [greedy(x, labels) for x in logits]
        else:
            decoder = decoder_for(row, labels, unigrams, models, args)
            if valid:
                tuned = tune(decoder, row, args, valid)
            t = time.perf_counter()
            hyps = [decoder.decode(x, beam_width=args.beam) for x in logits]
        seconds = time.perf_counter() - t
        wer, cer = error_rates(hyps, refs)
        result = {"name": row, "wer": wer, "cer": cer, "seconds": seconds, "utterances": len(refs), **recipe,
                  "tuned": bool(tuned), **tuned,
                  **({"model": neural[row.removesuffix("-kn5")]} if row.removesuffix("-kn5") in NEURAL else {})}
        print(result, flush=True)
        merge_rows("ctc", [result], {"recipe": __doc__.split("\n\n")[1]})


if __name__ == "__main__":
    main()
