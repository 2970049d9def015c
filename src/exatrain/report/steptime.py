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
from exatrain.report.style import TIME_COLORS, TIME_TERMS, Figure, new_figure, save, seconds


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
    fig, ax = new_figure(9.0, max(2.4, 1.6 + 0.38 * n))
    y = np.arange(n)
    left = np.zeros(n)
    longest = max(numbers["step"])
    for term in TIME_TERMS:
        vals = np.asarray(numbers[term])
        ax.barh(y, vals, left=left, color=TIME_COLORS[term], label=term.replace("_", " "), height=0.7,
                linewidth=0)
        for i, v in enumerate(vals):  # name the value inside a segment wide enough to hold it
            if v > 0.09 * longest:
                ax.text(left[i] + v / 2, y[i], f"{v:,.3g}", ha="center", va="center", fontsize=7,
                        color="white" if term != "bubble" else "black")
        left += vals
    for i, s in enumerate(numbers["step"]):
        ax.text(left[i] + 0.01 * longest, y[i], f"{seconds(s)}", va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, longest * 1.15)
    ax.set_xlabel("seconds per optimizer step")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper center", ncol=len(TIME_TERMS), fontsize=7, frameon=False,
              bbox_to_anchor=(0.5, -0.5 / (1 + 0.3 * n)))
    save(fig, path)

    first = rows[0][1]
    parts = ", ".join(f"{t.replace('_', ' ')} {getattr(first, t) / first.step:.0%}" for t in TIME_TERMS
                      if getattr(first, t) / first.step >= 0.005)
    caption = (f"Predicted seconds per optimizer step split into its exposed parts, which add up to the "
               f"step. {labels[0]}: {seconds(first.step)} ({parts}).")
    key = tuple((label, seconds(t.step)) for label, t in rows[:10])
    return Figure(file=path.name, title="Step-time breakdown", caption=caption, numbers=numbers, key_numbers=key)
