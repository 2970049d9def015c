"""The JSON objects the planner's commands print (`estimate --json`, `search --json`,
`scaling --json`), in one place so the report reads back exactly what was written."""

from __future__ import annotations

from typing import Any, Sequence

from exatrain.plan import Plan


def estimate_json(plan: Plan) -> dict[str, Any]:
    """A plan with its estimate: the estimate's fields at top level, plus the resolved plan."""
    if plan.estimate is None:
        raise ValueError("estimate_json needs a plan with its estimate")
    plan_d = plan.to_dict()
    plan_d.pop("estimate", None)
    return {**plan.estimate.to_dict(), "plan": plan_d}


def search_json(result: Any, explain: Sequence[str] | None = None) -> dict[str, Any]:
    """A SearchResult: the ranked plans (each as ``estimate_json``, with its ``memory_verdict``) and the counts of the
    search: ``rejected`` (with "does not fit", and "tight (--strict-memory)" under strict memory) and ``tight``, the
    legal layouts whose capacity lies inside their memory band (kept unless ``strict_memory``); ``best_fitting``, the
    fastest kept layout whose verdict is "fits" (as ``estimate_json``, with its ``rank`` among the kept), or null."""
    out = {
        "ranked": [estimate_json(p) for p in result.ranked],
        "examined": result.examined,
        "legal": result.legal,
        "feasible": result.feasible,
        "rejected": result.rejected,
        "collapsed": result.collapsed,
        "tight": getattr(result, "tight", 0),
        "strict_memory": bool(getattr(result, "strict_memory", False)),
    }
    best = getattr(result, "best_fitting", None)
    out["best_fitting"] = None if best is None else {"rank": result.best_fitting_rank, **estimate_json(best)}
    if getattr(result, "notes", ()):
        out["notes"] = list(result.notes)
    if explain is not None:
        out["explain"] = list(explain)
    return out


__all__ = ["estimate_json", "search_json"]
