"""The beams of a batch of utterances: K slots per utterance, stored as two stacked tensors so that taking any
set of beams is one gather of each.

A beam is a prefix of the transcript with pyctcdecode's identity: its text (finished words and the partial
word, or in token-level decoding its tokens) and the label of the last frame; its acoustic score sums the
probabilities of every alignment of the frames so far that yields it. Slots past an utterance's beam count are
dead: acoustic score -inf.
"""

from __future__ import annotations

import torch
from torch import Tensor

# the integer columns, then H columns of history (the hashes of the last H words or tokens, -1 before the first)
COLUMNS = ("key", "text", "part", "plen", "last", "node", "hot", "row")
KEY, TEXT, PART, PLEN, LAST, NODE, HOT, ROW = range(len(COLUMNS))
# key: hash of the text with the partial word (token level: of the tokens); text: of the finished words alone
# (word level); part: of the partial word; plen: its length in characters; last: the label of the last frame
# (the blank at the start); node, hot: the partial word's node among the LM's words and among the hotwords (-1:
# it starts none); row: the LM pool's row of the history read


class Beams:
    def __init__(self, scores: Tensor, ints: Tensor):
        self.scores = scores  # (..., 3) float64: acoustic score; LM and hotword score of the words read; the
        # partial word's score (seqlm.decode.search.Search.partial_scores)
        self.ints = ints  # (..., len(COLUMNS) + H) int64

    logit = property(lambda self: self.scores[..., 0])
    lm = property(lambda self: self.scores[..., 1])
    partial = property(lambda self: self.scores[..., 2])
    alive = property(lambda self: self.scores[..., 0] > -torch.inf)
    key = property(lambda self: self.ints[..., KEY])
    text = property(lambda self: self.ints[..., TEXT])
    part = property(lambda self: self.ints[..., PART])
    plen = property(lambda self: self.ints[..., PLEN])
    last = property(lambda self: self.ints[..., LAST])
    node = property(lambda self: self.ints[..., NODE])
    hot = property(lambda self: self.ints[..., HOT])
    row = property(lambda self: self.ints[..., ROW])
    hist = property(lambda self: self.ints[..., len(COLUMNS) :])

    @staticmethod
    def start(U: int, K: int, H: int, blank: int, device: torch.device) -> Beams:
        """One live beam per utterance: nothing read yet."""
        scores = torch.zeros((U, K, 3), dtype=torch.float64, device=device)
        scores[:, 1:, 0] = -torch.inf
        ints = torch.zeros((U, K, len(COLUMNS) + H), dtype=torch.long, device=device)
        ints[..., LAST] = blank
        ints[..., len(COLUMNS) :] = -1
        return Beams(scores, ints)

    def flat(self, index: Tensor) -> Beams:
        """Beams u * K + k for index (E,): one flat batch (E, ...)."""
        return Beams(self.scores.flatten(0, -2).index_select(0, index),
                     self.ints.flatten(0, -2).index_select(0, index))

    def rows(self, index: Tensor) -> Beams:
        """Rows `index` (R,) of flat beams."""
        return Beams(self.scores.index_select(0, index), self.ints.index_select(0, index))

    def written(self, active: int, u: Tensor, slot: Tensor, new: Beams) -> Beams:
        """These beams, in place, with utterances [0, active) replaced by the flat beams `new` at (u, slot); the
        others (finished utterances) as they were."""
        self.scores[:active, :, 0] = -torch.inf
        self.scores[u, slot] = new.scores
        self.ints[u, slot] = new.ints
        return self
