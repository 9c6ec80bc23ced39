"""Vocabulary-sized layers compressed by sparse codes (Chen et al. 2016, sparse-word-representations.txt).

Every word i has a sparse non-negative code x_i over B base words (base words: one-hot). Then

    embedding     w_hat_i = U x_i                 (Sec. 3.2, "Embedding compression")
    output weight W_i     = D x_i                 (Sec. 3.3, "Prediction compression")
    output bias   b_i     = c^T x_i, or a free b_i per word (`--code-bias`)

U (B x E), D (B x H) and c (B) are the trainable parameters: their number does not grow with V. The codes
are fixed data, held sparse (CSR: `code_indptr` (V+1), `code_index` (nnz), `code_value` (nnz)) in one
`SparseCodes` module the embedding and the output layer share; no dense V x B matrix is ever built. A
row lookup is one `embedding_bag` over the base table with the code values as per-sample weights.

Codes files (`seqlm sparse-codes`) hold codes for the words of an embedding vocabulary; `codes_for_vocab`
maps them onto a model's vocabulary, and every model word without a code (`</s>`, `<unk>`, words the
embeddings never saw) becomes one more base word with a one-hot code.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlm.data.vocab import Vocab
from seqlm.errors import SeqlmError

MAGIC = "seqlm-sparse-codes"
F32_MAX = float(np.finfo(np.float32).max)  # code values are stored as float32


@dataclass
class CodeBook:
    """Codes as read from a codes file: `base` words, then every word's (base index, value) pairs."""

    base: list[str]
    codes: dict[str, list[tuple[int, float]]]

    def write(self, path: str | Path) -> None:
        """Text: a header line, the B base words (one-hot, in base order), then the other words."""
        from seqlm.checkpoint import atomic_path

        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{MAGIC} {len(self.base)} {len(self.codes)}\n")
            order = self.base + [w for w in self.codes if w not in set(self.base)]
            for w in order:
                f.write(w + "\t" + " ".join(f"{j}:{v:.6g}" for j, v in self.codes[w]) + "\n")

    @staticmethod
    def read(path: str | Path) -> CodeBook:
        path = Path(path)
        if not path.is_file():
            raise SeqlmError(f"{path}: codes file not found (make one with `seqlm sparse-codes VECTORS --out ...`)")
        opener = gzip.open if path.name.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8") as f:
                head = f.readline().split()
                if len(head) != 3 or head[0] != MAGIC:
                    raise SeqlmError(f"{path}:1: not a seqlm sparse codes file (first line '{MAGIC} B N')")
                num_base, base, codes = int(head[1]), [], {}
                for n, line in enumerate(f, 2):
                    word, _, rest = line.rstrip("\n").partition("\t")
                    pairs = [(int(j), float(v)) for j, v in (p.split(":") for p in rest.split())]
                    if not word or any(not (0 <= j < num_base and 0 <= v <= F32_MAX) for j, v in pairs):  # NaN fails
                        raise SeqlmError(f"{path}:{n}: bad code line (word<TAB>index:value ..., 0 <= index < "
                                         f"{num_base}, values >= 0 that a float32 holds)")
                    if len(base) < num_base:
                        base.append(word)
                    codes[word] = pairs
        except (ValueError, UnicodeDecodeError, OSError, EOFError) as e:
            raise SeqlmError(f"{path}: cannot read codes ({e.__class__.__name__}: {e})") from None
        if len(base) < num_base:
            raise SeqlmError(f"{path}: the header promises {num_base} base words, the file has {len(base)}")
        return CodeBook(base, codes)


def codes_for_vocab(book: CodeBook, vocab: Vocab) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """CSR codes (indptr, index, value) of every word of `vocab`, and the number of base rows.

    Words the book has no code for get a base row of their own (one-hot), after the book's B base words.
    """
    indptr, index, value = [0], [], []
    extra = len(book.base)
    for word in vocab.itos:
        pairs = book.codes.get(word)
        if not pairs:
            pairs, extra = [(extra, 1.0)], extra + 1
        for j, v in pairs:
            index.append(j)
            value.append(v)
        indptr.append(len(index))
    return (np.asarray(indptr, dtype=np.int64), np.asarray(index, dtype=np.int64),
            np.asarray(value, dtype=np.float32), extra)


class SparseCodes(nn.Module):
    """The (V x B) code matrix in CSR form, as buffers (saved with the weights, moved with the model)."""

    def __init__(self, indptr: Tensor, index: Tensor, value: Tensor, num_base: int):
        super().__init__()
        self.num_base = num_base
        self.register_buffer("code_indptr", indptr)  # (V+1,)
        self.register_buffer("code_index", index)  # (nnz,)
        self.register_buffer("code_value", value)  # (nnz,)

    @staticmethod
    def empty(vocab_size: int, num_base: int, nonzeros: int) -> SparseCodes:
        """Placeholders of the right shapes, filled by load_state_dict (loading a saved model)."""
        return SparseCodes(torch.zeros(vocab_size + 1, dtype=torch.long), torch.zeros(nonzeros, dtype=torch.long),
                           torch.zeros(nonzeros), num_base)

    @property
    def vocab_size(self) -> int:
        return self.code_indptr.numel() - 1

    @property
    def nonzeros(self) -> int:
        return self.code_index.numel()

    def rows(self, ids: Tensor, table: Tensor) -> Tensor:
        """sum_j x_{id,j} table[j] for each id: ids (N,), table (B, D) -> (N, D)."""
        start = self.code_indptr[ids]  # (N,)
        length = self.code_indptr[ids + 1] - start  # (N,)
        offsets = torch.cumsum(length, 0) - length  # (N,) where each bag starts in the flat list
        total = int(length.sum())
        flat = (torch.arange(total, device=ids.device)
                + torch.repeat_interleave(start - offsets, length, output_size=total))  # (nnz of the ids,)
        return F.embedding_bag(self.code_index[flat], table, offsets, mode="sum",
                               per_sample_weights=self.code_value[flat].to(table.dtype))  # (N, D)

    def all_rows(self, table: Tensor) -> Tensor:
        """The rows of every word in id order: (V, D). Only (V, D), never (V, B)."""
        return F.embedding_bag(self.code_index, table, self.code_indptr[:-1], mode="sum",
                               per_sample_weights=self.code_value.to(table.dtype))  # (V, D)


class CodedEmbedding(nn.Module):
    """w_hat = U x (Sec. 3.2): a word's embedding from its code over the base words' embeddings."""

    def __init__(self, codes: SparseCodes, dim: int):
        super().__init__()
        self.codes = codes
        self.base = nn.Parameter(torch.empty(codes.num_base, dim))  # U^T: (B, E)
        nn.init.uniform_(self.base, -0.1, 0.1)

    @property
    def embedding_dim(self) -> int:
        return self.base.shape[1]

    def forward(self, ids: Tensor) -> Tensor:
        return self.codes.rows(ids.reshape(-1), self.base).view(*ids.shape, -1)  # (..., E)


class CodedLinear(nn.Module):
    """The output projection with W_i = D x_i and b_i = c^T x_i or a free per-word b_i (Sec. 3.3).

    Called like nn.Linear: h (N, H) -> logits (N, V). `rows(ids)` gives only the chosen words' weights
    and biases (what sampled objectives need). The codes are the embedding's (shared, not re-registered).
    """

    def __init__(self, codes: SparseCodes, hidden: int, free_bias: bool, prior: Tensor | None = None):
        super().__init__()
        self._codes = (codes,)  # a tuple hides the shared module from registration: saved once
        self.base = nn.Parameter(torch.empty(codes.num_base, hidden))  # D^T: (B, H)
        nn.init.uniform_(self.base, -0.1, 0.1)
        size = codes.vocab_size if free_bias else codes.num_base
        self.bias = nn.Parameter(torch.zeros(size))  # b (V,) or c (B,)
        self.free_bias = free_bias
        # A fixed per-word offset (log unigram probability; not trained) under a compressed bias: a rare word's
        # c^T x_i mixes frequent base words' biases, so without it rare words score like frequent ones.
        self.register_buffer("prior", prior)  # (V,) or None

    @property
    def codes(self) -> SparseCodes:
        return self._codes[0]

    def _bias_rows(self, ids: Tensor | None) -> Tensor:
        if self.free_bias:
            return self.bias if ids is None else self.bias[ids]
        table = self.bias.unsqueeze(1)  # (B, 1)
        out = (self.codes.all_rows(table) if ids is None else self.codes.rows(ids, table)).squeeze(1)  # (V,) or (N,)
        if self.prior is not None:
            out = out + (self.prior if ids is None else self.prior[ids])
        return out

    def rows(self, ids: Tensor | None) -> tuple[Tensor, Tensor]:
        """Weights and biases of the words `ids` ((N, H), (N,)), or of every word (None: (V, H), (V,)),
        rebuilt from D and the codes (differentiable)."""
        weight = self.codes.all_rows(self.base) if ids is None else self.codes.rows(ids, self.base)
        return weight, self._bias_rows(ids)

    def forward(self, h: Tensor) -> Tensor:
        weight, bias = self.rows(None)  # (V, H), (V,)
        return F.linear(h, weight.to(h.dtype), bias.to(h.dtype))  # (N, V)


def linear_rows(proj: nn.Module, ids: Tensor | None) -> tuple[Tensor, Tensor]:
    """Weights (N, H) and biases (N,) of the output words `ids` (None: every word), for nn.Linear and
    CodedLinear alike."""
    if isinstance(proj, nn.Linear):
        return (proj.weight, proj.bias) if ids is None else (proj.weight[ids], proj.bias[ids])
    return proj.rows(ids)
