"""Beam search against brute force, state reordering, and character-level models end to end."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from seqlm.cli import main
from seqlm.data.corpus import read_sentences
from seqlm.data.vocab import Vocab
from seqlm.eval.generate import beam_search
from seqlm.protocol import LMBase, select_state


class Bigram(LMBase):
    """A protocol model with a fixed random bigram table: the reference is easy to enumerate."""

    def __init__(self, seed: int, V: int = 5, p_end: float = 0.45):
        g = torch.Generator().manual_seed(seed)
        self.vocab = Vocab(["</s>", "<unk>"] + [f"w{i}" for i in range(V - 2)])
        table = torch.rand(V, V, generator=g) + 0.05
        table[:, 0] = 0.0
        table = (1 - p_end) * table / table.sum(1, keepdim=True)
        table[:, 0] = p_end
        self.logp = table.log()  # (V, V) row = previous token

    def initial_state(self, batch_size: int) -> torch.Tensor:
        return torch.zeros(batch_size, 1)

    def step(self, tokens: torch.Tensor, state: torch.Tensor):
        return self.logp[tokens], state + 1


def _brute_force(model: Bigram, max_words: int) -> list[tuple[float, list[int]]]:
    out = []
    V = len(model.vocab)
    for n in range(max_words + 1):
        for words in itertools.product(range(1, V), repeat=n):
            prev, total = 0, 0.0
            for w in (*words, 0):
                total += float(model.logp[prev, w])
                prev = w
            out.append((total, list(words)))
    return sorted(out, key=lambda x: -x[0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_finds_the_most_probable_sentences(seed):
    model = Bigram(seed)
    exact = _brute_force(model, 7)[:4]
    hyps = beam_search(model, beam=4, max_len=30)
    # p(</s>) = 0.45 at every step: a sentence of 8+ words is below 0.55^8 < every top-4 sentence here
    assert [h.ids for h in hyps] == [w for _, w in exact]
    assert [h.logp for h in hyps] == pytest.approx([s for s, _ in exact], abs=1e-9)


def test_a_wider_beam_never_finds_a_worse_best_sentence():
    for seed in range(5):
        model = Bigram(seed, p_end=0.2)
        narrow, wide = beam_search(model, beam=1, max_len=40)[0], beam_search(model, beam=8, max_len=40)[0]
        assert wide.logp >= narrow.logp - 1e-12


def test_select_state_reorders_every_tensor_of_a_nested_state():
    state = ([torch.arange(3), torch.arange(6).view(3, 2)], torch.tensor([True, False, True]), None)
    sel = select_state(LMBase(), state, torch.tensor([2, 2, 0]))  # the default layout: batch-first
    assert sel[0][0].tolist() == [2, 2, 0] and sel[0][1].tolist() == [[4, 5], [4, 5], [0, 1]]
    assert sel[1].tolist() == [True, True, True] and sel[2] is None


def test_char_unit_reads_characters_with_underscores(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("the cat\nab\n", encoding="utf-8")
    assert list(read_sentences(f, unit="char")) == [list("the_cat"), list("ab")]


def _char_corpus(d):
    d.mkdir()
    words = ["abc", "bca", "cab", "aa", "bb"]
    for split, n in (("train", 150), ("valid", 15), ("test", 15)):
        lines = [" ".join(words[(i * 7 + j * 3 + i // 3) % 5] for j in range(2 + i % 4)) for i in range(n)]
        (d / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def test_char_model_reports_bits_per_character_and_word(tmp_path, capsys):
    corpus = _char_corpus(tmp_path / "c")
    out = tmp_path / "m"
    tiny = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--context", "32", "--seq-len", "32",
            "--batch-size", "8", "--threads", "1", "--max-epochs", "2", "--unit", "char"]
    assert main(["train", "--model", "transformer", "--data", str(corpus), "--out", str(out), *tiny]) == 0
    capsys.readouterr()
    vocab = [line.split("\t")[0] for line in (out / "vocab.txt").read_text().splitlines()]
    assert set(vocab) == {"</s>", "<unk>", "a", "b", "c", "_"}
    assert main(["eval", str(out), "--data", str(corpus), "--split", "test"]) == 0
    r = json.loads(capsys.readouterr().out)
    text = (corpus / "test.txt").read_text().splitlines()
    chars = sum(len(line) + 1 for line in text)  # spaces become `_`, plus </s>
    words = sum(len(line.split()) + 1 for line in text)
    assert r["tokens"] == chars and r["words"] == words
    total_nats = math.log(r["ppl"]) * chars
    assert r["bpc"] == pytest.approx(math.log2(r["ppl"]), rel=1e-9)
    assert r["bits_per_word"] == pytest.approx(total_nats / math.log(2) / words, rel=1e-9)
    assert r["word_ppl"] == pytest.approx(math.exp(total_nats / words), rel=1e-9)
    assert main(["generate", str(out), "--beam", "3", "--num", "2", "--max-len", "40"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(set(x) <= set("abc ") for x in lines)


def test_beam_through_the_cli_matches_the_api(tmp_path, capsys):
    corpus = _char_corpus(tmp_path / "c")
    out = tmp_path / "kn"
    assert main(["train", "--model", "kn", "--order", "2", "--data", str(corpus), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["generate", str(out), "--beam", "2", "--num", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    import seqlm

    model = seqlm.load(out)
    assert lines == [" ".join(model.vocab.decode(h.ids)) for h in beam_search(model, 2)]
    assert main(["generate", str(out), "--beam", "-1"]) == 2
