"""Lattice rescoring (seqlm.lattice): AMI lattices timing and states; WER on lattices built from PTB test.

    python bench/lattice_rescore.py --rows ami,wer --threads 1 --afp-dir DIR

`--afp-dir`: bench/afp_ptb.py's checkpoints (the `bptt` RNN and the `afp-kK` models it trained); KN3 / KN5
are estimated on PTB train here.

- `ami`: the 8 AMI lattices (words lowercased for the PTB vocabulary; out-of-vocabulary words are <unk>),
  rescored exactly with AFP-K (K = 1..4: the afp-kK model where trained, else the bptt network run with
  K iterations: the same cost and states) and KN3 / KN5, and approximately with the exact RNN (hypotheses
  merged by their last 3 words): seconds, expanded nodes and arcs per lattice.
- `wer`: synthetic lattices from the first SENTENCES PTB test sentences (recipe in the row): one slot per word
  holding the reference and COMPETITORS words drawn from the PTB train unigram distribution; acoustic
  log-likelihood SIGMA * N(0, 1) per candidate plus BONUS for the reference (so the acoustics prefer the
  reference only some of the time); no first-pass LM score. WER of the acoustic 1-best, after KN5 (exact),
  after AFP-K (exact), after the RNN with n-gram merging (approximate), and after RNN 100-best rescoring (the
  100 best of the KN5-rescored lattice, each sentence rescored by the RNN).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

import seqlm
from seqlm.cli import main as seqlm_main
from seqlm.data.corpus import encode_sentences
from seqlm.eval.lattice_rescore import rescore_lattice
from seqlm.eval.perplexity import score_tokens
from seqlm.lattice import Arc, Lattice, WordMap, best_paths, read_lattices, words_of
from seqlm.models.afp import with_iterations

from common import CHECKPOINTS, merge_rows, ptb_dir, row_parser

AMI = Path(os.environ.get("SEQLM_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")) / "lattices" / "ami"
SENTENCES, COMPETITORS, SIGMA, BONUS, SEED, LMSCALE, MERGE, NBEST = 50, 2, 2.0, 1.0, 1, 1.0, 3, 100


def kn(order: int):
    out = CHECKPOINTS / "lattice_rescore" / f"kn{order}"
    if not (out / "model.arpa").exists():
        assert seqlm_main(["train", "--model", "kn", "--order", str(order), "--data", str(ptb_dir()),
                           "--out", str(out)]) == 0
    model = seqlm.load(out)
    note = None
    if getattr(model, "context_order", None) is None:  # KN predicts from n-1 words; the class does not say so yet
        model.context_order, note = model.order, "context_order set to the KN order by this bench"
    return model, note


def afp_models(afp_dir: Path) -> dict:
    """name -> (model, where it came from)."""
    bptt = seqlm.load(afp_dir / "bptt")
    out = {"rnn-approx": (with_iterations(bptt, None), "bptt model, exact recurrence")}
    for k in (1, 2, 3, 4, 6, 8):
        d = afp_dir / f"afp-k{k}"
        if (d / "weights.safetensors").exists():
            out[f"afp-k{k}"] = (seqlm.load(d), f"afp-k{k} (AFP-trained)")
        elif k <= 4:
            out[f"afp-k{k}"] = (with_iterations(bptt, k), f"bptt network run with {k} iterations")
    return out


def ami_row(models: dict, args) -> dict:
    lats = [(p.name, read_lattices(p)[1][0]) for p in sorted(AMI.glob("*.lat.gz"))]
    if len(lats) != 8:
        sys.exit(f"expected the 8 AMI lattices in {AMI}, found {len(lats)}: set SEQLM_DATA")
    results = {}
    for name, (model, source) in models.items():
        if name.startswith("afp-k") and int(name[5:]) > 4:
            continue
        per = []
        for fname, lat in lats:
            words = WordMap(model.vocab, lowercase=True)
            _, _, rep = rescore_lattice(lat, model, words, merge_order=MERGE if name == "rnn-approx" else 4)
            per.append({"file": fname, **{k: rep[k] for k in ("nodes", "arcs", "expanded_nodes", "expanded_arcs",
                        "max_states_per_node", "order", "exact", "seconds")}, "unknown_words": len(words.unknown)})
        results[name] = {"model": source, "lattices": per, "seconds": sum(r["seconds"] for r in per),
                         "expanded_nodes": sum(r["expanded_nodes"] for r in per),
                         "all_exact": all(r["exact"] for r in per)}
        print(name, json.dumps({k: v for k, v in results[name].items() if k != "lattices"}), flush=True)
    return {"name": "ami", "lattices": len(lats), "merge_order_rnn": MERGE, "models": results,
            "threads": args.threads}


def ptb_lattices(vocab, rng) -> tuple[list[Lattice], list[list[str]]]:
    """The recipe of the module docstring: one sausage lattice per PTB test sentence."""
    refs = [line.split() for line in (ptb_dir() / "test.txt").read_text().splitlines()[:SENTENCES]]
    counts = np.asarray(vocab.counts, dtype=np.float64)
    for special in ("<s>", "</s>", "<unk>"):
        if special in vocab.stoi:
            counts[vocab.stoi[special]] = 0
    probs = counts / counts.sum()
    lats = []
    for i, ref in enumerate(refs):
        arcs = []
        for t, w in enumerate(ref):
            others = set()
            while len(others) < COMPETITORS:
                c = vocab.itos[int(rng.choice(len(probs), p=probs))]
                if c != w:
                    others.add(c)
            for cand in [w, *sorted(others)]:
                a = SIGMA * rng.standard_normal() + (BONUS if cand == w else 0.0)
                arcs.append(Arc(t, t + 1, cand, a, 0.0))
        lats.append(Lattice(f"ptb-test-{i}", len(ref) + 1, arcs, 0, len(ref), lmscale=LMSCALE))
    return lats, refs


def edit_distance(a: list[str], b: list[str]) -> int:
    d = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        prev, d[0] = d[0], i
        for j in range(1, len(b) + 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (a[i - 1] != b[j - 1]))
    return d[len(b)]


def wer(hyps: list[list[str]], refs: list[list[str]]) -> float:
    return sum(edit_distance(h, r) for h, r in zip(hyps, refs, strict=True)) / sum(map(len, refs))


def wer_row(models: dict, kn5, args) -> dict:
    rng = np.random.default_rng(SEED)
    lats, refs = ptb_lattices(models["rnn-approx"][0].vocab, rng)  # the RNN's vocab.txt has the train counts
    out = {"acoustic": {"wer": wer([words_of(best_paths(lat)[0][1]) for lat in lats], refs)}}
    systems = {"kn5": (kn5, MERGE), **{k: (m, MERGE) for k, (m, _) in models.items()}}
    kn5_lats = []
    for name, (model, merge) in systems.items():
        t, hyps, exact = time.perf_counter(), [], True
        for lat in lats:
            lat_out, paths, rep = rescore_lattice(lat, model, WordMap(model.vocab), merge_order=merge)
            hyps.append(words_of(paths[0][1]))
            exact &= rep["exact"]
            if name == "kn5":
                kn5_lats.append(lat_out)
        out[name] = {"wer": wer(hyps, refs), "exact": exact, "seconds": time.perf_counter() - t}
        print(name, json.dumps(out[name]), flush=True)
    rnn = models["rnn-approx"][0]
    t, hyps = time.perf_counter(), []
    for lat in kn5_lats:  # the 100 best of the KN5 lattice, each sentence rescored by the RNN
        nbest = best_paths(lat, NBEST)
        sents = [words_of(arcs) for _, arcs in nbest]
        lm = score_tokens(rnn, encode_sentences(sents, rnn.vocab)).sentence_totals()
        totals = [sum(a.acoustic for a in arcs) + LMSCALE * x for (_, arcs), x in zip(nbest, lm, strict=True)]
        hyps.append(sents[int(np.argmax(totals))])
    out["rnn-100best"] = {"wer": wer(hyps, refs), "exact": True, "seconds": time.perf_counter() - t,
                          "nbest_from": "kn5-rescored lattice"}
    recipe = {"sentences": SENTENCES, "competitors_per_word": COMPETITORS, "competitors": "PTB train unigram",
              "acoustic": f"{SIGMA} * N(0,1) per candidate + {BONUS} for the reference", "seed": SEED,
              "lmscale": LMSCALE, "rnn_merge_order": MERGE, "nbest": NBEST, "words": sum(map(len, refs))}
    return {"name": "wer", "recipe": recipe, "systems": out, "threads": args.threads}


def main() -> None:
    p = row_parser(__doc__, "ami,wer", "fp32")
    p.add_argument("--afp-dir", type=Path, default=CHECKPOINTS / "afp_ptb")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    models = afp_models(args.afp_dir)
    kn3, note3 = kn(3)
    kn5, note5 = kn(5)
    for name in args.rows.split(","):
        if name == "ami":
            row = ami_row({"kn3": (kn3, "KN3 on PTB train"), "kn5": (kn5, "KN5 on PTB train"), **models}, args)
        elif name == "wer":
            row = wer_row(models, kn5, args)
        else:
            sys.exit(f"unknown row {name}; choose from ami, wer")
        row["notes"] = [n for n in (note3, note5) if n]
        row["afp_dir"] = str(args.afp_dir)
        merge_rows("lattice_rescore", [row])


if __name__ == "__main__":
    main()
