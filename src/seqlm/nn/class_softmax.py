"""The class-factorised softmax of Mikolov et al. (ICASSP 2011; rnnlm-extensions.txt, 'Speedup techniques'):
P(w|h) = P(c(w)|h) P(w|c(w),h), words binned into classes by frequency. The interface is nn/softmax.py's;
`pair_log_probs` serves decoders that score a few words per history (nn/readout.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqlm.nn.cross_entropy import ClassCrossEntropy, upcast


def frequency_classes(counts: Sequence[int] | Tensor, num_classes: int) -> Tensor:
    """Class of each word by frequency binning (paper, 'Factorization of the output layer').

    Words are visited in order of decreasing count (stable: ties keep increasing word id). With
    ``cum`` the unigram probability of the visited words *including* the current one, the rule is that
    of the rnnlm toolkit:

    1. the current word goes to the current class ``c`` (starting at 0);
    2. then ``c`` advances by one if ``cum > (c + 1) / C`` -- at most one step per word, even when
       ``cum`` jumped over several boundaries, so a very frequent word never leaves classes empty
       behind it.

    One addition guarantees that no class is empty (the toolkit can leave the last classes empty,
    e.g. for uniform counts with C = V): ``c`` also advances when the words still to visit are only
    just enough to give each remaining class one word. Hence every class is non-empty for any
    1 <= C <= V. The comparison is done in exact integer arithmetic (``cum_count * C > (c+1) * total``)
    so the result does not depend on float rounding.

    Returns a LongTensor (V,) with the class of each word id. Classes are contiguous in frequency
    order: every word of class k is at least as frequent as any word of class k + 1 (class 0 holds the
    most frequent words).
    """
    counts_list = [int(x) for x in (counts.tolist() if isinstance(counts, Tensor) else counts)]
    vocab_size = len(counts_list)
    if not 1 <= num_classes <= vocab_size:
        raise ValueError(f"num_classes must be in [1, {vocab_size}], got {num_classes}")
    if any(x < 0 for x in counts_list):
        raise ValueError("counts must be non-negative")
    if sum(counts_list) == 0:
        counts_list = [1] * vocab_size  # all-zero counts: treat as uniform so the slices are defined
    total = sum(counts_list)
    order = sorted(range(vocab_size), key=lambda i: -counts_list[i])  # sorted() is stable
    classes = [0] * vocab_size
    c = 0
    cum = 0
    for k, word in enumerate(order):
        cum += counts_list[word]
        classes[word] = c
        words_left = vocab_size - 1 - k
        classes_left = num_classes - 1 - c
        if classes_left > 0 and (cum * num_classes > (c + 1) * total or words_left <= classes_left):
            c += 1
    return torch.tensor(classes, dtype=torch.long, device="cpu")  # cpu even under a meta device context


class ClassSoftmax(nn.Module):
    """Class-factorised softmax P(w|h) = P(c(w)|h) P(w|c(w),h) (paper, 'Speedup techniques').

    Classes come from :func:`frequency_classes`. The word-output rows are stored re-ordered so that
    each class's words form a contiguous slice ``class_start[c]:class_end[c]`` of one (V, H) weight
    matrix: the within-class softmax is then a matmul with a weight *slice* (a view, no gather). The
    row order is the frequency order used for binning, which is already class-contiguous.

    Cost per token is H (C + |class of the target|) instead of H V (paper, 'Speedup techniques').
    """

    def __init__(self, hidden: int, counts: Sequence[int] | Tensor, num_classes: int) -> None:
        super().__init__()
        word_class = frequency_classes(counts, num_classes)  # (V,)
        vocab_size = word_class.numel()
        self.hidden = hidden
        self.vocab_size = vocab_size
        self.num_classes = num_classes
        self.class_proj = nn.Linear(hidden, num_classes)  # P(c | h)
        self.word_proj = nn.Linear(hidden, vocab_size)  # P(w | c, h); row r holds word row_to_word[r]

        # stable sort by class keeps the frequency order inside a class (and makes classes contiguous)
        row_to_word = torch.sort(word_class, stable=True).indices  # (V,)
        word_to_row = torch.empty_like(row_to_word)
        word_to_row[row_to_word] = torch.arange(vocab_size, device="cpu")
        sizes = torch.bincount(word_class, minlength=num_classes)  # (C,)
        class_end = torch.cumsum(sizes, 0)  # (C,)
        self.register_buffer("word_class", word_class)
        self.register_buffer("word_to_row", word_to_row)
        self.register_buffer("row_to_word", row_to_word)
        self.register_buffer("row_class", word_class[row_to_word])  # (V,) non-decreasing
        self.register_buffer("class_start", class_end - sizes)
        self.register_buffer("class_end", class_end)
        # python copy of the class sizes: the forward splits the weights with it without device syncs;
        # refreshed after load_state_dict, which may bring other class buffers
        self._class_sizes: list[int] = sizes.tolist()
        self._class_starts: list[int] = (class_end - sizes).tolist()
        self.register_load_state_dict_post_hook(ClassSoftmax._refresh_class_sizes)

    @staticmethod
    def _refresh_class_sizes(module: ClassSoftmax, incompatible_keys: object) -> None:
        module._class_sizes = (module.class_end - module.class_start).tolist()
        module._class_starts = module.class_start.tolist()

    def target_log_probs(self, h: Tensor, targets: Tensor) -> Tensor:
        """log P(c(w)|h) + log P(w|c(w),h) for each (h, target) pair; exact and differentiable."""
        n = targets.shape[0]
        tgt_class = self.word_class[targets]  # (N,)
        class_logits = upcast(self.class_proj(h))  # (N, C)
        class_lp = -F.cross_entropy(class_logits, tgt_class, reduction="none")  # (N,)

        # group the tokens by target class so each class needs one matmul against its weight slice
        sorted_class, order = torch.sort(tgt_class, stable=True)  # (N,), (N,)
        group_sizes = torch.bincount(sorted_class, minlength=self.num_classes).tolist()
        local_row = self.word_to_row[targets[order]] - self.class_start[sorted_class]  # (N,) row within class
        # split() rather than indexing slices one by one: it is a single autograd node whose backward
        # assembles the whole gradient once, while each slice's backward would allocate a zero (V, H)
        h_groups = h[order].split(group_sizes)  # C x (n_c, H)
        row_groups = local_row.split(group_sizes)  # C x (n_c,)
        w_groups = self.word_proj.weight.split(self._class_sizes)  # C x (|c|, H), views
        b_groups = self.word_proj.bias.split(self._class_sizes)  # C x (|c|,)
        pieces = []
        for c, size in enumerate(group_sizes):
            if size == 0 or self._class_sizes[c] == 1:
                # no target in this class in this batch, or a one-word class where P(w|c,h) = 1 exactly
                pieces.append(class_lp.new_zeros(size))
                continue
            logits = upcast(F.linear(h_groups[c], w_groups[c], b_groups[c]))  # (n_c, |c|)
            pieces.append(F.cross_entropy(logits, row_groups[c], reduction="none"))  # (n_c,) -log P(w|c,h)
        word_lp_sorted = -torch.cat(pieces) if pieces else class_lp.new_zeros(0)  # (N,)
        # undo the grouping: position order[i] receives the i-th grouped result
        word_lp = word_lp_sorted.new_empty(n).scatter(0, order, word_lp_sorted)  # (N,)
        return class_lp + word_lp

    @torch.no_grad()
    def pair_log_probs(self, h: Tensor, rows: Tensor, targets: Tensor, memo: dict | None = None) -> Tensor:
        """(N,) log P(targets[i] | h[rows[i]]) for a decoder's (history, word) pairs, h (B, H): each distinct row's
        class distribution once, each distinct (row, class)'s within-class normaliser once (and, with a `memo`
        kept for rows 0..B-1 across calls (protocol.Prefixes), once for all calls), each target's own logit a
        dot product. A few words per history: no (B, V) table."""
        urows, r = torch.unique(rows, return_inverse=True)  # (R,), (N,)
        hu = h[urows]  # (R, H)
        cls = self.word_class[targets]  # (N,)
        class_lp = torch.log_softmax(upcast(self.class_proj(hu)), 1)[r, cls]  # (N,)
        at = self.word_to_row[targets]  # (N,) the targets' weight rows
        w, b = self.word_proj.weight, self.word_proj.bias
        logit = upcast(torch.einsum("nh,nh->n", hu[r], w[at]) + b[at])  # (N,)
        table = None if memo is None else self._norm_table(memo, len(h), logit.dtype)
        word_lp = torch.where(self.class_end[cls] - self.class_start[cls] > 1,
                              logit - self._pair_norms(hu, r, cls, urows, table), 0.0)  # one-word classes: P = 1
        return class_lp + word_lp  # (N,)

    def _pair_norms(self, hu: Tensor, r: Tensor, cls: Tensor, urows: Tensor, table: Tensor | None) -> Tensor:
        """(N,) log sum_{w in cls[i]} exp(logit of w after hu[r[i]]): each distinct (row, class) not in `table`
        (B, C) (NaN: not known; filled here) once, one matmul a class asked. (Reducing all the small classes of
        all rows at once, one matmul and `_class_lse`, was slower for bench/decode.py's class LSTM: its decoder
        asks ~15 small classes a call, cheaper one by one.)"""
        R = len(hu)
        pairs, p = torch.unique(cls * R + r, return_inverse=True)  # (P,) by class, then row; (N,)
        pair_class, pair_row = pairs // R, pairs % R  # (P,), (P,)
        if table is None:
            norm, todo = hu.new_zeros(len(pairs), dtype=upcast(hu[:0]).dtype), None  # (P,)
        else:
            norm = table[urows[pair_row], pair_class]  # (P,)
            todo = norm.isnan().nonzero().squeeze(1)  # (Q,) still grouped by class
            pair_class, pair_row = pair_class[todo], pair_row[todo]
        found = norm.new_zeros(len(pair_class))  # (Q,) 0 for one-word classes
        asked = torch.bincount(pair_class, minlength=self.num_classes)  # (C,)
        hp, w, b, first = hu[pair_row], self.word_proj.weight, self.word_proj.bias, 0  # hp (Q, H): a slice a class
        for c, n in zip(asked.nonzero().squeeze(1).tolist(), asked[asked > 0].tolist(), strict=True):
            words = slice(self._class_starts[c], self._class_starts[c] + self._class_sizes[c])
            if self._class_sizes[c] > 1:
                logits = F.linear(hp[first:first + n], w[words], b[words])  # (n, |c|)
                torch.logsumexp(upcast(logits), 1, out=found[first:first + n])
            first += n
        if todo is None:
            return found[p]
        table[urows[pair_row], pair_class] = found
        norm[todo] = found
        return norm[p]

    def _norm_table(self, memo: dict, rows: int, dtype: torch.dtype) -> Tensor:
        """memo's (rows or more, C) table of within-class normalisers by row, NaN where not computed yet; grown
        (doubled) to cover `rows`."""
        table = memo.get("class_norms")
        if table is None or len(table) < rows or table.dtype != dtype:
            grown = torch.full((max(rows, 2 * (0 if table is None else len(table))), self.num_classes), torch.nan,
                               dtype=dtype, device=self.class_start.device)
            if table is not None and table.dtype == dtype:
                grown[: len(table)] = table
            memo["class_norms"] = table = grown
        return table

    def loss(self, h: Tensor, targets: Tensor) -> Tensor:
        """(N,) training losses; with gradients on, fused (nn/cross_entropy.py ClassCrossEntropy)."""
        if not torch.is_grad_enabled():
            return -self.target_log_probs(h, targets)  # (N,)
        layout = (self.word_class, self.word_to_row, self.class_start, self._class_sizes)
        return ClassCrossEntropy.apply(h, self.class_proj.weight, self.class_proj.bias, self.word_proj.weight,
                                       self.word_proj.bias, targets, layout)  # (N,)

    def log_probs(self, h: Tensor) -> Tensor:
        """Full distribution (N, V) in word-id order, exactly normalised (for generation and tests)."""
        class_lp = F.log_softmax(upcast(self.class_proj(h)), dim=-1)  # (N, C)
        logits = upcast(self.word_proj(h))  # (N, V) in row order
        lse = _class_lse(logits, self.row_class, self.num_classes)  # (N, C)
        row_lp = logits - lse[:, self.row_class] + class_lp[:, self.row_class]  # (N, V) in row order
        return row_lp[:, self.word_to_row]  # (N, V) in word-id order


def _class_lse(logits: Tensor, row_class: Tensor, num_classes: int) -> Tensor:
    """(N, C) log-sum-exp of logits (N, E) over each class's columns (row_class (E,): each column's class < C),
    vectorised; the per-class max only stabilises exp, so it takes no gradient."""
    n = logits.shape[0]
    with torch.no_grad():
        class_max = logits.new_full((n, num_classes), float("-inf"))
        class_max = class_max.scatter_reduce(1, row_class.expand(n, -1), logits, reduce="amax")  # (N, C)
    shifted = logits - class_max[:, row_class]  # (N, E)
    return class_max + logits.new_zeros(n, num_classes).index_add(1, row_class, shifted.exp()).log()  # (N, C)
