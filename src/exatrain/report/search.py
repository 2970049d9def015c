"""The search landscape: predicted throughput against memory for every ranked layout, and why the
rest were rejected.

Why a picture: the ranking table says which layout wins; the scatter shows how much headroom the
winner leaves below the capacity and which tp·pp families crowd the top (a layout that is 2% slower
but uses half the memory is often the better first run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from exatrain.report.inputs import SearchInput
from exatrain.report.style import (
    CAPACITY_COLOR,
    OKABE_ITO,
    OTHER_COLOR,
    Figure,
    byte_unit,
    compact,
    describe,
    human_bytes,
    new_figure,
    save,
    series_colors,
    top_series,
    wrap,
)

_MARKERS = "osD^vP*Xph<>"
CAPACITY_ON_AXIS = 4.0  # as in memory.py: the capacity line only when the points keep >= ~1/5 of the axis
ANNOTATE_TOP = 10  # rank numbers written beside the best this many layouts


def family(plan) -> str:
    """The tp·pp family a layout belongs to (dp follows from the GPU count)."""
    return f"tp{plan.tp}·pp{plan.pp}"


def _landscape_numbers(search: SearchInput) -> tuple[dict[str, Any], float]:
    """The numbers the landscape draws (each ranked layout's family, memory and tokens/s; the capacity, and
    whether it is on the axis; the search's counts) and the divisor of the memory axis's unit."""
    ranked = search.ranked
    est0 = ranked[0].estimate
    numbers = {
        "rank": list(range(1, len(ranked) + 1)),
        "family": [family(p) for p in ranked],
        "layout": [p.label for p in ranked],
        "memory_bytes": [float(p.estimate.memory_bytes.total) for p in ranked],
        "tokens_per_s": [float(p.estimate.tokens_per_s) for p in ranked],
        "capacity_bytes": int(est0.capacity_bytes),
        "rejected": dict(search.rejected),
        "examined": search.examined,
        "legal": search.legal,
        "feasible": search.feasible,
    }
    cap_b = float(est0.capacity_bytes)
    top_b = max(numbers["memory_bytes"])
    cap_drawn = cap_b <= CAPACITY_ON_AXIS * top_b
    div, unit = byte_unit(max(top_b, cap_b) if cap_drawn else top_b)
    numbers.update(capacity_drawn=cap_drawn, unit=unit)
    return numbers, div


def _scatter(ax, numbers: dict[str, Any], div: float, cap_b: float) -> tuple[np.ndarray, np.ndarray]:
    """The layouts as points, one colour and marker per leading tp·pp family (the rest grey), the best
    starred, the capacity a dashed line where it is on the axis; (memory, tokens/s) as drawn."""
    own, rest = top_series(numbers["family"])
    mem = np.asarray(numbers["memory_bytes"]) / div
    tps = np.asarray(numbers["tokens_per_s"])
    fam = np.asarray(numbers["family"])
    for i, (f, color) in enumerate(zip(own, series_colors(len(own)))):
        sel = fam == f
        ax.scatter(
            mem[sel], tps[sel], s=30, marker=_MARKERS[i % len(_MARKERS)], color=color, label=f, alpha=0.9, linewidths=0
        )
    if rest:
        sel = np.isin(fam, sorted(rest))
        ax.scatter(
            mem[sel],
            tps[sel],
            s=22,
            marker=".",
            color=OTHER_COLOR,
            label=f"{len(rest)} other tp·pp families",
            linewidths=0,
        )
    ax.scatter(mem[:1], tps[:1], s=240, marker="*", facecolors="none", edgecolors="black", linewidths=1.2, label="best")
    if numbers["capacity_drawn"]:
        ax.axvline(
            cap_b / div, color=CAPACITY_COLOR, linestyle="--", linewidth=1.2, label=f"capacity {human_bytes(cap_b)}"
        )
    return mem, tps


def _rank_labels(ax, mem: np.ndarray, tps: np.ndarray, x_hi: float, count: int) -> None:
    """Rank numbers of the best ``count`` layouts; a layout near an earlier labelled one (4% of the axis height,
    8% of its width, where a label runs) joins its label ("1,2"), written right of the group's rightmost point,
    instead of being printed over it."""
    lo, hi = float(tps.min()), float(tps.max())
    xy = np.column_stack([mem / x_hi, (tps - lo) / max(hi - lo, 1e-9 * hi)])
    spots: list[list[int]] = []
    for j in range(count):
        near = next(
            (g for g in spots if any(np.hypot((xy[j, 0] - xy[k, 0]) / 2, xy[j, 1] - xy[k, 1]) < 0.04 for k in g)), None
        )
        if near is None:
            spots.append([j])
        else:
            near.append(j)
    for js in spots:
        at = max(js, key=lambda k: mem[k])
        ax.annotate(
            ",".join(str(j + 1) for j in sorted(js)),
            (mem[at], tps[at]),
            textcoords="offset points",
            xytext=(5, 3),
            fontsize=7,
        )


def search_landscape(search: SearchInput, path: Path) -> Figure:
    """Scatter of tokens/s vs worst-stage memory per ranked layout (colour and marker by tp·pp,
    best starred) beside the rejection counts; return the numbers drawn."""
    from matplotlib.ticker import FuncFormatter

    ranked = search.ranked
    numbers, div = _landscape_numbers(search)
    cap_b, top_b = float(ranked[0].estimate.capacity_bytes), max(numbers["memory_bytes"])
    cap_drawn, unit = numbers["capacity_drawn"], numbers["unit"]
    width_in = 13.0
    fig, (ax, bx) = new_figure(width_in, 5.0, ncols=2, width_ratios=(3, 2))
    mem, tps = _scatter(ax, numbers, div, cap_b)
    x_hi = (max(top_b, cap_b) if cap_drawn else top_b) / div * 1.1
    lo, hi = float(tps.min()), float(tps.max())
    _rank_labels(ax, mem, tps, x_hi, min(ANNOTATE_TOP, len(ranked)))
    ax.set_xlim(0, x_hi)
    pad = 0.08 * (hi - lo) if hi > lo else 0.05 * hi
    ax.set_ylim(lo - pad, hi + 1.5 * pad)  # headroom for the best's star and number
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: compact(v)))
    ax.set_xlabel(
        f"worst-stage memory per rank, {unit}"
        + ("" if cap_drawn else f" (capacity {human_bytes(cap_b)}: off the scale)")
    )
    ax.set_ylabel("predicted tokens/s")
    ax.set_title(
        wrap(
            f"{len(ranked)} ranked layouts (numbers: rank) — {ranked[0].model.name} on "
            f"{ranked[0].gpus} × {ranked[0].cluster or 'devices'}, global batch {ranked[0].global_batch}",
            width_in * 0.55,
            9,
        ),
        fontsize=9,
    )
    ax.legend(
        fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="tp·pp family", title_fontsize=7
    )
    _rejections(bx, search)
    save(fig, path)

    best = ranked[0]
    caption = (
        f"Every layout the search JSON ranks ({len(ranked)}; `exatrain search --top N` lists more), "
        f"predicted throughput against its worst pipeline stage's memory, coloured by tp·pp; the best "
        f"is starred: {describe(best)}, {best.estimate.tokens_per_s:,.0f} tokens/s at "
        f"{human_bytes(best.estimate.memory_bytes.total)}. Right: how many candidates each rule rejected."
    )
    key = (
        ("best", describe(best)),
        ("best tokens/s", f"{best.estimate.tokens_per_s:,.0f}"),
        ("best memory", human_bytes(best.estimate.memory_bytes.total)),
        ("examined / legal / feasible", f"{search.examined} / {search.legal} / {search.feasible}"),
    )
    return Figure(file=path.name, title="Search landscape", caption=caption, numbers=numbers, key_numbers=key)


def _rejections(ax, search: SearchInput) -> None:
    """Horizontal bars: candidates rejected by each rule, and the feasible ones."""
    items = [(k, v) for k, v in search.rejected.items() if v]
    if search.feasible is not None:
        items.append(("feasible (fit in memory)", search.feasible))
    if not items:
        ax.text(0.5, 0.5, "no rejection counts in the JSON", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    labels = [wrap(k, 2.2, 7) for k, _ in items]
    vals = [v for _, v in items]
    n_rules = len(items) - (search.feasible is not None)
    colors = [OKABE_ITO["vermillion"]] * n_rules + [OKABE_ITO["green"]] * (search.feasible is not None)
    y = np.arange(len(items))
    ax.barh(y, vals, color=colors, linewidth=0)
    for yi, v in zip(y, vals):
        ax.text(v, yi, f" {v:,}", va="center", fontsize=7)
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(vals) * 1.25)
    ax.set_xlabel("candidates")
    ax.set_title(
        f"{search.examined:,} examined, {search.legal:,} legal"
        if search.examined is not None and search.legal is not None
        else "candidates",
        fontsize=9,
    )
