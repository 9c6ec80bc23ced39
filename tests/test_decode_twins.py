"""seqlm.decode's two frame steps, the compiled one (seqlm.decode.compiled, _search.cpp: the CPU's default) and
the tensor one (seqlm.decode.search, its twin, which runs on a GPU), on the same utterances: the same n-best
lists, label sequences, scores and LM scores in every mode (word level with a KN model, with history pruning,
with hotwords; ▁ pieces and no LM; no LM; token level with a character model)."""

from __future__ import annotations

import numpy as np
import pytest

from seqlm.decode import CTCDecoder, DecodeConfig, resolve
from seqlm.decode.compiled import extension
from seqlm.decode.lexicon import parse_hotwords
from test_decode import ALPHA, BETA, build_char_kn3, build_kn3

from conftest import require_env


@pytest.fixture(autouse=True)
def _built():
    if extension() is None:
        require_env("the compiled frame step (_search.cpp) could not be built here")


@pytest.fixture(scope="module")
def kn3(tmp_path_factory):
    return build_kn3(tmp_path_factory.mktemp("kn3"))


@pytest.mark.parametrize("setup", ["word-lm", "word-lm-history", "hotwords-lm", "pieces", "token-lm", "no-lm",
                                   "best-label-only"])
def test_the_compiled_frame_equals_the_tensor_search(kn3, tmp_path, setup):
    """seqlm.decode.compiled (_search.cpp) is the twin of seqlm.decode.search: the same n-best, the same scores."""
    from seqlm.decode.search import Search

    _, model, _, labels, mats, _ = kn3
    cfg = dict(alpha=ALPHA, beta=BETA, beam_width=8, nbest=8, prune_history=setup == "word-lm-history")
    if setup == "best-label-only":  # no label reaches ln p 0: each frame tries its best label alone, a space too
        cfg["token_min_logp"] = 0.0
    lm, hot, names = model, None, labels
    if setup == "hotwords-lm":
        hot = parse_hotwords([], ["cat", "mat", "the"], 3.0)
    if setup in ("pieces", "no-lm"):  # word starts as ▁ pieces next to a space label, no LM
        names, lm = (["", " ", "a", "b", "▁a", "▁b"], None) if setup == "pieces" else (labels, None)
        rng = np.random.default_rng(5)
        mats = [rng.normal(0, 2, (int(rng.integers(4, 30)), len(names))) for _ in range(30)]
    if setup == "token-lm":
        names, lm, mats = build_char_kn3(tmp_path)
    compiled = CTCDecoder(resolve(names), lm, DecodeConfig(**cfg, batch_size=7), hotwords=hot)
    tensor = CTCDecoder(resolve(names), lm, DecodeConfig(**cfg, batch_size=7), hotwords=hot)
    assert not isinstance(compiled.search, Search)
    tensor.search = Search(tensor.tables)
    for a, b in zip(compiled.decode(mats), tensor.decode(mats), strict=True):
        assert [h.text for h in a] == [h.text for h in b]
        assert [h.labels for h in a] == [h.labels for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-9)
        np.testing.assert_allclose([h.lm for h in a], [h.lm for h in b], atol=1e-9)
