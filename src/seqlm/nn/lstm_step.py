"""One LSTM step for a few rows at inference: what a decoder asks of an LSTM (seqlm.decode.lmpool extends ~20
histories at a time, one token each).

torch's LSTM pays for its generality at that size (two matrix products a layer and a dozen small operators
called from C++ one at a time: ~530 us for 18 rows of a 2 x 200 model on one thread, against ~240 us of matrix
products). Here, with the same numbers to rounding:
- the first layer's input product W_ih x + b for every word of the vocabulary is a table, made once (V x 4H;
  kept only under TABLE_BYTES), so a step reads a row where it computed 4H x E products;
- the other layers read [x, h] through one product with [W_ih W_hh] (one call instead of two);
- the gates come from one sigmoid over all 4H, tanh only on the cell's quarter.
Tables follow the weights: each parameter's (storage, version) is the key, so an optimizer step, dynamic
evaluation or load_state_dict makes them again. Without that (training, autograd, a quantized or projected
LSTM), `step` answers None and the caller runs torch's LSTM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

TABLE_BYTES = 128 << 20  # the input table's largest size (PTB's 10k x 800 fp32: 32 MB; GCIDE's 61k x 800: not)


class LSTMStep:
    """Held by a model beside its nn.LSTM and its embedding (a callable from token ids (N,) to (N, E))."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._table: Tensor | None = None  # (V, 4H) the first layer's input gates for every token, or None
        self._weights: list[Tensor] = []  # per layer (E or H + H, 4H): [W_ih W_hh] transposed
        self._biases: list[Tensor] = []  # per layer (4H,): b_ih + b_hh

    def step(self, lstm: nn.LSTM, embedding: Callable[[Tensor], Tensor], vocab_size: int, tokens: Tensor,
             state: tuple[Tensor, Tensor], params: Iterable[Tensor]) -> tuple[Tensor, Tensor] | None:
        """The state ((L, N, H), (L, N, H)) after tokens (N,), or None where this fast path does not apply.
        `params`: every tensor the embedding and the LSTM read (the model's parameters), the tables' key."""
        if not _applies(lstm):
            return None
        self._refresh(lstm, embedding, vocab_size, params)
        h0, c0 = state  # (L, N, H) each
        H, hs, cs = lstm.hidden_size, [], []
        x = None if self._table is not None else embedding(tokens)  # (N, E)
        for k in range(lstm.num_layers):
            if k == 0 and self._table is not None:
                gates = torch.addmm(self._table[tokens], h0[0], self._weights[0][-H:])  # (N, 4H)
            else:
                gates = torch.addmm(self._biases[k], torch.cat([x, h0[k]], 1), self._weights[k])  # (N, 4H)
            x, c = _cell(gates, c0[k], H)
            hs.append(x)
            cs.append(c)
        return torch.stack(hs), torch.stack(cs)  # (L, N, H) each

    def _refresh(self, lstm: nn.LSTM, embedding: Callable[[Tensor], Tensor], vocab_size: int,
                 params: Iterable[Tensor]) -> None:
        key = tuple((p.untyped_storage().data_ptr(), p._version, p.dtype, p.device) for p in params)
        if key == self._key:
            return
        layers = lstm.all_weights  # per layer [W_ih (4H, E or H), W_hh (4H, H), b_ih (4H,), b_hh (4H,)]
        self._weights = [torch.cat([w_ih, w_hh], 1).t().contiguous() for w_ih, w_hh, _, _ in layers]
        self._biases = [b_ih + b_hh for _, _, b_ih, b_hh in layers]
        w0 = layers[0][0]
        self._table = None
        if vocab_size * w0.shape[0] * w0.element_size() <= TABLE_BYTES:
            ids = torch.arange(vocab_size, device=w0.device)
            self._table = torch.addmm(self._biases[0], embedding(ids), w0.t())  # (V, 4H)
        self._key = key


def _applies(lstm: nn.LSTM) -> bool:
    """Inference on a plain LSTM: no autograd, no dropout between layers, no projection, one direction."""
    plain = type(lstm) is nn.LSTM and lstm.bias and lstm.proj_size == 0 and not lstm.bidirectional
    device = lstm.weight_hh_l0.device.type
    return plain and not lstm.training and not torch.is_grad_enabled() and not torch.is_autocast_enabled(device)


def _cell(gates: Tensor, c: Tensor, H: int) -> tuple[Tensor, Tensor]:
    """(h, c) from gates (N, 4H) in torch's order i, f, g, o and the previous cell c (N, H)."""
    s = gates.sigmoid()  # (N, 4H): the g quarter computed and not used, one call where three were
    i, f, o = s[:, :H], s[:, H:2 * H], s[:, 3 * H:]  # (N, H) each
    c = torch.addcmul(f * c, i, gates[:, 2 * H:3 * H].tanh())  # (N, H)
    return o * c.tanh(), c
