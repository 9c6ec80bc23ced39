"""int8 inference on CPU: PyTorch's dynamic quantization of a trained model's Linear and LSTM layers.

    seqlm quantize runs/lstm --out runs/lstm-int8      # then eval / score / generate it as any model

torch.ao.quantization.quantize_dynamic does the work: weights become int8 (one scale per matrix),
activations are quantized on the fly, so no calibration data is needed. Which layers:
  - every nn.LSTM;
  - every nn.Linear that only its own forward reads. A Linear whose weight other code reads directly (an
    LSTM's output matrix shared with the input embedding, a class-factorised softmax slicing its rows)
    stays float32: found by running the model once and watching reads. A model with an `untie()` method
    (the Transformer) is first given its own copy of a tied output matrix, which then becomes int8 (the
    directory's config says untied).
The model directory keeps config.json (plus "quantization": scheme and layer names), vocab.txt, and
weights.safetensors with the int8 matrices, their scales and zero points beside the float32 rest; no
pickles. seqlm.load rebuilds the float model from the config, quantizes the same layers and puts the
stored int8 weights in, so every command reads a quantized directory like any other.
"""

from __future__ import annotations

import json
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import LSTM as QLSTM
from torch.ao.nn.quantized.dynamic import Linear as QLinear

from seqlm import checkpoint as ckpt
from seqlm.errors import SeqlmError
from seqlm.outputs import claim_output, clear_model
from seqlm.protocol import Batch, require

SCHEME = "dynamic-int8"


def quantize(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """(the quantized copy of `model`, the names of the layers replaced); SeqlmError when none applies."""
    if not (isinstance(model, nn.Module) and model.capabilities().quantizable):
        raise SeqlmError(f"{model.family} models have no Linear or LSTM layers to quantize; "
                         "quantize applies to the neural families")
    names = quantizable(model)
    if not names:
        raise SeqlmError("this model has no Linear or LSTM layer that int8 quantization can replace")
    return _apply(model, names), names


def quantizable(model: nn.Module) -> list[str]:
    """Names of the LSTM and self-contained Linear modules (see the module docstring)."""
    read_outside = _weights_read_outside_forward(model)
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.LSTM) or (type(m) is nn.Linear and name not in read_outside)]


@contextmanager
def _quiet():
    """torch 2.13 warns on every quantized tensor it creates that these functions are deprecated (pytorch
    issue 184982, in favour of torchao); they work, and a user of `seqlm quantize` can do nothing about it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated")
        yield


def _apply(model: nn.Module, names: list[str]) -> nn.Module:
    with _quiet():
        q = torch.ao.quantization.quantize_dynamic(model, set(names), dtype=torch.qint8)
    for name in names:
        layer = q.get_submodule(name)
        if isinstance(layer, QLSTM):  # keep a zero-size float stand-in for each weight name, so code that
            for p in model.get_submodule(name)._flat_weights_names:  # reads a weight's dtype/device still works
                setattr(layer, p, torch.empty(0))
    q.family, q.data_config = model.family, model.data_config  # deepcopied by quantize_dynamic; set by load
    if "config" in vars(model):  # absent on a bare build
        q.config = model.config
    return q.eval()


def _weights_read_outside_forward(model: nn.Module) -> set[str]:
    """Names of the Linear modules whose weight or bias is read other than by their own forward, while the
    model scores a short batch and takes one step (what every command does)."""
    linears = {m: name for name, m in model.named_modules() if type(m) is nn.Linear}
    inside: set[nn.Module] = set()
    found: set[str] = set()

    class Watched(nn.Linear):
        def __getattr__(self, attr: str) -> Any:
            if attr in ("weight", "bias") and self not in inside:
                found.add(linears[self])
            return super().__getattr__(attr)

        def forward(self, x: Tensor) -> Tensor:
            inside.add(self)
            try:
                return super().forward(x)
            finally:
                inside.discard(self)

    for m in linears:
        m.__class__ = Watched
    try:
        _probe(model)
    finally:
        for m in linears:
            m.__class__ = nn.Linear
    return found


@torch.no_grad()
def _probe(model: nn.Module) -> None:
    """Score a two-token sentence and take one step from a sentence start."""
    was = model.training
    model.eval()
    v = model.vocab
    w = min(v.unk_id + 1, len(v) - 1)
    batch = Batch(torch.tensor([[v.bos_id, w]]), torch.tensor([[w, v.eos_id]]), torch.ones(1, 2, dtype=torch.bool),
                  torch.tensor([[True, False]]))
    try:
        model.score(batch)
        model.step(torch.tensor([v.bos_id]), model.initial_state(1))
    finally:
        model.train(was)


# ---- the model directory ---------------------------------------------------------------------------


def _int8(prefix: str, q: Tensor) -> dict[str, Tensor]:
    return {f"{prefix}.int8": q.int_repr(), f"{prefix}.scale": torch.tensor([q.q_scale()], dtype=torch.float64),
            f"{prefix}.zero_point": torch.tensor([q.q_zero_point()], dtype=torch.int64)}


def _from_int8(tensors: dict[str, Tensor], prefix: str) -> Tensor:
    return torch._make_per_tensor_quantized_tensor(tensors[f"{prefix}.int8"], float(tensors[f"{prefix}.scale"]),
                                                   int(tensors[f"{prefix}.zero_point"]))


def quantized_tensors(fp32: nn.Module, q: nn.Module, names: list[str]) -> dict[str, Tensor]:
    """What weights.safetensors holds: float32 tensors outside the quantized layers, int8 ones in them."""
    under = tuple(n + "." for n in names)
    out = {k: v for k, v in fp32.state_dict().items() if not k.startswith(under)}
    for name in names:
        layer = q.get_submodule(name)
        if isinstance(layer, QLinear):
            weight, bias = layer._weight_bias()
            out.update(_int8(f"{name}.weight", weight))
            if bias is not None:
                out[f"{name}.bias"] = bias
        else:  # a dynamic LSTM: {"weight": {"weight_ih_l0": int8, ...}, "bias": {"bias_ih_l0": float, ...}}
            wb = layer._weight_bias()
            for k, t in wb["weight"].items():
                out.update(_int8(f"{name}.{k}", t))
            out.update({f"{name}.{k}": t for k, t in wb["bias"].items()})
    return out


def quantize_dir(model_dir: str | Path, out: str | Path, force: bool = False) -> dict[str, Any]:
    """`seqlm quantize MODEL --out DIR`: write the int8 model directory (replacing a model there only with
    `force`); returns a summary."""
    import seqlm

    model_dir, out = Path(model_dir), Path(out)
    replace = claim_output(out, force, "--out", directory=True, inputs=[model_dir])
    meta = ckpt.read_json(model_dir / ckpt.CONFIG, "config.json") if model_dir.is_dir() else None
    if isinstance(meta, dict) and "quantization" in meta:
        raise SeqlmError(f"{model_dir}: already quantized ({meta['quantization'].get('scheme')})")
    model = seqlm.load(model_dir)
    require(model, quantizable="quantize")
    if model.untie():  # a tied output matrix becomes its own Linear
        meta["model"]["tie_embeddings"] = False  # the int8 directory describes the untied model it holds
    q, names = quantize(model)
    if replace:  # only now, after everything that can fail on the input: no two models in one directory
        clear_model(out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt.save_tensors(out / ckpt.WEIGHTS, quantized_tensors(model, q, names))
    shutil.copyfile(model_dir / ckpt.VOCAB, out / ckpt.VOCAB)
    for name in ("tokenizer.model", "tokenizer.json"):  # a subword model's tokenizer is part of its text
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, out / name)
    meta["quantization"] = {"scheme": SCHEME, "modules": names}
    ckpt.write_json(out / ckpt.CONFIG, meta)
    size = {d: sum(f.stat().st_size for f in Path(d).iterdir() if f.is_file()) for d in (model_dir, out)}
    return {"out": str(out), "scheme": SCHEME, "quantized": names, "bytes": size[model_dir],
            "bytes_int8": size[out]}


def load_quantized(model_dir: Path, fam: Any, cfg: Any, vocab: Any, info: Any) -> nn.Module:
    """seqlm.load for a directory `quantize_dir` wrote: build, quantize the listed layers, fill in the weights."""
    if not isinstance(info, dict) or info.get("scheme") != SCHEME or not isinstance(info.get("modules"), list):
        raise SeqlmError(f"{model_dir / ckpt.CONFIG}: unknown quantization {json.dumps(info)}; this seqlm reads "
                         f"{SCHEME!r} (seqlm quantize)")
    tensors = ckpt.load_tensors(model_dir / ckpt.WEIGHTS)
    names = [str(n) for n in info["modules"]]
    expected = fam.shapes(cfg, vocab)  # a meta-device build: an edited config cannot make us allocate a huge model
    under = tuple(n + "." for n in names)
    for key, shape in expected.items():
        stored = tensors.get(f"{key}.int8", tensors.get(key)) if key.startswith(under) else tensors.get(key)
        if stored is None or stored.shape != shape:
            raise SeqlmError(f"{model_dir}: weights do not match config.json/vocab.txt ({key}); the directory "
                             "mixes files of different models")
    fp32 = fam.build(cfg, vocab)
    fp32.load_state_dict({k: v for k, v in tensors.items() if k in expected and not k.startswith(under)},
                         strict=False)
    q = _apply(fp32.eval(), names)
    with _quiet():
        _fill(q, names, tensors)
    return q


def _fill(q: nn.Module, names: list[str], tensors: dict[str, Tensor]) -> None:
    """Put the stored int8 weights into the freshly quantized layers."""
    for name in names:
        layer = q.get_submodule(name)
        if isinstance(layer, QLinear):
            layer.set_weight_bias(_from_int8(tensors, f"{name}.weight"), tensors.get(f"{name}.bias"))
        else:
            keys = layer._weight_bias()
            layer.set_weight_bias({**{k: _from_int8(tensors, f"{name}.{k}") for k in keys["weight"]},
                                   **{k: tensors[f"{name}.{k}"] for k in keys["bias"]}})
