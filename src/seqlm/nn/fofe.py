"""Fixed-size ordinally-forgetting encoding (FOFE), Zhang et al. 2015 (fofe-fnnlm.txt, EQUATIONS.md).

A sequence of symbols w_1..w_T, each a one-hot (or, in a model, an embedding) row e_t, is encoded by

    z_0 = 0,    z_t = alpha * z_{t-1} + e_t                                          (Sec. 2, eq. 1)

so z_t holds every earlier symbol, weighted by alpha^(distance). The recursion is sequential, but all
codes of a sentence are one matrix product S = M V with the lower-triangular M[i, j] = alpha^(i-j)
(Sec. 3.3); a mini-batch of several sentences makes M block-diagonal, which here is expressed by a
`resets` mask (a segment = a sentence starts wherever resets[b, t] is True).

Two sides live here:
- torch: `fofe_matrix`, `fofe_codes` (parallel, differentiable, what the FOFE-FNNLM family calls) and
  `fofe_codes_reference` (the plain recursion, for tests);
- numpy, one-hot: `encode`, `encode_all` and `decode`, the exact inverse for 0 < alpha <= 0.5 that
  the paper's uniqueness argument gives (Sec. 2.1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

# -----------------------------------------------------------------------------
# torch: the parallel encoding used by models


def fofe_matrix(resets: Tensor, alpha: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """The paper's M for every row of a batch: M[b, i, j] = alpha^(i-j) if i >= j and i, j share a segment.

    resets: (B, T) bool, True where a new segment (sentence) starts; position 0 always starts one.
    Returns (B, T, T) of `dtype`. alpha = 0 gives the identity (0^0 = 1), alpha = 1 running sums.
    """
    B, T = resets.shape
    starts = resets.bool().clone()
    starts[:, 0] = True
    seg = torch.cumsum(starts.long(), dim=1)  # (B, T) segment id of each position
    pos = torch.arange(T, device=resets.device)
    lag = pos[:, None] - pos[None, :]  # (T, T) i - j
    base = torch.tensor(alpha, dtype=dtype, device=resets.device)
    powers = torch.pow(base, lag.clamp(min=0).to(dtype))  # (T, T) alpha^(i-j), 0^0 = 1
    keep = (lag >= 0) & (seg[:, :, None] == seg[:, None, :])  # (B, T, T) lower triangle, same segment
    return torch.where(keep, powers, torch.zeros((), dtype=dtype, device=resets.device))


def _toeplitz(T: int, alpha: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """M for a single segment: (T, T), shared by every row of a batch that has no resets."""
    return fofe_matrix(torch.zeros(1, T, dtype=torch.bool, device=device), alpha, dtype)[0]


def _matrix_dtype(x: Tensor) -> torch.dtype:
    # Powers of alpha are built in float32 (float64 when x is float64): in bf16 alpha^k would carry
    # only ~3 significant digits before the matmul even starts.
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _block(x: Tensor, resets: Tensor | None, alpha: float) -> Tensor:
    """FOFE codes of one block, as if z were 0 before its first position: (B, C, D)."""
    C = x.shape[1]
    if resets is None:
        M = _toeplitz(C, alpha, _matrix_dtype(x), x.device)  # (C, C), broadcast over the batch
    else:
        M = fofe_matrix(resets, alpha, _matrix_dtype(x))  # (B, C, C)
    if not torch.is_autocast_enabled(x.device.type):
        M = M.to(x.dtype)  # under autocast the matmul picks the compute dtype itself
    return torch.matmul(M, x)  # (B, C, D)


def fofe_codes(x: Tensor, resets: Tensor | None, alpha: float, chunk: int = 512) -> Tensor:
    """z_t = alpha * z_{t-1} + x_t for all t at once (Sec. 3.3, S = M V), z reset to 0 at segment starts.

    x: (B, T, D) one-hot rows or embeddings (the paper applies FOFE to embeddings: M (V U) = (M V) U).
    resets: (B, T) bool, True where a sentence starts (position 0 always does); None = one segment.
    Differentiable w.r.t. x; works on any device and under autocast. Sequences longer than `chunk`
    are processed block by block, carrying the last code across, so memory is O(B * T * chunk) rather
    than O(B * T^2); the Python loop is over T / chunk blocks, never over time steps.
    """
    B, T, D = x.shape
    if T <= chunk:
        return _block(x, resets, alpha)
    out = []
    carry = None  # (B, D) code at the end of the previous block
    for s in range(0, T, chunk):
        xc = x[:, s : s + chunk]  # (B, C, D)
        rc = None if resets is None else resets[:, s : s + chunk].bool()  # (B, C)
        zc = _block(xc, rc, alpha)  # (B, C, D) as if the block started a segment
        if carry is not None:
            # The carried code decays by alpha^(k+1) at block position k, until the first reset.
            C = xc.shape[1]
            k = torch.arange(1, C + 1, device=x.device, dtype=_matrix_dtype(x))
            decay = torch.pow(torch.tensor(alpha, dtype=k.dtype, device=x.device), k)  # (C,)
            if rc is not None:
                decay = decay * (torch.cumsum(rc.long(), dim=1) == 0)  # (B, C) zero from a reset on
            zc = zc + decay.to(zc.dtype)[..., None] * carry.to(zc.dtype)[..., None, :]
        carry = zc[:, -1]
        out.append(zc)
    return torch.cat(out, dim=1)  # (B, T, D)


def fofe_codes_reference(x: Tensor, resets: Tensor | None, alpha: float) -> Tensor:
    """The plain recursion (Sec. 2, eq. 1), one time step at a time: the ground truth for tests."""
    B, T, D = x.shape
    z = x.new_zeros(B, D)
    out = []
    for t in range(T):
        if t > 0 and resets is not None:
            z = torch.where(resets[:, t, None].bool(), torch.zeros_like(z), z)  # new sentence: z = 0
        z = alpha * z + x[:, t]  # (B, D)
        out.append(z)
    return torch.stack(out, dim=1)  # (B, T, D)


# -----------------------------------------------------------------------------
# numpy: one-hot codes of symbol sequences and their exact inverse


def encode(seq: Sequence[int], vocab_size: int, alpha: float) -> np.ndarray:
    """One-hot FOFE code z_T of a whole sequence: (K,) float64, sum_t alpha^(T-1-t) e_{w_t}.

    E.g. with A, B, C = 0, 1, 2: ABC -> [a^2, a, 1]; ABCBC -> [a^4, a + a^3, 1 + a^2] (Sec. 2).
    """
    ids = np.asarray(seq, dtype=np.int64)
    code = np.zeros(vocab_size, dtype=np.float64)
    if ids.size:
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(f"symbol ids must lie in [0, {vocab_size}), got {ids.min()}..{ids.max()}")
        dist = np.arange(ids.size - 1, -1, -1, dtype=np.float64)  # distance from the end
        np.add.at(code, ids, np.power(float(alpha), dist))  # 0.0 ** 0 = 1: alpha = 0 keeps the last
    return code


def encode_all(seq: Sequence[int], vocab_size: int, alpha: float) -> np.ndarray:
    """Codes of every prefix: (T, K) float64, row t = z_{t+1} (the history after reading seq[: t + 1])."""
    ids = np.asarray(seq, dtype=np.int64)
    codes = np.zeros((ids.size, vocab_size), dtype=np.float64)
    z = np.zeros(vocab_size, dtype=np.float64)
    for t, w in enumerate(ids):
        z = alpha * z
        z[w] += 1.0
        codes[t] = z
    return codes


def decode(code: np.ndarray, alpha: float, tol: float = 1e-9) -> list[int]:
    """Recover the sequence from its FOFE code, exactly, for 0 < alpha <= 0.5 (Sec. 2.1).

    The paper's uniqueness argument, run as an algorithm from the most recent word outwards: once the
    words at distances < t are subtracted, the word at distance t still holds >= alpha^t in its
    element, while all older words together add at most alpha^(t+1) / (1 - alpha) <= alpha^t to any
    element, strictly less for a finite sequence. So the largest remaining element names the word at
    distance t, and "largest remaining < alpha^t / 2" means the sequence is over.

    tol is the absolute precision of `code`: words are recovered while their weight alpha^t > tol, so a
    sequence of length L is recovered exactly when alpha^(L-1) comfortably exceeds tol (and float64
    rounding, ~1e-16 * |code|). Raises ValueError when alpha is outside (0, 0.5] (for alpha > 0.5 the
    code is unique only almost everywhere, Theorem 2, and this greedy decoder is not valid) or when
    `code` is not, within tol, the FOFE code of any sequence.
    """
    if not 0.0 < alpha <= 0.5:
        raise ValueError(
            f"decode needs 0 < alpha <= 0.5, got {alpha}: for alpha > 0.5 FOFE decoding is not unique "
            "in general (only almost everywhere), and alpha = 0 forgets all but the last symbol"
        )
    r = np.array(code, dtype=np.float64)  # residual: the code minus the words decoded so far
    words: list[int] = []  # most recent first
    w = 1.0  # alpha^t, the weight of the word at distance t
    while w > tol and r.size:
        k = int(np.argmax(r))
        if r[k] < w / 2:
            break  # no word at distance t: the sequence has ended
        if r[k] < w - tol:
            raise ValueError(
                f"not a FOFE code for alpha={alpha}: element {k} = {r[k]:.3g} < alpha^t = {w:.3g}"
            )
        words.append(k)
        r[k] -= w
        w *= alpha
    if r.size and np.abs(r).max() > tol:
        raise ValueError(
            f"not a FOFE code for alpha={alpha} at tol={tol}: residual {np.abs(r).max():.3g} is left "
            "(a negative element, or a sequence longer than alpha^t > tol can resolve)"
        )
    return words[::-1]
