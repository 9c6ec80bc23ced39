"""The one evaluation protocol, for every family.

Each sentence is scored left to right from a fresh start; every word and the final `</s>` is a
predicted token, the start symbol is context only. Words outside the vocabulary are `<unk>` and are
counted (PTB convention); the figure without them is reported too. ppl = exp(-sum(ln p) / tokens).
With `stream=True` a model that can (see protocol.StreamingModel) carries its state across sentence
boundaries instead, as Mikolov's rnnlm does by default. A model trained to restart at every sentence
(`rnn --sentence-independent`) has no stream mode: for it `stream=True` means its own mode, sentence
by sentence (said on stderr, and `mode` in the result is "sentence"), never a mix of the two.

Out of vocabulary (one definition, used by eval, bench/kn_ptb.py and rescore): a token is OOV when the
model's vocabulary maps it to `<unk>`: a word the vocabulary lacks, or a literal `<unk>` in the text
(PTB's stand-in for rare words). This is what KenLM's `query` counts as OOV.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np
import torch

from seqlm.data.batching import sentence_batches, stream_batches
from seqlm.data.corpus import TokenStream
from seqlm.protocol import LanguageModel, StreamingModel

LOG10 = math.log(10.0)


@dataclass
class Scores:
    """Per-token natural-log probabilities of a whole text, in text order (targets incl. </s>)."""

    logp: np.ndarray  # (N,) float64
    stream: TokenStream

    def sentence_totals(self) -> np.ndarray:
        return np.add.reduceat(self.logp, np.asarray(self.stream.starts[:-1])) if len(self.logp) else self.logp


def model_device(model: LanguageModel) -> torch.device:
    params = getattr(model, "parameters", None)
    if params is not None:
        for p in params():
            return p.device
    return torch.device("cpu")


@torch.no_grad()
def score_tokens(model: LanguageModel, stream: TokenStream, stream_mode: bool = False,
                 max_tokens: int = 4096) -> Scores:
    """ln p of every token of `stream` under `model` (sentence-independent unless stream_mode)."""
    if hasattr(model, "score_text"):  # a model that scores text its own way (a mixture: each component's mode)
        return Scores(model.score_text(stream, stream_mode, max_tokens), stream)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    device = model_device(model)
    starts = np.asarray(stream.starts)
    out = np.zeros(len(stream.ids), dtype=np.float64)
    try:
        if stream_mode and can_stream(model):
            state, pos = None, 0
            for batch in stream_batches(stream, model.vocab.bos_id, batch_size=1, bptt=max_tokens):
                logp, state = model.score_stream(batch.to(device), state)  # (1, T)
                n = batch.targets.shape[1]
                out[pos : pos + n] = logp[0].double().cpu().numpy()
                pos += n
        else:
            for rows in sentence_batches(stream, model.vocab.bos_id, max_tokens=max_tokens):
                logp = model.score(rows.batch.to(device)).double().cpu().numpy()  # (B, T)
                mask = rows.batch.mask.numpy()
                for b in range(logp.shape[0]):
                    vals = logp[b][mask[b]]
                    first = starts[rows.sentence[b]] + rows.offset[b]
                    out[first : first + len(vals)] = vals
    finally:
        if was_training:
            model.train()
    return Scores(out, stream)


def can_stream(model: LanguageModel) -> bool:
    """A StreamingModel, or a model that says it can (a mixture with a recurrent component).

    A model that resets its state at every sentence (`sentence_independent`) cannot: scored as a stream
    it would carry state inside a chunk and reset at chunk edges, mid-sentence.
    """
    if getattr(model, "sentence_independent", False):
        return False
    return isinstance(model, StreamingModel) or bool(getattr(model, "can_stream", False))


def oov_mask(stream: TokenStream, vocab) -> np.ndarray:
    """(N,) True where a token is out of vocabulary: mapped to `<unk>` (module docstring)."""
    return np.asarray(stream.ids) == vocab.unk_id


def stream_refusal(model: LanguageModel) -> str:
    """Why `--stream` falls back to sentence-by-sentence scoring for this model (stderr note)."""
    if getattr(model, "sentence_independent", False):
        return "seqlm: this model restarts at every sentence (--sentence-independent); scoring sentence by sentence"
    return "seqlm: this model cannot carry state across sentences; scoring sentence by sentence"


def evaluate(model: LanguageModel, stream: TokenStream, stream_mode: bool = False, max_tokens: int = 4096) -> dict:
    """The JSON `seqlm eval` prints: ppl, tokens, sentences, oov, ppl_excl_oov, log10prob, mode."""
    if stream_mode and not can_stream(model):
        print(stream_refusal(model), file=sys.stderr)
        stream_mode = False
    scores = score_tokens(model, stream, stream_mode, max_tokens)
    logp = scores.logp
    oov = oov_mask(stream, model.vocab)
    n, n_in = len(logp), int((~oov).sum())
    total = float(logp.sum())
    total_in = float(logp[~oov].sum())
    result = {
        "ppl": math.exp(-total / n),
        "tokens": n,
        "sentences": stream.num_sentences,
        "oov": int(oov.sum()),
        "ppl_excl_oov": math.exp(-total_in / n_in) if n_in else float("nan"),
        "log10prob": total / LOG10,
        "mode": "stream" if stream_mode else "sentence",
    }
    if getattr(getattr(model, "data_config", None), "unit", "word") == "char":
        result.update(char_rates(stream, model.vocab, total))
    return result


def char_rates(stream: TokenStream, vocab, total: float) -> dict:
    """A character model's bits per character (`</s>` counted as one) and per word, and the word-level
    perplexity of the same text (words and `</s>` counted, as a word model's `ppl`): comparable figures."""
    from seqlm.data.corpus import WORD_SEP

    words = int((np.asarray(stream.ids) == vocab.stoi.get(WORD_SEP, -1)).sum()) + 2 * stream.num_sentences
    bits = -total / math.log(2.0)
    return {"bpc": bits / len(stream.ids), "bits_per_word": bits / words, "word_ppl": math.exp(-total / words),
            "words": words}
