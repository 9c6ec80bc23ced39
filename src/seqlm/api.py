"""The public surface: save/load a model directory, score text, generate."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from seqlm import checkpoint as ckpt
from seqlm.config import DataConfig, from_dict
from seqlm.data.corpus import tokenize_raw
from seqlm.data.tokenizers import files_vocab, read_tokens, stored_data
from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError
from seqlm.eval.generate import sample
from seqlm.eval.perplexity import LOG10, score_tokens
from seqlm.protocol import LanguageModel, encode_lines

ARPA_SUFFIXES = (".arpa", ".arpa.gz", ".lm", ".lm.gz")


def save(model: Any, out: str | Path, data: DataConfig | None = None) -> None:
    """Write config.json, vocab.txt and the weights (or ARPA) of `model` into directory `out`."""
    from seqlm.registry import family

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if data is not None:
        model.data_config = data
    with files_vocab(model):  # a NeMo-encoded n-gram model's files name its pieces by their ids
        family(model.family).save(model, out)
    model.vocab.save(out / ckpt.VOCAB)
    stored = stored_data(model.data_config, out)  # --unit token: the tokenizer goes into the directory
    ckpt.write_json(out / ckpt.CONFIG, model_meta(model) | ({"data": asdict(stored)} if stored else {}))


def model_meta(model: LanguageModel) -> dict[str, Any]:
    """config.json: the family, its config, how text was read, and the model's contract (text conventions and
    capabilities, written for readers of the directory; seqlm derives them again from the model on load)."""
    meta = {"family": model.family, "model": asdict(model.config)}
    if model.data_config is not None:
        meta["data"] = asdict(model.data_config)
    return meta | {"text": asdict(model.text_spec()), "capabilities": asdict(model.capabilities())}


def load(path: str | Path, data: DataConfig | None = None) -> LanguageModel:
    """A model directory written by seqlm, or an n-gram file: ARPA (KenLM, SRILM, seqlm), seqlm's binary or KenLM's.
    `data`: how an n-gram file's words read text (a file has no config.json), e.g. a NeMo token model:
    DataConfig(unit="token", tokenizer="tokenizer.model", arpa_encoding="nemo-offset"); words by default."""
    from seqlm.registry import family

    path = Path(path)
    from seqlm.ngram.binary import is_binary
    from seqlm.ngram.kenlm_binary import is_kenlm_binary

    # an ARPA file by its name; seqlm's binary n-gram file or KenLM's (build_binary) by its magic
    if path.is_file() and (path.name.endswith(ARPA_SUFFIXES) or is_binary(path) or is_kenlm_binary(path)):
        from seqlm.models.kn import KNConfig, load_ngram_file

        model = load_ngram_file(path)
        model.family, model.config = "kn", KNConfig(order=model.order)
        model.data_config = data or DataConfig()  # an ARPA file's words are whitespace-separated tokens
        read_tokens(model, None)
        return model
    if not path.is_dir():
        raise SeqlmError(f"{path}: no such model directory (train one with `seqlm train --out {path}`)")
    if data is not None and data != DataConfig():
        raise SeqlmError(f"{path}: a model directory states how it reads text (config.json); --tokenizer and "
                         "--arpa-encoding are for n-gram files")
    meta = ckpt.read_json(path / ckpt.CONFIG, "config.json")
    if not isinstance(meta, dict) or "family" not in meta or "model" not in meta:
        raise SeqlmError(f"{path / ckpt.CONFIG}: not a seqlm config (needs 'family' and 'model')")
    fam = family(str(meta["family"]))
    cfg = from_dict(fam.config, meta["model"])
    vocab = Vocab.load(path / ckpt.VOCAB)
    if "quantization" in meta:  # written by `seqlm quantize`: int8 layers (seqlm.nn.quantize)
        from seqlm.nn.quantize import load_quantized

        model = load_quantized(path, fam, cfg, vocab, meta["quantization"])
    else:
        model = fam.load(path, cfg, vocab)
    model.family, model.config = meta["family"], cfg
    model.data_config = from_dict(DataConfig, meta.get("data", {}))
    read_tokens(model, path)  # --unit token: the directory's tokenizer; NeMo-encoded words back to pieces
    if model.vocab != vocab:
        raise SeqlmError(f"{path}: vocab.txt does not match the model file; the directory mixes two models")
    return model


def _token_lists(sentences: Sequence[str | Sequence[str]], raw: bool = False) -> list[list[str]]:
    """Each sentence as its words: a list of words as given, a string split on whitespace (like KenLM's
    Python API; by seqlm.data.corpus.tokenize_raw for a model trained on raw text), never a string's
    characters: a character model reads the words' characters itself (protocol.encode_lines)."""
    if isinstance(sentences, str):
        raise SeqlmError("score_text takes a list of sentences, got one string; use score_text(lm, [text]) or "
                         "score_sentence(lm, text)")
    out = []
    for i, s in enumerate(sentences):
        if isinstance(s, str):
            out.append([w for part in tokenize_raw(s) for w in part] if raw else s.split())
        elif isinstance(s, Sequence) and all(isinstance(w, str) for w in s):
            out.append(list(s))
        else:
            raise SeqlmError(f"score_text: sentence {i} is a {type(s).__name__}; give a string or a list of words")
    return out


def score_text(model: LanguageModel, sentences: Sequence[str | Sequence[str]]) -> list[list[float]]:
    """log10 probability of every token of every sentence, `</s>` last (KenLM's full_scores).

    A sentence is a list of words, or a string, which is split on whitespace: `["the cat sat"]` and
    `[["the", "cat", "sat"]]` score the same. The model's text conventions apply (its unit: a character
    model scores every character and word boundary; raw text).
    """
    stream = encode_lines(model, _token_lists(sentences, model.text_spec().raw))
    logp = score_tokens(model, stream).logp / LOG10
    starts = stream.starts
    return [logp[starts[i] : starts[i + 1]].tolist() for i in range(stream.num_sentences)]


def score_sentence(model: LanguageModel, sentence: str) -> float:
    """log10 P(sentence </s> | <s>), like KenLM's `model.score(sentence)`."""
    return float(np.sum(score_text(model, [sentence])[0]))


def perplexity(model: LanguageModel, sentence: str) -> float:
    scores = score_text(model, [sentence])[0]
    return math.pow(10.0, -sum(scores) / len(scores))


def generate(model: LanguageModel, num: int = 1, seed: int = 0, temperature: float = 1.0,
             max_len: int = 100) -> list[str]:
    """Sample `num` sentences (ancestral sampling from `step`)."""
    return [" ".join(s) for s in sample(model, num, seed, temperature, max_len)]


def describe(path: str | Path) -> dict:
    """`seqlm info`: family, config, parameter counts and vocabulary size of a model directory or n-gram file.

    An n-gram model's parameters are its stored numbers: a probability per n-gram and a backoff weight per
    n-gram below the highest order. A file (ARPA or binary) carries no seqlm config: `config` is null.
    """
    from seqlm.nn.softmax import parameters_by_layer

    model = load(path)
    info: dict[str, Any] = {"family": model.family}
    if Path(path).is_file():
        from seqlm.ngram.binary import is_binary
        from seqlm.ngram.kenlm_binary import is_kenlm_binary

        kind = ("a seqlm binary n-gram file" if is_binary(Path(path)) else "a KenLM binary file (build_binary)"
                if is_kenlm_binary(Path(path)) else "an ARPA file (KenLM, SRILM or seqlm)")
        info.update(config=None, source=f"{kind}, not a seqlm model directory: no config")
    else:
        info["config"] = asdict(model.config)
    if isinstance(model, nn.Module):
        params = sum(p.numel() for p in model.parameters())
        by_layer = parameters_by_layer(model)
        if by_layer:  # a shared embedding/output matrix counts once, under whichever name holds it
            by_layer["embedding+output"] = sum(by_layer.get(k, 0) for k in ("embedding", "embed", "out"))
        info.update(parameters=params, parameters_by_layer=by_layer)
        tied = getattr(model.config, "tie_embeddings", None)
        if tied is not None:
            info["tied"] = tied  # True: the output layer reuses the input embedding (counted once)
    info.update(model.describe())  # n-gram sizes and parameters, a history rule
    info.setdefault("parameters", None)  # a cache or a mixture stores no parameters of its own
    info["vocab_size"] = len(model.vocab)
    return info | {"text": asdict(model.text_spec()), "capabilities": asdict(model.capabilities())}
