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
from exatrain.report.style import GiB, Figure, new_figure, save


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


def _pairs(records: Sequence[RunRecord]) -> tuple[dict, dict, dict[str, int]]:
    """(step-time pairs, memory pairs, why the other records were left out)."""
    t = {"labels": [], "predicted_step_s": [], "measured_step_s": []}
    m = {"labels": [], "predicted_memory_bytes": [], "measured_memory_bytes": []}
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
        if est.time_s is not None and finite(got.step_time_s) and got.step_time_s > 0:
            t["labels"].append(label)
            t["predicted_step_s"].append(float(est.time_s.step))
            t["measured_step_s"].append(float(got.step_time_s))
        else:
            skip("no step time predicted or measured")
        by_stage = got.peak_memory_by_stage
        if by_stage and len(by_stage) == len(est.memory_by_stage):
            for i, (pm, mm) in enumerate(zip(est.memory_by_stage, by_stage)):
                m["labels"].append(f"{label} stage {i}")
                m["predicted_memory_bytes"].append(float(pm.total))
                m["measured_memory_bytes"].append(float(mm))
        elif finite(got.peak_memory_bytes):
            m["labels"].append(label)
            m["predicted_memory_bytes"].append(float(est.memory_bytes.total))
            m["measured_memory_bytes"].append(float(got.peak_memory_bytes))
    return t, m, skipped


def _parity(ax, pred: np.ndarray, meas: np.ndarray, unit: str) -> None:
    """Log-log scatter of measured against predicted, with y = x and ±25% guides."""
    lo = float(min(pred.min(), meas.min())) / 1.5
    hi = float(max(pred.max(), meas.max())) * 1.5
    xs = np.array([lo, hi])
    ax.plot(xs, xs, "-", color="gray", linewidth=1, label="measured = predicted")
    ax.plot(xs, xs * 1.25, ":", color="gray", linewidth=0.8, label="±25%")
    ax.plot(xs, xs / 1.25, ":", color="gray", linewidth=0.8)
    ax.scatter(pred, meas, s=26, color="C0", zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"predicted {unit}")
    ax.set_ylabel(f"measured {unit}")


def predicted_vs_measured(runs: RunsInput, path: Path) -> Figure | None:
    """Measured against predicted step time (one point per run) and peak memory (one per pipeline
    stage where the run measured stages); None when no record has both."""
    t, m, skipped = _pairs(runs.records)
    if not t["labels"] and not m["labels"]:
        return None
    fig, (ax, bx) = new_figure(10.0, 4.4, ncols=2)
    if t["labels"]:
        _parity(ax, np.asarray(t["predicted_step_s"]), np.asarray(t["measured_step_s"]), "seconds per step")
    ax.set_title(f"step time, {len(t['labels'])} runs", fontsize=9)
    if m["labels"]:
        _parity(bx, np.asarray(m["predicted_memory_bytes"]) / GiB, np.asarray(m["measured_memory_bytes"]) / GiB,
                "peak GiB per rank")
    bx.set_title(f"peak memory, {len(m['labels'])} points (per pipeline stage where measured)", fontsize=9)
    handles, labels = (ax if t["labels"] else bx).get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    save(fig, path)

    numbers = {**t, "memory_labels": m["labels"], "predicted_memory_bytes": m["predicted_memory_bytes"],
               "measured_memory_bytes": m["measured_memory_bytes"], "skipped": skipped}
    key = []
    if t["labels"]:
        err = np.abs(np.asarray(t["predicted_step_s"]) / np.asarray(t["measured_step_s"]) - 1)
        key.append(("step time, median |error|", f"{np.median(err):.1%} over {len(err)} runs"))
    if m["labels"]:
        err = np.abs(np.asarray(m["predicted_memory_bytes"]) / np.asarray(m["measured_memory_bytes"]) - 1)
        key.append(("memory, median |error|", f"{np.median(err):.1%} over {len(err)} points"))
    caption = ("Each point is a run (left) or a pipeline stage of a run (right): what the cost model "
               "predicted for its plan against what the run measured (median step time after warm-up; "
               "peak memory: allocated device memory, or the process's peak RSS on a CPU). Points on the "
               "grey line are exact; dotted lines are ±25%.")
    if skipped:
        caption += " Left out: " + ", ".join(f"{n} ({why})" for why, n in skipped.items()) + "."
    return Figure(file=path.name, title="Predicted vs measured", caption=caption, numbers=numbers,
                  key_numbers=tuple(key))


def loss_curves(runs: RunsInput, path: Path) -> Figure | None:
    """Loss against step for every run in the file; None when it has no per-step lines."""
    groups = split_runs(runs)
    if not groups:
        return None
    fig, ax = new_figure(8.0, 4.2)
    for g in groups:
        ax.plot(g.step, g.loss, "-", marker="." if len(g.step) <= 50 else None, linewidth=1.2, label=g.label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"training loss, {len(groups)} run{'s' if len(groups) > 1 else ''}", fontsize=9)
    if len(groups) <= 12:
        ax.legend(fontsize=7)
    save(fig, path)
    numbers = {"runs": [{"label": g.label, "step": list(g.step), "loss": list(g.loss)} for g in groups]}
    key = tuple((g.label, f"loss {g.loss[0]:.4g} → {g.loss[-1]:.4g} over {len(g.step)} steps") for g in groups[:10])
    caption = ("Loss of every run in the file against its step (the mean over the global batch, as the "
               "trainer logs it).")
    return Figure(file=path.name, title="Loss curves", caption=caption, numbers=numbers, key_numbers=key)
