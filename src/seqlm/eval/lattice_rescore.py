"""`seqlm rescore MODEL --lattice FILE...`: lattice rescoring with any model (seqlm.lattice.expand).

For each lattice file: read it (HTK SLF, or Kaldi text with `--words`), expand it by the model's context
(exact for finite-context models: KN/FNN order n, AFP-K order K+1; the n-gram-merging approximation for
unbounded histories, reported as such), replace each arc's LM score by lm = W new + (1 - W) old
(W = `--new-lm-weight`, the convention of n-best rescoring: seqlm.eval.rescore.Combination), and
- with `--lattice-out DIR`: write the expanded lattice to DIR/<file name> in the format it was read;
- print the 1-best of every lattice (`uttid word ...`, the lattice's spelling, no sentence marks or silence)
  to stdout or `--best FILE`;
- with `--out FILE`: the score table of n-best rescoring (key, acoustic, old_lm, new_lm, total, oov) for the
  `--nbest-decode N` best distinct texts of each lattice (default 1);
- with `--nbest-out FILE`: the same hypotheses as the TSV `seqlm rescore --tsv` reads (key, acoustic, lm, text):
  text in the model's words (after `--lowercase` / `--map`; no `<s>`, `</s>`, silence or null words), lm the
  old LM score, acoustic everything else of the total but the per-word penalty of the text's words; so
  `seqlm rescore MODEL --tsv FILE --lm-scale L --word-penalty P` (L, P as this run used them: the JSON line's
  lmscale and -wdpenalty) gives the same totals;
- report per lattice, as one JSON line on stderr: sizes, expanded states, order, whether the scores are exact,
  what the beam / the per-node cap pruned, the scales used and where they came from, unknown words, seconds.
Path total, as HTK's LArcTotLike: acscale * acoustic + lmscale * lm + prscale * r + wdpenalty per non-null word,
less `--oov-penalty` per word the model scores as <unk>. acscale=, lmscale=, prscale=, wdpenalty= come from the
SLF header (Kaldi lattices: 1, 1, 1, 0) unless `--acoustic-scale`, `--lm-scale`, `--word-penalty P`
(wdpenalty = -P) say otherwise.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from seqlm import checkpoint as ckpt
from seqlm.errors import SeqlmError
from seqlm.eval.rescore import Combination, format_table
from seqlm.lattice import Arc, Lattice, WordMap, best_paths, expand, read_lattices, write_lattices
from seqlm.lattice.slf import read_text
from seqlm.protocol import require

SCALES = ("acscale", "lmscale", "prscale", "wdpenalty")  # HTK header fields of the total
MAX_PATHS = 64  # distinct texts: search at most this many times N best paths


def read_map(path: str | Path) -> dict[str, str]:
    """`lattice-word model-word` per line."""
    out = {}
    for n, line in enumerate(read_text(path), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise SeqlmError(f"{path}:{n}: expected 'lattice-word model-word', got {len(parts)} fields")
        out[parts[0]] = parts[1]
    return out


def set_scales(lat: Lattice, comb: Combination) -> tuple[dict[str, float], dict[str, str]]:
    """Flags override the lattice's header values (SRILM's -htk-lmscale ...); -> (values, where each came from)."""
    flags = {"acscale": comb.acoustic_scale, "lmscale": comb.lm_scale,
             "wdpenalty": None if comb.word_penalty is None else -comb.word_penalty}
    used, source = {}, {}
    for k in SCALES:
        if flags.get(k) is not None:
            setattr(lat, k, flags[k])
            if lat.header:
                lat.header[k] = repr(flags[k])  # the written lattice says what the totals used
            source[k] = "flag"
        else:
            source[k] = "header" if k in lat.header else "default"
        used[k] = getattr(lat, k)
    return used, source


def model_word(words: WordMap, word: str) -> str:
    """The spelling the model reads for a lattice word (--map, else --lowercase)."""
    return words.mapping.get(word, word.lower() if words.lowercase else word)


def mark_oovs(lat: Lattice, words: WordMap, oov_penalty: float) -> tuple[int, int]:
    """Set the words the model scores as <unk> (charged oov_penalty); -> (word tokens, of them <unk>)."""
    unk, oov, n = words.vocab.unk_id, set(), 0
    for a in lat.arcs:
        t = words.token(a.word)
        if t is not None:
            n += 1
            if t == unk:
                oov.add(a.word)
    lat.oov_words, lat.oov_penalty = frozenset(oov), oov_penalty
    return n, sum(1 for a in lat.arcs if a.word in lat.oov_words)


def rescore_lattice(lat: Lattice, model, words: WordMap, comb: Combination | None = None, merge_order: int = 4,
                    order: int | None = None, beam: float | None = None, max_states: int | None = None,
                    nbest: int = 1) -> tuple[Lattice, list, dict]:
    """(rescored expanded lattice, [(total, arcs)] n best paths, report); arc.lm = W new + (1 - W) old."""
    out, paths, report, _ = _rescore(lat, model, words, comb, merge_order, order, beam, max_states, nbest)
    return out, paths, report


def _rescore(lat: Lattice, model, words: WordMap, comb: Combination | None, merge_order: int, order: int | None,
             beam: float | None, max_states: int | None, nbest: int = 1) -> tuple[Lattice, list, dict, dict]:
    """rescore_lattice, and {id(arc): (new, old)} LM scores of the expanded arcs."""
    comb = comb or Combination()
    comb.check()
    used, source = set_scales(lat, comb)
    tokens, oov_tokens = mark_oovs(lat, words, comb.oov_penalty)
    t0 = time.perf_counter()
    exp = expand(lat, model, words, merge_order, order, beam, max_states)
    out = exp.lattice
    for k in (*SCALES, "oov_words", "oov_penalty"):
        setattr(out, k, getattr(lat, k))
    w, lm = comb.new_lm_weight, {}
    for arc, old in zip(out.arcs, exp.old_lm, strict=True):
        lm[id(arc)] = (arc.lm, old)
        arc.lm = arc.lm if w == 1.0 else w * arc.lm + (1.0 - w) * old
    paths = best_paths(out, max(nbest, 1))
    report = {"utterance": lat.name, "nodes": lat.num_nodes, "arcs": len(lat.arcs), "expanded_nodes": out.num_nodes,
              "expanded_arcs": len(out.arcs), "max_states_per_node": exp.max_states_per_node, "order": exp.order,
              "exact": exp.exact, "pruned_beam": exp.pruned_beam, "pruned_cap": exp.pruned_cap,
              "model_steps": exp.model_steps, "seconds": time.perf_counter() - t0, **used, "scales_from": source,
              "new_lm_weight": w, "oov_penalty": comb.oov_penalty, "word_tokens": tokens, "oov_tokens": oov_tokens}
    if not exp.exact:
        report["note"] = ("approximate: " + ("the beam or the state cap pruned states" if exp.pruned_beam or
                          exp.pruned_cap else f"unbounded history merged by its last {exp.order - 1} words"))
    return out, paths, report, lm


@dataclass
class Hyp:
    """One lattice path as an n-best hypothesis (the columns of `--out` and `--nbest-out`)."""

    text: list[str]  # the model's words
    acoustic: float  # the total less lmscale * lm, less the per-word penalty of `text`, plus the OOV charges
    old_lm: float
    new_lm: float
    total: float
    oov: int


def hypotheses(lat: Lattice, words: WordMap, lm: dict[int, tuple[float, float]], n: int) -> tuple[list[Hyp], int]:
    """The n best paths with distinct texts (the best path of each text), best first; and how many best paths
    were searched for them (at most MAX_PATHS * n: fewer texts come back when the cap binds)."""
    k = n
    while True:
        paths, seen = best_paths(lat, k), {}
        for total, arcs in paths:
            text = tuple(model_word(words, a.word) for a in arcs if words.token(a.word) is not None)  # type: ignore
            if text not in seen:
                seen[text] = _hyp(lat, list(text), total, arcs, lm)
            if len(seen) == n:
                return list(seen.values()), k
        if len(paths) < k or k >= MAX_PATHS * n:
            return list(seen.values()), k
        k *= 4


def _hyp(lat: Lattice, text: list[str], total: float, arcs: list[Arc], lm: dict) -> Hyp:
    oov = sum(1 for a in arcs if a.word in lat.oov_words)
    acoustic = total - lat.lmscale * sum(a.lm for a in arcs) - lat.wdpenalty * len(text) + lat.oov_penalty * oov
    return Hyp(text, acoustic, sum(lm[id(a)][1] for a in arcs), sum(lm[id(a)][0] for a in arcs), total, oov)


def _oov_cause(words: WordMap) -> str:
    """Why most words are unknown to the model: a guess from the unknown spellings."""
    unknown, vocab = words.unknown, words.vocab.stoi
    if not words.lowercase and sum(w.lower() in vocab for w in unknown) * 2 > len(unknown):
        return "the lattice is in upper case and the model's words are not: try --lowercase"
    if words.lowercase and sum(w in vocab or w.upper() in vocab for w in unknown) * 2 > len(unknown):
        return "the model's words are upper case: drop --lowercase"
    return ("the model was trained on other words or another tokenisation; --map FILE maps lattice words "
            "to the model's")


@dataclass
class Outputs:
    """Where `seqlm rescore --lattice` writes (None: not written; best None: stdout)."""

    lattice_dir: str | None = None  # --lattice-out DIR: the rescored lattices
    best: str | None = None  # --best FILE: the 1-best of each lattice
    table: str | None = None  # --out FILE: the score table of the n-best hypotheses
    nbest: str | None = None  # --nbest-out FILE: the n-best hypotheses as `--tsv` reads them
    n: int = 1  # --nbest-decode N: hypotheses per lattice in table and nbest


def rescore_lattice_files(model_dir: str, files: list[str], outputs: Outputs, comb: Combination | None = None,
                          words_txt: str | None = None, lowercase: bool = False, map_file: str | None = None,
                          merge_order: int = 4, order: int | None = None, beam: float | None = None,
                          max_states: int | None = None) -> list[dict]:
    """What `seqlm rescore --lattice` does (module docstring); returns the reports."""
    import seqlm

    model = seqlm.load(model_dir)
    require(model, words="--lattice (an arc is one word, one `step`; rescore its --nbest-out list instead)")
    wm = WordMap(model.vocab, lowercase, read_map(map_file) if map_file else {})
    reports, best_lines, hyps, warned = [], [], [], False
    for f in files:
        fmt, lattices = read_lattices(f, words_txt)
        done = []
        for lat in lattices:
            wm.unknown.clear()
            out, paths, rep, lm = _rescore(lat, model, wm, comb, merge_order, order, beam, max_states)
            rep |= {"file": f, "unknown_words": len(wm.unknown)}
            key = re.sub(r"\s", "_", lat.name)
            if outputs.table or outputs.nbest:
                found, searched = hypotheses(out, wm, lm, outputs.n)
                hyps += [(f"{key}-{i}", h) for i, h in enumerate(found, 1)]
                rep |= {"nbest": len(found), "nbest_paths_searched": searched}
            print(json.dumps(rep), file=sys.stderr)
            if not warned and rep["oov_tokens"] * 2 > rep["word_tokens"]:
                print(f"seqlm: lattice {lat.name}: {rep['oov_tokens']} of {rep['word_tokens']} word tokens are outside "
                      f"the model's vocabulary (scored as <unk>); likely cause: {_oov_cause(wm)}", file=sys.stderr)
                warned = True
            reports.append(rep)
            done.append(out)
            best_lines.append(" ".join([key, *(a.word for a in paths[0][1] if wm.token(a.word) is not None)]) + "\n")
        if outputs.lattice_dir:
            write_lattices(done, Path(outputs.lattice_dir) / Path(f).name, fmt, words_txt)
    _write(outputs, best_lines, hyps)
    return reports


def _write(outputs: Outputs, best_lines: list[str], hyps: list[tuple[str, Hyp]]) -> None:
    if outputs.nbest:
        rows = ["key\tacoustic\tlm\ttext"] + [f"{k}\t{h.acoustic:.6f}\t{h.old_lm:.6f}\t{' '.join(h.text)}"
                                              for k, h in hyps]
        ckpt.atomic_write_text(outputs.nbest, "\n".join(rows) + "\n")
    if outputs.table:
        cols = [[getattr(h, c) for _, h in hyps] for c in ("acoustic", "old_lm", "new_lm", "total", "oov")]
        ckpt.atomic_write_text(outputs.table, format_table([k for k, _ in hyps], *cols))
    if outputs.best:
        ckpt.atomic_write_text(outputs.best, "".join(best_lines))
    else:
        sys.stdout.write("".join(best_lines))
