"""The search landscape: predicted throughput against memory for every ranked layout, and why the
rest were rejected.

Why a picture: the ranking table says which layout wins; the scatter shows how much headroom the
winner leaves below the capacity and which tp·pp families crowd the top (a layout that is 2% slower
but uses half the memory is often the better first run).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from exatrain.report.inputs import SearchInput
from exatrain.report.style import CAPACITY_COLOR, GiB, Figure, describe, gib, new_figure, save

_MARKERS = "osD^vP*Xph<>"


def family(plan) -> str:
    """The tp·pp family a layout belongs to (dp follows from the GPU count)."""
    return f"tp{plan.tp}·pp{plan.pp}"


def search_landscape(search: SearchInput, path: Path) -> Figure:
    """Scatter of tokens/s vs worst-stage memory per ranked layout (colour and marker by tp·pp,
    best starred) beside the rejection counts; return the numbers drawn."""
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
        "examined": search.examined, "legal": search.legal, "feasible": search.feasible,
    }
    fams = list(dict.fromkeys(numbers["family"]))
    fig, (ax, bx) = new_figure(12.0, 4.8, ncols=2, width_ratios=(3, 2))
    mem = np.asarray(numbers["memory_bytes"]) / GiB
    tps = np.asarray(numbers["tokens_per_s"])
    for i, f in enumerate(fams):
        sel = [j for j, x in enumerate(numbers["family"]) if x == f]
        ax.scatter(mem[sel], tps[sel], s=28, marker=_MARKERS[i % len(_MARKERS)], color=f"C{i % 10}",
                   label=f, alpha=0.85, linewidths=0)
    ax.scatter(mem[:1], tps[:1], s=220, marker="*", facecolors="none", edgecolors="black", linewidths=1.2,
               label="best")
    cap = est0.capacity_bytes / GiB
    ax.axvline(cap, color=CAPACITY_COLOR, linestyle="--", linewidth=1.2, label=f"capacity {cap:,.0f} GiB")
    if len(ranked) <= 25:
        for j in range(len(ranked)):
            ax.annotate(str(j + 1), (mem[j], tps[j]), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xlim(0, max(cap, float(mem.max())) * 1.08)
    ax.set_xlabel("worst-stage memory per rank, GiB")
    ax.set_ylabel("predicted tokens/s")
    ax.set_title(f"{len(ranked)} ranked layouts — {ranked[0].model.name} on {ranked[0].gpus} × "
                 f"{ranked[0].cluster or 'devices'}, global batch {ranked[0].global_batch}", fontsize=9)
    ax.legend(fontsize=7, ncol=2 if len(fams) > 6 else 1, loc="best")
    _rejections(bx, search)
    save(fig, path)

    best = ranked[0]
    caption = (f"Every layout the search JSON ranks ({len(ranked)}; `exatrain search --top N` lists more), "
               f"predicted throughput against its worst pipeline stage's memory, coloured by tp·pp; the best "
               f"is starred: {describe(best)}, {best.estimate.tokens_per_s:,.0f} tokens/s at "
               f"{gib(best.estimate.memory_bytes.total)}. Right: how many candidates each rule rejected.")
    key = (("best", describe(best)), ("best tokens/s", f"{best.estimate.tokens_per_s:,.0f}"),
           ("best memory", gib(best.estimate.memory_bytes.total)),
           ("examined / legal / feasible", f"{search.examined} / {search.legal} / {search.feasible}"))
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
    labels = [k if len(k) <= 38 else k[:36] + "…" for k, _ in items]
    vals = [v for _, v in items]
    colors = ["#C44E52"] * (len(items) - (search.feasible is not None)) + ["#55A868"] * (search.feasible is not None)
    y = np.arange(len(items))
    ax.barh(y, vals, color=colors, linewidth=0)
    for yi, v in zip(y, vals):
        ax.text(v, yi, f" {v:,}", va="center", fontsize=7)
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(vals) * 1.25)
    ax.set_xlabel("candidates")
    ax.set_title(f"{search.examined:,} examined, {search.legal:,} legal" if search.examined is not None
                 and search.legal is not None else "candidates", fontsize=9)
