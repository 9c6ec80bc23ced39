"""`seqlm decode`: CTC posteriors to transcripts, one line per utterance (or --json lines), with any seqlm model,
mixture or ARPA file as the LM; `--tune` picks alpha and beta on a development set instead."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from seqlm import checkpoint as ckpt
from seqlm.decode.decoder import CTCDecoder, DecodeConfig, load_lm
from seqlm.decode.inputs import read_posteriors
from seqlm.decode.labels import read_labels
from seqlm.decode.lexicon import parse_hotwords
from seqlm.decode.tune import parse_grid, tune
from seqlm.errors import SeqlmError
from seqlm.outputs import claim_output


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("posteriors", nargs="+", help=".npy files (frames x labels: logits, log posteriors or "
                   "probabilities), folders of them (name order), .npz archives (one utterance per array)")
    p.add_argument("--labels", required=True, metavar="FILE", help="one label a line, in column order (a line "
                   "holding a space is the space), or a JSON {label: index} such as wav2vec2's vocab.json")
    p.add_argument("--blank", metavar="INDEX|NAME", help="the CTC blank (default: an empty label, else <blank>, "
                   "<pad>, [pad] or <eps>, else index 0; -1: the last)")
    p.add_argument("--space", metavar="LABEL", help="the word boundary (default: ' ', else '|'); labels starting "
                   "with ▁ start words too")
    p.add_argument("--lm", metavar="DIR|FILE", help="a seqlm model directory (any family, a mixture) or an ARPA / "
                   "binary n-gram file; none: the posteriors alone")
    p.add_argument("--lm-unit", default="auto", choices=["auto", "word", "token"], help="word: labels spell words "
                   "the LM scores when they end; token: labels are the LM's tokens, each scored (auto: token for a "
                   "character model, else word)")
    p.add_argument("--unigrams", metavar="FILE", help="word level: the words whose partial spellings go "
                   "unpenalised, one a line (default: the LM's words)")
    _search_options(p)
    p.add_argument("--hotwords", metavar="FILE", help='lines "phrase weight" (weight optional): words to boost')
    p.add_argument("--hotword", action="append", default=[], metavar="PHRASE", help="a phrase to boost (repeatable)")
    p.add_argument("--hotword-weight", type=float, default=10.0, help="the weight of phrases given without one")
    p.add_argument("--json", action="store_true", help="JSON lines: n-best, scores, frames, time per utterance")
    p.add_argument("--out", metavar="FILE", help="write here (atomically) instead of standard output")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where the search (and a "
                   "neural LM) runs; n-gram tables are read on the CPU")
    p.add_argument("--tune", action="store_true", help="pick --alpha/--beta from the grids by WER against --refs; "
                   "prints the grid and the best point as JSON")
    p.add_argument("--refs", metavar="FILE", help="--tune: reference transcripts, one line per utterance")
    p.add_argument("--tune-alpha", default="0.3,0.5,0.7,1.0", metavar="LIST", help="--tune: alphas to try")
    p.add_argument("--tune-beta", default="0,0.5,1,1.5,2", metavar="LIST", help="--tune: betas to try")


def _search_options(p: argparse.ArgumentParser) -> None:
    d = DecodeConfig()
    p.add_argument("--alpha", type=float, default=d.alpha, help="LM weight")
    p.add_argument("--beta", type=float, default=d.beta, help="bonus per word (token level: per token)")
    p.add_argument("--beam-width", type=int, default=d.beam_width, help="beams kept per frame")
    p.add_argument("--beam-prune-logp", type=float, default=d.beam_prune_logp, help="drop beams this far below "
                   "the best")
    p.add_argument("--token-min-logp", type=float, default=d.token_min_logp, help="skip labels below this ln p in "
                   "a frame (its best label is always tried)")
    p.add_argument("--unk-offset", type=float, default=d.unk_offset, help="log10 added for a word outside the "
                   "unigrams; the score of a partial word that starts none")
    p.add_argument("--no-prune-history", dest="prune_history", action="store_false", help="keep beams that agree "
                   "on their last n-1 words (pyctcdecode's decode_beams; its decode prunes them, as the default)")
    p.add_argument("--trailing-space", default=d.trailing_space, choices=["unk", "ignore"], help="unk: a beam "
                   "ending in a space scores an empty <unk> word, as pyctcdecode; ignore: </s> after its last word")
    p.add_argument("--nbest", type=int, default=None, help="hypotheses per utterance in --json (default 5)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="utterances decoded side by side")


def run(args: argparse.Namespace) -> None:
    """Decode (or tune), then write everything at once: nothing is written if any input is refused."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tune and not args.refs:
        raise SeqlmError("--tune needs --refs FILE, the reference transcripts")
    inputs = [*args.posteriors, args.labels, args.lm, args.refs, args.unigrams, args.hotwords]
    claim_output(args.out, args.force, "--out", inputs=inputs)
    decoder, names, mats = _prepare(args)
    bar = _progress(len(mats) * (len(args.alphas) * len(args.betas) if args.tune else 1), decoder.cfg.batch_size)
    if args.tune:
        text = json.dumps(tune(decoder, mats, _lines(args.refs), args.alphas, args.betas, bar and bar.update)) + "\n"
    else:
        nbest = decoder.decode(mats, bar and bar.update)
        text = "".join(_line(n, h, len(m), ms, args.json) for n, h, m, ms in
                       zip(names, nbest, mats, decoder.ms_per_utterance, strict=True))
    if bar is not None:
        bar.close()
    if args.out:
        ckpt.atomic_write_text(args.out, text)
    else:
        sys.stdout.write(text)


def _prepare(args: argparse.Namespace) -> tuple[CTCDecoder, list[str], list]:
    """The decoder and the utterances, every input checked."""
    args.alphas = parse_grid(args.tune_alpha, "--tune-alpha") if args.tune else []
    args.betas = parse_grid(args.tune_beta, "--tune-beta") if args.tune else []
    cfg = DecodeConfig(alpha=args.alpha, beta=args.beta, beam_width=args.beam_width,
                       beam_prune_logp=args.beam_prune_logp, token_min_logp=args.token_min_logp,
                       unk_offset=args.unk_offset, prune_history=args.prune_history, lm_unit=args.lm_unit,
                       trailing_space=args.trailing_space, batch_size=args.batch_size,
                       nbest=(args.nbest or 5) if args.json else 1)
    labels = read_labels(args.labels, args.blank, args.space)
    names, mats = read_posteriors(args.posteriors, len(labels))
    hot = parse_hotwords(_lines(args.hotwords) if args.hotwords else [], args.hotword, args.hotword_weight)
    unigrams = [w for w in _lines(args.unigrams) if w.strip()] if args.unigrams else None
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device.replace("auto", "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SeqlmError("--device cuda: torch sees no CUDA device here; use --device cpu")
    return CTCDecoder(labels, load_lm(args.lm), cfg, unigrams, hot, device), names, mats


def _line(name: str, nbest: list, frames: int, ms: float, as_json: bool) -> str:
    if not as_json:
        return nbest[0].text + "\n"
    hyps = [{"text": h.text, "score": h.score, "acoustic": h.acoustic, "lm": h.lm} for h in nbest]
    return json.dumps({"name": name, **hyps[0], "frames": frames, "ms_per_utterance": round(ms, 3),
                       "nbest": hyps}) + "\n"


def _lines(path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise SeqlmError(f"{path}: no such file")
    return p.read_text(encoding="utf-8").splitlines()


def _progress(total: int, batch: int):
    """A tqdm bar on standard error for inputs of more than one batch, when it is a terminal; else None."""
    if total <= batch or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="utt", file=sys.stderr)
