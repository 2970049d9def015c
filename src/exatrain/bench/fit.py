"""``exatrain calibrate``: refit the cost model's shared factors to the RunRecords of real runs.

Runs are grouped by cluster and engine (the cluster each ran on: the plan's, the catalog cluster of its device, or the
one given; the engine: the plan's runtime), whatever recorded them: exatrain's own trainer, or ``exatrain record`` for a
run of another engine. Each group's few factors are fitted to all of its runs at once
(``planner.cost.calibrate.fit_runs``: one run fits the one term of the cost model that its own breakdown says is the
most uncertain, shrunk to the prior; more runs, more factors, ``run_factors``), starting from a base calibration (e.g.
``exatrain bench``'s) or the device's prior; from ``MIN_BAND_RUNS`` runs on, the band an estimate calibrated on them
carries is measured by predicting each run from the others (``held_out_band``). The result keeps the base's devices and
link tiers, adds one set of parameters per cluster and engine (``Calibration.fits``), and records which runs and hosts
it came from, so a prediction can tell whether it was calibrated on this machine. Torch-free.

"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from exatrain.catalog import ClusterSpec
from exatrain.errors import UserError
from exatrain.plan import RunRecord
from exatrain.planner.compare import cluster_for, layout_label, recorded_overlap
from exatrain.planner.cost.calibrate import MIN_BAND_RUNS, RunPoint, fit_runs, held_out_band
from exatrain.planner.cost.coefficients import FIT_KEY_SEP, Calibration, default_params


@dataclass(frozen=True)
class GroupFit:
    """One cluster's runs of one engine, and what was fitted to them."""

    cluster: str
    runtime: str
    device: str
    runs: int
    factors: dict[str, float]  # the fitted factors' new values
    before: dict[str, float]  # step-time error statistics with the base parameters
    after: dict[str, float]  # ... with the fitted ones (in sample)
    band: tuple[float, float] | None = None  # p10, p90 of measured / predicted, each run held out
    terms: tuple[str, ...] = ()  # a shrunk fit's terms (planner/cost/shrinkage.py), else ()
    taken: float | None = None  # a shrunk fit: the share of the runs' mean log miss it took

    @property
    def key(self) -> str:
        return f"{self.cluster}{FIT_KEY_SEP}{self.runtime}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "runtime": self.runtime,
            "device": self.device,
            "runs": self.runs,
            "factors": self.factors,
            "before": self.before,
            "after": self.after,
            "terms": list(self.terms),
            "taken": self.taken,
            "band": None
            if self.band is None
            else {"ratio_low": self.band[0], "ratio_high": self.band[1], "held_out_runs": self.runs},
        }


@dataclass(frozen=True)
class CalibrateResult:
    calibration: Calibration
    fits: tuple[GroupFit, ...]
    skipped: int  # records without a successful measured step time

    def summary_lines(self) -> list[str]:
        """Per cluster and engine: the fitted factors, the step-time error before and after, the band."""
        lines = []
        for f in self.fits:
            fitted = ", ".join(f"{k}={v:.3g}" for k, v in f.factors.items()) or "nothing (no term is uncertain)"
            if f.terms:
                fitted = f"the {' and '.join(f.terms)} term{'s' * (len(f.terms) > 1)}: {fitted}"
            lines.append(f"{f.cluster} / {f.runtime} ({f.device}): {f.runs} run{'s' * (f.runs > 1)}; fitted {fitted}")
            for when, e in (("before:", f.before), ("after: ", f.after)):
                lines.append(
                    f"  step-time error {when} median {e['median']:.1%}, p90 {e['p90']:.1%}, max "
                    f"{e['max']:.1%} (rms log-error {e['rms_log']:.3f}"
                    + (")" if when == "before:" else ", the quantity fitted" + _shrunk(f) + ")")
                )
            if f.band is not None:
                lines.append(
                    f"  band: measured / predicted ×{f.band[0]:.3f}–×{f.band[1]:.3f} (p10–p90 of the "
                    f"{f.runs} runs, each predicted from the others)"
                )
            else:
                lines.append(f"  band: the published-run band (fewer than {MIN_BAND_RUNS} runs to measure one on)")
        if self.skipped:
            lines.append(f"{self.skipped} record(s) without a successful measurement skipped")
        return lines


def _shrunk(f: GroupFit) -> str:
    """Where a shrunk fit was made: the terms it moved and the share of the runs' log miss it took
    (planner/cost/shrinkage.py)."""
    if f.terms:
        return f"; the {' and '.join(f.terms)} term{'s' * (len(f.terms) > 1)} took {f.taken:.2f} of the runs' log miss"
    if set(f.factors) == {"step_scale"} and f.taken is not None and f.taken < 1:
        return f"; step_scale takes {f.taken:.2f} of the runs' log miss, their cluster's share"
    return ""


def _groups(
    records: Sequence[RunRecord], base: Calibration | None, cluster: ClusterSpec | None, runs_label: str
) -> tuple[dict[tuple[str, str], list[RunPoint]], dict, int]:
    """The successful runs as RunPoints grouped by (cluster, runtime), the hosts of each group, the skipped count."""
    groups: dict[tuple[str, str], list[RunPoint]] = {}
    hosts: dict[tuple[str, str], set[str]] = {}
    skipped = 0
    for r in records:
        if r.status != "ok" or r.measured is None or not r.measured.step_time_s:
            skipped += 1
            continue
        c = cluster_for(r, cluster)
        if c is None:
            raise UserError(
                f"{runs_label or 'runs'}: cannot tell the cluster of run {layout_label(r)} "
                f"(device {r.device!r}); pass --cluster"
            )
        if base is not None:
            c = base.apply(c)
        key = (c.name, r.plan.runtime)
        groups.setdefault(key, []).append(
            RunPoint(r.plan, c, r.measured.step_time_s, layout_label(r), overlap=recorded_overlap(r.env))
        )
        if r.env.get("host"):
            hosts.setdefault(key, set()).add(str(r.env["host"]))
    if not groups:
        raise UserError(f"{runs_label or 'runs'}: no successful run with a measured step time")
    return groups, hosts, skipped


def fit_calibration(
    records: Sequence[RunRecord],
    *,
    base: Calibration | None = None,
    cluster: ClusterSpec | None = None,
    runs_label: str = "",
) -> CalibrateResult:
    """Fit each cluster and engine's shared factors to its successful runs, and measure its band on them held out
    (module doc); ``cluster`` for runs whose plan names none."""
    groups, hosts, skipped = _groups(records, base, cluster, runs_label)
    fitted = dict(base.fits) if base else {}
    fits = []
    for (name, runtime), points in groups.items():
        device = points[0].cluster.device.name
        start = (base.params_for(device, name, runtime) if base else None) or default_params(device)
        fit = fit_runs(points, start)
        band = held_out_band(points, start)
        on = sorted(hosts.get((name, runtime), ()))
        # The source names the hosts the runs came from (compare.calibrated_on reads them back).
        params = fit.params.replace(
            source=f"exatrain calibrate ({len(points)} runs" + (f"; {', '.join(on)})" if on else ")"),
            calibrated_runs=len(points),
        )
        if band is not None:
            params = params.replace(band_low=band[0], band_high=band[1], band_runs=len(points))
        fitted[(name, runtime)] = params
        fits.append(
            GroupFit(
                name,
                runtime,
                device,
                len(points),
                {f: getattr(fit.params, f) for f in fit.factors},
                fit.before,
                fit.after,
                None if band is None else band[:2],
                fit.terms,
                fit.taken,
            )
        )
    extra = dict(base.extra) if base else {}
    extra["calibrate"] = {"runs_file": runs_label, "skipped": skipped, **{f.key: f.to_dict() for f in fits}}
    cal = Calibration(
        devices=dict(base.devices) if base else {},
        cluster_tiers=dict(base.cluster_tiers) if base else {},
        extra=extra,
        fits=fitted,
    )
    return CalibrateResult(calibration=cal, fits=tuple(fits), skipped=skipped)


__all__ = ["CalibrateResult", "GroupFit", "fit_calibration"]
