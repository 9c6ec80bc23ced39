"""The kenlm Python module's API on seqlm models: switching is a one-line change.

    import seqlm.kenlm as kenlm                 # instead of `import kenlm`
    model = kenlm.Model("lm.arpa.gz")            # ARPA (any name, gzip or not), seqlm binary, or a model dir
    model.score("the cat sat", bos=True, eos=True)
    state, out = kenlm.State(), kenlm.State()
    model.BeginSentenceWrite(state)
    model.BaseFullScore(state, "the", out)       # FullScoreReturn(log_prob, ngram_length, oov)

n-gram models give kenlm's numbers (tests/test_kenlm_compat.py holds them to the kenlm module within 1e-4,
with equal n-gram lengths and OOV flags). A neural model directory (lstm, rnn, transformer, ...) answers
the same calls from its `step`; seqlm.kenlm.neural says which. Beyond kenlm: `model.next_distribution(
states)`, the whole next-word distribution after many states at once; seqlm.kenlm.ctc puts any seqlm model
into pyctcdecode's beam search.
"""

from seqlm.kenlm.model import (
    ARPALoadComplain,
    Config,
    FullScoreReturn,
    LanguageModel,
    LoadMethod,
    Model,
)
from seqlm.ngram.query import state_attribute

__all__ = ["ARPALoadComplain", "Config", "FullScoreReturn", "LanguageModel", "LoadMethod", "Model", "State"]

__getattr__ = state_attribute(__name__)  # State: the compiled one where seqlm's n-gram loops are built
