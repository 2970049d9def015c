"""Sizes of src/exatrain: no function over 80 lines and no file over 600 lines, so that each reads on a screen or
two and a file holds one job. A function's length runs from its `def` line (decorators left out) to its last line,
nested functions included; a file's is its number of lines.

The ones still being cut are listed in ALLOWED with their length today. The list only shrinks: an allowed item that
grows fails, and so does one that is now within the limit or gone (take it off the list).

Broken on purpose and seen to fail here: a 90-line dummy function added to src/exatrain/report/text.py; 20 lines
added to src/exatrain/trainer/failures.py (613 lines); an ALLOWED entry set below its item's length (the item grew); an
ALLOWED entry set above it (the list did not shrink with it).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "exatrain"
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 600

# "path" (a file) or "path::qualified.name" (a function) -> its length today. Only shrinks.
ALLOWED: dict[str, int] = {}


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method, nested ones under their parent's name."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, prefix + node.name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:
            yield from _functions(node, prefix)


def sizes(src: Path = SRC) -> dict[str, int]:
    """Every file over MAX_FILE_LINES and every function over MAX_FUNCTION_LINES under ``src``, with its length."""
    out: dict[str, int] = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_FILE_LINES:
            out[rel] = lines
        for name, node in _functions(ast.parse(text)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out[f"{rel}::{name}"] = length
    return out


@lru_cache(maxsize=1)
def _src_sizes() -> dict[str, int]:
    return sizes(SRC)


def test_no_long_function_or_file() -> None:
    """Nothing over the limits but what ALLOWED names, and nothing there longer than it was."""
    over = _src_sizes()
    new = {k: n for k, n in over.items() if k not in ALLOWED}
    assert not new, f"over {MAX_FUNCTION_LINES} lines a function / {MAX_FILE_LINES} a file: {new}"
    grown = {k: (ALLOWED[k], n) for k, n in over.items() if k in ALLOWED and n > ALLOWED[k]}
    assert not grown, f"allowed items that grew (allowed, now): {grown}"


def test_allowed_list_only_shrinks() -> None:
    """An allowed item now within the limit (or gone) comes off ALLOWED; an item's length is written as it is."""
    over = _src_sizes()
    done = sorted(k for k in ALLOWED if k not in over)
    assert not done, f"within the limits now, take them off ALLOWED: {done}"
    shorter = {k: (ALLOWED[k], over[k]) for k in ALLOWED if k in over and over[k] < ALLOWED[k]}
    assert not shorter, f"shorter than ALLOWED says, write the new length (allowed, now): {shorter}"


def test_the_measure(tmp_path: Path) -> None:
    """The measure itself: methods and nested functions are named under their parents and counted from `def` to
    their last line; a file is counted in lines; what is within the limits is not listed."""
    inner = ["    def inner():"] + [f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES)]
    lines = ["class C:", "    def short(self):", "        return 1", "def outer():", *inner, "    return inner"]
    lines += ["# padding"] * (MAX_FILE_LINES + 1 - len(lines))
    (tmp_path / "m.py").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "ok.py").write_text("\n".join(lines[:3]) + "\n", encoding="utf-8")
    found = sizes(tmp_path)
    want = {
        "m.py": MAX_FILE_LINES + 1,
        "m.py::outer": MAX_FUNCTION_LINES + 3,
        "m.py::outer.inner": MAX_FUNCTION_LINES + 1,
    }
    assert found == want, found
