"""CTC beam search on simulated posteriors: `seqlm decode` against pyctcdecode + kenlm and flashlight-text.

    SEQLM_DATA=../shared/data python bench/decode.py --threads 1
    python bench/decode.py --threads 1 --rows decode-greedy,seqlm-kn5-b8 --utterances 20      # a quick look

Posteriors (this script's own generator): the first UTTERANCES sentences of PTB test as characters (labels:
blank, space and every character of the PTB training vocabulary, <unk> spelled out); each character takes 1
or 2 frames (even odds), then one blank frame; every frame's logits are N(0, NOISE) noise over all labels plus
PEAK on the true one (seed SEED; the tuning set: the first TUNE sentences of PTB valid, seed SEED + 1).
Rows, at beam widths B = 8 and 32:
- decode-greedy: frame argmax, repeats merged, blanks dropped;
- pyctcdecode-kn5-bB: pyctcdecode's `decode` with the kenlm module on the KN5 ARPA seqlm trains on PTB train
  (unigrams: its words less <s> and </s>);
- seqlm-kn5-bB: `seqlm decode`'s decoder on the same model (all test utterances in one batch);
  seqlm-kn5-bB-batch1: the same, one utterance at a time; seqlm-char6-bB: `seqlm decode` at token level with the
  character 6-gram below (alpha * ln p + beta per character read);
- flashlight-lexicon-kn5-bB: flashlight-text's LexiconDecoder (CTC) with its KenLM on the same ARPA, the PTB
  words as lexicon (each spelling ended by the space token; unigram scores smeared by max); lm_weight =
  alpha * ln 10 (KenLM's log10 as natural logs), word_score = beta,
  sil_score 0, beam_threshold 10, every token tried; unk_score -inf (0 lets its unknown-word path spell every
  word as <unk>; PTB's literal <unk> stays a word of the lexicon);
- flashlight-lexfree-char6-bB: its LexiconFreeDecoder with a character 6-gram KN (seqlm, PTB train, `_` between
  words; 6: the highest order its KenLM build reads) through its KenLM: lm_weight = alpha * ln 10, sil_score =
  beta (its only per-word score).
- seqlm-lstm-bB: `seqlm decode` with an LSTM 2 x 200 on PTB words (bench/units.py's lstm-word row: 10 minutes
  of training, trained by that row's code when missing); seqlm-lstm+kn5-bB: that LSTM and the KN5 interpolated
  (`seqlm interpolate`, weights by EM on PTB valid), both through the decoder's batched `advance`;
  seqlm-lstmc-bB, seqlm-lstmc+kn5-bB: the same with bench/units.py's lstm-word-class (the same LSTM and
  budget, a class-factorised output: the words the beams end are scored from the states, `advance_targets`);
  seqlm-lstmt-bB, seqlm-lstmt+kn5-bB: the same with lstm-word-tree (a hierarchical softmax on a Huffman tree:
  a word costs the dot products of its path, no normaliser);
- -hot200 rows (beam 32): the same decoders boosting 200 hotwords, the rarest words of the test transcripts by
  PTB train count, at pyctcdecode's default weight 10 (`hotwords_recalled`, in every row: how many of those
  words' occurrences the transcripts hold).
Every row but greedy picks (alpha, beta) from one grid by WER on the tuning set (`picked_on`, `grid`), then
decodes test, timed (`ms_per_utterance`: decoding only, model loading excluded; the best of up to 3 runs, another
run made only while the runs so far took under a minute: `timed_runs_ms`); seqlm-kn5-b32-batch1 takes
seqlm-kn5-b32's. --device (default auto: a GPU where there is one) is where seqlm's rows decode (the tensor
search, on a GPU); there they are named NAME-cuda, e.g. `--device cuda --rows seqlm-kn5-b32,seqlm-lstm+kn5-b32`.
`differs_from_pyctcdecode`: transcripts unlike pyctcdecode's at the same beam. One thread.
Writes bench/results/decode.json and decode.png (WER against ms per utterance).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

import seqlm
from seqlm.cli import main as seqlm_main
from seqlm.decode import CTCDecoder, DecodeConfig, resolve
from seqlm.decode.tune import edits
from seqlm.train.loop import resolve_device

from common import CHECKPOINTS, RESULTS, merge_rows, ptb_dir, row_parser

WORK = CHECKPOINTS / "decode"
PEAK, NOISE, SEED = 5.0, 1.2, 0
ALPHAS, BETAS = (0.2, 0.35, 0.5, 0.7), (-1.0, 0.0, 1.0, 2.0)
LN10 = math.log(10)
TIMED_RUNS, TIMED_SECONDS = 3, 60.0  # test decoded up to 3 times while under a minute was spent: best kept
# the LSTMs of the seqlm-lstm* rows: bench/units.py's rows (seqlm-lstmc-bB: the class-factorised output, -lstmt-:
# the Huffman tree output, both scored word by word from the state: nn/readout.py)
LSTMS = {"lstm": "lstm-word", "lstmc": "lstm-word-class", "lstmt": "lstm-word-tree"}
HOTWORDS, HOT_WEIGHT = 200, 10.0  # -hot200 rows: the rarest test words (rare_words), pyctcdecode's default weight


def simulate(text: str, index: dict[str, int], rng: np.random.Generator) -> np.ndarray:
    """(frames, labels) float32 logits for `text` (the recipe in the module docstring)."""
    frames = []
    for c in text:
        frames += [index[c]] * int(rng.integers(1, 3)) + [index[""]]
    logits = rng.normal(0.0, NOISE, (len(frames), len(index)))  # (F, L)
    logits[np.arange(len(frames)), frames] += PEAK
    return logits.astype(np.float32)


def utterances(split: str, count: int, labels: list[str], seed: int) -> tuple[list[np.ndarray], list[str]]:
    refs = [" ".join(line.split()) for line in (ptb_dir() / split).read_text().splitlines() if line.split()][:count]
    rng, index = np.random.default_rng(seed), {c: i for i, c in enumerate(labels)}
    return [simulate(r, index, rng) for r in refs], refs


def error_rates(hyps: list[str], refs: list[str]) -> tuple[float, float]:
    pairs = list(zip(hyps, refs, strict=True))
    wer = sum(edits(h.split(), r.split()) for h, r in pairs) / sum(len(r.split()) for r in refs)
    cer = sum(edits(list(h), list(r)) for h, r in pairs) / sum(len(r) for r in refs)
    return wer, cer


def trained(name: str, argv: list[str]) -> Path:
    out = WORK / name
    if not (out / "model.arpa").is_file():
        assert seqlm_main(["train", "--model", "kn", *argv, "--data", str(ptb_dir()), "--out", str(out)]) == 0
    return out


def lstm_model(name: str = "lstm-word") -> Path:
    """bench/units.py's LSTM row `name` (LSTM 2 x 200 on PTB words, 10 minutes of training; lstm-word-class: with
    a class-factorised output), trained by that row's own code where it is missing (`python bench/units.py --rows
    NAME` writes its row)."""
    work = CHECKPOINTS / "units" / name
    if not (work / "trained.json").is_file():
        import units

        work.mkdir(parents=True, exist_ok=True)
        cache = os.environ.get("SEQLM_CACHE")
        units.bench_row(name, ptb_dir(), work, None)
        os.environ.pop("SEQLM_CACHE") if cache is None else os.environ.update(SEQLM_CACHE=cache)
    return work / "model"


def mixture(lstm: Path, kn5: Path, name: str = "lstm+kn5") -> Path:
    """The LSTM and KN5 interpolated, weights by EM on PTB valid (`seqlm interpolate`)."""
    out = WORK / name
    if not (out / "config.json").is_file():
        assert seqlm_main(["interpolate", str(lstm), str(kn5), "--data", str(ptb_dir()), "--split", "valid",
                           "--out", str(out)]) == 0
    return out


def rare_words(refs: list[str], kn5: Path) -> list[str]:
    """The HOTWORDS rarest words of the test transcripts by their PTB train count (ties by spelling; <unk>
    aside): the words a user would boost, each in some reference."""
    vocab = seqlm.load(kn5).vocab
    counts = dict(zip(vocab.itos, vocab.counts, strict=True))
    words = sorted({w for r in refs for w in r.split() if w != "<unk>"}, key=lambda w: (counts.get(w, 0), w))
    return words[:HOTWORDS]


def greedy(mats: list[np.ndarray], labels: list[str]) -> list[str]:
    out = []
    for m in mats:
        best = m.argmax(1)  # (F,)
        keep = np.concatenate([[True], best[1:] != best[:-1]])
        out.append(" ".join("".join(labels[i] for i in best[keep]).split()))
    return out


class PyCTCDecode:
    def __init__(self, labels, kn5: Path, unigrams, beam: int, hotwords: list[str] | None):
        import pyctcdecode

        self.decoder = pyctcdecode.build_ctcdecoder(labels, str(kn5 / "model.arpa"), unigrams=unigrams)
        self.beam, self.hot = beam, {"hotwords": hotwords, "hotword_weight": HOT_WEIGHT} if hotwords else {}

    def __call__(self, mats, alpha, beta):
        self.decoder.reset_params(alpha=alpha, beta=beta)
        return [self.decoder.decode(m, beam_width=self.beam, **self.hot) for m in mats]


class Seqlm:
    def __init__(self, labels, lm: Path, beam: int, batch: int, hotwords: list[str] | None, device: torch.device):
        hot = dict.fromkeys(hotwords, HOT_WEIGHT) if hotwords else None
        self.decoder = CTCDecoder(resolve(labels), seqlm.load(lm), DecodeConfig(beam_width=beam, batch_size=batch),
                                  hotwords=hot, device=device)

    def __call__(self, mats, alpha, beta):
        self.decoder.cfg.alpha, self.decoder.cfg.beta = alpha, beta
        return [n[0].text for n in self.decoder.decode(mats)]


class Flashlight:
    """flashlight-text's CTC decoders (the options in the module docstring)."""

    def __init__(self, labels: list[str], arpa: Path, beam: int, words: list[str] | None):
        from flashlight.lib.text.decoder import KenLM, SmearingMode, Trie
        from flashlight.lib.text.dictionary import Dictionary

        space = "|" if words else "_"  # the character LM's word separator is `_`
        self.names = ["<blank>", space, *labels[2:]]
        self.tokens = Dictionary(self.names)
        self.beam, self.words, self.labels = beam, words, labels
        if words is None:
            self.lm = KenLM(str(arpa), self.tokens)
            return
        self.word_dict = Dictionary(words)
        self.lm = KenLM(str(arpa), self.word_dict)
        self.trie = Trie(len(self.names), 1)
        start = self.lm.start(False)
        for i, w in enumerate(words):
            self.trie.insert([self.names.index(c) for c in w] + [1], i, self.lm.score(start, i)[1])
        self.trie.smear(SmearingMode.MAX)

    def decoder(self, alpha: float, beta: float):
        from flashlight.lib.text.decoder import (
            CriterionType,
            LexiconDecoder,
            LexiconDecoderOptions,
            LexiconFreeDecoder,
            LexiconFreeDecoderOptions,
        )

        n, w = len(self.names), alpha * LN10
        if self.words is None:
            opts = LexiconFreeDecoderOptions(self.beam, n, 10.0, w, beta, False, CriterionType.CTC)
            return LexiconFreeDecoder(opts, self.lm, 1, 0, [])
        opts = LexiconDecoderOptions(self.beam, n, 10.0, w, beta, -math.inf, 0.0, False, CriterionType.CTC)
        return LexiconDecoder(opts, self.trie, self.lm, 1, 0, self.word_dict.get_index("<unk>"), [], False)

    def __call__(self, mats, alpha, beta):
        decoder, out = self.decoder(alpha, beta), []
        for m in mats:
            lp = np.ascontiguousarray(torch.log_softmax(torch.from_numpy(m), 1).numpy())  # (F, L) float32
            best = decoder.decode(lp.ctypes.data, lp.shape[0], lp.shape[1])[0]
            out.append(self._text(best))
        return out

    def _text(self, best) -> str:
        if self.words is not None:
            return " ".join(self.words[i] for i in best.words if i >= 0)
        ids = [k for k, _ in itertools.groupby(best.tokens) if k > 0]  # repeats merged, blanks dropped
        return " ".join("".join(" " if i == 1 else self.labels[i] for i in ids).split())


def system(row: str, labels, models, unigrams, hotwords: list[str], device: torch.device):
    """The decoder a row names: f(mats, alpha, beta) -> transcripts."""
    beam = int(row.split("-b")[1].split("-")[0])
    hot = hotwords if row.endswith("-hot200") else None
    if row.startswith("pyctcdecode"):
        return PyCTCDecode(labels, models["kn5"], unigrams, beam, hot)
    if row.startswith("seqlm"):
        model = models[row.split("-")[1]]  # seqlm-kn5-b8: kn5; seqlm-lstm+kn5-b32: lstm+kn5
        return Seqlm(labels, model, beam, 1 if row.endswith("batch1") else 1000, hot, device)
    if row.startswith("flashlight-lexicon"):
        return Flashlight(labels, models["kn5"] / "model.arpa", beam, unigrams)
    return Flashlight(labels, models["char6"] / "model.arpa", beam, None)


def measure(row: str, decode, valid, test, picked: dict | None = None) -> dict:
    """Pick (alpha, beta) on the tuning set (or take `picked`, another row's), then decode test once, timed."""
    grid = []
    for alpha, beta in [] if picked else itertools.product(ALPHAS, BETAS):
        wer, _ = error_rates(decode(valid[0], alpha, beta), valid[1])
        grid.append({"alpha": alpha, "beta": beta, "valid_wer": wer})
        print({"row": row, **grid[-1]}, flush=True)
    best = picked or min(grid, key=lambda g: g["valid_wer"])
    hyps, runs = timed(lambda: decode(test[0], best["alpha"], best["beta"]))
    wer, cer = error_rates(hyps, test[1])
    return {"wer": wer, "cer": cer, **runs, "alpha": best["alpha"], "beta": best["beta"],
            "valid_wer": best["valid_wer"], "grid": grid, "hyps": hyps}


def timed(decode) -> tuple[list[str], dict]:
    """The transcripts of decode() and its time: the best of up to TIMED_RUNS runs, another run made only while
    the runs so far took under TIMED_SECONDS (a run of a second or two is at the mercy of the moment; one of a
    minute is not); every run's ms per utterance is kept."""
    hyps, ms, spent = None, [], 0.0
    while len(ms) < TIMED_RUNS and spent < TIMED_SECONDS:
        start = time.perf_counter()
        again = decode()
        seconds = time.perf_counter() - start
        spent += seconds
        ms.append(1000 * seconds / len(again))
        assert hyps is None or again == hyps, "a decoder gave other transcripts on a second run"
        hyps = again
    return hyps, {"ms_per_utterance": min(ms), "timed_runs_ms": ms}


def recalled(hyps: list[str], refs: list[str], hotwords: list[str]) -> dict:
    """Of the hotword occurrences in the references, how many the transcripts hold (as bags of words)."""
    hot, found, total = set(hotwords), 0, 0
    for h, r in zip(hyps, refs, strict=True):
        want = [w for w in r.split() if w in hot]
        total += len(want)
        found += sum(min(want.count(w), h.split().count(w)) for w in set(want))
    return {"found": found, "of": total}


def versions() -> dict:
    out = {"torch": torch.__version__}
    for name in ("pyctcdecode", "kenlm", "flashlight-text"):
        try:
            out[name] = version(name)
        except Exception:  # noqa: BLE001 - a peer that is not installed has no version
            out[name] = None
    return out


def wait_for_quiet(limit: float, minutes: float) -> float:
    """The 1-minute load average once it is below `limit` (checked every 30 s for up to `minutes`)."""
    end = time.time() + 60 * minutes
    while os.getloadavg()[0] >= limit and time.time() < end:
        print(f"load average {os.getloadavg()[0]:.2f} >= {limit}: waiting", flush=True)
        time.sleep(30)
    return os.getloadavg()[0]


def plot(rows: list[dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    kinds = ("decode-greedy", "pyctcdecode", "seqlm-kn5", "seqlm-char6", "flashlight-lexicon", "flashlight-lexfree",
             "seqlm-lstmc+kn5", "seqlm-lstmc", "seqlm-lstmt+kn5", "seqlm-lstmt", "seqlm-lstm+kn5", "seqlm-lstm")
    marks = dict(zip(kinds, "o^sDvPhpHdX*", strict=True))
    for r in rows:
        mark = next(m for k, m in marks.items() if r["name"].startswith(k))
        ax.scatter(r["ms_per_utterance"], 100 * r["wer"], marker=mark, s=50, label=r["name"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set(xlabel="ms per utterance (one thread; decoding only)", ylabel="WER %",
           title="CTC beam search, simulated posteriors of 200 PTB test sentences")
    ax.grid(True, alpha=0.3)
    path = RESULTS / "decode.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    beams = (8, 32)
    systems = ("pyctcdecode-kn5", "seqlm-kn5", "flashlight-lexicon-kn5", "flashlight-lexfree-char6", "seqlm-char6")
    names = ["decode-greedy"] + [f"{s}-b{b}" for b in beams for s in systems]
    names.append("seqlm-kn5-b32-batch1")
    names += [f"seqlm-{lm}-b{b}" for b in beams for lm in ("lstm", "lstm+kn5", "lstmc", "lstmc+kn5", "lstmt",
                                                            "lstmt+kn5")]
    names += [f"{s}-b32-hot{HOTWORDS}" for s in ("pyctcdecode-kn5", "seqlm-kn5", "seqlm-lstm+kn5")]
    p = row_parser(__doc__, ",".join(names), "fp32")
    p.add_argument("--utterances", type=int, default=200)
    p.add_argument("--tune", type=int, default=40, help="PTB valid sentences alpha and beta are picked on")
    p.add_argument("--max-load", type=float, default=3.0, help="wait until the 1-minute load average is below this")
    p.add_argument("--plot", action="store_true", help="only draw decode.png again from decode.json")
    args = p.parse_args()
    if args.plot:
        return print(plot(json.loads((RESULTS / "decode.json").read_text())["rows"]))
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)  # seqlm's rows decode there (the peers stay on the CPU)
    load = wait_for_quiet(args.max_load, 30)
    models = {"kn5": trained("kn5", ["--order", "5"]), "char6": trained("char6", ["--order", "6", "--unit", "char"])}
    for lm, units_row in LSTMS.items():  # seqlm-lstmc+kn5-b32: the LM part is `lstmc+kn5`, as system() reads it
        if any(row.split("-")[1].removesuffix("+kn5") == lm for row in args.rows.split(",") if "-" in row):
            models[lm] = lstm_model(units_row)
            models[f"{lm}+kn5"] = mixture(models[lm], models["kn5"], f"{lm}+kn5")
    unigrams = [w for w in seqlm.load(models["kn5"]).vocab.itos if w not in ("<s>", "</s>")]
    labels = ["", " ", *sorted({c for w in unigrams for c in w} - {" "})]
    test = utterances("test.txt", args.utterances, labels, SEED)
    hotwords = rare_words(test[1], models["kn5"])
    valid = utterances("valid.txt", args.tune, labels, SEED + 1)
    recipe = {"utterances": len(test[1]), "peak": PEAK, "noise": NOISE, "seed": SEED, "labels": len(labels),
              "frames_per_char": "1 or 2, then a blank", "threads": args.threads, "load_average_1min": load,
              "seqlm_device": str(device),
              "picked_on": {"split": "PTB valid", "utterances": len(valid[1]), "seed": SEED + 1, "by": "WER"},
              "versions": versions()}
    done: dict[str, dict] = {}
    for row in args.rows.split(","):
        if row == "decode-greedy":  # named apart from ctc.json's greedy row (other posteriors)
            hyps, runs = timed(lambda: greedy(test[0], labels))
            wer, cer = error_rates(hyps, test[1])
            result = {"wer": wer, "cer": cer, **runs, "hyps": hyps}
        else:  # a batch1 row decodes as its batched row does: it takes that row's alpha and beta
            batched = done.get(row.removesuffix("-batch1")) if row.endswith("-batch1") else None
            result = measure(row, system(row, labels, models, unigrams, hotwords, device), valid, test, batched)
            result["beam"] = int(row.split("-b")[1].split("-")[0])
            if row.startswith("seqlm"):
                result["batch_size"] = 1 if row.endswith("-batch1") else len(test[1])
            if batched:
                result["picked_by_row"] = row.removesuffix("-batch1")
            if row.endswith("-hot200"):
                result.update(hotwords=len(hotwords), hotword_weight=HOT_WEIGHT)
            if "lstm" in row:
                lm = row.split("-")[1]
                lstm = LSTMS[lm.removesuffix("+kn5")]
                result["lm"] = (f"seqlm interpolate {lstm} kn5 (EM on PTB valid)" if lm.endswith("+kn5") else
                                f"bench/units.py's {lstm} (bench/checkpoints/units/{lstm})")
        result["hotwords_recalled"] = recalled(result["hyps"], test[1], hotwords)  # every row: the baseline too
        done[row] = result
        peer = done.get(row.replace("seqlm", "pyctcdecode").removesuffix("-batch1"))
        if row.startswith("seqlm") and peer is not None:  # the same transcripts as pyctcdecode's?
            result["differs_from_pyctcdecode"] = sum(a != b for a, b in zip(result["hyps"], peer["hyps"], strict=True))
        name = f"{row}-{device.type}" if row.startswith("seqlm") and device.type != "cpu" else row  # not the CPU's
        row_out = {"name": name, **{k: v for k, v in result.items() if k != "hyps"}, **recipe}
        print({k: v for k, v in row_out.items() if k != "grid"}, flush=True)
        merge_rows("decode", [row_out], {"recipe": __doc__.split("\n\n")[1]})
    print(plot(json.loads((RESULTS / "decode.json").read_text())["rows"]))


if __name__ == "__main__":
    main()
