"""Pictures of real runs: predicted against measured (step time, memory), and loss curves.

Both read a runs file: RunRecords carry the plan, what the cost model predicted for it and what the
run measured; per-step lines carry the loss. One file may hold several runs one after another: a
run's steps end where the step number stops increasing or where its RunRecord is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from exatrain.plan import RunRecord
from exatrain.report.inputs import RunsInput, StepLine, finite
from exatrain.report.style import (
    OTHER_COLOR,
    Figure,
    byte_unit,
    legend_columns,
    log_or_linear,
    new_figure,
    save,
    series_colors,
    top_series,
)


def record_label(r: RunRecord) -> str:
    p = r.plan
    return f"{p.model.name} {p.label} mb{p.micro_batch}" + (f" on {r.device}" if r.device else "")


@dataclass
class LossRun:
    label: str
    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)


def split_runs(runs: RunsInput) -> list[LossRun]:
    """Per-step lines grouped into runs, in file order; a run is named after the RunRecord that
    closes it (or "run N" when none does)."""
    out: list[LossRun] = []
    cur: LossRun | None = None
    for e in runs.entries:
        if isinstance(e, StepLine):
            if cur is None or (cur.step and e.step <= cur.step[-1]):
                cur = LossRun(label="")
                out.append(cur)
            cur.step.append(e.step)
            cur.loss.append(e.loss)
        elif cur is not None:  # a RunRecord closes the run whose steps precede it
            cur.label = record_label(e)
            cur = None
    for i, r in enumerate(out, 1):
        r.label = r.label or f"run {i}"
    return out


MEMORY_NOT_COMPARABLE = "memory only: a CPU run's peak is its process's RSS, not comparable with predicted tensors"


def _predicted_memory(r: RunRecord) -> tuple:
    """The prediction a run's measured memory is held against, per stage: the model of exatrain's own trainer
    (``trainer_memory_by_stage``, what ``torch.cuda.max_memory_allocated`` counts in it) for a run of the exatrain
    runtime, else the planner's reference model of the runtime the plan names."""
    est = r.predicted
    own = r.plan.settings.runtime == "exatrain" and len(est.trainer_memory_by_stage) == len(est.memory_by_stage)
    return tuple(est.trainer_memory_by_stage) if own else tuple(est.memory_by_stage)


def _pairs(records: Sequence[RunRecord]) -> tuple[dict, dict, dict[str, int], dict[int, str]]:
    """(step-time pairs, memory pairs, why the other records were left out, the label of each
    drawn record by its number)."""
    t = {"labels": [], "run": [], "predicted_step_s": [], "measured_step_s": []}
    m = {"labels": [], "run": [], "predicted_memory_bytes": [], "measured_memory_bytes": []}
    names: dict[int, str] = {}  # the drawn records, numbered 1, 2, ... in file order
    skipped: dict[str, int] = {}

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1

    for r in records:
        est, got = r.predicted, r.measured
        if r.status != "ok" or got is None:
            skip(f"status {r.status}, nothing measured" if got is None else f"status {r.status}")
            continue
        if est is None:
            skip("no prediction")
            continue
        label = record_label(r)
        has_time = est.time_s is not None and finite(got.step_time_s) and got.step_time_s > 0
        predicted = _predicted_memory(r)
        device_memory = bool(r.device) and r.device != "cpu"  # a CPU run measures its process's RSS
        by_stage = got.peak_memory_by_stage
        staged = device_memory and bool(by_stage) and len(by_stage) == len(predicted)
        worst = device_memory and not staged and finite(got.peak_memory_bytes)
        if not device_memory and (by_stage or finite(got.peak_memory_bytes)):
            skip(MEMORY_NOT_COMPARABLE)
        if not has_time:
            skip("no step time predicted or measured")
            if not staged and not worst:
                continue
        n = len(names) + 1
        names[n] = label
        if has_time:
            t["labels"].append(label)
            t["run"].append(n)
            t["predicted_step_s"].append(float(est.time_s.step))
            t["measured_step_s"].append(float(got.step_time_s))
        if staged:
            for i, (pm, mm) in enumerate(zip(predicted, by_stage)):
                m["labels"].append(f"{label} stage {i}")
                m["run"].append(n)
                m["predicted_memory_bytes"].append(float(pm.total))
                m["measured_memory_bytes"].append(float(mm))
        elif worst:
            m["labels"].append(label)
            m["run"].append(n)
            m["predicted_memory_bytes"].append(float(max(pm.total for pm in predicted)))
            m["measured_memory_bytes"].append(float(got.peak_memory_bytes))
    return t, m, skipped, names


def _run_colors(runs: list[int]) -> dict[int, str]:
    """A distinct colour per run number (the first eight of more than nine share grey beyond)."""
    own, rest = top_series([str(r) for r in runs])
    colors = dict(zip(own, series_colors(len(own))))
    return {r: colors.get(str(r), OTHER_COLOR) for r in runs}


def _parity(
    ax, pred: np.ndarray, meas: np.ndarray, runs: list[int], names: list[str], colors: dict[int, str], unit: str
) -> None:
    """Measured against predicted, one colour per run and each point named (``names``), with the
    y = x and ±25% guides; log axes when the values span enough for three ticks."""
    lo = float(min(pred.min(), meas.min())) / 1.5
    hi = float(max(pred.max(), meas.max())) * 1.5
    xs = np.geomspace(lo, hi, 64)
    ax.plot(xs, xs, "-", color="gray", linewidth=1, label="measured = predicted", zorder=1)
    ax.plot(xs, xs * 1.25, ":", color="gray", linewidth=0.8, label="±25%", zorder=1)
    ax.plot(xs, xs / 1.25, ":", color="gray", linewidth=0.8, zorder=1)
    run_arr = np.asarray(runs)
    for r in dict.fromkeys(runs):
        sel = run_arr == r
        ax.scatter(pred[sel], meas[sel], s=30, color=colors[r], zorder=3, edgecolors="black", linewidths=0.4)
    for x, y, name in zip(pred, meas, names):
        if name:
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, -9), fontsize=7)
    for axis in ("x", "y"):
        log_or_linear(ax, axis, lo, hi)
    ax.set_xlabel(f"predicted {unit}")
    ax.set_ylabel(f"measured {unit}")


def _memory_panel(bx, m: dict[str, list], colors: dict) -> None:
    """Measured against predicted peak memory, one point per pipeline stage of a run, its number once."""
    pm, mm = np.asarray(m["predicted_memory_bytes"]), np.asarray(m["measured_memory_bytes"])
    div, unit = byte_unit(float(max(pm.max(), mm.max())))
    # Each run's number once, at its fullest point: a run's stages sit close together.
    fullest = {r: max((i for i, q in enumerate(m["run"]) if q == r), key=lambda i: mm[i]) for r in set(m["run"])}
    names = [str(r) if fullest[r] == i else "" for i, r in enumerate(m["run"])]
    _parity(bx, pm / div, mm / div, m["run"], names, colors, f"peak {unit} per rank")
    bx.set_title(f"peak device memory, {len(m['labels'])} points (one per pipeline stage where measured)", fontsize=9)


def _run_legend(fig, ax, colors: dict, labels: dict, order: list, width_in: float) -> None:
    """One legend below the panels: each run's number, colour and label, then the panel's guide lines."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D(
            [],
            [],
            linestyle="",
            marker="o",
            markersize=6,
            markerfacecolor=colors[r],
            markeredgecolor="black",
            markeredgewidth=0.4,
            label=f"{r}: {labels[r]}",
        )
        for r in order
    ]
    guides, guide_labels = ax.get_legend_handles_labels()
    entries = handles + guides
    names = [h.get_label() for h in handles] + guide_labels
    fig.legend(
        entries,
        names,
        loc="outside lower center",
        ncol=legend_columns(names, width_in - 0.4, 8),
        fontsize=8,
        frameon=False,
    )


def _key_numbers(t: dict[str, list], m: dict[str, list]) -> list[tuple[str, str]]:
    """The median |error| of the step times and of the memory points drawn."""
    key = []
    if t["labels"]:
        err = np.abs(np.asarray(t["predicted_step_s"]) / np.asarray(t["measured_step_s"]) - 1)
        key.append(("step time, median |error|", f"{np.median(err):.1%} over {len(err)} runs"))
    if m["labels"]:
        err = np.abs(np.asarray(m["predicted_memory_bytes"]) / np.asarray(m["measured_memory_bytes"]) - 1)
        key.append(("memory, median |error|", f"{np.median(err):.1%} over {len(err)} points"))
    return key


def _caption(t: dict[str, list], both: bool, skipped: dict) -> str:
    """What the points are, which panel shows what, and the records left out."""
    caption = (
        "Each point is a run's step time"
        + (
            " (left) or a pipeline stage of a run's peak memory (right)"
            if both
            else ""
            if t["labels"]
            else " or a pipeline stage of a run's peak memory"
        )
        + ", numbered and coloured by run as the legend names them: what the cost model predicted for its "
        "plan against what the run measured (median step time after warm-up; peak memory: the device memory "
        "the trainer allocated, torch.cuda.max_memory_allocated, against the model of the trainer's own "
        "memory for an exatrain run, else the runtime's reference model; a CPU run's peak RSS holds the "
        "interpreter and its libraries besides the tensors and is not drawn). Points on the grey line are "
        "exact; dotted lines are ±25%."
    )
    if skipped:
        caption += " Left out: " + ", ".join(f"{n} ({why})" for why, n in skipped.items()) + "."
    return caption


def predicted_vs_measured(runs: RunsInput, path: Path) -> Figure | None:
    """Measured against predicted step time (one point per run) and peak memory (one per pipeline
    stage where the run measured stages); None when no record has both. Points carry their run's
    number and colour; the legend names each run."""
    t, m, skipped, labels = _pairs(runs.records)
    if not t["labels"] and not m["labels"]:
        return None
    order = sorted(set(t["run"]) | set(m["run"]))
    colors = _run_colors(order)
    both = bool(t["labels"]) and bool(m["labels"])  # a panel only for what was measured comparably
    width_in = 11.0 if both else 6.5
    fig, axes = new_figure(width_in, 5.0, ncols=2 if both else 1)
    ax, bx = axes if both else (axes, axes)
    if t["labels"]:
        _parity(
            ax,
            np.asarray(t["predicted_step_s"]),
            np.asarray(t["measured_step_s"]),
            t["run"],
            [str(r) for r in t["run"]],
            colors,
            "seconds per step",
        )
        ax.set_title(f"step time, {len(t['labels'])} run{'s' if len(t['labels']) != 1 else ''}", fontsize=9)
    if m["labels"]:
        _memory_panel(bx, m, colors)
    _run_legend(fig, ax if t["labels"] else bx, colors, labels, order, width_in)
    save(fig, path)

    numbers = {
        **t,
        "memory_labels": m["labels"],
        "memory_run": m["run"],
        "predicted_memory_bytes": m["predicted_memory_bytes"],
        "measured_memory_bytes": m["measured_memory_bytes"],
        "run_labels": dict(labels),
        "skipped": skipped,
    }
    return Figure(
        file=path.name,
        title="Predicted vs measured",
        caption=_caption(t, both, skipped),
        numbers=numbers,
        key_numbers=tuple(_key_numbers(t, m)),
    )


def loss_curves(runs: RunsInput, path: Path) -> Figure | None:
    """Loss against step for every run in the file; None when it has no per-step lines."""
    groups = split_runs(runs)
    if not groups:
        return None
    width_in = 9.0
    fig, ax = new_figure(width_in, 4.6)
    colors = _run_colors(list(range(1, len(groups) + 1)))
    repeated = {g.label for g in groups if sum(h.label == g.label for h in groups) > 1}
    names = []
    for i, g in enumerate(groups, 1):
        name = f"{g.label} (run {i})" if g.label in repeated else g.label
        names.append(name)
        ax.plot(
            g.step, g.loss, "-", marker="." if len(g.step) <= 50 else None, linewidth=1.4, color=colors[i], label=name
        )
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=3))  # steps are whole numbers
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"training loss, {len(groups)} run{'s' if len(groups) > 1 else ''}", fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    if len(groups) > 9:  # grey "other" runs share one legend entry
        keep = [i for i, c in enumerate(colors.values()) if c != OTHER_COLOR]
        handles = [handles[i] for i in keep] + [handles[-1]]
        labels = [labels[i] for i in keep] + [f"{len(groups) - len(keep)} other runs"]
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=legend_columns(labels, width_in - 0.4, 8),
        fontsize=8,
        frameon=False,
    )
    save(fig, path)
    numbers = {"runs": [{"label": g.label, "step": list(g.step), "loss": list(g.loss)} for g in groups]}
    key = tuple((g.label, f"loss {g.loss[0]:.4g} → {g.loss[-1]:.4g} over {len(g.step)} steps") for g in groups[:10])
    caption = "Loss of every run in the file against its step (the mean over the global batch, as the trainer logs it)."
    return Figure(file=path.name, title="Loss curves", caption=caption, numbers=numbers, key_numbers=key)
