"""Per-stage memory: one stacked bar per pipeline stage against the device's capacity.

Why a picture: the pipeline's first stage holds the most micro-batches of activations in flight and
the two ends hold the embedding and the head, so whether a layout fits is decided by one stage; the
bars show which one and by what kind of memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from exatrain.plan import Plan
from exatrain.report.style import (
    CAPACITY_COLOR,
    MEMORY_COLORS,
    MEMORY_KINDS,
    Figure,
    byte_unit,
    describe,
    human_bytes,
    new_figure,
    percent,
    save,
    wrap,
)

# The capacity line is drawn when it is at most this many times the fullest stage, so the bars take
# at least ~1/5 of the axis; a plan far below capacity (a tiny model) gets an axis that fits its bars
# and the capacity in words.
CAPACITY_ON_AXIS = 4.0


def stage_ticks(n: int) -> list[int]:
    """Every stage up to 16 stages, else about eight evenly spaced ones starting at 0."""
    step = 1 if n <= 16 else -(-n // 8)
    return list(range(0, n, step))


def _stage_numbers(est) -> tuple[dict, float]:
    """The bytes drawn per stage and kind, the capacity (and whether it is on the axis), the worst stage, and
    the divisor of the axis's unit."""
    stages = list(range(len(est.memory_by_stage)))
    numbers: dict = {"stage": stages}
    for k in MEMORY_KINDS:
        numbers[k] = [float(getattr(mb, k)) for mb in est.memory_by_stage]
    numbers["total"] = [float(mb.total) for mb in est.memory_by_stage]
    numbers["capacity_bytes"] = int(est.capacity_bytes)
    numbers["fits"] = bool(est.fits)
    numbers["memory_verdict"] = est.verdict
    worst = int(np.argmax(numbers["total"]))
    numbers["worst_stage"] = worst
    top, cap_b = numbers["total"][worst], float(est.capacity_bytes)
    cap_drawn = cap_b <= CAPACITY_ON_AXIS * top
    numbers["capacity_drawn"] = cap_drawn
    div, unit = byte_unit(max(top, cap_b) if cap_drawn else top)
    numbers["unit"] = unit
    return numbers, div


def _caption_and_key(est, numbers: dict) -> tuple[str, tuple]:
    """The caption (what is stacked, the capacity, the worst stage and its verdict) and the key numbers."""
    worst, n, cap_b = numbers["worst_stage"], len(numbers["stage"]), float(est.capacity_bytes)
    top, cap_drawn = numbers["total"][worst], numbers["capacity_drawn"]
    share = top / cap_b
    w = est.memory_by_stage[worst]
    caption = (
        "Peak bytes held by one rank of each pipeline stage (after tensor-parallel and ZeRO "
        "sharding), stacked by kind"
        + (
            ", against the device's capacity (dashed)"
            if cap_drawn
            else f"; the device's capacity ({human_bytes(cap_b)}) is more than {CAPACITY_ON_AXIS:.0f}× "
            "the fullest stage and is left off the axis"
        )
        + f". The worst is stage {worst}: {human_bytes(w.total)} of {human_bytes(cap_b)} ({percent(share)}) — "
        + {
            "fits": "it fits.",
            "does not fit": "it does not fit.",
            "tight": "tight: the capacity lies inside the band of measured peaks around it.",
        }[est.verdict]
    )
    key = (
        ("worst stage", f"{worst} of {n}"),
        ("worst stage total", f"{human_bytes(w.total)} ({percent(share)} of {human_bytes(cap_b)})"),
        *((k, human_bytes(getattr(w, k))) for k in MEMORY_KINDS),
    )
    return caption, key


def memory_by_stage_figure(plan: Plan, path: Path) -> Figure:
    """Draw ``plan.estimate.memory_by_stage`` (bytes per rank of each pipeline stage, by kind) as
    stacked bars with the capacity line; return the bytes drawn."""
    est = plan.estimate
    if est is None or not est.memory_by_stage:
        raise ValueError("memory_by_stage_figure needs a plan with an estimate")
    numbers, div = _stage_numbers(est)
    stages, worst, unit, cap_drawn = (
        numbers["stage"],
        numbers["worst_stage"],
        numbers["unit"],
        numbers["capacity_drawn"],
    )
    top, cap_b = numbers["total"][worst], float(est.capacity_bytes)
    n = len(stages)
    width_in = max(7.0, min(13.0, 5.3 + 0.12 * n))
    fig, ax = new_figure(width_in, 4.4)
    bottom = np.zeros(n)
    bar_w = 0.8 if n < 48 else 0.95
    handles = []
    for k in MEMORY_KINDS:
        vals = np.asarray(numbers[k]) / div
        handles.append(ax.bar(stages, vals, bar_w, bottom=bottom, color=MEMORY_COLORS[k], label=k, linewidth=0))
        bottom += vals
    handles.reverse()  # the legend reads top-down, as the bars stack
    if cap_drawn:
        handles.append(
            ax.axhline(
                cap_b / div, color=CAPACITY_COLOR, linewidth=1.3, linestyle="--", label=f"capacity {human_bytes(cap_b)}"
            )
        )
        ax.set_title(
            f"worst stage {worst}: {human_bytes(top)} of {human_bytes(cap_b)} ({percent(top / cap_b)})", fontsize=8
        )
    else:
        ax.set_title(
            f"worst stage {worst}: {human_bytes(top)}, {percent(top / cap_b)} of the device's "
            f"{human_bytes(cap_b)} (capacity off the scale)",
            fontsize=8,
        )
    ax.set_ylim(0, max(top, cap_b if cap_drawn else 0.0) / div * 1.12)
    pad = max(0.0, (3 - n) / 2)  # one or two stages: bars of a readable width, not the whole axis
    ax.set_xlim(-0.6 - pad, n - 0.4 + pad)
    ax.set_xticks(stage_ticks(n))
    ax.set_xlabel("pipeline stage (one rank of each)")
    ax.set_ylabel(f"{unit} per rank")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.suptitle(wrap(f"memory per stage — {describe(plan)}", width_in - 0.3, 9), fontsize=9)
    save(fig, path)

    caption, key = _caption_and_key(est, numbers)
    return Figure(file=path.name, title="Memory per pipeline stage", caption=caption, numbers=numbers, key_numbers=key)
