"""The commands README.md and docs/*.md show stay true to the code.

Every `seqlm ...` line of a ```sh / ```console block, an indented code block or an inline code span is checked
against the real argparse parser of seqlm.cli: the subcommand exists and every `--flag` is one of its options
(for `seqlm train`, one of its own options or a `--key value` field of the family's config, as
`--help-config` lists them). `python bench/X.py ...` lines name a script that exists, flags it defines and
rows it has. Every repo-relative path a command names (bench/..., src/..., docs/..., tests/...) exists, and no
page names an absolute path of the machine it was written on. Nothing is run: it takes well under a second.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from seqlm.cli import build_parser
from seqlm.config import RENAMED, DataConfig, flat_fields
from seqlm.registry import DEFAULT_FAMILY, FAMILIES

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`]+)`")
REPO_PATH = re.compile(r"^(?:bench|src|docs|tests)/[\w./-]*\w$")
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:work|root|home)/\S*")
SEPARATORS = {"|", "||", "&&", ";", "&"}
REDIRECTS = {"<", ">", ">>", "2>", "2>&1", "&>"}


def _block_lines(lang: str, body: str) -> list[str]:
    """Command lines of a fenced block: every line of ```sh, the `$ ` lines of ```console."""
    body = re.sub(r"\\\n\s*", " ", body)  # continuation lines
    if lang in ("sh", "bash", "shell"):
        return [line for line in body.splitlines() if line.strip()]
    if lang == "console":
        return [line[2:] for line in body.splitlines() if line.startswith("$ ")]
    return []


def command_lines(text: str) -> list[str]:
    """Shell command lines of a page: fenced sh/console blocks, indented blocks, inline `seqlm`/bench spans."""
    lines = [line for m in FENCE.finditer(text) for line in _block_lines(m.group(1), m.group(2))]
    prose = FENCE.sub("", text)
    indented = re.findall(r"(?:^|\n\n)((?:(?: {4}|\t)[^\n]*\n?)+)", prose)
    lines += [ln.strip() for block in indented for ln in re.sub(r"\\\n\s*", " ", block).splitlines()
              if ln.strip().startswith(("seqlm ", "python bench/"))]
    for span in INLINE.findall(prose.replace("\n", " ")):
        if span.startswith(("seqlm ", "python bench/", "python -m seqlm ")):
            lines.append(span)
    return lines


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in prose: plain words are good enough
        return line.split("#")[0].split()


def invocations(line: str) -> list[list[str]]:
    """Each simple command of a line (split at pipes and `&&`), redirections and their files left out."""
    out, cur, words = [], [], _words(line)
    skip = False
    for w in words:
        if skip:
            skip = False
        elif w in SEPARATORS:
            out.append(cur)
            cur = []
        elif w in REDIRECTS:
            skip = w != "2>&1"
        elif not re.match(r"^\d?[<>]", w):
            cur.append(w)
    return [c for c in out + [cur] if c]


def _seqlm_args(words: list[str]) -> list[str] | None:
    if words[0] == "seqlm":
        return words[1:]
    if "-m" in words and words[words.index("-m") + 1:words.index("-m") + 2] == ["seqlm"]:
        return words[words.index("-m") + 2:]  # python -m seqlm, torchrun ... -m seqlm
    return None


def _flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("-") and a not in ("-", "--") and not _number(a)]


def _number(word: str) -> bool:
    try:
        float(word)
        return True
    except ValueError:
        return False


def _config_keys(model: str) -> set[str] | None:
    """`--key` names `seqlm train --model MODEL` takes through the family's config (None: not checkable)."""
    fam = FAMILIES.get(model)
    if fam is None or not callable(getattr(fam, "config", None)):
        return None
    keys = set(flat_fields(fam.config())) | set(flat_fields(DataConfig())) | set(RENAMED)
    return {"--" + k.replace("_", "-") for k in keys}


def check_seqlm(args: list[str], parser) -> list[str]:
    """What is wrong with one `seqlm ARGS` command line (empty: nothing)."""
    if not args or args[0].startswith("-"):
        top = set(parser._option_string_actions)
        return [f"seqlm: unknown option {f}" for f in _flags(args) if f not in top]
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    if args[0] not in subs:
        return [f"no subcommand {args[0]!r}"]
    own, errors = set(subs[args[0]]._option_string_actions), []
    config = None
    if args[0] == "train":
        model = args[args.index("--model") + 1] if "--model" in args[:-1] else DEFAULT_FAMILY
        if model not in FAMILIES and not model.isupper():  # NAME and the like are placeholders
            errors.append(f"seqlm train: unknown family {model!r}")
        config = _config_keys(model)
    for flag in _flags(args[1:]):
        if flag in own or (config is not None and flag in config):
            continue
        if args[0] == "train" and config is None:
            continue  # a placeholder family: its options cannot be checked
        errors.append(f"seqlm {args[0]}: {flag} is not an option")
    return errors


def check_bench(words: list[str]) -> list[str]:
    """`python bench/X.py --flag ...`: the script exists and defines each flag (itself or via bench/common.py);
    each `--rows` name is a row of bench/results/X.json or a name the script spells out."""
    script = ROOT / words[1]
    if not script.is_file():
        return [f"{words[1]} does not exist"]
    source = script.read_text(encoding="utf-8") + (ROOT / "bench" / "common.py").read_text(encoding="utf-8")
    errors = [f"{words[1]}: {f} is not an option" for f in _flags(words[2:]) if f'"{f}"' not in source]
    rows = [w.split("=", 1)[-1] for prev, w in zip(["", *words], words) if w.startswith("--rows=") or prev == "--rows"]
    results = ROOT / "bench" / "results" / f"{script.stem}.json"
    known = {r["name"] for r in json.loads(results.read_text(encoding="utf-8"))["rows"]} if results.is_file() else set()
    for name in (n for value in rows for n in value.split(",")):
        placeholder = name.isupper() or "..." in name or "*" in name or not name
        if not placeholder and name not in known and f'"{name}"' not in source:
            errors.append(f"{words[1]}: no row {name!r}")
    return errors


def check_paths(words: list[str]) -> list[str]:
    values = [w.split("=", 1)[-1] for w in words]
    return [f"{v} does not exist" for v in values
            if REPO_PATH.match(v) and not v.startswith("bench/checkpoints/") and not (ROOT / v).exists()]


def problems(text: str) -> list[str]:
    parser = build_parser()
    out = []
    for line in command_lines(text):
        for words in invocations(line):
            args = _seqlm_args(words)
            errs = check_paths(words)
            if args is not None:
                errs += check_seqlm(args, parser)
            elif words[0] in ("python", "python3") and len(words) > 1 and words[1].startswith("bench/"):
                errs += check_bench(words)
            out += [f"{e}   (in: {line.strip()})" for e in dict.fromkeys(errs)]  # each once
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_of_the_page_names_real_subcommands_flags_and_files(page):
    assert not problems(page.read_text(encoding="utf-8")), "\n".join(problems(page.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_names_a_path_of_the_machine_it_was_written_on(page):
    found = MACHINE_PATH.findall(page.read_text(encoding="utf-8"))
    assert not found, f"{page.name}: {found}"


def test_the_checker_finds_what_has_gone_stale():
    page = "\n".join([
        "```sh",
        "seqlm train --model lstm --hiddne 200 --data ptb --out runs/x   # a typo in a config key",
        "seqlm eval runs/x --data ptb --split test --no-such-flag",
        "seqlm frobnicate runs/x",
        "python bench/no_such_bench.py --rows a",
        "python bench/kn_ptb.py --reps 1 --no-such-option",
        "python bench/afp_ptb.py --rows bptt,afp-k5,ROW --threads 1   # afp-k5 was never a row",
        "```",
        "```console",
        "$ seqlm score runs/x --text docs/no-such-file.txt | head -1",
        "output line: seqlm eval --bogus is not a command line",
        "```",
        "Prose: `seqlm generate runs/x --beams 3`, and an indented block:",
        "",
        "    seqlm interpolate a b --out m --valdi v.txt",
        "",
        "and a line that is fine: `seqlm train --model rnn --hidden 200 --tau 5 --data ptb --out runs/rnn`.",
    ])
    found = problems(page)
    expected = ["--hiddne", "--no-such-flag", "'frobnicate'", "no_such_bench.py does not exist",
                "--no-such-option", "no row 'afp-k5'", "docs/no-such-file.txt does not exist", "--beams", "--valdi"]
    for what in expected:
        assert any(what in f for f in found), (what, found)
    assert len(found) == len(expected), found  # the console output line and the good command pass
    assert MACHINE_PATH.findall("--afp-dir /work/x/y and ~/.cache/seqlm and /home/u") == ["/work/x/y", "/home/u"]


def test_the_readme_keeps_its_two_set_up_commands_and_its_commands_are_found():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = command_lines(text)
    assert any(line.startswith("make run") for line in lines) and any(line.startswith("make test") for line in lines)
    assert sum(bool(_seqlm_args(w)) for line in lines for w in invocations(line)) >= 10
