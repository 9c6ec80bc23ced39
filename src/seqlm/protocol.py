"""The one interface every model family offers, the Kneser-Ney n-gram model included, and the contract each
model states: its text conventions (`TextSpec`) and what it can do (`Capabilities`).

Evaluation, scoring, rescoring, interpolation, decoding and generation are written once against this
protocol; none of them asks which family a model is, and none probes for optional attributes: what a
caller needs is a method of `LanguageModel` (with a default in `LMBase`) or a declared capability, and the
`check_*` functions below give the one-line refusals every command shares.

A `Batch` holds B rows of T predicted positions. Row b predicts `targets[b, t]` from the inputs up
to and including `inputs[b, t]`. A sentence starts wherever `resets[b, t]` is True: there the input
is the start symbol and no earlier input may be used as context. Padding has `mask` False.
Sentence-per-row batches (evaluation) and packed 200-token batches of whole sentences (FOFE training)
are both Batches; only the reset pattern differs.

States of `step` are batched: one row per sequence. Beam search keeps and reorders rows, lattice expansion
picks rows of many `step` calls and concatenates them; both do so only through `select_state` and
`cat_states`, never by looking inside a state. By default (`LMBase`) a state is a tensor, or nested tuples /
lists / dicts of tensors, each with the batch on dimension 0, and rows concatenate along it. A family whose
state is laid out otherwise (an LSTM's (layers, B, H), a Transformer's key/value caches of different
lengths, a mixture's per-component states) overrides both methods.

A decoder (beam search, lattice expansion, CTC prefix search) holds `Prefixes`: B token sequences, each as
the state after reading its last token. It alternates `advance` (the (B, V) distribution of every
continuation, in one call) and `extend` (the states of the (row, token) pairs it keeps, R of them, never
B x V), starting from `begin(model, B)`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from seqlm.config import DataConfig
from seqlm.data.corpus import TokenStream, encode_file, encode_sentences
from seqlm.data.tokenizers import token_hash, units_of
from seqlm.data.vocab import BOS, Vocab
from seqlm.errors import SeqlmError

State = Any  # whatever a family needs to continue a sequence (hidden vector, recent ids, codes)


@dataclass
class Batch:
    inputs: Tensor  # (B, T) int64 context tokens; the start symbol at each sentence start
    targets: Tensor  # (B, T) int64 predicted tokens
    mask: Tensor  # (B, T) bool, False on padding
    resets: Tensor  # (B, T) bool, True where a new sentence starts (history is cut before it)

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device, non_blocking=True) for t in (self.inputs, self.targets, self.mask, self.resets)))


@dataclass(frozen=True)
class Prefixes:
    """B prefixes a decoder extends: `state` is the model's `step` state after each prefix's last token
    (`initial_state`'s when nothing has been read), `cache` what `advance` needs beyond it, kept by `extend`:
    by default the (B, V) distribution `step` returned with the state; None where `advance` computes it from
    the state (n-gram, cache) or nothing has been read. Only the model that made them looks inside.
    `memo`: a dict the caller keeps with these rows (seqlm.decode.lmpool's pool); `advance_targets` may keep
    tensors in it (or dicts of them) whose dimension 0 is the row, computed for some rows, to reuse when those
    rows are asked again (ClassSoftmax: each (row, class) normaliser). Where the caller drops or renumbers rows
    it selects the memo's rows as it does the states'. None: nothing is kept."""

    state: State
    cache: Any = None
    memo: dict | None = None


@runtime_checkable
class LanguageModel(Protocol):
    """What eval/score/rescore/interpolate/decode/generate rely on: the whole contract. `LMBase` gives the
    optional methods their defaults; a family overrides what it does otherwise."""

    vocab: Vocab
    family: str  # the registry name (seqlm.registry.FAMILIES), set by seqlm.load and by training

    def score(self, batch: Batch) -> Tensor:
        """(B, T) natural-log probability of each target; 0 where `mask` is False."""
        ...

    def initial_state(self, batch_size: int) -> State:
        """The state at a sentence start, before the start symbol has been read."""
        ...

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """Read tokens (B,) and return log-probabilities of the next token (B, V) and the new state."""
        ...

    def capabilities(self) -> Capabilities: ...

    def text_spec(self) -> TextSpec: ...

    def context_window(self) -> int | None: ...

    def select_state(self, state: State, rows: Tensor) -> State: ...

    def cat_states(self, states: list[State]) -> State: ...

    def step_targets(self, tokens: Tensor, state: State, rows: Tensor, targets: Tensor) -> tuple[Tensor, State]: ...

    def advance(self, prefixes: Prefixes) -> Tensor:
        """(B, V) natural-log distribution of the token after each prefix, one tensor on the model's device
        (an n-gram model's or a cache's: where its state is): row b is what `step` returned when it read
        prefix b's last token."""
        ...

    def advance_targets(self, prefixes: Prefixes, rows: Tensor, targets: Tensor) -> Tensor:
        """(N,) `advance(prefixes)[rows, targets]`: ln p of targets[i] after prefix rows[i] (a decoder scoring
        the word a beam ends). Without the (B, V) table where the model declares `sparse_targets`."""
        ...

    def extend(self, prefixes: Prefixes, rows: Tensor, tokens: Tensor) -> Prefixes:
        """R prefixes: prefix rows[i] followed by tokens[i] (rows, tokens (R,); a row may repeat). Their
        state is `step(tokens, select_state(prefixes.state, rows))[1]`; a model that computes the
        distribution from the state leaves it to `advance`, so a kept prefix never read from costs nothing."""
        ...

    def score_text(self, stream: TokenStream, stream_mode: bool, max_tokens: int, scorer: Any) -> Any: ...

    def component_logp(self, stream: TokenStream, stream_mode: bool, max_tokens: int, scorer: Any) -> Any: ...

    def settings(self) -> dict[str, Any]: ...

    def describe(self) -> dict[str, Any]: ...

    def untie(self) -> bool: ...

    def generate_lines(self, args: Any) -> list[str] | None: ...


@runtime_checkable
class StreamingModel(LanguageModel, Protocol):
    """A model that can carry its history across sentence boundaries (recurrent families).

    `score_stream` scores a batch whose rows continue the rows of the previous call; `state` is what the
    previous call returned (None at the very start). Used by `eval --stream` and by TBPTT training. The scores
    must not depend on how the text is cut into calls (tests/test_conformance.py checks chunks of 1 token up).
    """

    def score_stream(self, batch: Batch, state: State | None) -> tuple[Tensor, State]: ...


def select_state(model: LanguageModel, state: State, rows: Tensor) -> State:
    """The state of rows `rows` (R,) of a batched `state`, in that order (a row may repeat)."""
    return model.select_state(state, rows)


def cat_states(model: LanguageModel, states: list[State]) -> State:
    """One batched state holding the rows of `states` (a non-empty list), in order."""
    return model.cat_states(states)


def begin(model: LanguageModel, batch_size: int) -> Prefixes:
    """`batch_size` prefixes holding the start symbol alone: where a decoder begins."""
    rows = torch.zeros(batch_size, dtype=torch.long)
    start = torch.full((batch_size,), model.vocab.bos_id, dtype=torch.long, device=model_device(model))
    return model.extend(Prefixes(model.initial_state(1)), rows, start)


def _select_batch_first(state: State, rows: Tensor) -> State:
    if isinstance(state, Tensor):
        return state.index_select(0, rows.to(state.device))
    if isinstance(state, (tuple, list)):
        return type(state)(_select_batch_first(s, rows) for s in state)
    if isinstance(state, dict):
        return {k: _select_batch_first(v, rows) for k, v in state.items()}
    return state  # no per-row content (None, a number)


def _cat_batch_first(states: list[State]) -> State:
    first = states[0]
    if isinstance(first, Tensor):
        return torch.cat(states)
    if isinstance(first, (tuple, list)):
        return type(first)(_cat_batch_first([s[i] for s in states]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _cat_batch_first([s[k] for s in states]) for k in first}
    return first  # no per-row content (None, a number)


def model_device(model: LanguageModel) -> torch.device:
    """Where a model's weights are (the first parameter's device); CPU for a model without any."""
    if isinstance(model, torch.nn.Module):
        for p in model.parameters():
            return p.device
    return torch.device("cpu")


def context_order(model: LanguageModel) -> int | None:
    """n when the model predicts from its last n-1 tokens only (a finite-context model), else None: with it
    the lattice rescorer (seqlm.lattice.expand) expands exactly."""
    return model.capabilities().context_order


# ---------------------------------------------------------------------------------------------------------
# The contract: what a model declares about its text and what it can do. Every command asks these, never a
# family name or an attribute that may be missing.

UNITS = ("word", "char", "token")


@dataclass(frozen=True)
class TextSpec:
    """How text becomes this model's tokens. Saved in config.json ("text"); `require` compares a request
    against it, so a model is never fed text split another way than it was trained on.

    Blank lines are not sentences, for every command (eval, score, query, rescore, interpolate): they are
    skipped, and `seqlm score` prints an empty line for each, so its output lines up with its input.
    """

    unit: str = "word"  # word | char: characters, with `_` between words | token: a tokenizer's pieces
    raw: bool = False  # untokenised text, split by seqlm.data.corpus.tokenize_raw
    vocab_size: int = 0
    vocab_hash: str = ""  # sha256 of the vocabulary's tokens in id order (first 16 hex digits)
    unk: str = "map"  # map: a word outside the vocabulary is scored as <unk>; none: it is an error (kn)
    blank_lines: str = "skip"  # skip: a blank line is no sentence (see the class docstring)
    tokenizer_hash: str = ""  # unit token: sha256 of the tokenizer file (first 16 hex digits); "" otherwise

    @staticmethod
    def of(vocab: Vocab, unit: str = "word", raw: bool = False, unk: str = "map", tokenizer_hash: str = "") -> TextSpec:
        return TextSpec(unit, raw, len(vocab), vocab_hash(vocab), unk, tokenizer_hash=tokenizer_hash)

    def same_reading(self, other: TextSpec) -> bool:
        """Whether both read a line of text into the same tokens (vocabularies aside)."""
        return ((self.unit, self.raw, self.blank_lines, self.tokenizer_hash) ==
                (other.unit, other.raw, other.blank_lines, other.tokenizer_hash))

    def describe(self) -> str:
        unit = f"token units of tokenizer {self.tokenizer_hash}" if self.unit == "token" else f"{self.unit} units"
        return f"{unit} from {'raw' if self.raw else 'tokenised'} text"


def vocab_hash(vocab: Vocab) -> str:
    return hashlib.sha256("\n".join(vocab.itos).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Capabilities:
    """What a model can do, declared by its family (`LanguageModel.capabilities`) and saved in config.json.
    tests/test_conformance.py holds every registered family to what it declares."""

    stream: bool = False  # carries its state across sentences (`eval --stream`, `score_stream`)
    context_order: int | None = None  # n: predicts from its last n-1 tokens only (exact lattice expansion)
    window: int | None = None  # attends to at most this many tokens; a longer history slides (Transformer)
    batched_step: bool = True  # `step` advances B independent rows at once
    dynamic: bool = False  # has weights that dynamic evaluation may update (`eval --dynamic-lr`)
    quantizable: bool = False  # has Linear/LSTM layers that `seqlm quantize` can make int8
    peeks: bool = False  # reads the scored sentence itself (a dae model's c(s)): not a plain LM figure
    # `advance_targets` looks up the tokens asked for (an n-gram's lookups) at a fraction of `advance`'s (B, V)
    # table: a decoder asks it for the words its beams end instead of keeping whole rows
    sparse_targets: bool = False


class LMBase:
    """Default implementations of the protocol's optional methods; every family's model class derives from
    it (before nn.Module). A family overrides what it does otherwise, in its own file."""

    vocab: Vocab
    family: str = "unnamed"  # the registry name, set by seqlm.load and by training
    data_config: DataConfig | None = None  # how its text was read, set by seqlm.load and by training

    def capabilities(self) -> Capabilities:
        return Capabilities()

    def text_spec(self) -> TextSpec:
        data = self.data_config or DataConfig()
        return TextSpec.of(self.vocab, data.unit, data.raw, data.unk, token_hash(data))

    def context_window(self) -> int | None:
        """How many of the latest inputs (the start symbol counted) a prediction can depend on; None: all of
        them. The declared window, else n - 1 of a finite-context model; a model whose reach is finite only
        to float rounding (FOFE with alpha < 1) says so itself. Evaluation re-reads that much before each
        piece of a long line."""
        caps = self.capabilities()
        if caps.window is not None:
            return caps.window
        return None if caps.context_order is None else caps.context_order - 1

    def select_state(self, state: State, rows: Tensor) -> State:
        """The state of rows `rows` (R,) of a batched `state`, in that order (a row may repeat)."""
        return _select_batch_first(state, rows)

    def cat_states(self, states: list[State]) -> State:
        """One batched state holding the rows of `states` (a non-empty list), in order."""
        return _cat_batch_first(states)

    def step_targets(self, tokens: Tensor, state: State, rows: Tensor, targets: Tensor) -> tuple[Tensor, State]:
        """`step`, but only ln p of targets (N,) after rows (N,): the lattice expander asks for arcs' words
        only. A model that can skip the full (B, V) distribution overrides this."""
        logp, new = self.step(tokens, state)  # (B, V)
        return logp[rows.to(logp.device), targets.to(logp.device)], new  # (N,)

    def advance(self, prefixes: Prefixes) -> Tensor:
        """The distribution `extend` kept: `step` computes it with the state anyway."""
        if prefixes.cache is None:
            raise SeqlmError("advance: these prefixes have read no token yet; start from protocol.begin(model, B)")
        return prefixes.cache

    def advance_targets(self, prefixes: Prefixes, rows: Tensor, targets: Tensor) -> Tensor:
        """Gathered from `advance`'s whole table (a model that declares sparse_targets looks them up)."""
        logp = self.advance(prefixes)  # (B, V)
        return logp[rows.to(logp.device), targets.to(logp.device)]  # (N,)

    def extend(self, prefixes: Prefixes, rows: Tensor, tokens: Tensor) -> Prefixes:
        """One batched `step` of the R rows chosen."""
        logp, state = self.step(tokens, self.select_state(prefixes.state, rows))  # (R, V)
        return Prefixes(state, logp)

    def score_text(self, stream: TokenStream, stream_mode: bool, max_tokens: int, scorer: Any) -> Any:
        """(N,) ln p of every token of a text, for a model that scores text its own way (a mixture: each
        component in its own mode, through `scorer`, the one evaluation loop of seqlm.eval.perplexity); None:
        that loop scores the model directly."""
        return None

    def settings(self) -> dict[str, Any]:
        """Evaluation settings that change the figure (dynamic evaluation's rate), added to eval's JSON."""
        return {}

    def describe(self) -> dict[str, Any]:
        """What `seqlm info` adds beyond family, config and parameters (n-gram sizes, a history rule)."""
        return {}

    def untie(self) -> bool:
        """Give a tied output matrix its own copy (before int8 quantization); True when there was one."""
        return False

    def component_logp(self, stream: TokenStream, stream_mode: bool, max_tokens: int, scorer: Any) -> Any:
        """(K, N) per-component ln p of a text, for a model made of components (a mixture); None otherwise."""
        return None

    def generate_lines(self, args: Any) -> list[str] | None:
        """`seqlm generate` output for a model that needs more than a sentence start (a dae: c(s) first);
        None: the generic sampler and beam search serve it."""
        return None


def stream_refusal(model: LanguageModel) -> str | None:
    """None when the model can be scored as a stream; else why `--stream` scores it sentence by sentence (a
    note on stderr, and "mode": "sentence" in the result): scored as a stream it would carry a state it never
    learnt to use (a sentence-trained Transformer) or reset mid-sentence (a --sentence-independent RNN)."""
    if model.capabilities().stream:
        return None
    return (f"seqlm: this {model.family} model was trained sentence by sentence (it restarts at every sentence: "
            "--sentence-independent, or a Transformer without --cross-sentence) and cannot carry its state across "
            "sentences; scoring sentence by sentence")


def require(model: LanguageModel, *, raw: bool | None = None, words: str = "", dynamic: str = "",
            quantizable: str = "") -> TextSpec:
    """The one check before a command uses a model: the model's TextSpec, after refusing, in one line, what it
    cannot do as asked. `raw`: how the user asked to read text (None: the model's own way); `words`: the
    command needs whitespace-separated words (lattice arcs, kenlm's calls), named in the message; `dynamic`,
    `quantizable`: the command needs that capability (the option that asks for it, named in the message).
    Stream mode is no refusal: a model that cannot stream is scored by sentence (`stream_refusal`)."""
    spec, caps = model.text_spec(), model.capabilities()
    if raw is not None and raw != spec.raw:
        raise SeqlmError(f"--raw: this model reads {spec.describe()}; text is read the way the model was "
                         f"trained, {'drop' if raw else 'add'} --raw" + ("" if raw else " (or leave it out)"))
    if words and (spec.unit != "word" or spec.raw):
        raise SeqlmError(f"{words} takes whitespace-separated words, and this model reads {spec.describe()}")
    if dynamic and not caps.dynamic:
        raise SeqlmError(f"{dynamic}: a {model.family} model has no weights with a running history to update; "
                         "dynamic evaluation applies to rnn, afp, lstm and transformer models, and mixtures "
                         "holding one")
    if quantizable and not caps.quantizable:
        raise SeqlmError(f"{quantizable}: {model.family} models have no Linear or LSTM layers to quantize; it "
                         "applies to the neural families (a mixture: quantize its components and interpolate those)")
    return spec


def check_same_text(models: list[LanguageModel], names: list[str]) -> TextSpec:
    """Models that are combined (mixtures, interpolation, rescoring, decoding) must read text alike and share
    their words: a word one knows and another lacks would be scored as the other's <unk>, and the mixed
    distribution would no longer sum to one. Refuse, naming the difference."""
    first = models[0].text_spec()
    words = _words(models[0].vocab)
    for m, name in zip(models[1:], names[1:], strict=True):
        spec = m.text_spec()
        if not first.same_reading(spec):
            raise SeqlmError(f"{name} reads {spec.describe()}, {names[0]} reads {first.describe()}: models "
                             "combined must read text alike")
        other = _words(m.vocab)
        if other != words:
            only_a, only_b = sorted(words - other), sorted(other - words)
            raise SeqlmError(f"{names[0]} and {name} have different vocabularies ({len(only_a)} words only in "
                             f"the first, e.g. {only_a[:3]}; {len(only_b)} only in the second, e.g. {only_b[:3]}): "
                             "a mixture would not sum to one; combine models trained with one vocabulary")
    return first


def _words(vocab: Vocab) -> set[str]:
    """The words a model predicts; <s> is context only (ARPA files have it, neural models read </s>)."""
    return set(vocab.itos) - {BOS}


def encode_text(model: LanguageModel, path: str | Path, raw: bool | None = None) -> TokenStream:
    """A text file as the model reads text (its unit, raw or not): the one reader every command uses. `raw`
    is what the user asked for (None: the model's own setting); a different one is refused."""
    spec = require(model, raw=raw)
    return encode_file(path, model.vocab, spec.raw, unit=units_of(spec))


def encode_lines(model: LanguageModel, sentences: list[list[str]]) -> TokenStream:
    """In-memory sentences (lists of words: the API, n-best hypotheses) as the model reads them."""
    return encode_sentences(sentences, model.vocab, unit=units_of(model.text_spec()))
