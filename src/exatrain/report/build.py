"""Assemble a report: prepare every input (fail before writing anything), draw every picture into a
staging folder, then move them and index.html into the output folder.

A report never leaves half its files behind: bad input is refused before the output folder is
touched, and if drawing fails the staging folder (and any folder this call created) is removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from exatrain.catalog.hardware import ClusterSpec, get_cluster
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.planner.cost.coefficients import Calibration, CostParams, default_params
from exatrain.report.html import Section, write_index
from exatrain.report.inputs import PlanInput, RunsInput, ScalingInput, SearchInput
from exatrain.report.style import Figure


@dataclass(frozen=True)
class ReportInputs:
    """Everything a report is made from. ``cluster`` stands in for plans that name no cluster, or one
    the catalog lacks; ``calibration`` (a calibration file as ``load_calibration`` reads it, or a
    mapping of device name -> parameters) replaces the cost model's priors and, where the file
    measured them, the cluster's link tiers."""

    plans: tuple[PlanInput, ...] = ()
    searches: tuple[SearchInput, ...] = ()
    scalings: tuple[ScalingInput, ...] = ()
    runs: tuple[RunsInput, ...] = ()
    cluster: ClusterSpec | None = None
    calibration: Calibration | Mapping[str, CostParams] | None = None

    def __post_init__(self) -> None:
        cal = self.calibration
        if cal is not None and not isinstance(cal, Calibration):
            object.__setattr__(self, "calibration", Calibration(devices=dict(cal)) if cal else None)

    @property
    def empty(self) -> bool:
        return not (self.plans or self.searches or self.scalings or self.runs)


@dataclass(frozen=True)
class PreparedPlan:
    source: PlanInput
    plan: Plan  # with an estimate
    cluster: ClusterSpec | None
    params: CostParams | None
    notes: tuple[str, ...]


def _cluster_for(plan: Plan, fallback: ClusterSpec | None) -> ClusterSpec | None:
    if plan.cluster:
        try:
            return get_cluster(plan.cluster)
        except UserError:
            if fallback is not None and fallback.name == plan.cluster:
                return fallback
            return None
    return fallback


def prepare_plan(src: PlanInput, inputs: ReportInputs) -> PreparedPlan:
    """The plan with an estimate and the cluster and cost parameters its timeline needs; a plan
    without an estimate is estimated here (UserError if no cluster is known for it)."""
    plan = src.plan
    cluster = _cluster_for(plan, inputs.cluster)
    cal = inputs.calibration
    notes: list[str] = []
    params = None
    if cluster is not None:
        params = cal.params_for(cluster.device.name, cluster.name, plan.runtime) if cal is not None else None
        if cal is not None:
            cluster = cal.apply(cluster)
            notes.append(
                f"the calibration file has no parameters for {cluster.device.name}; the timeline uses "
                "the cost model's priors"
                if params is None
                else f"the timeline uses the calibration file's parameters for {cluster.device.name}"
            )
        params = params or default_params(cluster.device.name)
    if plan.estimate is None:
        if cluster is None:
            raise UserError(
                f"{src.path}: the plan carries no estimate and names no known cluster "
                f"({plan.cluster or 'none'}); pass --cluster or --cluster-file, or write it "
                "with `exatrain estimate --out`"
            )
        from exatrain.planner.estimate import estimate_plan

        plan = plan.with_estimate(estimate_plan(plan, cluster, params))
        notes.append(f"the plan carried no estimate; estimated here for {cluster.name}")
    elif cluster is None:
        notes.append(
            f"pipeline timeline not drawn: cluster {plan.cluster or '(none)'} is not in the catalog; "
            "pass --cluster-file (or --cluster for a plan that names none)"
        )
    return PreparedPlan(source=src, plan=plan, cluster=cluster, params=params, notes=tuple(notes))


def _prefixes(inputs: ReportInputs) -> dict[int, str]:
    """File-name prefix per input object: 'plan', or 'plan2', 'plan3'... when a kind repeats."""
    out: dict[int, str] = {}
    for kind, items in (
        ("plan", inputs.plans),
        ("search", inputs.searches),
        ("scaling", inputs.scalings),
        ("runs", inputs.runs),
    ):
        for i, item in enumerate(items, 1):
            out[id(item)] = kind if len(items) == 1 else f"{kind}{i}"
    return out


def _plan_section(p: PreparedPlan, prefix: str, folder: Path) -> Section:
    from exatrain.report.memory import memory_by_stage_figure
    from exatrain.report.steptime import step_time_breakdown
    from exatrain.report.timeline import pipeline_timeline

    plan, notes = p.plan, list(p.notes)
    figs: list[Figure] = [memory_by_stage_figure(plan, folder / f"{prefix}-memory.png")]
    if plan.estimate.time_s is not None:
        label = f"{plan.label} {plan.schedule_label}"
        figs.append(
            step_time_breakdown(
                [(label, plan.estimate.time_s)], folder / f"{prefix}-step-time.png", f"step time — {plan.model.name}"
            )
        )
    if p.cluster is not None and plan.pp > 1:
        figs.append(pipeline_timeline(plan, p.cluster, p.params, folder / f"{prefix}-timeline.png"))
    elif plan.pp == 1:
        notes.append("no pipeline timeline: the plan has one pipeline stage (pp 1)")
    return Section(
        title=f"Plan: {plan.model.name}, {plan.label}",
        source=str(p.source.path),
        figures=tuple(figs),
        notes=tuple(notes),
    )


def _search_section(s: SearchInput, prefix: str, folder: Path) -> Section:
    from exatrain.report.memory import memory_by_stage_figure
    from exatrain.report.search import search_landscape
    from exatrain.report.steptime import step_time_breakdown

    best = s.ranked[0]
    rows = [
        (f"#{i} {p.label} mb{p.micro_batch} Z{p.zero_stage} {p.recompute_label} {p.schedule_label}", p.estimate.time_s)
        for i, p in enumerate(s.ranked[:12], 1)
    ]
    figs = [
        search_landscape(s, folder / f"{prefix}-landscape.png"),
        step_time_breakdown(rows, folder / f"{prefix}-step-time.png", f"step time of the top {len(rows)} layouts"),
        memory_by_stage_figure(best, folder / f"{prefix}-best-memory.png"),
    ]
    return Section(
        title=f"Search: {best.model.name} on {best.gpus} × {best.cluster or 'devices'}",
        source=str(s.path),
        figures=tuple(figs),
    )


def _scaling_section(s: ScalingInput, prefix: str, folder: Path) -> Section:
    from exatrain.report.scaling import scaling_curves
    from exatrain.report.steptime import step_time_breakdown

    rows = [(f"{p.gpus:,} GPUs {p.plan.label}", p.plan.estimate.time_s) for p in s.points]
    figs = [
        scaling_curves(s, folder / f"{prefix}-scaling.png"),
        step_time_breakdown(rows, folder / f"{prefix}-step-time.png", f"step time per GPU count ({s.mode} scaling)"),
    ]
    first = s.points[0].plan
    return Section(
        title=f"{s.mode.capitalize()} scaling: {first.model.name} on {first.cluster or 'the cluster'}",
        source=str(s.path),
        figures=tuple(figs),
    )


def _runs_section(r: RunsInput, prefix: str, folder: Path) -> Section:
    from exatrain.report.ranks import rank_times
    from exatrain.report.runs import loss_curves, predicted_vs_measured

    figs = [
        f
        for f in (
            predicted_vs_measured(r, folder / f"{prefix}-predicted-vs-measured.png"),
            loss_curves(r, folder / f"{prefix}-loss.png"),
            rank_times(r.path, folder / f"{prefix}-ranks.png"),
        )
        if f is not None
    ]
    notes = []
    if not any(f.file.endswith("predicted-vs-measured.png") for f in figs):
        notes.append(
            f"no predicted-vs-measured picture: none of the {len(r.records)} run records has both "
            "a prediction and a measurement"
        )
    if not r.steps:
        notes.append("no loss curves: the file has no per-step lines")
    return Section(title=f"Runs: {r.path.name}", source=str(r.path), figures=tuple(figs), notes=tuple(notes))


def render(inputs: ReportInputs, prepared: list[PreparedPlan], folder: Path) -> list[Section]:
    """Draw every picture into ``folder``; one section per input, in the order plan, search,
    scaling, runs."""
    pre = _prefixes(inputs)
    sections = [_plan_section(p, pre[id(p.source)], folder) for p in prepared]
    sections += [_search_section(s, pre[id(s)], folder) for s in inputs.searches]
    sections += [_scaling_section(s, pre[id(s)], folder) for s in inputs.scalings]
    sections += [_runs_section(r, pre[id(r)], folder) for r in inputs.runs]
    return sections


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (what mkdir -p would create)."""
    missing = None
    for p in (path, *path.parents):
        if p.exists():
            return missing
        missing = p
    return missing


def write_report(inputs: ReportInputs, out: str | Path) -> tuple[Path, list[Section]]:
    """Write the report into ``out``; return index.html's path and the sections. All or nothing."""
    if inputs.empty:
        raise UserError("nothing to report: give at least one of --plan, --search, --scaling, --runs")
    prepared = [prepare_plan(p, inputs) for p in inputs.plans]  # may raise: nothing written yet
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder; choose another --out")
    created = _first_missing(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".report-", dir=out))
    except OSError as exc:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise UserError(f"{out}: cannot write the report there ({exc.strerror or exc})") from None
    try:
        sections = render(inputs, prepared, staging)
        write_index(sections, staging)
        names = sorted(f.name for f in staging.iterdir())
        for name in names:  # pictures first, index.html last: it never names a picture not yet there
            if name != "index.html":
                os.replace(staging / name, out / name)
        os.replace(staging / "index.html", out / "index.html")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return out / "index.html", sections
