"""The report's inputs, read and checked before anything is drawn.

Each reader takes a path and returns typed objects, or raises ``UserError`` naming the file and what
is wrong with it — including JSON of the wrong kind, with the flag that does take it. Accepted:
- ``--plan``: a plan file (``exatrain estimate --out``, ``search --out``), the object ``estimate --json``
  prints (the estimate's fields at top level, the plan under "plan"), or one run-record line;
- ``--search``: what ``exatrain search --json`` prints ({"ranked": [...], "examined", ...});
- ``--scaling``: what ``exatrain scaling --json`` prints ({"mode", "points": [...]});
- ``--runs``: a JSON-lines runs file: RunRecord lines (``"kind": "run_record"``) and per-step metric
  lines (any object with numeric "step" and "loss"); other lines are skipped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Union

from exatrain.errors import UserError
from exatrain.plan import Plan, RunRecord
from exatrain.jsonio import iter_json_lines, read_json
from exatrain.planner.scaling import ScalingPoint

# What `classify` calls each kind of JSON, and the flag that takes it.
FLAG_FOR = {
    "plan": "--plan",
    "estimate": "--plan",
    "run_record": "--plan or --runs",
    "search": "--search",
    "scaling": "--scaling",
}
DESCRIBE = {
    "plan": "a plan file",
    "estimate": "`exatrain estimate --json` output",
    "run_record": "a run record",
    "search": "`exatrain search --json` output",
    "scaling": "`exatrain scaling --json` output",
}


@dataclass(frozen=True)
class PlanInput:
    path: Path
    plan: Plan  # its estimate may be None (a hand-written plan); the report then estimates it


@dataclass(frozen=True)
class SearchInput:
    path: Path
    ranked: tuple[Plan, ...]  # best first, each with its estimate
    examined: int | None
    legal: int | None
    feasible: int | None
    rejected: Mapping[str, int]


@dataclass(frozen=True)
class ScalingInput:
    path: Path
    mode: str  # weak | strong
    points: tuple[ScalingPoint, ...]


@dataclass(frozen=True)
class StepLine:
    """One per-step metrics line of a training run (only step and loss are required)."""

    step: int
    loss: float
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class RunsInput:
    path: Path
    entries: tuple[Union[StepLine, RunRecord], ...]  # in file order (loss curves split on it)

    @property
    def records(self) -> tuple[RunRecord, ...]:
        return tuple(e for e in self.entries if isinstance(e, RunRecord))

    @property
    def steps(self) -> tuple[StepLine, ...]:
        return tuple(e for e in self.entries if isinstance(e, StepLine))


def classify(obj: Any) -> str:
    """Which exatrain JSON this is: plan, estimate, search, scaling, run_record, or unknown."""
    if not isinstance(obj, dict):
        return "unknown"
    if obj.get("kind") == "run_record" and isinstance(obj.get("plan"), dict):
        return "run_record"
    if isinstance(obj.get("ranked"), list):
        return "search"
    if "mode" in obj and isinstance(obj.get("points"), list):
        return "scaling"
    if isinstance(obj.get("plan"), dict) and "memory_by_stage" in obj:
        return "estimate"
    if "model" in obj and "tp" in obj and "pp" in obj:
        return "plan"
    return "unknown"


def _wrong_kind(path: Path, found: str, flag: str) -> UserError:
    if found in DESCRIBE:
        return UserError(f"{path}: this is {DESCRIBE[found]}, not input for {flag}; pass it with {FLAG_FOR[found]}")
    return UserError(f"{path}: not exatrain JSON for {flag} (expected {_EXPECTED[flag]})")


_EXPECTED = {
    "--plan": "a plan file or `exatrain estimate --json` output",
    "--search": "`exatrain search --json` output",
    "--scaling": "`exatrain scaling --json` output",
    "--runs": "JSON lines of run records and per-step metrics",
}


def plan_from_json(d: Mapping[str, Any], source: str) -> Plan:
    """A Plan with its estimate from a plan object, an ``estimate --json`` object (also one entry of
    search's "ranked" or scaling's "points", whose extra keys are dropped) or a run record."""
    kind = classify(d)
    if kind == "run_record":
        return RunRecord.from_dict(d, source=source).plan
    if kind == "estimate":
        estimate = {
            k: v for k, v in d.items() if k not in ("plan", "gpus", "global_batch", "efficiency", "format_version")
        }
        return Plan.from_dict({**d["plan"], "estimate": estimate}, source=source)
    if kind == "plan":
        return Plan.from_dict(d, source=source)
    raise UserError(f"{source}: not a plan (expected the fields of `exatrain estimate --json`)")


def read_plan(path: str | Path) -> PlanInput:
    path = Path(path)
    d = read_json(path)
    kind = classify(d)
    if kind not in ("plan", "estimate", "run_record"):
        raise _wrong_kind(path, kind, "--plan")
    return PlanInput(path=path, plan=plan_from_json(d, str(path)))


def _count(d: Mapping[str, Any], key: str, source: Path) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise UserError(f"{source}: {key!r} must be an integer, got {v!r}")
    return v


def _estimated(plan: Plan, source: str) -> Plan:
    e = plan.estimate
    if e is None or e.time_s is None or e.tokens_per_s is None:
        raise UserError(f"{source}: the entry carries no time estimate (tokens_per_s, time_s)")
    return plan


def read_search(path: str | Path) -> SearchInput:
    path = Path(path)
    d = read_json(path)
    kind = classify(d)
    if kind != "search":
        raise _wrong_kind(path, kind, "--search")
    if not d["ranked"]:
        raise UserError(f"{path}: 'ranked' is empty: the search found no feasible layout")
    ranked = []
    for i, entry in enumerate(d["ranked"]):
        src = f"{path}: ranked[{i}]"
        if classify(entry) != "estimate":
            raise UserError(f"{src}: not an `estimate --json` object (needs 'plan' and 'memory_by_stage')")
        ranked.append(_estimated(plan_from_json(entry, src), src))
    rejected = d.get("rejected") or {}
    if not isinstance(rejected, dict) or any(isinstance(v, bool) or not isinstance(v, int) for v in rejected.values()):
        raise UserError(f"{path}: 'rejected' must map reasons to counts")
    return SearchInput(
        path=path,
        ranked=tuple(ranked),
        examined=_count(d, "examined", path),
        legal=_count(d, "legal", path),
        feasible=_count(d, "feasible", path),
        rejected=dict(rejected),
    )


def read_scaling(path: str | Path) -> ScalingInput:
    path = Path(path)
    d = read_json(path)
    kind = classify(d)
    if kind != "scaling":
        raise _wrong_kind(path, kind, "--scaling")
    if d["mode"] not in ("weak", "strong"):
        raise UserError(f"{path}: mode must be 'weak' or 'strong', got {d['mode']!r}")
    if not d["points"]:
        raise UserError(f"{path}: 'points' is empty")
    points = []
    for i, p in enumerate(d["points"]):
        src = f"{path}: points[{i}]"
        if classify(p) != "estimate":
            raise UserError(f"{src}: not a scaling point (needs gpus, global_batch, efficiency, plan)")
        try:
            gpus, gb, eff = int(p["gpus"]), int(p["global_batch"]), float(p["efficiency"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{src}: malformed scaling point ({type(exc).__name__}: {exc})") from None
        points.append(
            ScalingPoint(gpus=gpus, global_batch=gb, efficiency=eff, plan=_estimated(plan_from_json(p, src), src))
        )
    return ScalingInput(path=path, mode=d["mode"], points=tuple(points))


def _step_line(obj: Any) -> StepLine | None:
    """A per-step metrics line, read tolerantly: any object with an integer step and a numeric loss."""
    if not isinstance(obj, dict):
        return None
    step, loss = obj.get("step"), obj.get("loss")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    if isinstance(loss, bool) or not isinstance(loss, (int, float)):
        return None
    return StepLine(step=step, loss=float(loss), fields=dict(obj))


def read_runs(path: str | Path) -> RunsInput:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file of JSON lines") from None
    try:  # a whole-file JSON document of another kind: say which flag takes it
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict) and classify(whole) in ("plan", "estimate", "search", "scaling"):
        raise _wrong_kind(path, classify(whole), "--runs")
    entries: list[Union[StepLine, RunRecord]] = []
    for lineno, obj in iter_json_lines(path, text, " (a runs file has one JSON object per line)"):
        if isinstance(obj, dict) and obj.get("kind") == "run_record":
            entries.append(RunRecord.from_dict(obj, source=f"{path}:{lineno}"))
        elif (s := _step_line(obj)) is not None:
            entries.append(s)
    if not entries:
        raise UserError(f"{path}: no run records and no per-step lines (objects with 'step' and 'loss')")
    return RunsInput(path=path, entries=tuple(entries))


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
