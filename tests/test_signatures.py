"""Every function outside ``api/`` takes at most 15 parameters: a run's settings travel as one resolved object
(``accounting.engines.Resolved``), a rank's counts as one (``accounting.memory.RankCounts``), a batch of layouts
as one (``planner.layouts.Layouts``), not spread over keyword arguments. Every public API call (``exatrain.<name>``
and what ``exatrain.api`` exports) takes at most 8: the typed requests of ``api.requests``, whose fields a call
also takes flat (``**pins``, one parameter).

Broken on purpose and seen to fail here: ``step_times`` given back one of its old keyword arguments;
``api.estimate`` given back ``tokens`` as its own keyword argument (9 parameters); ``api.launch`` given a ``nodes``
keyword beside its requests."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import exatrain
from exatrain import api

LIMIT = 15
API_LIMIT = 8
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


def _public_api() -> dict[str, object]:
    """Every function a user reaches as ``exatrain.<name>`` or ``exatrain.api.<name>``."""
    names = {n: getattr(exatrain, n) for n in exatrain.__dir__() if not n.startswith("_")}
    names.update({f"api.{n}": getattr(api, n) for n in api.__all__})
    return {n: f for n, f in names.items() if inspect.isfunction(f) or callable(f) and inspect.ismodule(f)}


def test_no_public_api_call_takes_more_than_8_parameters() -> None:
    from exatrain.api.training import train

    calls = _public_api()
    calls["train"] = train  # exatrain.train is a module that forwards to it
    assert {"estimate", "search", "scaling", "make_plan", "tune", "api.train", "api.launch", "api.record"} <= set(calls)
    counts = {n: len(inspect.signature(f).parameters) for n, f in calls.items() if inspect.isfunction(f)}
    over = sorted(f"{n} ({k})" for n, k in counts.items() if k > API_LIMIT)
    assert not over, "public API calls with more than 8 parameters: " + ", ".join(over)
