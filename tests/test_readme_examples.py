"""The README's example outputs are what the commands print today.

Every ```text block of README.md that starts with ``$ exatrain ...`` is run. Planner examples
(estimate, search, scaling) run in-process; every number the README shows (table cells, totals,
candidate counts, JSON values) must appear in the command's real output, so a change to the cost
model, the memory model or the search that moves a published headline figure fails here until the
README is updated with the new output. Tables in the README are trimmed ("..."), so numbers are
compared as a set, not line by line.

``exatrain train`` (100 steps on 8 ranks, minutes) runs for one step only: its header line and the
first step's loss and gradient norm (computed before any update, so independent of the run length;
a second step, as this test once ran, showed nothing the first does not) must match the README;
timings are not compared.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
NUMBER = re.compile(r"(?<![\w.])[-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?%?")
PLANNER_COMMANDS = ("estimate", "search", "scaling")


def readme_examples() -> list[tuple[list[str], list[str]]]:
    """(argv after `exatrain`, the README's output lines) for each ```text block that runs a command."""
    text = README.read_text(encoding="utf-8")
    examples = []
    for block in re.findall(r"```text\n(.*?)```", text, flags=re.S):
        lines = block.splitlines()
        if not lines or not lines[0].startswith("$ exatrain"):
            continue
        cmd = []
        i = 0
        while True:
            line = lines[i].removeprefix("$ ").strip()
            cont = line.endswith("\\")
            cmd.append(line.rstrip("\\").strip())
            i += 1
            if not cont:
                break
        argv = shlex.split(" ".join(cmd))[1:]
        examples.append((argv, lines[i:]))
    return examples


def numbers(lines: list[str]) -> set[str]:
    found = set()
    for line in lines:
        if line.strip() in ("...", "(Tables trimmed.)"):
            continue
        for tok in NUMBER.findall(line):
            found.add(tok.replace("−", "-").rstrip(","))
    return found


EXAMPLES = readme_examples()


def test_the_readme_has_the_headline_examples() -> None:
    commands = [" ".join(argv[:3]) for argv, _ in EXAMPLES]
    assert any(c.startswith("estimate --model gpt-175b") for c in commands), commands
    assert any(c.startswith("estimate --model gpt-1t") for c in commands), commands
    assert any(c.startswith("search --model gpt-1t") for c in commands), commands
    assert any(c.startswith("scaling") for c in commands), commands


@pytest.mark.parametrize("argv,expected", [e for e in EXAMPLES if e[0][0] in PLANNER_COMMANDS],
                         ids=lambda x: " ".join(x[:3]) if isinstance(x, list) and x and x[0] in PLANNER_COMMANDS
                         else "")
def test_planner_example_output(argv: list[str], expected: list[str], capsys, monkeypatch) -> None:
    from exatrain.cli import main

    monkeypatch.setenv("COLUMNS", "160")
    assert main(argv) == 0
    out = capsys.readouterr().out
    missing = sorted(numbers(expected) - numbers(out.splitlines()))
    assert not missing, f"README numbers not in the output of `exatrain {' '.join(argv)}`: {missing}\n{out}"


@pytest.mark.slow
def test_train_example_first_step(tmp_path: Path) -> None:
    examples = [e for e in EXAMPLES if e[0] and e[0][0] == "train"]
    assert examples, "README has no `$ exatrain train` example"
    argv, expected = examples[0]
    header = expected[0]
    step1 = next(line for line in expected if line.startswith("step     1/"))
    loss, grad = re.search(r"loss (\S+)\s+grad norm (\S+)", step1).groups()
    out = subprocess.run([sys.executable, "-m", "exatrain", *argv, "--steps", "1",
                          "--metrics-file", str(tmp_path / "m.jsonl")],
                         capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert header in lines, (header, out.stdout)
    first = next(line for line in lines if line.startswith("step     1/"))
    assert re.search(r"loss (\S+)\s+grad norm (\S+)", first).groups() == (loss, grad), (step1, first)
