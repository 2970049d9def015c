"""``exatrain calibrate``: refit the cost model's shared factors to the RunRecords of real runs.

Runs are grouped by device (the cluster each ran on: the plan's, the catalog cluster of its
device, or the one given); each device's few factors are fitted to all of its runs at once
(``planner.cost.calibrate.fit_runs``), starting from a base calibration (e.g. ``exatrain bench``'s)
or the device's prior. The result keeps the base's other devices and link tiers, and records which
runs and hosts it came from, so a prediction can tell whether it was calibrated on this machine.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from exatrain.catalog import ClusterSpec
from exatrain.errors import UserError
from exatrain.plan import RunRecord
from exatrain.planner.compare import cluster_for, layout_label
from exatrain.planner.cost.calibrate import RunPoint, fit_runs
from exatrain.planner.cost.coefficients import Calibration, default_params


@dataclass(frozen=True)
class DeviceFit:
    device: str
    runs: int
    factors: dict[str, float]  # the fitted factors' new values
    before: dict[str, float]  # step-time error statistics with the base parameters
    after: dict[str, float]  # ... with the fitted ones

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "factors": self.factors, "before": self.before, "after": self.after}


@dataclass(frozen=True)
class CalibrateResult:
    calibration: Calibration
    fits: tuple[DeviceFit, ...]
    skipped: int  # records without a successful measured step time

    def summary_lines(self) -> list[str]:
        """Per device: the fitted factors, and the step-time error before and after the fit."""
        lines = []
        for f in self.fits:
            fitted = ", ".join(f"{k}={v:.3g}" for k, v in f.factors.items())
            lines.append(f"{f.device}: {f.runs} runs; fitted {fitted}")
            for when, e in (("before:", f.before), ("after: ", f.after)):
                lines.append(f"  step-time error {when} median {e['median']:.1%}, p90 {e['p90']:.1%}, max "
                             f"{e['max']:.1%} (rms log-error {e['rms_log']:.3f}"
                             + (")" if when == "before:" else ", the quantity fitted)"))
        if self.skipped:
            lines.append(f"{self.skipped} record(s) without a successful measurement skipped")
        return lines


def fit_calibration(records: Sequence[RunRecord], *, base: Calibration | None = None,
                    cluster: ClusterSpec | None = None, runs_label: str = "") -> CalibrateResult:
    """Fit each device's shared factors to its successful runs; ``cluster`` for runs whose plan names none."""
    groups: dict[str, list[RunPoint]] = {}
    hosts: dict[str, set[str]] = {}
    skipped = 0
    for r in records:
        if r.status != "ok" or r.measured is None or not r.measured.step_time_s:
            skipped += 1
            continue
        c = cluster_for(r, cluster)
        if c is None:
            raise UserError(f"{runs_label or 'runs'}: cannot tell the cluster of run {layout_label(r)} "
                            f"(device {r.device!r}); pass --cluster")
        if base is not None:
            c = base.apply(c)
        groups.setdefault(c.device.name, []).append(RunPoint(r.plan, c, r.measured.step_time_s, layout_label(r)))
        if r.env.get("host"):
            hosts.setdefault(c.device.name, set()).add(str(r.env["host"]))
    if not groups:
        raise UserError(f"{runs_label or 'runs'}: no successful run with a measured step time")
    devices = dict(base.devices) if base else {}
    fits = []
    for device, points in groups.items():
        start = (base.params_for(device) if base else None) or default_params(device)
        fit = fit_runs(points, start)
        on = sorted(hosts.get(device, ()))
        # The source names the hosts the runs came from (compare.calibrated_on reads them back).
        devices[device] = fit.params.replace(source=f"exatrain calibrate ({len(points)} runs"
                                             + (f"; {', '.join(on)})" if on else ")"))
        fits.append(DeviceFit(device, len(points), {f: getattr(fit.params, f) for f in fit.factors},
                              fit.before, fit.after))
    extra = dict(base.extra) if base else {}
    extra["calibrate"] = {"runs_file": runs_label, "skipped": skipped, **{f.device: f.to_dict() for f in fits}}
    cal = Calibration(devices=devices, cluster_tiers=dict(base.cluster_tiers) if base else {}, extra=extra)
    return CalibrateResult(calibration=cal, fits=tuple(fits), skipped=skipped)


__all__ = ["CalibrateResult", "DeviceFit", "fit_calibration"]
