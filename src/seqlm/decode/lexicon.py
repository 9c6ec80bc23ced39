"""Prefix trees over words whose edges are labels: where a partial word stands among the LM's words (is it
the start of a unigram? which word does it spell?) and among the hotwords, one batched lookup per frame.

A node is a character string that starts some word; node 0 is the empty string, -1 stands for a string that
starts none (it stays -1 until the word ends). A label that continues a word follows an edge (node, label) ->
node, found by binary search among the sorted keys node * L + label; a word-starting label (space, a ▁ piece)
goes to the node of its own text whatever came before.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from seqlm.data.vocab import UNK
from seqlm.decode.labels import Labels

DENSE_MAX = 1 << 25  # nodes x labels up to which the children are a table (128 MB of int32) instead of a search


class Trie:
    """The prefixes of `words` (strings) as nodes, with the labels' edges between them (see the module docstring)."""

    def __init__(self, words: Iterable[str], labels: Labels, device: torch.device):
        self.index: dict[str, int] = {"": 0}
        for w in words:
            for i in range(1, len(w) + 1):
                self.index.setdefault(w[:i], len(self.index))
        cont = {t: i for i, t in enumerate(labels.texts) if t and not labels.starts[i] and i != labels.blank}
        longest = max(map(len, cont), default=0)
        edges = sorted((self.index[p[:-j]] * len(labels) + cont[p[-j:]], node)
                       for p, node in self.index.items() for j in range(1, min(longest, len(p)) + 1) if p[-j:] in cont)
        self.keys = torch.tensor([k for k, _ in edges], dtype=torch.long, device=device)  # (E,) sorted
        self.child = torch.tensor([n for _, n in edges], dtype=torch.long, device=device)  # (E,)
        start = [self.index.get(t, -1) if labels.starts[i] else -1 for i, t in enumerate(labels.texts)]
        self.start = torch.tensor(start, dtype=torch.long, device=device)  # (L,)
        self.num_labels = len(labels)
        self.dense = None  # (N, L) int32 every node's children, where that table is small enough
        if len(self.index) * len(labels) <= DENSE_MAX:
            self.dense = torch.full((len(self.index), len(labels)), -1, dtype=torch.int32, device=device)
            self.dense.view(-1)[self.keys] = self.child.int()

    def __len__(self) -> int:
        return len(self.index)

    def node_values(self, values: dict[str, float], fill: float, dtype: torch.dtype) -> Tensor:
        """(N,) values[string] at each node that is a key of `values`, `fill` elsewhere."""
        out = torch.full((len(self.index),), fill, dtype=dtype)
        for s, v in values.items():
            if s in self.index:
                out[self.index[s]] = v
        return out.to(self.keys.device)

    def follow(self, node: Tensor, label: Tensor, starts: Tensor) -> Tensor:
        """(E,) the node after reading `label` (E,) at `node` (E,): its own text's node where `starts` (E,)."""
        start = self.start.index_select(0, label)  # (E,)
        if self.dense is not None:
            child = self.dense.view(-1).index_select(0, node.clamp(min=0) * self.num_labels + label).long()  # (E,)
            return torch.where(starts, start, torch.where(node >= 0, child, -1))
        if len(self.keys) == 0:
            return torch.where(starts, start, -1)
        query = node.clamp(min=0) * self.num_labels + label  # (E,)
        at = torch.searchsorted(self.keys, query).clamp_(max=len(self.keys) - 1)  # (E,)
        found = (self.keys[at] == query) & (node >= 0)
        return torch.where(starts, start, torch.where(found, self.child[at], -1))


class Lexicon:
    """The LM's words (all it can spell) and the unigrams among them, for word-level decoding.

    `word[n]`: the LM's id of the word node n spells, -1 if none; `unigram[n]`: that word is a unigram;
    `prefix[n]`: some unigram starts with node n's string (a partial word outside them is penalised). <unk> is
    never a unigram (kenlm's `in` says no to it, so pyctcdecode drops it too)."""

    def __init__(self, words: dict[str, int], unigrams: set[str], labels: Labels, device: torch.device):
        unigrams = (unigrams & words.keys()) - {UNK}
        self.trie = Trie(words, labels, device)
        self.word = self.trie.node_values(dict(words), -1, torch.long)  # (N,)
        self.unigram = self.trie.node_values(dict.fromkeys(unigrams, 1), 0, torch.bool)  # (N,)
        starts = {w[:i] for w in unigrams for i in range(len(w) + 1)}
        self.prefix = self.trie.node_values(dict.fromkeys(starts, 1), 0, torch.bool)  # (N,)
        self.outside = None  # (N + 1, L) the partial word after label l at node n starts no unigram (row N: node -1)
        if self.trie.dense is not None:
            nxt = torch.cat([self.trie.dense.long(), torch.full_like(self.trie.dense[:1], -1).long()])  # (N + 1, L)
            nxt = torch.where(self.trie.start >= 0, self.trie.start, nxt)  # a word-starting label: its own text's node
            self.outside = ~((nxt >= 0) & self.prefix[nxt.clamp(min=0)]) & (nxt != 0)  # the empty word: no penalty
        self._penalty: tuple[float, Tensor] | None = None

    def penalty(self, unk_offset: float) -> Tensor:
        """(N + 1, L) float32 unk_offset where `outside`, else 0 (kept for the last unk_offset asked)."""
        if self._penalty is None or self._penalty[0] != unk_offset:
            self._penalty = unk_offset, torch.where(self.outside, unk_offset, 0.0).float()
        return self._penalty[1]


class Hotwords:
    """Words to boost, each with its weight, as pyctcdecode's HotwordScorer scores them: a finished word that is a
    hotword adds its weight; a partial word that starts one adds w * (characters so far) / (length of the
    shortest hotword it starts), w that hotword's weight. A phrase counts as its words, each boosted alone.
    A word listed twice keeps its largest weight."""

    def __init__(self, weights: dict[str, float], labels: Labels, device: torch.device):
        self.trie = Trie(weights, labels, device)
        self.weight = self.trie.node_values(weights, 0.0, torch.float64)  # (N,) 0 where no hotword ends
        shortest: dict[str, tuple[int, float]] = {}
        for w in sorted(weights, key=lambda w: (len(w), -weights[w])):
            for i in range(len(w) + 1):
                shortest.setdefault(w[:i], (len(w), weights[w]))
        self.min_len = self.trie.node_values({s: v[0] for s, v in shortest.items()}, 1, torch.float64)  # (N,)
        self.min_weight = self.trie.node_values({s: v[1] for s, v in shortest.items()}, 0.0, torch.float64)  # (N,)

    def finished(self, node: Tensor) -> Tensor:
        """(E,) the boost of a finished word at `node` (E,)."""
        return torch.where(node >= 0, self.weight[node.clamp(min=0)], 0.0)

    def partial(self, node: Tensor, length: Tensor) -> Tensor:
        """(E,) the boost of a partial word of `length` characters at `node` (E,); 0 off the tree."""
        n = node.clamp(min=0)
        return torch.where(node >= 0, self.min_weight[n] * length / self.min_len[n], 0.0)


def parse_hotwords(lines: Iterable[str], phrases: Iterable[str], weight: float) -> dict[str, float]:
    """{word: weight} from lines "phrase weight" (a weight ending the line, else `weight`) and phrases given alone."""
    out: dict[str, float] = {}
    pairs = [(p, weight) for p in phrases]
    for line in lines:
        parts = line.split()
        if not parts:
            continue
        try:
            pairs.append((" ".join(parts[:-1]), float(parts[-1])) if len(parts) > 1 else (parts[0], weight))
        except ValueError:
            pairs.append((" ".join(parts), weight))
    for phrase, w in pairs:
        for word in phrase.split():
            out[word] = max(w, out.get(word, w))
    return out
