"""Training speed of every vocabulary-sized output layer of the full-corpus GCIDE recipe (bench/sparse.py's
`gcide-all-*` rows: V = 61k, the same 2 x 200 LSTM, 32 x 20 batches of the whole training split), in fp32
and in bf16, all measured in this one run, so that speed compares on equal terms even where the long rows
ran at different precisions or on different machines.

    python bench/output_speed.py --threads 1 [--seconds 60]
    python bench/output_speed.py --threads 1 --variants full,nce,nce-zreg     # some rows (full always runs)

Each row trains a fresh model from the start of the training split through the family's own batches and
step (common.train_speed: 3 warm-up steps, then `--seconds` of training). `vs_full` is the row's words/s
over the full softmax's at the same precision; `vs_full_fp32` over the fp32 full softmax's. `full-unfused`
is the full softmax through autograd's linear + cross_entropy instead of seqlm.nn.cross_entropy (what
training did before it): the fused layer's gain, measured in the same run. The codes rows
use the skip-gram vectors and sparse codes of the training split that the `gcide-all-codes-*` rows use
(built first if absent; bench/sparse.py `_codes`).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import sparse
from seqlm.nn import softmax
from seqlm.nn.softmax import parameters_by_layer
from seqlm.train.precision import native_bf16

from common import merge_rows, train_speed

VARIANTS = ("full", "full-unfused", "nce", "nce-zreg", "adaptive", "class", "tree", "codes-ibias")


def autograd_cross_entropy(h, weight, bias, targets):
    """The unfused path: (N, V) logits upcast, then log-softmax and nll_loss through autograd."""
    return F.cross_entropy(F.linear(h, weight, bias).float(), targets, reduction="none")  # (N,)


def measure(variant: str, precision: str, data, codes: str, args) -> dict:
    _, data_cfg, vocab, train, _, _ = data
    layer = sparse.ALL_VARIANTS[variant.removesuffix("-unfused")]
    flags = [codes if f == "{codes}" else f for f in [*sparse.ALL_ENCODER, *layer]]
    cfg = sparse._lstm_setup("gcide", flags, data_cfg, vocab, argparse.Namespace(threads=args.threads,
                                                                                 precision=precision))
    torch.manual_seed(0)
    fused = softmax.linear_cross_entropy
    softmax.linear_cross_entropy = autograd_cross_entropy if variant.endswith("-unfused") else fused
    try:
        words_per_s, model = train_speed("lstm", cfg, vocab, train, args.seconds)
    finally:
        softmax.linear_cross_entropy = fused
    return {"name": f"speed-{variant}-{precision}", "variant": variant, "precision": precision,
            "train_words_per_s": words_per_s, "seconds": args.seconds, "flags": flags,
            "embed_output_params": parameters_by_layer(model)["embedding+output"], "threads": args.threads}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seconds", type=float, default=60.0, help="training time measured per row")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="rows to run (comma-separated); full runs in any case: every row's vs_full is from this run")
    args = p.parse_args()
    variants = ["full", *[v for v in args.variants.split(",") if v != "full"]]
    if unknown := set(variants) - set(VARIANTS):
        p.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    torch.set_num_threads(args.threads)
    data = sparse._all_data("gcide")
    codes, info = ("", None)
    if "codes-ibias" in variants:  # the codes of the training split, built first where absent
        codes, info = sparse._codes("gcide", data[0], args.threads, sparse.ALL_WORK)
    precisions = ("fp32", "bf16") if native_bf16() or torch.cuda.is_available() else ("fp32",)
    rows = [measure(v, prec, data, str(codes), args) for prec in precisions for v in variants]
    base = {q["precision"]: q["train_words_per_s"] for q in rows if q["variant"] == "full"}
    for r in rows:
        r["vs_full"] = r["train_words_per_s"] / base[r["precision"]]
        r["vs_full_fp32"] = r["train_words_per_s"] / base["fp32"]
        print(f"{r['name']:>18}  {r['train_words_per_s']:8.0f} words/s  {r['vs_full']:5.2f}x full", flush=True)
    if info is not None:
        rows[-1]["codes_stage"] = info
    merge_rows("output_speed", rows)


if __name__ == "__main__":
    main()
