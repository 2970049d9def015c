"""Step-time breakdown: where the seconds of one optimizer step go, for one plan or several.

The terms are ``TimeBreakdown``'s exposed parts (compute, pipeline bubble, exposed TP / PP / DP
communication, optimizer, fixed overhead), which add up to the step; one bar per plan makes the
search's ranking and a scaling series readable as "more bubble" or "more DP traffic".
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from exatrain.plan import TimeBreakdown
from exatrain.report.style import TIME_COLORS, TIME_TERMS, Figure, legend_columns, new_figure, save, seconds, wrap

# Segment labels: white on the dark colours, black on the light ones.
_DARK = {"compute", "pp_comm", "optimizer"}


def step_time_breakdown(rows: Sequence[tuple[str, TimeBreakdown]], path: Path, title: str) -> Figure:
    """Horizontal stacked bars, one per (label, breakdown), first row on top; return the seconds drawn."""
    if not rows:
        raise ValueError("step_time_breakdown needs at least one row")
    labels = [label for label, _ in rows]
    numbers: dict = {"labels": labels}
    for term in TIME_TERMS:
        numbers[term] = [float(getattr(t, term)) for _, t in rows]
    numbers["step"] = [float(t.step) for _, t in rows]

    n = len(rows)
    width_in = 9.0
    fig, ax = new_figure(width_in, max(2.6, 1.9 + 0.38 * n))
    y = np.arange(n)
    left = np.zeros(n)
    longest = max(numbers["step"])
    handles = []
    for term in TIME_TERMS:
        vals = np.asarray(numbers[term])
        bars = ax.barh(
            y, vals, left=left, color=TIME_COLORS[term], label=term.replace("_", " "), height=0.7, linewidth=0
        )
        if np.any(vals > 0):  # a legend entry only for what the picture shows
            handles.append(bars)
        for i, v in enumerate(vals):  # name the value inside a segment wide enough to hold it
            if v > 0.09 * longest:
                ax.text(
                    left[i] + v / 2,
                    y[i],
                    f"{v:,.3g}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if term in _DARK else "black",
                )
        left += vals
    for i, s in enumerate(numbers["step"]):
        ax.text(left[i] + 0.01 * longest, y[i], f"{seconds(s)}", va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, longest * 1.18)  # room for the total written after each bar
    ax.set_xlabel("seconds per optimizer step")
    ax.set_title(wrap(title, width_in - 0.5, 9), fontsize=9)
    names = [h.get_label() for h in handles]
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=legend_columns(names, width_in - 0.4, 8),
        fontsize=8,
        frameon=False,
    )
    save(fig, path)

    first = rows[0][1]
    parts = ", ".join(
        f"{t.replace('_', ' ')} {getattr(first, t) / first.step:.0%}"
        for t in TIME_TERMS
        if getattr(first, t) / first.step >= 0.005
    )
    caption = (
        f"Predicted seconds per optimizer step split into its exposed parts, which add up to the "
        f"step. {labels[0]}: {seconds(first.step)} ({parts})."
    )
    key = tuple((label, seconds(t.step)) for label, t in rows[:10])
    return Figure(file=path.name, title="Step-time breakdown", caption=caption, numbers=numbers, key_numbers=key)
