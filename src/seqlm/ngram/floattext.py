"""The shortest text of float32 values, vectorised: byte for byte what numpy's str of a float32 gives.

ARPA files hold log10 values as the shortest decimal that reads back as the same float32 (KenLM writes
them so). numpy's str (Dragon4: Steele & White's digit generation) costs ~0.5 us a value from Python,
and a 5-gram model has millions of distinct values. Here the digits come from exact float64 arithmetic:

- x lies in the open interval (lo, hi) between the midpoints to its float32 neighbours. Dragon4 stops at
  the first digit count p for which t * 10^q or (t + 1) * 10^q lies strictly inside (t = floor(x / 10^q),
  q = e - p + 1, e = floor(log10 x)), and prints the one closer to x if both do. If p works, p + 1 does,
  and p works as soon as 10^q < hi - lo: so start there and step down while shorter ones still work.
- for a non-integer x no integer candidate (q >= 0) can lie inside (it would be a float32 reading as
  x), so q < 0 and every comparison is exact after scaling by 10^-q: x, lo, hi have at most 25 significant
  bits and 10^-q = 2^-q 5^-q with 5^-q <= 5^12 < 2^28, so the products fit float64's 53 bits.

Integers below 1e5 (0 included) print as "k.0". inf, NaN, values outside [1e-4, 1e5) (numpy goes
scientific beyond) and exact ties between two candidates go to numpy's str, once per distinct value;
log10 probabilities and back-offs are almost never any.
"""

from __future__ import annotations

import numpy as np

LOW, HIGH = 1e-4, 1e5  # the positional range handled here (numpy's own switch to scientific is beyond it)
WIDTH = 24  # a text's row: [2 spare][8 integer digits][.][12 fraction digits][1 spare]
POINT = 10  # the column of '.'
FALLBACK = 16  # numpy's own texts (e.g. '-1.06175423e+15') go at column 2, at most this long
CHUNK = 1 << 16
POW10 = np.array([float(10**i) for i in range(23)])  # exact powers of ten
GROUPS = np.frombuffer("".join(f"{i:04d}" for i in range(10_000)).encode("ascii"), dtype="<u4")  # '0000'..'9999'


def float32_texts(values: np.ndarray, before: bytes = b"", after: bytes = b"") -> tuple[np.ndarray, ...]:
    """Each value's str(np.float32) as ASCII, with `before` and `after` (a byte or nothing) around it.

    Returns rows (n, WIDTH) uint8 and each text's start column and length in its row."""
    if len(before) > 1 or len(after) > 1:
        raise ValueError("float32_texts wraps a text in at most one byte on each side")
    values = np.asarray(values, dtype=np.float32).reshape(-1)
    rows = np.empty((len(values), WIDTH), dtype=np.uint8)
    start = np.empty(len(values), dtype=np.int64)
    end = np.empty(len(values), dtype=np.int64)
    for a in range(0, len(values), CHUNK):
        part = slice(a, a + CHUNK)
        start[part], end[part] = _texts(values[part], rows[part])
    if before:
        start -= 1
        rows[np.arange(len(values)), start] = before[0]
    if after:
        rows[np.arange(len(values)), end] = after[0]
        end += 1
    return rows, start, end - start


def numpy2_str(v: np.float32) -> str:
    """str(np.float32(v)) as numpy 2 writes it, whatever numpy is installed (numpy 1.x goes scientific only
    from 1e16 on, so its texts would change the ARPA bytes): positional from 1e-4 up to 1e6, else scientific."""
    if not np.isfinite(v):
        return str(float(v))  # inf, -inf, nan
    if v == 0 or 1e-4 <= abs(float(v)) < 1e6:
        return np.format_float_positional(v, unique=True, trim="0")
    return np.format_float_scientific(v, unique=True, trim="-", exp_digits=2)


def _texts(x32: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fill rows (n, WIDTH) with the texts; their start and end columns."""
    digits, q, fast = shortest_digits(x32)  # (n,) each
    start, end = _positional(digits, q, np.signbit(x32) & fast, rows)
    slow = np.flatnonzero(~fast)
    uniq, which = np.unique(x32[slow], return_inverse=True)  # rare: numpy's own text, once per value
    texts = [numpy2_str(v).encode("ascii") for v in uniq]
    if any(len(t) > FALLBACK for t in texts):
        raise ValueError(f"float text longer than the ARPA number field: {max(texts, key=len)!r}")
    table = np.frombuffer(b"".join(t.ljust(FALLBACK) for t in texts), dtype=np.uint8).reshape(-1, FALLBACK)
    rows[slow, 2 : 2 + FALLBACK] = table[which.reshape(-1)]
    start[slow] = 2
    end[slow] = 2 + np.array([len(t) for t in texts], dtype=np.int64)[which.reshape(-1)]
    return start, end


def shortest_digits(x32: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """|x| = digits * 10^q with the fewest digits that read back as x (Dragon4's choice), and the mask of
    values handled (the rest, see the module docstring, need numpy's str). digits, q int64 (n,)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ax = np.abs(x32)  # (n,) float32
        a = ax.astype(np.float64)  # (n,) exact
        whole = a == np.floor(a)  # (n,) integers, 0 included: printed "k.0"
        fast = (a >= LOW) & (a < HIGH) & ~whole  # NaN compares False
        whole &= a < HIGH
        integer = np.where(whole, a, 0).astype(np.int64)  # (n,)
    ax = np.where(fast, ax, np.float32(1.5))
    a = ax.astype(np.float64)
    lo = (a + np.nextafter(ax, np.float32(0)).astype(np.float64)) / 2  # (n,) exact midpoints
    hi = (a + np.nextafter(ax, np.float32(np.inf)).astype(np.float64)) / 2
    e = np.floor(np.log10(a)).astype(np.int64)  # (n,) decimal exponent, corrected below
    e -= a < 10.0**e
    e += a >= 10.0 ** (e + 1)
    p = e - (np.ceil(np.log10(hi - lo)).astype(np.int64) - 1) + 1  # (n,) 10^q < hi - lo: p works
    shortest = np.maximum(e + 2, 1)  # (n,) q <= -1
    todo = np.flatnonzero(fast & (p > shortest))
    while len(todo):  # try one digit fewer where that may still work
        works = _inside(a[todo], lo[todo], hi[todo], p[todo] - 2 - e[todo]).any(axis=0)
        todo = todo[works]
        p[todo] -= 1
        todo = todo[p[todo] > shortest[todo]]
    scale = POW10[np.clip(p - 1 - e, 0, 22)]  # (n,) 10^-q
    down_ok, up_ok = _inside(a, lo, hi, p - 1 - e)
    sa, t = a * scale, np.floor(a * scale)
    tie = down_ok & up_ok & (2 * sa == 2 * t + 1)
    up = up_ok & ~(down_ok & (2 * sa < 2 * t + 1))  # the upper candidate, unless the lower is closer
    digits = (t + up).astype(np.int64)
    fast &= ~tie & (digits % 10 != 0) & (p <= 9)  # (a trailing 0 would mean a shorter p was missed)
    digits = np.where(fast, digits, 10 * integer)
    return digits, np.where(whole, -1, e - p + 1), fast | whole


def _inside(a: np.ndarray, lo: np.ndarray, hi: np.ndarray, minus_q: np.ndarray) -> np.ndarray:
    """(2, n): whether t * 10^q and (t + 1) * 10^q lie strictly inside (lo, hi), exactly (q < 0)."""
    scale = POW10[np.clip(minus_q, 0, 22)]  # (n,)
    t = np.floor(a * scale)  # (n,) exact products
    return np.stack([t > lo * scale, t + 1 < hi * scale])


def _positional(digits: np.ndarray, q: np.ndarray, negative: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """Write '[-]I.F' into rows (n, WIDTH): digits * 10^q split into the integer part I (< 10^5, at
    least one digit) and the -q fraction digits F, four ASCII digits per table lookup. Returns the
    start and end columns (the point is always at POINT)."""
    d = digits.astype(np.float64)  # (n,) exact, < 10^9
    scale = POW10[np.clip(-q, 1, 12)]  # (n,) 10^-q
    whole = np.floor(d / scale)  # (n,) I: exact quotients of integers by powers of ten
    frac = (d - whole * scale) * POW10[np.clip(12 + q, 0, 11)]  # (n,) F as 12 digits, left-aligned
    split = np.empty((len(d), 5))  # (n, 5) the digits of I (8) and F (12) in groups of four
    split[:, 0] = np.floor(whole / 1e4)
    split[:, 1] = whole - split[:, 0] * 1e4
    split[:, 2] = np.floor(frac / 1e8)
    rest = frac - split[:, 2] * 1e8
    split[:, 3] = np.floor(rest / 1e4)
    split[:, 4] = rest - split[:, 3] * 1e4
    text = GROUPS[split.astype(np.int64)].view(np.uint8)  # (n, 20) ASCII
    rows[:, 2:POINT] = text[:, :8]
    rows[:, POINT] = ord(".")
    rows[:, POINT + 1 : POINT + 13] = text[:, 8:]
    n_whole = 1 + (whole >= 10) + (whole >= 100) + (whole >= 1000) + (whole >= 10_000)  # (n,)
    start = POINT - n_whole
    rows[np.flatnonzero(negative), start[negative] - 1] = ord("-")
    return start - negative, POINT + 1 + np.clip(-q, 1, 12)
