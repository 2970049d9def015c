"""Per-stage memory: one stacked bar per pipeline stage against the device's capacity.

Why a picture: the pipeline's first stage holds the most micro-batches of activations in flight and
the two ends hold the embedding and the head, so whether a layout fits is decided by one stage; the
bars show which one and by what kind of memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from exatrain.plan import Plan
from exatrain.report.style import (CAPACITY_COLOR, GiB, MEMORY_COLORS, MEMORY_KINDS, Figure, describe,
                                   gib, new_figure, save)


def memory_by_stage(plan: Plan, path: Path) -> Figure:
    """Draw ``plan.estimate.memory_by_stage`` (bytes per rank of each pipeline stage, by kind) as
    stacked bars with the capacity line; return the bytes drawn."""
    est = plan.estimate
    if est is None or not est.memory_by_stage:
        raise ValueError("memory_by_stage needs a plan with an estimate")
    stages = list(range(len(est.memory_by_stage)))
    numbers: dict = {"stage": stages}
    for k in MEMORY_KINDS:
        numbers[k] = [float(getattr(mb, k)) for mb in est.memory_by_stage]
    numbers["total"] = [float(mb.total) for mb in est.memory_by_stage]
    numbers["capacity_bytes"] = int(est.capacity_bytes)
    numbers["fits"] = bool(est.fits)
    worst = int(np.argmax(numbers["total"]))
    numbers["worst_stage"] = worst

    fig, ax = new_figure(max(6.0, min(12.0, 4 + 0.12 * len(stages))), 4.2)
    bottom = np.zeros(len(stages))
    width = 0.8 if len(stages) < 48 else 0.95
    for k in MEMORY_KINDS:
        vals = np.asarray(numbers[k]) / GiB
        ax.bar(stages, vals, width, bottom=bottom, color=MEMORY_COLORS[k], label=k, linewidth=0)
        bottom += vals
    cap = est.capacity_bytes / GiB
    ax.axhline(cap, color=CAPACITY_COLOR, linewidth=1.5, linestyle="--", label=f"capacity {cap:,.0f} GiB")
    ax.set_ylim(0, max(cap, float(bottom.max())) * 1.12)
    ax.set_xlim(-0.7, len(stages) - 0.3)
    ax.set_xlabel("pipeline stage (one rank of each)")
    ax.set_ylabel("GiB per rank")
    ax.set_title(f"memory per stage — {describe(plan)}", fontsize=9)
    ax.legend(loc="upper center", ncol=6, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.13))
    save(fig, path)

    share = numbers["total"][worst] / est.capacity_bytes
    w = est.memory_by_stage[worst]
    caption = (f"Peak bytes held by one rank of each pipeline stage (after tensor-parallel and ZeRO "
               f"sharding), stacked by kind, against the device's capacity (dashed). The worst is stage "
               f"{worst}: {gib(w.total)} of {gib(est.capacity_bytes)} ({share:.0%}) — "
               + ("it fits." if est.fits else "it does not fit."))
    key = (("worst stage", f"{worst} of {len(stages)}"),
           ("worst stage total", f"{gib(w.total)} ({share:.0%} of {gib(est.capacity_bytes)})"),
           *((k, gib(getattr(w, k))) for k in MEMORY_KINDS))
    return Figure(file=path.name, title="Memory per pipeline stage", caption=caption, numbers=numbers,
                  key_numbers=key)
