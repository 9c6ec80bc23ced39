"""`seqlm sparse-codes`: code every rare word as a sparse non-negative mix of B common words
(Chen et al. 2016, sparse-word-representations.txt Sec. 3.1, objective (5)).

The base set is the first B words of the vectors file (word2vec files list the most frequent first);
base words keep one-hot codes. For every other word w, with U the base vectors,

    min_x  L(x) + alpha_t R1(x) + beta_t R2(x),   L = ||U x - w||^2,  R1 = ||x||_1,  R2 = |1^T x - 1|
    alpha_t = w_alpha L(x_{t-1}) / R1(x_{t-1}),   beta_t = w_beta L(x_{t-1}) / R2(x_{t-1})   (eqs. 6, 7)

by Adam, negatives clipped to 0 after every step, then entries below 0.015 x max(x) set to 0. All rare
words form one batched problem (processed in chunks of `chunk` words to bound memory). Each word's
candidates are its `candidates` most cosine-similar base words (0 = all B, the exact problem); the others
are held at 0, which is what makes 53k words x 8k base words fit on a CPU: with L written through the
candidates' Gram matrix, L(x) = x^T G x - 2 c^T x + ||w||^2, a step costs O(K^2) per word, not O(B E).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from seqlm.checkpoint import atomic_write_text
from seqlm.codes.embed import load_vectors
from seqlm.errors import SeqlmError
from seqlm.nn.sparse_code import CodeBook
from seqlm.outputs import claim_output

EPS = 1e-6  # floor of R1 and R2 in the adaptive weights


@dataclass
class CodeOptions:
    base: int = 8000  # B: the most frequent words (first in the vectors file) are the base set
    w_alpha: float = 1.0  # l1 term's share of the fitting loss (eq. 6)
    w_beta: float = 0.1  # sum-to-one term's share (eq. 7)
    steps: int = 500  # Adam steps
    lr: float = 0.01  # Adam learning rate
    threshold: float = 0.015  # entries below threshold x max(x) are zeroed at the end
    candidates: int = 64  # base words considered per rare word (most cosine-similar); 0 = all
    chunk: int = 2048  # rare words optimised together (memory: chunk x candidates x E doubles)
    seed: int = 1
    threads: int = 0  # torch threads; 0 = torch's default


def _candidates(U: torch.Tensor, W: torch.Tensor, k: int) -> torch.Tensor:
    """(R, k) base indices most cosine-similar to each row of W."""
    if k == 0 or k >= U.shape[0]:
        return torch.arange(U.shape[0]).expand(W.shape[0], -1)
    un = (U / U.norm(dim=1, keepdim=True).clamp(min=1e-12)).float()  # (B, E)
    wn = (W / W.norm(dim=1, keepdim=True).clamp(min=1e-12)).float()  # (R, E)
    # in slices: the whole (R, B) similarity matrix would be 53k x 8k floats on GCIDE
    return torch.cat([(part @ un.T).topk(k, dim=1).indices for part in wn.split(4096)])  # (R, k)


def solve_codes(U: torch.Tensor, W: torch.Tensor, opt: CodeOptions) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes of the rows of W (R, E) over base vectors U (B, E): (indices (R, K), values (R, K); zero values
    are entries dropped), and which words took the single-base-word code instead (R,) (see _solve_chunk).
    Float64 throughout: the problems are small."""
    U, W = U.double(), W.double()
    idx = _candidates(U, W, opt.candidates)  # (R, K)
    vals = torch.empty(idx.shape, dtype=torch.float64)
    single = torch.empty(idx.shape[0], dtype=torch.bool)
    for lo in range(0, W.shape[0], opt.chunk):
        sl = slice(lo, lo + opt.chunk)
        vals[sl], single[sl] = _solve_chunk(U[idx[sl]], W[sl], opt)  # U[idx] (n, K, E)
    return idx, vals, single


def _solve_chunk(Uc: torch.Tensor, w: torch.Tensor, opt: CodeOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """Objective (5) for n words at once: Uc (n, K, E) candidate vectors, w (n, E) -> thresholded codes
    (n, K), and (n,) whether the single-base-word code replaced the optimised one.

    With the adaptive l1 weight L/R1 a word the vectors cannot fit well can lose its code (x -> 0 is a fixed
    point: the weight grows as x shrinks), ending with a useless near-zero code. So every word's result is
    compared with the best code of one base word (the most similar candidate, scaled to fit: relative fit
    error 1 - cos^2 < 1), and the word keeps whichever fits better; the report counts the replacements."""
    G = Uc @ Uc.transpose(1, 2)  # (n, K, K)
    c = (Uc @ w.unsqueeze(2)).squeeze(2)  # (n, K)
    ww = (w * w).sum(1)  # (n,)
    # start from the least-squares fit over the candidates (a little ridge: K may exceed E), clipped:
    # from a start far from any fit, the adaptive l1 weight outgrows the fit at once
    ridge = 1e-3 * G.diagonal(dim1=1, dim2=2).mean(1).view(-1, 1, 1) * torch.eye(G.shape[1], dtype=G.dtype)
    x = torch.linalg.solve(G + ridge, c.unsqueeze(2)).squeeze(2).clamp(min=0.0).requires_grad_(True)  # (n, K)
    adam = torch.optim.Adam([x], lr=opt.lr)
    alpha = beta = torch.zeros_like(ww)
    for t in range(opt.steps):
        fit = ((G @ x.unsqueeze(2)).squeeze(2) * x).sum(1) - 2 * (c * x).sum(1) + ww  # (n,) L(x)
        r1 = x.abs().sum(1)  # (n,)
        r2 = (x.sum(1) - 1).abs()  # (n,)
        if t > 0:  # the weights of step t come from x_{t-1} (eqs. 6, 7); fixed within the step
            alpha = opt.w_alpha * fit.detach() / r1.detach().clamp(min=EPS)
            beta = opt.w_beta * fit.detach() / r2.detach().clamp(min=EPS)
        adam.zero_grad()
        (fit + alpha * r1 + beta * r2).sum().backward()
        adam.step()
        with torch.no_grad():
            x.clamp_(min=0.0)  # non-negative codes: clip after each step (Sec. 3.1)
    x = x.detach()
    x = torch.where(x >= opt.threshold * x.max(dim=1, keepdim=True).values, x, torch.zeros_like(x))  # (n, K)
    gdiag = G.diagonal(dim1=1, dim2=2).clamp(min=1e-12)  # (n, K)
    best = (c.clamp(min=0) ** 2 / gdiag).argmax(1, keepdim=True)  # (n, 1) the candidate fitting alone best
    one = torch.zeros_like(x).scatter_(1, best, (c.gather(1, best) / gdiag.gather(1, best)).clamp(min=0))
    single = _fit(G, c, ww, one) < _fit(G, c, ww, x)  # (n,)
    return torch.where(single.unsqueeze(1), one, x), single


def _fit(G: torch.Tensor, c: torch.Tensor, ww: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """||U x - w||^2 through the Gram matrix: x^T G x - 2 c^T x + ||w||^2, (n,)."""
    return ((G @ x.unsqueeze(2)).squeeze(2) * x).sum(1) - 2 * (c * x).sum(1) + ww


def _fit_error(U: torch.Tensor, W: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    """||U x - w||^2 / ||w||^2 per rare word (R,)."""
    U, W = U.double(), W.double()
    recon = torch.cat([(U[i] * v.unsqueeze(2)).sum(1) for i, v in zip(idx.split(2048), vals.split(2048),
                                                                        strict=True)])  # (R, E), in slices
    return ((recon - W) ** 2).sum(1) / (W**2).sum(1).clamp(min=1e-12)


def sparse_codes(vectors: Path, out: Path, opt: CodeOptions, show: list[str] | None = None,
                 force: bool = False) -> dict:
    """Solve the codes, write the codes file and `OUT.report.json` (replacing existing ones only with
    `force`); return the report."""
    report_path = Path(str(out) + ".report.json")
    for path in (out, report_path):  # both refused before any work, so that neither is half replaced
        claim_output(path, force, "--out", inputs=[vectors])
    if opt.threads:
        torch.set_num_threads(opt.threads)
    torch.manual_seed(opt.seed)
    words, vecs = load_vectors(vectors)
    if not 1 <= opt.base < len(words):
        raise SeqlmError(f"--base must be between 1 and {len(words) - 1} (the file has {len(words)} words), "
                         f"got {opt.base}")
    for name in ("steps", "chunk"):
        if getattr(opt, name) < 1:
            raise SeqlmError(f"--{name} must be at least 1, got {getattr(opt, name)}")
    t0 = time.time()
    U, W = torch.from_numpy(vecs[: opt.base]), torch.from_numpy(vecs[opt.base :])
    idx, vals, single = solve_codes(U, W, opt)
    book = CodeBook(words[: opt.base], {w: [(i, 1.0)] for i, w in enumerate(words[: opt.base])})
    for r, w in enumerate(words[opt.base :]):
        nz = torch.nonzero(vals[r]).flatten().tolist()
        book.codes[w] = sorted(((int(idx[r, j]), float(vals[r, j])) for j in nz), key=lambda p: -p[1])
    book.write(out)
    report = _report(book, words, opt, _fit_error(U, W, idx, vals), show, time.time() - t0)
    report["single_base_word"] = int(single.sum())  # words whose optimised code fitted worse (see _solve_chunk)
    atomic_write_text(report_path, json.dumps(report, indent=2) + "\n")
    return report


def _report(book: CodeBook, words: list[str], opt: CodeOptions, err: torch.Tensor, show: list[str] | None,
            seconds: float) -> dict:
    rare = words[opt.base :]
    nnz = np.array([len(book.codes[w]) for w in rare])
    samples = [w for w in (show or []) if w in book.codes]
    if not samples:  # the most frequent rare words, then a few from further down the list
        samples = rare[:5] + rare[len(rare) // 2 :: max(len(rare) // 10, 1)][:5]
    return {
        "options": asdict(opt), "base_words": opt.base, "rare_words": len(rare), "seconds": round(seconds, 2),
        "nonzeros_per_word": {"mean": float(nnz.mean()), "median": float(np.median(nnz)), "max": int(nnz.max()),
                              "min": int(nnz.min())},
        "relative_fit_error": {"mean": float(err.mean()), "median": float(err.median())},
        "samples": {w: [[book.base[j], round(v, 4)] for j, v in book.codes[w][:5]] for w in samples},
        "sum_of_code": {"mean": float(np.mean([sum(v for _, v in book.codes[w]) for w in rare]))},
    }


def summary_lines(report: dict) -> str:
    nz, err = report["nonzeros_per_word"], report["relative_fit_error"]
    lines = [f"{report['rare_words']} rare words coded over {report['base_words']} base words in "
             f"{report['seconds']} s: non-zeros per word mean {nz['mean']:.2f} (median {nz['median']:g}, "
             f"max {nz['max']}); relative fit error ||Ux-w||^2/||w||^2 mean {err['mean']:.3f} "
             f"(median {err['median']:.3f}); code sums mean {report['sum_of_code']['mean']:.3f}"]
    for w, top in report["samples"].items():
        lines.append(f"  {w}: " + " ".join(f"{b} {v:.3f}" for b, v in top))
    return "\n".join(lines)


__all__ = ["CodeOptions", "solve_codes", "sparse_codes", "summary_lines"]


def codes_from_cli(args) -> str:
    """`seqlm sparse-codes VECTORS --base B --out CODES`: solve, write, and return the printed summary."""
    opt = CodeOptions(base=args.base, w_alpha=args.w_alpha, w_beta=args.w_beta, steps=args.steps, lr=args.lr,
                      threshold=args.threshold, candidates=args.candidates, chunk=args.chunk, seed=args.seed,
                      threads=args.threads)
    show = [w for w in (args.show or "").split(",") if w]
    return summary_lines(sparse_codes(Path(args.vectors), Path(args.out), opt, show, args.force))


def add_codes_options(p) -> None:
    d = CodeOptions()
    p.add_argument("vectors", help="word2vec text or binary file, most frequent word first (seqlm embed)")
    p.add_argument("--out", required=True, help="codes file to write (and OUT.report.json)")
    p.add_argument("--force", action="store_true", help="replace --out and OUT.report.json if they exist")
    p.add_argument("--base", type=int, default=d.base, help="base words: the first B words of the file")
    p.add_argument("--w-alpha", type=float, default=d.w_alpha, help="l1 term's share of the fitting loss")
    p.add_argument("--w-beta", type=float, default=d.w_beta, help="sum-to-one term's share of the fitting loss")
    p.add_argument("--steps", type=int, default=d.steps, help="Adam steps")
    p.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate")
    p.add_argument("--threshold", type=float, default=d.threshold, help="zero entries below this x max(x)")
    p.add_argument("--candidates", type=int, default=d.candidates,
                   help="base words considered per word (most cosine-similar); 0 = all")
    p.add_argument("--chunk", type=int, default=d.chunk, help="words optimised together")
    p.add_argument("--show", help="comma-separated words whose codes the report shows")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads (0 = default)")
