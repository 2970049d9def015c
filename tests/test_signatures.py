"""Every function outside ``api/`` takes at most 15 parameters: a run's settings travel as one resolved object
(``accounting.engines.Resolved``), a rank's counts as one (``accounting.memory.RankCounts``), a batch of layouts
as one (``planner.layouts.Layouts``), not spread over keyword arguments. (Broken on purpose and seen to fail:
``step_times`` given back one of its old keyword arguments.)"""

from __future__ import annotations

import ast
from pathlib import Path

import exatrain

LIMIT = 15
SRC = Path(exatrain.__file__).parent


def _count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)


def test_no_function_outside_the_api_takes_more_than_15_parameters() -> None:
    over, seen = [], set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] in ("api", "api.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                seen.add(node.name)
                if _count(node) > LIMIT:
                    over.append(f"{rel}:{node.lineno} {node.name} ({_count(node)})")
    assert {"evaluate", "step_times", "stage_times", "rank_memory", "trainer_rank_memory"} <= seen  # all were read
    assert not over, "functions with more than 15 parameters: " + ", ".join(over)
