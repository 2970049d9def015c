"""The examples of README.md and of every page in docs/ are what the commands print today.

One convention on every page:

- A ```text block whose first line is ``$ exatrain ...`` (continued by trailing backslashes) is an example
  with its output. The planner's and the catalog's commands (``PLANNER_COMMANDS``) run in-process. Every
  number the page shows (table cells, totals, candidate counts, JSON values) must appear in the command's real
  output, so a change that moves a published figure fails here until the page is updated with the new output.
  Pages trim tables ("..."), so numbers are compared as a set, not line by line.
- ``$ exatrain train ...`` runs for one step, in its own processes (slow): the header line and the first step's
  loss and gradient norm (computed before any update, so independent of the run length) must match the page;
  timings are not compared. The same command on two pages runs once.
- A ```python block followed at once by a ```text block runs as a script, and every number of the text block
  must appear in what it prints.
- The examples of one page run in order, in one scratch folder: an example may read a file an earlier one wrote
  (``--out plan.json``, then ``--plan plan.json``), and nothing lands in the repository.
- Every other command line in a ```bash block or an indented block, ``exatrain ...``, ``python -m
  exatrain.train ...`` or ``torchrun ... -m exatrain.train ...``, and every inline ``exatrain ...`` code span
  of the prose and tables, is parsed by the command line's own parser: each flag and choice it shows exists.
  ``python benchmarks/NAME.py`` names a script that exists.

Broken on purpose and seen to fail here: a number of an example's output changed on a docs page (the planner
example test), a flag renamed in a docs page's bash block (the command-line test), the plan file of
docs/engines.md written under another name (the export-config example that reads it), a stray file in examples/
and the README's --vocab dropped from its estimate --from line (the quick start's examples test).
"""

from __future__ import annotations

import hashlib
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
NUMBER = re.compile(r"(?<![\w.])[-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?%?")
# Commands that run in-process in well under a second or two each.
PLANNER_COMMANDS = ("estimate", "search", "scaling", "models", "hardware", "launch", "export-config")
# How the command lines a page shows start (others, such as make or cp, are not exatrain's).
COMMAND_STARTS = ("exatrain ", "python ", "torchrun ")
# Lines of a page's trimmed output that are not output.
TRIM = ("...", "(Tables trimmed.)")


@dataclass(frozen=True)
class Example:
    page: str  # path relative to the repository root
    index: int  # its place among the page's examples
    argv: tuple[str, ...]  # after `exatrain`; empty for a python example
    expected: tuple[str, ...]  # the page's output lines
    source: str = ""  # a python example's code

    @property
    def id(self) -> str:
        what = " ".join(self.argv[:3]) if self.argv else "python"
        return f"{self.page}#{self.index} {what}"


def _command(lines: list[str]) -> tuple[list[str], int]:
    """The argv of a command continued by trailing backslashes, and how many lines it took."""
    parts, i = [], 0
    while True:
        line = lines[i].strip()
        cont = line.endswith("\\")
        parts.append(line.rstrip("\\").strip())
        i += 1
        if not cont or i == len(lines):
            return shlex.split(" ".join(parts), comments=True), i


def page_examples(path: Path) -> list[Example]:
    """The page's examples with output, in page order."""
    text = path.read_text(encoding="utf-8")
    page = path.relative_to(ROOT).as_posix()
    out: list[Example] = []
    blocks = re.finditer(r"```(\w*)\n(.*?)```", text, flags=re.S)
    previous = None
    for m in blocks:
        lang, body = m.group(1), m.group(2)
        lines = body.splitlines()
        if lang == "text" and lines and lines[0].startswith("$ exatrain"):
            first = [lines[0].removeprefix("$ "), *lines[1:]]
            argv, n = _command(first)
            out.append(Example(page, len(out), tuple(argv[1:]), tuple(lines[n:])))
        elif (
            lang == "text"
            and previous is not None
            and previous[0] == "python"
            and text[previous[1] : m.start()].strip() == ""
        ):
            out.append(Example(page, len(out), (), tuple(lines), source=previous[2]))
        previous = (lang, m.end(), body)
    return out


def page_command_lines(path: Path) -> list[tuple[str, list[str]]]:
    """(the line as written, argv) of every command line in the page's bash and indented blocks."""
    text = path.read_text(encoding="utf-8")
    found = []
    chunks = [m.group(1) for m in re.finditer(r"```bash\n(.*?)```", text, flags=re.S)]
    chunks += [
        "\n".join(line[4:] for line in m.group(0).splitlines())
        for m in re.finditer(r"(?:^|\n)((?:    \S.*\n)+)", re.sub(r"```.*?```", "", text, flags=re.S))
    ]
    for chunk in chunks:
        lines = chunk.splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].lstrip().startswith(COMMAND_STARTS):
                i += 1
                continue
            argv, n = _command(lines[i:])
            found.append((lines[i].strip(), argv))
            i += n
    return found


def page_inline_commands(path: Path) -> list[str]:
    """Every inline ``exatrain ...`` code span of the page's prose and tables."""
    prose = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return re.findall(r"`(exatrain [A-Za-z][\w-]*(?:\s[^`]*)?)`", prose.replace("\n", " "))


def numbers(lines) -> set[str]:
    found = set()
    for line in lines:
        if line.strip() in TRIM:
            continue
        for tok in NUMBER.findall(line):
            found.add(tok.replace("−", "-").rstrip(","))
    return found


EXAMPLES = [e for page in PAGES for e in page_examples(page)]
INLINE = [(page.relative_to(ROOT).as_posix(), span) for page in PAGES for span in page_inline_commands(page)]
COMMAND_LINES = [
    (page.relative_to(ROOT).as_posix(), line, argv) for page in PAGES for line, argv in page_command_lines(page)
]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """Each page's scratch folder, and the examples already run in it."""
    folders: dict[str, Path] = {}
    done: set[Example] = set()

    def folder(page: str) -> Path:
        if page not in folders:
            folders[page] = tmp_path_factory.mktemp(re.sub(r"\W", "_", page))
        return folders[page]

    return folder, done


def _run_in_process(argv, cwd: Path, capsys, monkeypatch) -> str:
    from exatrain.cli import main

    monkeypatch.setenv("COLUMNS", "160")
    monkeypatch.chdir(cwd)
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, f"`exatrain {' '.join(argv)}` exited {code}: {err}"
    return out


def _prepare(example: Example, scratch, capsys, monkeypatch) -> Path:
    """The page's scratch folder, after every earlier in-process example of the page that writes a file."""
    folder, done = scratch
    cwd = folder(example.page)
    for e in EXAMPLES:
        if e.page != example.page or e.index >= example.index or e in done:
            continue
        if e.argv and e.argv[0] in PLANNER_COMMANDS and "--out" in e.argv:
            _run_in_process(e.argv, cwd, capsys, monkeypatch)
            done.add(e)
    return cwd


def test_the_pages_have_the_headline_examples() -> None:
    commands = [" ".join(e.argv[:3]) for e in EXAMPLES]
    assert any(c.startswith("estimate --model gpt-175b") for c in commands), commands
    assert any(c.startswith("estimate --model gpt-1t") for c in commands), commands
    assert any(c.startswith("search --model gpt-1t") for c in commands), commands
    assert any(c.startswith("scaling") for c in commands), commands
    readme = [e for e in EXAMPLES if e.page == "README.md"]
    assert any(e.argv and e.argv[0] == "train" for e in readme), "README's quick start trains nothing"
    assert any(not e.argv for e in readme), "README has no Python example with its output"
    with_examples = {e.page for e in EXAMPLES if e.page.startswith("docs/")}
    assert len(with_examples) >= 4, with_examples


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.argv and e.argv[0] != "train"], ids=lambda e: e.id)
def test_planner_example_output(example: Example, scratch, capsys, monkeypatch) -> None:
    assert example.argv[0] in PLANNER_COMMANDS, (
        f"{example.id}: no runner for `exatrain {example.argv[0]}`; show its output in a plain block instead"
    )
    cwd = _prepare(example, scratch, capsys, monkeypatch)
    out = _run_in_process(example.argv, cwd, capsys, monkeypatch)
    scratch[1].add(example)
    missing = sorted(numbers(example.expected) - numbers(out.splitlines()))
    assert not missing, (
        f"{example.id}: numbers not in the output of `exatrain {' '.join(example.argv)}`: {missing}\n{out}"
    )


@pytest.mark.parametrize("example", [e for e in EXAMPLES if not e.argv], ids=lambda e: e.id)
def test_python_example_output(example: Example, scratch, capsys, monkeypatch) -> None:
    cwd = _prepare(example, scratch, capsys, monkeypatch)
    out = subprocess.run([sys.executable, "-c", example.source], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    missing = sorted(numbers(example.expected) - numbers(out.stdout.splitlines()))
    assert not missing, f"{example.id}: numbers not in what the example prints: {missing}\n{out.stdout}"


_TRAIN_RUNS: dict[str, subprocess.CompletedProcess] = {}


@pytest.mark.slow
@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.argv and e.argv[0] == "train"], ids=lambda e: e.id)
def test_train_example_first_step(example: Example, scratch, capsys, monkeypatch) -> None:
    cwd = _prepare(example, scratch, capsys, monkeypatch)
    header = example.expected[0]
    step1 = next(line for line in example.expected if line.startswith("step     1/"))
    loss, grad = re.search(r"loss (\S+)\s+grad norm (\S+)", step1).groups()
    argv = list(example.argv)
    plan = argv[argv.index("--plan") + 1] if "--plan" in argv else None
    key = " ".join(argv) + (hashlib.sha256((cwd / plan).read_bytes()).hexdigest() if plan else "")
    if key not in _TRAIN_RUNS:
        _TRAIN_RUNS[key] = subprocess.run(
            [sys.executable, "-m", "exatrain", *argv, "--steps", "1", "--metrics-file", str(cwd / "first-step.jsonl")],
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=cwd,
        )
    out = _TRAIN_RUNS[key]
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert header in lines, (header, out.stdout)
    first = next(line for line in lines if line.startswith("step     1/"))
    assert re.search(r"loss (\S+)\s+grad norm (\S+)", first).groups() == (loss, grad), (step1, first)


def _cli_argv(argv: list[str]) -> list[str] | None:
    """The `exatrain` arguments of a command line, cut at a redirection or pipe; None if it is not one."""
    for i, tok in enumerate(argv):
        if tok in (">", ">>", "|", "&&", ";", "2>", "2>&1"):
            argv = argv[:i]
            break
    if argv[:1] == ["exatrain"]:
        return argv[1:]
    if "exatrain.train" in argv and argv[argv.index("exatrain.train") - 1] == "-m":
        return ["train", *argv[argv.index("exatrain.train") + 1 :]]
    return None


@pytest.mark.parametrize("page,line,argv", COMMAND_LINES, ids=[f"{p}: {line[:60]}" for p, line, _ in COMMAND_LINES])
def test_command_lines_parse(page: str, line: str, argv: list[str], capsys) -> None:
    if argv[:1] == ["python"] and len(argv) > 1 and argv[1].startswith("benchmarks/"):
        assert (ROOT / argv[1]).is_file(), f"{page}: `{line}` names a script that does not exist"
        return
    cli = _cli_argv(argv)
    if cli is None:
        return  # make, pip, cp, ...: not exatrain's
    from exatrain.cli import build_parser

    try:
        build_parser().parse_args(cli)
    except SystemExit as exc:
        assert exc.code == 0, f"{page}: `{line}` does not parse: {capsys.readouterr().err.strip()}"


def _options(command: str) -> set[str] | None:
    """The option strings of one `exatrain` command, or None when there is no such command."""
    import argparse

    from exatrain.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    if command not in sub.choices:
        return None
    return {o for a in sub.choices[command]._actions for o in a.option_strings}


@pytest.mark.parametrize("page,span", INLINE, ids=[f"{p}: {span[:60]}" for p, span in INLINE])
def test_inline_commands_name_real_flags(page: str, span: str) -> None:
    """An inline mention may be partial (`exatrain train --plan`), so only its command and flags are checked."""
    words = span.split()
    if words[1].isupper():  # a placeholder: `exatrain COMMAND --help`
        return
    options = _options(words[1])
    assert options is not None, f"{page}: `{span}` names no exatrain command"
    unknown = [w for w in words[2:] if w.startswith("--") and w.split("=")[0] not in options]
    assert not unknown, f"{page}: `{span}` shows flags `exatrain {words[1]}` does not have: {unknown}"


README_EXAMPLES = ROOT / "examples"


def test_the_quick_start_reads_the_files_examples_holds(tmp_path: Path, capsys, monkeypatch) -> None:
    """The README's "start from what you already have" commands, run as shown with $EXAMPLES the repository's
    examples/ folder: the search over the Hugging Face config.json writes a plan, the estimate reads the Megatron-LM
    script, export-config renders the plan; and every file of examples/ is one the README uses."""
    readme = [(line, argv) for page, line, argv in COMMAND_LINES if page == "README.md"]
    first = next(i for i, (_, argv) in enumerate(readme) if any("$EXAMPLES" in a for a in argv))
    block = [argv for _, argv in readme[first : first + 3]]
    assert [argv[1] for argv in block] == ["search", "estimate", "export-config"], block
    outs = []
    for argv in block:
        cli = [a.replace("$EXAMPLES", str(README_EXAMPLES)) for a in _cli_argv(argv)]
        outs.append(_run_in_process(cli, tmp_path, capsys, monkeypatch))
    assert (tmp_path / "plan.json").is_file() and "Llama-3.1-8B" in outs[0]
    assert "8.03B params) on 64 x dgx-h100: tp 2 · pp 1 · dp 32" in outs[1]
    assert outs[2].startswith("#!/bin/bash") and "--tensor-model-parallel-size" in outs[2]
    used = {a.split("$EXAMPLES/", 1)[1] for _, argv in readme for a in argv if "$EXAMPLES/" in a}
    held = {
        p.relative_to(README_EXAMPLES).as_posix()
        for p in README_EXAMPLES.rglob("*")
        if p.is_file() and p.name != "README.md"
    }
    assert held == used, (held, used)
