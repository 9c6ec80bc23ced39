"""An exported ONNX file under onnxruntime, scoring text the way seqlm scores it: each sentence from the start
state, read from sos_id, every word and eos_id scored. Used by `seqlm export`'s check, the tests and
bench/export.py; also a short example of reading the signature (seqlm.export.onnx's docstring).

Only the file's metadata is read, never the model directory: what a consumer of the file has.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from seqlm.data.corpus import TokenStream
from seqlm.errors import SeqlmError


def runtime_missing() -> bool:
    return importlib.util.find_spec("onnxruntime") is None


class OnnxLM:
    """An onnxruntime session of an exported file, `threads` intra-op threads (1: one core)."""

    def __init__(self, path: str | Path, threads: int = 1):
        if runtime_missing():
            raise SeqlmError("onnxruntime is not installed: pip install 'seqlm[onnx]'")
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.meta = self.session.get_modelmeta().custom_metadata_map
        self.states = self.meta["inputs"].split(",")[1:]  # h0 (and c0); none for a window model
        self.sos_id, self.eos_id = int(self.meta["sos_id"]), int(self.meta["eos_id"])
        self.window = int(self.meta["context"]) if "context" in self.meta else None
        self.stride = int(self.meta.get("stride", 0))

    def initial_state(self, rows: int) -> list[np.ndarray]:
        """The start state of `rows` rows: each state input (L, rows, H) filled with `initial_state`; a
        finite-context model's (rows, context_size) ids, all -1."""
        if not self.states:
            return []
        if "context_size" in self.meta:  # a finite-context model: its last inputs, -1 before the start
            return [np.full((rows, int(self.meta["context_size"])), -1, dtype=np.int64)]
        shape = (int(self.meta["num_layers"]), rows, int(self.meta["hidden_size"]))
        return [np.full(shape, float(self.meta["initial_state"]), dtype=np.float32) for _ in self.states]

    def run(self, x: np.ndarray, state: list[np.ndarray] | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
        """One call: ids x (N, T) and the state before them -> log-probs (N, T, V) and the state after them."""
        feed = {"x": np.ascontiguousarray(x, dtype=np.int64)}
        feed.update(zip(self.states, state if state is not None else self.initial_state(len(x)), strict=True))
        out = self.session.run(None, feed)
        return out[0], out[1:]

    def score(self, stream: TokenStream, max_tokens: int = 4096) -> np.ndarray:
        """(N,) ln p of every token of `stream` (sentence by sentence), in text order. Sentences of similar
        lengths share a call, padded at the end (which no earlier position sees) up to `max_tokens` ids."""
        starts = np.asarray(stream.starts)
        lengths = np.diff(starts)
        out = np.zeros(len(stream.ids), dtype=np.float64)
        order = np.argsort(lengths, kind="stable")
        i = 0
        while i < len(order):
            j = i + 1
            while j < len(order) and (j + 1 - i) * lengths[order[j]] <= max_tokens:
                j += 1
            group = order[i:j]
            for s, logp in zip(group, self._sentences([stream.sentence(s) for s in group]), strict=True):
                out[starts[s] : starts[s + 1]] = logp
            i = j
        return out

    def _sentences(self, sentences: list[np.ndarray]) -> list[np.ndarray]:
        """ln p of each sentence's tokens (N sentences, one call; a long one for a window model: windows)."""
        longest = max(len(s) for s in sentences)
        if self.window is not None and longest > self.window:
            return [self._windows(s) for s in sentences]
        x = np.full((len(sentences), longest), self.eos_id, dtype=np.int64)  # (N, T), padded at the end
        for n, s in enumerate(sentences):
            x[n, 0], x[n, 1 : len(s)] = self.sos_id, s[:-1]
        logp = self.run(x)[0]  # (N, T, V)
        return [logp[n, np.arange(len(s)), s].astype(np.float64) for n, s in enumerate(sentences)]

    def _windows(self, sentence: np.ndarray) -> np.ndarray:
        """A sentence longer than the window in seqlm's windows (seqlm.models.transformer): the first W inputs,
        then S new ones a window, each window re-reading the W - S inputs before them from position 0."""
        W, S = self.window, self.stride
        inputs = np.concatenate([[self.sos_id], sentence[:-1]]).astype(np.int64)  # (L,)
        L, out = len(inputs), np.zeros(len(sentence), dtype=np.float64)
        first, keep = 0, 0  # window start, first position this window scores
        while keep < L:
            end = min(first + W, L)
            logp = self.run(inputs[None, first:end])[0][0]  # (end - first, V)
            out[keep:end] = logp[np.arange(keep - first, end - first), sentence[keep:end]]
            keep, first = end, end + S - W
        return out
