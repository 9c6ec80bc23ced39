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
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from seqlm.data.batching import (
    CONTEXT,
    MAX_LEN,
    Rows,
    continued_groups,
    continued_rows,
    long_sentences,
    sentence_batches,
    stream_batches,
)
from seqlm.data.corpus import TokenStream
from seqlm.errors import SeqlmError
from seqlm.protocol import LanguageModel, StreamingModel, model_device, stream_refusal

LOG10 = math.log(10.0)


@dataclass
class Scores:
    """Per-token natural-log probabilities of a whole text, in text order (targets incl. </s>)."""

    logp: np.ndarray  # (N,) float64
    stream: TokenStream

    def sentence_totals(self) -> np.ndarray:
        return np.add.reduceat(self.logp, np.asarray(self.stream.starts[:-1])) if len(self.logp) else self.logp


@torch.no_grad()
def score_tokens(model: LanguageModel, stream: TokenStream, stream_mode: bool = False,
                 max_tokens: int = 4096) -> Scores:
    """ln p of every token of `stream` under `model` (sentence-independent unless stream_mode)."""
    own = model.score_text(stream, stream_mode, max_tokens, text_logp)  # a mixture: each component in its own mode
    if own is not None:
        return Scores(own, stream)
    was_training = isinstance(model, torch.nn.Module) and model.training
    if was_training:
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
            for rows, logp in score_sentences(model, stream, device, max_tokens):
                logp = logp.double().cpu().numpy()  # (B, T)
                mask = rows.batch.mask.numpy()
                for b in range(logp.shape[0]):
                    vals = logp[b][mask[b]]
                    first = starts[rows.sentence[b]] + rows.offset[b]
                    out[first : first + len(vals)] = vals
    finally:
        if was_training:
            model.train()
    return Scores(out, stream)


def history_window(model: LanguageModel) -> int | None:
    """How many of the latest inputs a prediction may depend on: the model's `context_window()`, else n - 1
    for a model that declares only its order n (protocol.context_order); None = its whole history."""
    return model.context_window()


def score_sentences(model: LanguageModel, stream: TokenStream, device: torch.device,
                    max_tokens: int) -> Iterator[tuple[Rows, Tensor]]:
    """(rows, their ln p (B, T)) for every sentence, each scored with its whole history, however long.

    A sentence longer than MAX_LEN comes in pieces. A model that carries a state from call to call
    (`score_stream`: the recurrent families, the Transformer's windows) reads the pieces in order, so memory
    stays bounded on a line of any length; any other model re-reads, before each piece, at least the inputs
    its window (`history_window`) reaches. A model with neither (an unbounded history read whole, a code of
    the whole sentence) is given the sentence in one row.
    """
    bos = model.vocab.bos_id
    if isinstance(model, StreamingModel):
        long = long_sentences(stream)
        short = np.setdiff1d(np.arange(stream.num_sentences), long)
        for rows in sentence_batches(stream, bos, max_tokens=max_tokens, sentences=short):
            yield rows, model.score(rows.batch.to(device))
        for group in continued_groups(stream, long, max_tokens):
            state = None
            for rows in continued_rows(stream, bos, group):
                logp, state = model.score_stream(rows.batch.to(device), state)  # (B, T)
                yield rows, logp
        return
    window = history_window(model)
    max_len = MAX_LEN if window is not None else max(1, len(stream.ids))
    for rows in sentence_batches(stream, bos, max_tokens, max_len, context=max(CONTEXT, window or 0)):
        yield rows, model.score(rows.batch.to(device))


def text_logp(model: LanguageModel, stream: TokenStream, stream_mode: bool, max_tokens: int) -> np.ndarray:
    """(N,) `score_tokens` as a plain function: how a mixture scores each of its components."""
    return score_tokens(model, stream, stream_mode, max_tokens).logp


def can_stream(model: LanguageModel) -> bool:
    """Whether the model declares it can carry its history across sentences (Capabilities.stream)."""
    return model.capabilities().stream


def oov_mask(stream: TokenStream, vocab) -> np.ndarray:
    """(N,) True where a token is out of vocabulary: mapped to `<unk>` (module docstring)."""
    return np.asarray(stream.ids) == vocab.unk_id


def evaluate(model: LanguageModel, stream: TokenStream, stream_mode: bool = False, max_tokens: int = 4096) -> dict:
    """The JSON `seqlm eval` prints: ppl, tokens, sentences, oov, ppl_excl_oov, log10prob, mode, unit,
    ppl_per_word."""
    note = stream_refusal(model) if stream_mode else None
    if note:
        print(note, file=sys.stderr)
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
        "unit": model.text_spec().unit,
    }
    window = model.capabilities().window
    if window is not None and int(stream.lengths().max(initial=0)) + 1 > window:  # some history slid
        result["window"] = window
    unit = model.text_spec().unit
    rates = (char_rates(stream, model.vocab, total) if unit == "char" else
             token_rates(stream, total) if unit == "token" else {})
    result.update(rates)
    # One figure that compares models of any unit: the same log-probability over the text's words and </s>.
    result["ppl_per_word"] = rates.get("word_ppl", result["ppl"])
    return result


def char_rates(stream: TokenStream, vocab, total: float) -> dict:
    """A character model's bits per character (`</s>` counted as one) and per word, and the word-level
    perplexity of the same text (words and `</s>` counted, as a word model's `ppl`): comparable figures."""
    from seqlm.data.corpus import WORD_SEP

    words = int((np.asarray(stream.ids) == vocab.stoi.get(WORD_SEP, -1)).sum()) + 2 * stream.num_sentences
    bits = -total / math.log(2.0)
    return {"bpc": bits / len(stream.ids), "bits_per_word": bits / words, "word_ppl": math.exp(-total / words),
            "words": words}


def token_rates(stream: TokenStream, total: float) -> dict:
    """A subword model's figures per word of the same text: its words counted from the text itself (white-space
    words of each line, TokenStream.words) and one `</s>` per sentence, as a word model's `ppl` counts them."""
    if stream.words is None:
        raise SeqlmError("a subword model's text must be read with its tokenizer (seqlm.protocol.encode_text), "
                         "which counts the text's words for ppl_per_word")
    words = stream.words + stream.num_sentences
    return {"bits_per_word": -total / math.log(2.0) / words, "word_ppl": math.exp(-total / words), "words": words}
