"""int8 inference on CPU (`seqlm quantize`): PTB test perplexity and evaluation speed, float32 against int8.

    python bench/quantize.py --rows lstm,rnn,transformer --threads 1
    python bench/quantize.py --rows lstm --model lstm=DIR --limit 200       # another model, a quick look
    python bench/quantize.py --rows lstm --threads 1 --profile 300     # where evaluation's time goes

Each row quantizes a trained PTB model (default: the component of bench/combination.py, i.e. the recipe of
sparse.py lstm-ptb, rnnlm_ptb.py rnn-bptt-h400-long or transformer_ptb.py transformer-ptb, trained first
when missing, so a row reproduces from nothing; `--model ROW=DIR` for another) into
bench/checkpoints/quantize/ROW-int8, then evaluates both on PTB test, sentence by sentence as `seqlm eval`,
timing one pass each after a short warm-up. Rows are named ROW-int8 (lstm-int8, rnn-int8, transformer-int8).
Fields: test_ppl, test_ppl_int8, tokens_per_s, tokens_per_s_int8, speedup (int8 over float32 tokens/s, one
run), ppl_ratio (int8 over float32), bytes and bytes_int8 (the model directories on disk), quantized (the
layers replaced). With --profile N, only rows ROW-int8-profile: torch.profiler over seqlm eval of the first N
test sentences, float32 and int8 (the top ops of each). Writes bench/results/quantize.json.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

import seqlm
from combination import component_dir
from seqlm.data.corpus import TokenStream, encode_file
from seqlm.eval.perplexity import evaluate, score_tokens
from seqlm.nn.quantize import quantize_dir

from common import CHECKPOINTS, merge_rows, profiled, ptb_dir, row_parser

COMPONENTS = {"lstm": "lstm", "rnn": "rnn", "transformer": "transformer"}  # row -> bench/combination.py component


def timed_eval(model, stream) -> tuple[dict, float]:
    """(seqlm eval's result, tokens per second of one scoring pass after a warm-up)."""
    score_tokens(model, limited(stream, 20))
    t = time.perf_counter()
    result = evaluate(model, stream)
    return result, result["tokens"] / (time.perf_counter() - t)


def limited(stream, n: int):
    """The first n sentences of a token stream (all when n is 0)."""
    if not n or n >= stream.num_sentences:
        return stream
    end = int(stream.starts[n])
    return TokenStream(stream.ids[:end], stream.starts[: n + 1])


def models_of(name: str, model_dir: Path | None, threads: int) -> tuple[Path, Path, dict, dict]:
    """(float32 dir, int8 dir, the float32 model's record, quantize_dir's summary); int8 made every time."""
    record = {"model_dir": str(model_dir)}
    if model_dir is None:
        model_dir, record = component_dir(COMPONENTS[name], threads)
    elif not (model_dir / "config.json").is_file():
        raise SystemExit(f"{name}: no trained model at {model_dir}")
    out = CHECKPOINTS / "quantize" / f"{name}-int8"
    return model_dir, out, record, quantize_dir(model_dir, out)  # the row's model may have changed


def profile_row(name: str, model_dir: Path | None, sentences: int, threads: int) -> dict:
    """Row ROW-int8-profile: seqlm eval of the first `sentences` test sentences under torch.profiler."""
    model_dir, out, record, summary = models_of(name, model_dir, threads)
    row = {"name": f"{name}-int8-profile", **record, "sentences": sentences, "quantized": summary["quantized"]}
    for key, path in (("fp32", model_dir), ("int8", out)):
        model = seqlm.load(path)
        stream = limited(encode_file(ptb_dir() / "test.txt", model.vocab), sentences)
        score_tokens(model, limited(stream, 20))  # warm-up
        row[f"profile_{key}"] = profiled(lambda m=model, s=stream: evaluate(m, s), 1)
    return row


def run_row(name: str, model_dir: Path | None, limit: int, threads: int) -> dict:
    model_dir, out, record, summary = models_of(name, model_dir, threads)
    fp32, int8 = seqlm.load(model_dir), seqlm.load(out)
    stream = limited(encode_file(ptb_dir() / "test.txt", fp32.vocab), limit)
    res, speed = timed_eval(fp32, stream)
    res_q, speed_q = timed_eval(int8, stream)
    size = {d: sum(f.stat().st_size for f in d.iterdir() if f.is_file()) for d in (model_dir, out)}
    return {
        "name": f"{name}-int8", **record, "sentences": stream.num_sentences, "tokens": res["tokens"],
        "test_ppl": res["ppl"], "test_ppl_int8": res_q["ppl"],
        "tokens_per_s": speed, "tokens_per_s_int8": speed_q, "speedup": speed_q / speed,
        "ppl_ratio": res_q["ppl"] / res["ppl"], "bytes": size[model_dir], "bytes_int8": size[out],
        "quantized": summary["quantized"],
    }


def main() -> None:
    p = row_parser(__doc__, "lstm,rnn,transformer", "fp32")
    p.add_argument("--model", action="append", default=[], help="ROW=DIR: the float32 model of a row")
    p.add_argument("--limit", type=int, default=0, help="first N test sentences only (0: all)")
    p.add_argument("--profile", type=int, default=0, help="only profile eval of the first N test sentences")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    models = {k: Path(v) for k, v in (m.split("=", 1) for m in args.model)}
    for name in args.rows.split(","):
        row = (profile_row(name, models.get(name), args.profile, args.threads) if args.profile else
               run_row(name, models.get(name), args.limit, args.threads))
        print(row, flush=True)
        merge_rows("quantize", [row], {"recipe": "torch.ao.quantization.quantize_dynamic (qint8) of the LSTM and "
                                                 "self-contained Linear layers; eval = seqlm eval on PTB test"})


if __name__ == "__main__":
    main()
