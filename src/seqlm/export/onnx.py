"""ONNX export of a model's step function, its state as explicit inputs and outputs: `seqlm export DIR --onnx OUT`.

Signatures (N rows of T tokens; ids are 0-based line numbers of the model directory's vocab.txt):

    lstm         x int64 (N, T), h0 float32 (L, N, H), c0 float32 (L, N, H)
                 -> log_probs float32 (N, T, V), next_h0 (L, N, H), next_c0 (L, N, H)
    rnn          x int64 (N, T), h0 float32 (1, N, H) -> log_probs (N, T, V), next_h0 (1, N, H)
    transformer  x int64 (N, T), 1 <= T <= context -> log_probs (N, T, V)
    fnn, afp     x int64 (N, T), context int64 (N, K) -> log_probs (N, T, V), next_context (N, K)
                 (K = n - 1 inputs of an order-n fnn, K iterations of an afp model; an afp model read exactly,
                 with no finite context, exports as the rnn family does)

log_probs[n, t] is the natural-log distribution of the token after x[n, t]: what `step` returns after reading
it. A sentence is read from the start state, starting with sos_id (seqlm reads `</s>` as the start symbol), and
scored up to and including eos_id. The recurrent families take the state of the previous call and return the
next one, so a text may come in calls of any length; the start state is `initial_state` in every cell
(metadata: 0 for the LSTM, 0.1 for a sigmoid Elman RNN, as seqlm's). The Transformer has no carried state: each
call is a window read from position 0, and a sentence longer than `context` is read in seqlm's windows (the
first `context` tokens, then `stride` new ones a window; seqlm.export.runtime.OnnxLM does it). The state of
fnn and afp is the last K inputs, oldest first, -1 before the start (all -1 at the start).

The LSTM's layout is the one sherpa-onnx's RNN LM reads (OnlineRnnLM): inputs x (1, T), h and c (L, 1, H) and
outputs (scores, h, c), bound by position; num_layers, hidden_size and sos_id from the metadata; zero start
states, then sos_id read. The input names are those of icefall's RNN-LM export (x, h0, c0 -> ..., next_h0,
next_c0); the first output is `log_probs` (torch's exporter gives an inner value the name `log_softmax`).

The torch.export-based exporter (`dynamo=True`, which needs onnxscript) is the one used: torch 2.13's
TorchScript exporter is deprecated, cannot trace the Elman layer, and traced a Transformer whose output for a
window of another length than the example's was wrong (0.03 off); this one gives every length right.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlm import checkpoint as ckpt
from seqlm.errors import SeqlmError
from seqlm.nn.fixed_point import fixed_point, input_preactivation
from seqlm.outputs import MODEL_FILES, claim_output
from seqlm.protocol import LanguageModel

OPSET = 18
INSTALL = "pip install 'seqlm[onnx]' (onnx, onnxscript; onnxruntime to check and run the file)"


def _log_probs(out: nn.Module, h: Tensor) -> Tensor:
    """The output layer's (N, T, V) distributions of hidden states h (N, T, H)."""
    return out.log_probs(h.flatten(0, 1)).unflatten(0, h.shape[:2])  # (N, T, V)


def _example_tokens(model: LanguageModel) -> Tensor:
    """(2, 5) ids to trace with: 2 rows and 5 columns, so neither axis is taken for a constant 1."""
    return torch.arange(10).remainder(len(model.vocab)).view(2, 5)


class _Step(nn.Module):
    """A family's step over T tokens as a graph: what the exporter traces."""

    inputs: tuple[str, ...] = ("x",)
    outputs: tuple[str, ...] = ("log_probs",)

    def __init__(self, model: Any):
        super().__init__()
        self.model = model

    def example(self) -> tuple[Tensor, ...]:
        return (_example_tokens(self.model),)

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        # min 2: the recurrent loops' traces hold only for sizes other than 1 (the graph is right for 1 too:
        # tests/test_export_onnx.py); with min 1 torch's exporter quietly made T a constant
        rows, length = torch.export.Dim("N", min=2), torch.export.Dim("T", min=2)
        return {"x": {0: rows, 1: length}} | {name: {1: rows} for name in self.inputs[1:]}

    def metadata(self) -> dict[str, Any]:
        return {}


class LSTMStep(_Step):
    inputs, outputs = ("x", "h0", "c0"), ("log_probs", "next_h0", "next_c0")

    def forward(self, x: Tensor, h0: Tensor, c0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h, (h1, c1) = self.model.lstm(self.model.embedding(x), (h0, c0))  # (N, T, H), (L, N, H) each
        return _log_probs(self.model.out, h), h1, c1

    def example(self) -> tuple[Tensor, ...]:
        return (_example_tokens(self.model), *self.model.initial_state(2))  # (L, 2, H) each

    def metadata(self) -> dict[str, Any]:
        lstm = self.model.lstm
        return {"num_layers": lstm.num_layers, "hidden_size": lstm.hidden_size, "initial_state": 0.0}


class ElmanStep(_Step):
    """The Elman recurrence as a torch.while_loop, which the exporter writes as an ONNX Loop over the T inputs
    (torch's own RNN and seqlm's Python loop over steps are unrolled for the example's length instead)."""

    inputs, outputs = ("x", "h0"), ("log_probs", "next_h0")

    def forward(self, x: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
        elman = self.model.rnn
        pre = input_preactivation(elman, self.model.embedding(x)).transpose(0, 1)  # (T, N, H): W_x x + b
        w_hh = elman.weight_hh.t().clone()  # (H, H); a copy: the loop's body may not alias a parameter
        f = torch.sigmoid if elman.activation == "sigmoid" else torch.tanh

        def more(i: Tensor, out: Tensor, h: Tensor) -> Tensor:
            return i < pre.size(0)

        def one(i: Tensor, out: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            t = i.item()
            torch._check_is_size(t, max=pre.size(0) - 1)
            h = f(pre[t] + h @ w_hh)  # (N, H)
            out = out.clone()
            out[t] = h
            return i + 1, out, h

        _, out, last = torch.while_loop(more, one, (torch.tensor(0), torch.empty_like(pre), h0[0]))
        return _log_probs(self.model.out, out.transpose(0, 1)), last.unsqueeze(0)  # (N, T, V), (1, N, H)

    def example(self) -> tuple[Tensor, ...]:
        return _example_tokens(self.model), self.model.initial_state(2).unsqueeze(0)  # (1, 2, H)

    def metadata(self) -> dict[str, Any]:
        elman = self.model.rnn
        return {"num_layers": 1, "hidden_size": elman.hidden, "activation": elman.activation,
                "initial_state": float(elman.initial_state(1)[0, 0])}


class WindowStep(_Step):
    """One window of the Transformer, positions from 0. The blocks are called here with causal attention
    (mask None) rather than through `run`, whose mask of packed sentences needs cummax, which ONNX lacks."""

    def forward(self, x: Tensor) -> Tensor:
        m = self.model
        h = m.embed(x) + m.pos[: x.shape[1]]  # (N, T, D)
        for block in m.blocks:
            h, _ = block(h, None)  # (N, T, D)
        return F.log_softmax(m.logits(m.norm(h)).float(), dim=-1)  # (N, T, V)

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        return {"x": {0: torch.export.Dim("N"), 1: torch.export.Dim("T", max=self.model.context)}}

    def metadata(self) -> dict[str, Any]:
        return {"context": self.model.context, "stride": self.model.stride, "num_layers": len(self.model.blocks)}


class ContextStep(_Step):
    """A finite-context model (fnn: n - 1 inputs; afp: K) whose state is its last K inputs, oldest first, -1
    before the text's start: seqlm's own `step` state of both families."""

    inputs, outputs = ("x", "context"), ("log_probs", "next_context")

    def __init__(self, model: Any):
        super().__init__(model)
        self.size = model.context_window()  # K inputs, the latest included

    def forward(self, x: Tensor, context: Tensor) -> tuple[Tensor, Tensor]:
        ids = torch.cat([context, x], dim=1)  # (N, K + T)
        return self.scores(ids), ids[:, -self.size :]

    def example(self) -> tuple[Tensor, ...]:
        return _example_tokens(self.model), self.model.initial_state(2)  # (2, K) of -1

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        shapes = super().dynamic_shapes()
        return shapes | {"context": {0: shapes["x"][0]}}  # batch first

    def metadata(self) -> dict[str, Any]:
        return {"context_size": self.size, "initial_state": -1}


class FNNStep(ContextStep):
    def scores(self, ids: Tensor) -> Tensor:
        T, K = ids.shape[1] - self.size, self.size
        windows = torch.stack([ids[:, 1 + k : 1 + k + T] for k in range(K)], dim=-1)  # (N, T, K), oldest first
        windows = torch.where(windows < 0, self.model.vocab.bos_id, windows)  # before the start: <s>, as fnn reads
        feats = self.model.embedding(windows).flatten(-2)  # (N, T, K * E)
        return self.model.head.log_probs(feats)  # (N, T, V)


class AFPStep(ContextStep):
    """AFP-K: K fixed-point iterations over the context and x, as seqlm.models.afp's stream scoring: a position
    whose previous input is before the start restarts from h_0."""

    def scores(self, ids: Tensor) -> Tensor:
        m, K = self.model, self.size
        x = m.embedding(ids.clamp(min=0))  # (N, K + T, E)
        gone = torch.cat([torch.ones_like(ids[:, :1], dtype=torch.bool), ids[:, :-1] < 0], dim=1)  # (N, K + T)
        h = fixed_point(m.rnn, x, m.rnn.initial_state(ids.shape[0], ids.device), gone, K)[:, K:]  # (N, T, H)
        return _log_probs(m.out, h)


def _afp(model: Any) -> _Step:
    """AFP-K with K iterations; an afp model read exactly (no finite context) is the Elman recurrence."""
    return ElmanStep(model) if model.capabilities().context_order is None else AFPStep(model)


STEPS: dict[str, Any] = {"rnn": ElmanStep, "lstm": LSTMStep, "transformer": WindowStep, "afp": _afp,
                         "fnn": FNNStep}


def metadata(model: LanguageModel, step: _Step) -> dict[str, str]:
    """ONNX metadata_props: what a reader needs besides the graph (all values strings)."""
    from seqlm import __version__

    vocab = model.vocab
    meta = {"model_type": f"seqlm-{model.family}", "family": model.family, "sos_id": vocab.bos_id,
            "eos_id": vocab.eos_id, "unk_id": vocab.unk_id, "vocab_size": len(vocab),
            "text": json.dumps(asdict(model.text_spec())), "capabilities": json.dumps(asdict(model.capabilities())),
            "inputs": ",".join(step.inputs), "outputs": ",".join(step.outputs), "seqlm_version": __version__}
    return {k: str(v) for k, v in (meta | step.metadata()).items()}


def export_onnx(model_dir: str | Path, out: str | Path, force: bool = False) -> dict[str, Any]:
    """Write `out`, the ONNX graph of the model in `model_dir`; the summary `seqlm export` prints."""
    import seqlm

    model = seqlm.load(model_dir)
    if model.family not in STEPS:
        raise SeqlmError(f"export --onnx: {model.family} models are not exported; the families that are: "
                         f"{', '.join(STEPS)}")
    if "quantization" in ckpt.read_json(Path(model_dir, ckpt.CONFIG)):  # torch's int8 layers have no ONNX form
        raise SeqlmError("export --onnx: this is an int8 model (seqlm quantize); export the float model it was "
                         "made from")
    claim_output(out, force, "--onnx", inputs=[model_dir, *(Path(model_dir, name) for name in MODEL_FILES)])
    step = STEPS[model.family](model).eval()
    program = _export(step, model.family)
    program.model.metadata_props.update(metadata(model, step))
    with ckpt.atomic_path(out) as tmp:
        program.save(str(tmp), external_data=False)
    return {"family": model.family, "onnx": str(out), "bytes": Path(out).stat().st_size, "opset": OPSET,
            "inputs": list(step.inputs), "outputs": list(step.outputs), "check": check(model, out)}


def _export(step: _Step, family: str) -> Any:
    try:
        import onnx  # noqa: F401  (the exporter needs both)
        import onnxscript  # noqa: F401
    except ImportError:
        raise SeqlmError(f"seqlm export --onnx needs the onnx extra: {INSTALL}") from None
    try:
        with torch.no_grad(), _quiet():
            return torch.onnx.export(step, step.example(), dynamo=True, verbose=False, opset_version=OPSET,
                                     input_names=list(step.inputs), output_names=list(step.outputs),
                                     dynamic_shapes=step.dynamic_shapes())
    except Exception as e:  # a layer the exporter has no ONNX for (int8, sparse codes): one line, not a trace
        first = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()[0] if str(e).strip() else ""
        raise SeqlmError(f"this {family} model could not be exported to ONNX ({type(e).__name__}: {first})") from None


@contextlib.contextmanager
def _quiet():
    """The exporter's progress lines, deprecation warnings and 'torchvision is not installed' notes: not the
    user's concern (seqlm prints one JSON line)."""
    log = logging.getLogger("torch.onnx")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(None):
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def check(model: LanguageModel, path: str | Path) -> dict[str, Any]:
    """The exported file against seqlm's own scores on a probe sentence (every id in turn, 3 times over
    `context` tokens for a window model): the largest difference of ln p. Skipped without onnxruntime."""
    from seqlm.eval.perplexity import score_tokens
    from seqlm.export.runtime import OnnxLM, runtime_missing

    if runtime_missing():
        return {"skipped": "onnxruntime is not installed"}
    V, window = len(model.vocab), model.capabilities().window
    n = max(24, 3 * window) if window else 24
    ids = np.append((np.arange(1, n) * 7919) % V, model.vocab.eos_id).astype(np.int32)  # (n,)
    from seqlm.data.corpus import TokenStream

    stream = TokenStream(ids, np.array([0, len(ids)]))
    ours = score_tokens(model, stream).logp  # (n,)
    theirs = OnnxLM(path).score(stream)  # (n,)
    return {"tokens": len(ids), "max_abs_diff": float(np.abs(ours - theirs).max())}
