"""What fills the worst stage's memory, and what each of four changes would free (``estimate``'s line).

The changes are the ones a user reaches for first, one at a time from the plan as it is: the next
recomputation level (none -> selective -> full), the next ZeRO stage, half the micro-batch (the global
batch kept, so twice the micro-batches), and twice the pipeline stages (half the data-parallel
replicas). Each is counted, not guessed: the changed plan's worst stage goes through the same memory
model as the estimate's (``planner.evaluate``, memory only, the plan's runtime), and what it frees is
the difference of the two worst stages. A change the layout does not allow (``Plan.validate``: e.g. no
dp left to halve, layers too few for the stages) or the runtime does not run (a ZeRO stage it lacks) is
left out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from exatrain.catalog.hardware import ClusterSpec
from exatrain.errors import UserError
from exatrain.plan import MemoryBreakdown, ParallelDims, Plan, TrainShape
from exatrain.planner.cost.coefficients import CostParams

GiB = 1024**3
PARTS = ("weights", "gradients", "optimizer", "activations", "other")


def worst_stage(plan: Plan, cluster: ClusterSpec, coeffs: CostParams | None = None) -> tuple[int, MemoryBreakdown]:
    """(pipeline rank, its memory) of the plan's worst stage, as ``estimate_plan`` counts it."""
    from exatrain.accounting.engines import plan_run
    from exatrain.planner.cost.coefficients import default_params
    from exatrain.planner.evaluate import MEMORY_FIELDS, evaluate
    from exatrain.planner.layouts import Layouts

    coeffs = coeffs or default_params(cluster.device.name)
    ev = evaluate(
        Layouts.from_plan(plan),
        plan.model,
        cluster,
        coeffs,
        global_batch=plan.global_batch,
        run=plan_run(plan),
        memory=(plan.runtime,),
        by_rank=True,
        time=False,
    )
    r = int(ev.worst_rank[plan.runtime][0])
    parts = ev.by_rank[plan.runtime]
    return r, MemoryBreakdown(*(float(parts[f][0, r]) for f in MEMORY_FIELDS))


def changes(plan: Plan) -> list[tuple[str, Plan]]:
    """(the flags that say it, the changed plan) for each of the four changes the layout allows."""
    from exatrain.settings import RECOMPUTE

    out: list[tuple[str, Any]] = []
    level = RECOMPUTE.index(plan.recompute)
    if level + 1 < len(RECOMPUTE):
        out.append((f"--recompute {RECOMPUTE[level + 1]}", dataclasses.replace(plan, recompute=RECOMPUTE[level + 1])))
    if plan.zero_stage < 3:
        out.append((f"--zero {plan.zero_stage + 1}", dataclasses.replace(plan, zero_stage=plan.zero_stage + 1)))
    if plan.micro_batch > 1 and plan.micro_batch % 2 == 0:
        out.append(
            (
                f"--micro-batch {plan.micro_batch // 2}",
                dataclasses.replace(plan, shape=TrainShape(plan.micro_batch // 2, plan.global_batch)),
            )
        )
    if plan.dp % 2 == 0:
        d = plan.dims
        dims = ParallelDims(d.tp, d.pp * 2, d.dp // 2, ep=d.ep, cp=d.cp)
        out.append((f"--pp {d.pp * 2}", dataclasses.replace(plan, dims=dims, stage_layers=())))
    allowed = []
    for flags, changed in out:
        try:
            allowed.append((flags, changed.validate()))
        except (UserError, ValueError):
            continue
    return allowed


# A memory category as the line says it (each read as a plural: "... dominate").
_SAID = {"optimizer": "optimizer states", "other": "buffers and the allocator's allowance"}


def memory_advice(
    plan: Plan,
    cluster: ClusterSpec,
    coeffs: CostParams | None = None,
    worst: tuple[int, MemoryBreakdown] | None = None,
) -> dict[str, Any]:
    """What dominates the worst stage and what each allowed change frees, largest first:
    {"stage", "dominant", "dominant_bytes", "total_bytes", "options": [{"change", "frees_bytes",
    "worst_bytes"}], "text"}. ``worst``: the plan's own ``worst_stage`` where the caller has counted it already
    (``estimate_plan``'s evaluation, the same memory model), so that it is not counted twice."""
    rank, worst = worst if worst is not None else worst_stage(plan, cluster, coeffs)
    dominant = max(PARTS, key=lambda k: getattr(worst, k))
    options = []
    for flags, changed in changes(plan):
        try:
            _, after = worst_stage(changed, cluster, coeffs)
        except (UserError, ValueError):  # a change the runtime does not run (e.g. its ZeRO stages)
            continue
        options.append({"change": flags, "frees_bytes": worst.total - after.total, "worst_bytes": after.total})
    options.sort(key=lambda o: -o["frees_bytes"])
    return {
        "stage": rank,
        "dominant": dominant,
        "dominant_bytes": getattr(worst, dominant),
        "total_bytes": worst.total,
        "options": options,
        "text": advice_text(rank, worst, dominant, options),
    }


def advice_text(rank: int, worst: MemoryBreakdown, dominant: str, options: list[dict[str, Any]]) -> str:
    """One line: the dominant part of the worst stage, then each change with what it frees."""
    said = _SAID.get(dominant, dominant)
    head = f"stage {rank}: {said} dominate ({getattr(worst, dominant) / GiB:.1f} of {worst.total / GiB:.1f} GiB)"
    if not options:
        return head + "; no single change of recomputation, ZeRO, micro-batch or pp applies"
    said = [
        f"{o['change']} frees {o['frees_bytes'] / GiB:.1f} GiB (to {o['worst_bytes'] / GiB:.1f})"
        if o["frees_bytes"] > 0
        else f"{o['change']} frees nothing ({o['worst_bytes'] / GiB:.1f})"
        for o in options
    ]
    return head + "; " + ", ".join(said)


__all__ = ["advice_text", "changes", "memory_advice", "worst_stage"]
