"""The pipeline schedule as a picture: rank × time, forward / backward / weight-gradient / idle.

The plan is recast to each of the four looped schedules (same layout, batch and stage split; interleave 1
for gpipe and 1f1b, the plan's interleave — or 2 — for interleaved and zero_bubble), beside its own
when that is zbh1, zbv or dualpipev, and each is
simulated op by op (``planner.plan_cost.simulate_plan``) on the very per-stage seconds the estimate
uses; its step time comes from the estimate's own path (``planner.plan_cost.step_time``), whose
pipeline term is a closed form never above this simulation (equal to it where the critical path
changes rank only at the first or last micro-batch; see ``planner.cost.pipeline``).

Ops are drawn as a raster, one column per slice of time and one row per rank, rather than one
rectangle per op: a 1T layout has ~100k ops, most narrower than a pixel, and the raster stays exact
to a pixel whatever the size (its idle share per rank is returned, so a test can hold it to the
simulation's idle time).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.errors import PlanError
from exatrain.plan import Plan, TimeBreakdown
from exatrain.planner.cost.coefficients import CostParams
from exatrain.report.style import OKABE_ITO, Figure, describe, legend_columns, new_figure, save, seconds, wrap

# Colours: idle, then (kind, shade) pairs — shades alternate between micro-batches — then "after the
# step". Each kind is an Okabe-Ito colour (blue, orange, bluish green; see style.OKABE_ITO) and its
# light shade the same colour mixed half-and-half with white.
IDLE_RGB = (0.86, 0.86, 0.86)
AFTER_RGB = (1.0, 1.0, 1.0)
KINDS = ("F", "B", "W")
KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient (zero bubble)"}

LOOPED = ("gpipe", "1f1b", "interleaved", "zero_bubble")  # what every plan is recast to


def _hex_rgb(h: str) -> tuple[float, float, float]:
    return tuple(int(h[i : i + 2], 16) / 255 for i in (1, 3, 5))  # type: ignore[return-value]


def _light(rgb: tuple[float, float, float]) -> tuple[float, float, float]:
    return tuple(0.5 * c + 0.5 for c in rgb)  # type: ignore[return-value]


KIND_RGB = {
    k: (_hex_rgb(OKABE_ITO[c]), _light(_hex_rgb(OKABE_ITO[c])))
    for k, c in (("F", "blue"), ("B", "orange"), ("W", "green"))
}
# Ranks are drawn as bands with a white line between them when there are few enough to leave each
# band several pixels tall; each band is ROW_PIXELS image rows, the last of them the gap.
GAP_MAX_PP = 32
ROW_PIXELS = 8
COLUMNS = 1100


@dataclass(frozen=True)
class Simulated:
    """One schedule of the plan: the plan recast to it, its step breakdown and simulated timeline."""

    plan: Plan
    time_s: TimeBreakdown
    result: Any  # planner.cost.schedule.ScheduleResult
    own: bool


def schedule_variants(plan: Plan) -> tuple[list[Plan], dict[str, str]]:
    """The plan recast to every schedule it can run (the plan itself for its own schedule), and why
    the others cannot (e.g. fewer micro-batches than stages, or too few layers to interleave)."""
    if plan.pp == 1:
        return [plan], {}
    plans, skipped = [], {}
    # the four looped schedules, and the plan's own when it is another (zbh1, zbv, dualpipev)
    for s in LOOPED + ((plan.schedule,) if plan.schedule not in LOOPED else ()):
        if s == plan.schedule:
            plans.append(plan)
            continue
        v = 1 if s in ("gpipe", "1f1b") else (plan.interleave if plan.interleave > 1 else 2)
        try:
            plans.append(plan.replace(schedule=s, interleave=v, stage_layers=()).validate())
        except PlanError as exc:
            skipped[s] = str(exc)
    return plans, skipped


def simulate_variants(plan: Plan, cluster: ClusterSpec, params: CostParams) -> tuple[list[Simulated], dict[str, str]]:
    """Each schedule variant: its step time by the estimate's own path, its pipeline simulated op
    by op on the same per-stage seconds."""
    from exatrain.planner.plan_cost import simulate_plan, step_time

    plans, skipped = schedule_variants(plan)
    out = []
    for q in plans:
        bd, _ = step_time(q, cluster, params)
        out.append(Simulated(plan=q, time_s=bd, result=simulate_plan(q, cluster, params), own=q is plan))
    return out, skipped


def ops_of(result: Any) -> dict[str, np.ndarray]:
    """The simulated timeline as arrays: rank, kind (index into KINDS), micro-batch, virtual stage,
    start and end seconds. Reads ``Timeline``'s parallel arrays (kind codes index the simulator's
    own KINDS); falls back to ``events()`` for a timeline that only offers those."""
    tl = result.timeline
    try:
        from exatrain.planner.cost.schedule import KINDS as SIM_KINDS

        remap = np.array([KINDS.index(k) for k in SIM_KINDS])
        return {
            "rank": np.asarray(tl.rank, dtype=np.int64),
            "kind": remap[np.asarray(tl.kind)],
            "microbatch": np.asarray(tl.microbatch, dtype=np.int64),
            "virtual_stage": np.asarray(tl.virtual_stage, dtype=np.int64),
            "start_s": np.asarray(tl.start_s, dtype=np.float64),
            "end_s": np.asarray(tl.end_s, dtype=np.float64),
        }
    except (ImportError, AttributeError):
        ev = tl.events()
    return {
        "rank": np.array([e.rank for e in ev], dtype=np.int64),
        "kind": np.array([KINDS.index(e.kind) for e in ev], dtype=np.int64),
        "microbatch": np.array([e.microbatch for e in ev], dtype=np.int64),
        "virtual_stage": np.array([e.virtual_stage for e in ev], dtype=np.int64),
        "start_s": np.array([e.start_s for e in ev], dtype=np.float64),
        "end_s": np.array([e.end_s for e in ev], dtype=np.float64),
    }


def _occupied(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Seconds of [edges[0], edges[c]] covered by the (non-overlapping, sorted) intervals, per edge."""
    if len(starts) == 0:
        return np.zeros(len(edges))
    done_s = np.concatenate([[0.0], np.cumsum(ends - starts)])
    n_done = np.searchsorted(ends, edges, side="right")  # intervals over by this edge
    nxt = np.minimum(n_done, len(starts) - 1)
    partial = np.where(n_done < len(starts), np.clip(edges - starts[nxt], 0.0, ends[nxt] - starts[nxt]), 0.0)
    return done_s[n_done] + partial


def wide_ops(ops: dict[str, np.ndarray], column_s: float) -> bool:
    """Whether the typical op spans a few columns of ``column_s`` seconds (else ops blend)."""
    return float(np.median(ops["end_s"] - ops["start_s"])) >= 3 * column_s


def shades(ops: dict[str, np.ndarray], pp: int, column_s: float) -> np.ndarray:
    """Per op, 0 (dark) or 1 (light): alternating between micro-batches where ops span a few
    columns of ``column_s`` seconds; all dark where narrower ops would blend into noise."""
    if not wide_ops(ops, column_s):
        return np.zeros_like(ops["kind"])
    return (ops["microbatch"] + ops["virtual_stage"] // pp) % 2


def coverage(
    ops: dict[str, np.ndarray], pp: int, span_s: float, columns: int = COLUMNS
) -> tuple[np.ndarray, np.ndarray]:
    """Share of each time column (over [0, span_s], time measured from the first op) that each rank
    spends on each (kind, micro-batch shade): shape (pp, 2*len(KINDS), columns); and the share of
    each column inside the step (before the last op ends), shape (columns,). Idle is what is left.
    Exact, not sampled: a column holds the time-weighted mix of whatever ran in it."""
    t0 = float(ops["start_s"].min())
    edges = np.linspace(0.0, span_s, columns + 1)
    width = span_s / columns
    cov = np.zeros((pp, 2 * len(KINDS), columns))
    shade = shades(ops, pp, width)
    group = ops["rank"] * (2 * len(KINDS)) + 2 * ops["kind"] + shade  # (rank, kind, shade)
    order = np.lexsort((ops["start_s"], group))  # one sort, then one slice per group
    keys, first = np.unique(group[order], return_index=True)
    bounds = np.append(first, len(order))
    for key, a, b in zip(keys.tolist(), bounds[:-1], bounds[1:]):
        sel = order[a:b]
        occ = _occupied(ops["start_s"][sel] - t0, ops["end_s"][sel] - t0, edges)
        cov[key // (2 * len(KINDS)), key % (2 * len(KINDS))] = np.diff(occ) / width
    in_step = np.clip((float(ops["end_s"].max()) - t0 - edges[:-1]) / width, 0.0, 1.0)
    return cov, in_step


def to_rgb(cov: np.ndarray, in_step: np.ndarray) -> np.ndarray:
    """(pp, columns, 3) image: each column's mix of op colours, idle grey and after-the-step white."""
    colors = np.array([rgb for k in KINDS for rgb in KIND_RGB[k]])  # (2*len(KINDS), 3)
    busy = cov.sum(axis=1)  # (pp, columns)
    idle = np.clip(in_step[None, :] - busy, 0.0, None)
    after = 1.0 - in_step
    img = np.einsum("rkc,kx->rcx", cov, colors)
    img += idle[..., None] * np.array(IDLE_RGB) + after[None, :, None] * np.array(AFTER_RGB)
    return np.clip(img, 0.0, 1.0)


def banded(img: np.ndarray) -> np.ndarray:
    """(pp * ROW_PIXELS, columns, 3): each rank's row repeated, its last pixel row white, so
    neighbouring ranks stay apart when the picture is scaled (up to GAP_MAX_PP ranks; more are
    returned as they are, one row each)."""
    pp = img.shape[0]
    if pp > GAP_MAX_PP:
        return img
    out = np.repeat(img, ROW_PIXELS, axis=0)
    out[ROW_PIXELS - 1 :: ROW_PIXELS] = 1.0
    return out


def idle_share(cov: np.ndarray, in_step: np.ndarray) -> list[float]:
    """Per rank, the idle share of the step as drawn (what the grey covers)."""
    inside = float(in_step.sum())
    return [float(np.clip(inside - row.sum(), 0.0, None) / inside) for row in cov.sum(axis=1)]


def _label(s: Simulated) -> str:
    return s.plan.schedule_label + (" (the plan's)" if s.own else "")


def _name_microbatches(ax: Any, ops: dict[str, np.ndarray], shade: np.ndarray, t_max: float) -> None:
    """Write the micro-batch number on ops wide enough to hold it (small pipelines only): white on
    the dark shade, black on the light one."""
    t0 = float(ops["start_s"].min())
    wide = np.flatnonzero(ops["end_s"] - ops["start_s"] > 0.02 * t_max)
    if len(wide) > 400:
        return
    for i in wide:
        ax.text(
            (ops["start_s"][i] + ops["end_s"][i]) / 2 - t0,
            ops["rank"][i],
            str(ops["microbatch"][i]),
            ha="center",
            va="center",
            fontsize=6,
            color="black" if shade[i] else "white",
        )


def _blend(ops) -> tuple:
    """The colour of forward and backward ops mixed in one column, weighted by their time (for the legend)."""
    dur = ops["end_s"] - ops["start_s"]
    f_s, b_s = (float(dur[ops["kind"] == KINDS.index(k)].sum()) for k in ("F", "B"))
    return tuple((f_s * np.array(KIND_RGB["F"][0]) + b_s * np.array(KIND_RGB["B"][0])) / (f_s + b_s))


def _panel(ax, s, ops, pp: int, t_max: float) -> dict:
    """One schedule's ranks over time (micro-batches named where there are few ranks), the step's end dotted;
    return its simulated numbers and the idle share drawn."""
    cov, in_step = coverage(ops, pp, t_max)
    ax.imshow(banded(to_rgb(cov, in_step)), aspect="auto", interpolation="nearest", extent=(0.0, t_max, pp - 0.5, -0.5))
    if pp <= 16:
        _name_microbatches(ax, ops, shades(ops, pp, t_max / COLUMNS), t_max)
    ax.axvline(s.time_s.step, color="black", linewidth=1.0, linestyle=":")
    r = s.result
    ax.set_title(
        f"{_label(s)}: pipeline {seconds(r.step_s)}, busiest rank idle {r.bubble_fraction:.1%}; "
        f"whole step {seconds(s.time_s.step)}",
        fontsize=8,
        loc="left",
    )
    ax.set_ylabel("pipeline rank", fontsize=8)
    ax.set_yticks(range(0, pp, max(1, pp // 8)))
    ax.tick_params(labelsize=7)
    return {
        "schedule": s.plan.schedule,
        "interleave": s.plan.interleave,
        "schedule_label": s.plan.schedule_label,
        "own": s.own,
        "makespan_s": float(r.step_s),
        "step_s": float(s.time_s.step),
        "bubble_s": float(r.bubble_s),
        "busy_s": [float(x) for x in r.busy_s],
        "idle_s": [float(x) for x in r.idle_s],
        "ops": {k: int(np.sum(ops["kind"] == i)) for i, k in enumerate(KINDS)},
        "time_s": s.time_s.to_dict(),
        "drawn_idle_share": idle_share(cov, in_step),
    }


def _legend(fig, rows: list[dict], mixed: tuple | None, width_in: float) -> None:
    """One legend below the panels: the op kinds drawn, the F/B blend, idle, and the step's end."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    drawn = [k for k in KINDS if any(r["ops"][k] for r in rows)]
    legend = [Patch(color=KIND_RGB[k][0], label=KIND_NAMES[k]) for k in drawn]
    if mixed is not None:
        legend.append(Patch(color=mixed, label="forward and backward mixed (ops narrower than a pixel)"))
    legend.append(Patch(color=IDLE_RGB, label="idle"))
    legend.append(
        Line2D(
            [],
            [],
            color="black",
            linewidth=1.0,
            linestyle=":",
            label="end of the step (+ DP sync, optimizer, overhead)",
        )
    )
    fig.legend(
        handles=legend,
        loc="outside lower center",
        fontsize=8,
        frameon=False,
        ncol=legend_columns([h.get_label() for h in legend], width_in - 0.4, 8),
    )


def pipeline_timeline(plan: Plan, cluster: ClusterSpec, params: CostParams, path: Path) -> Figure:
    """One panel per schedule (shared time axis); return each schedule's simulated numbers and the
    idle share each rank has in the picture."""
    sims, skipped = simulate_variants(plan, cluster, params)
    # The time axis holds every panel's pipeline and its whole step (the dotted line), clear of the frame.
    t_max = 1.015 * max(max(s.result.step_s, s.time_s.step) for s in sims)
    pp = plan.pp
    panel_h = 1.0 + min(2.4, 0.03 * pp + 0.15)
    width_in = 12.0
    fig, axes = new_figure(width_in, 1.0 + panel_h * len(sims), nrows=len(sims), sharex=True, squeeze=False)
    rows = []
    mixed = None  # the F/B blend of a panel whose ops are narrower than a column (for the legend)
    for ax, s in zip(axes[:, 0], sims):
        ops = ops_of(s.result)
        if mixed is None and not wide_ops(ops, t_max / COLUMNS):
            mixed = _blend(ops)
        rows.append(_panel(ax, s, ops, pp, t_max))
    axes[-1, 0].set_xlabel("seconds into the optimizer step (one data-parallel replica)", fontsize=9)
    _legend(fig, rows, mixed, width_in)
    fig.suptitle(
        wrap(f"pipeline schedules — {describe(plan)}, {plan.num_microbatches} micro-batches", width_in - 0.4, 9),
        fontsize=9,
    )
    save(fig, path, palette=32)
    return Figure(
        file=path.name,
        title="Pipeline schedule timeline",
        caption=_caption(plan, rows, skipped),
        numbers=_numbers(plan, rows, skipped),
        key_numbers=_key_numbers(rows),
    )


def _numbers(plan: Plan, rows: Sequence[dict], skipped: dict[str, str]) -> dict:
    est = plan.estimate
    return {
        "schedules": list(rows),
        "skipped": dict(skipped),
        "pp": plan.pp,
        "num_microbatches": plan.num_microbatches,
        "estimate_step_s": None if est is None or est.time_s is None else float(est.time_s.step),
    }


def _caption(plan: Plan, rows: Sequence[dict], skipped: dict[str, str]) -> str:
    text = (
        "Each row is one pipeline rank, time runs right: blue forward, orange backward (the input "
        "gradient only, under zero bubble), green weight gradient, grey idle, the dotted line the end "
        "of the whole step; light and dark shades alternate between micro-batches (where ops are narrower "
        "than a pixel they blend). Every panel uses the estimate's own per-stage seconds and schedule simulator. "
    )
    text += "; ".join(f"{r['schedule_label']} {seconds(r['makespan_s'])}" for r in rows) + " of pipeline per step."
    own = next(r for r in rows if r["own"])
    est = plan.estimate
    if est is not None and est.time_s is not None and abs(own["step_s"] / est.time_s.step - 1) > 1e-3:
        text += (
            f" Note: the plan's stored estimate says {seconds(est.time_s.step)} per step but the cost "
            f"model now gives {seconds(own['step_s'])} (another exatrain version or calibration)."
        )
    for s, why in skipped.items():
        text += f" {s} not drawn: {why}."
    return text


def _key_numbers(rows: Sequence[dict]) -> tuple[tuple[str, str], ...]:
    return tuple(
        (
            f"{r['schedule_label']}{' (plan)' if r['own'] else ''}",
            f"step {seconds(r['step_s'])}, pipeline {seconds(r['makespan_s'])}, "
            f"busiest rank idle {r['bubble_s'] / r['makespan_s']:.1%}",
        )
        for r in rows
    )
