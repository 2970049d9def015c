"""Predicted against measured, per run and as a distribution: `exatrain validate`, and the lines
`exatrain train` prints at the end of a run.

A prediction is the one stored in the RunRecord (made when the run started), or a new one from a
calibration file. Step time is compared on every run; peak memory where the run measured device
memory (``torch.cuda.max_memory_allocated``; a CPU run's peak RSS includes the interpreter and is
shown, not scored). Memory is predicted twice: by the planner's reference model (Megatron's
tensors) and by the model of the trainer's own execution (``accounting.trainer_memory``).

A prediction is shown beside a run's measurement only when it was made with parameters measured
on the machine that ran it (``calibrated_on``): the cost model's priors are for a device type, not
for one machine, and a CPU's prior can be off by an order of magnitude.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from exatrain.catalog.hardware import ClusterSpec, cluster_catalog, match_device
from exatrain.errors import UserError
from exatrain.loadwatch import CHANGED
from exatrain.plan import RunRecord, StepEstimate
from exatrain.planner.cost.calibrate import error_stats
from exatrain.planner.cost.coefficients import Calibration


@dataclass(frozen=True)
class Comparison:
    label: str
    device: str
    status: str
    predicted_step_s: float | None
    measured_step_s: float | None
    predicted_memory_bytes: float | None  # planner reference model, worst stage
    trainer_memory_bytes: float | None  # trainer execution model, worst stage (tensors + allowance)
    measured_memory_bytes: float | None  # max over ranks
    device_memory: bool  # measured memory is device memory (comparable), not a CPU process's RSS
    predicted_range_s: tuple[float, float] | None = None  # the prediction's band (planner/band.py), seconds
    band_text: str | None = None  # where that band comes from, in words
    # The change of the machine's load between the calibration's bench and this run (loadwatch.py): its line, and
    # the expected measured/predicted step time from it alone, by which predicted_range_s was widened (CPU runs)
    load_line: str | None = None
    load_factor: float | None = None

    @property
    def in_band(self) -> bool | None:
        """Did the measured step time land inside the prediction's band (None: no band or no measurement)?"""
        if self.predicted_range_s is None or not self.measured_step_s:
            return None
        low, high = self.predicted_range_s
        return low <= self.measured_step_s <= high

    @property
    def step_error(self) -> float | None:
        if self.predicted_step_s is None or not self.measured_step_s:
            return None
        return self.predicted_step_s / self.measured_step_s - 1.0

    def memory_error(self, which: str = "trainer") -> float | None:
        pred = self.trainer_memory_bytes if which == "trainer" else self.predicted_memory_bytes
        if pred is None or not self.measured_memory_bytes or not self.device_memory:
            return None
        return pred / self.measured_memory_bytes - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.label,
            "device": self.device,
            "status": self.status,
            "predicted_step_s": self.predicted_step_s,
            "measured_step_s": self.measured_step_s,
            "step_error": self.step_error,
            "predicted_memory_bytes": self.predicted_memory_bytes,
            "trainer_memory_bytes": self.trainer_memory_bytes,
            "measured_memory_bytes": self.measured_memory_bytes,
            "device_memory": self.device_memory,
            "predicted_range_s": None if self.predicted_range_s is None else list(self.predicted_range_s),
            "in_band": self.in_band,
            "load_factor": self.load_factor,
            "memory_error": self.memory_error("trainer"),
            "reference_memory_error": self.memory_error("reference"),
        }


def recorded_overlap(env: Any) -> str | None:
    """The overlaps a recorded run is priced with again: what `exatrain record` stored (None: not stated, each
    engine's defaults), or every overlap on for a record that names none (exatrain's own training runs)."""
    return env["overlap"] if "overlap" in env else "all"


def layout_label(record: RunRecord) -> str:
    p = record.plan
    s = f"{p.model.name} {p.label} mb{p.micro_batch}×{p.num_microbatches}"
    if p.zero_stage:
        s += f" ZeRO-{p.zero_stage}"
    if p.recompute != "none":
        s += f" {p.recompute}"
    if p.sequence_parallel:
        s += " SP"
    if p.pp > 1:
        s += f" {p.schedule_label}"
    return s + f" {p.dtype}"


def cluster_for(record: RunRecord, override: ClusterSpec | None = None) -> ClusterSpec | None:
    """The cluster a record ran on: --cluster, the plan's, or the catalog cluster of its device."""
    if override is not None:
        return override
    clusters = cluster_catalog()
    if record.plan.cluster in clusters:
        return clusters[record.plan.cluster]
    if record.device == "cpu":
        return clusters.get("local-cpu")
    spec = match_device(record.device) if record.device else None
    for c in clusters.values():
        if spec is not None and c.device.name == spec.name:
            return c
    return None


def compare(
    record: RunRecord, calibration: Calibration | None = None, cluster: ClusterSpec | None = None
) -> Comparison:
    """Predicted vs measured for one record; re-predicted when a calibration is given."""
    from exatrain.accounting.trainer_memory import trainer_memory_by_stage
    from exatrain.planner.estimate import estimate_plan

    plan, est = record.plan, record.predicted
    c = cluster_for(record, cluster)
    if calibration is not None:
        if c is None:
            raise UserError(
                f"cannot tell which cluster run {layout_label(record)} ran on "
                f"(device {record.device!r}); pass --cluster"
            )
        params = calibration.params_for(c.device.name, c.name, plan.runtime)
        if params is None:
            raise UserError(
                f"the calibration has no parameters for device {c.device.name!r} "
                f"(it has: {', '.join(sorted(calibration.devices)) or 'none'}) nor for "
                f"{c.name}/{plan.runtime}"
            )
        est = estimate_plan(plan, calibration.apply(c), params, recorded_overlap(record.env))
    trainer_mem = None
    if c is not None or plan.cluster:
        on_cpu = (c.device.name == "cpu") if c is not None else None
        trainer_mem = max(m.total for m in trainer_memory_by_stage(plan, on_cpu=on_cpu))
    m = record.measured
    band = None if est is None or est.step_range_s is None else tuple(est.step_range_s)
    load = _contention(record) if calibration is None else None  # a new calibration: not that bench's load
    if load is not None and band is not None:
        band = load.widen(*band)
    return Comparison(
        label=layout_label(record),
        device=record.device or "?",
        status=record.status,
        predicted_step_s=None if est is None or est.time_s is None else est.time_s.step,
        measured_step_s=None if m is None else m.step_time_s,
        predicted_memory_bytes=None if est is None else est.memory_bytes.total,
        trainer_memory_bytes=trainer_mem,
        measured_memory_bytes=None if m is None else m.peak_memory_bytes,
        device_memory=bool(record.device) and record.device != "cpu",
        predicted_range_s=band,
        band_text=None if est is None or not est.band else est.band.get("text"),
        load_line=None if load is None else load.line(),
        load_factor=None if load is None else load.factor,
    )


def _contention(record: RunRecord):
    """The change of load between the bench that calibrated a CPU run's prediction and the run (``env.bench_load``,
    ``env.load``: api/training.py records them), or None: a GPU run (the host's load is not what it waits on), or a
    record without both."""
    from exatrain.loadwatch import contention

    if record.device != "cpu":
        return None
    return contention(record.env.get("bench_load"), record.env.get("load"), record.plan.gpus)


def compare_all(
    records: Iterable[RunRecord], calibration: Calibration | None = None, cluster: ClusterSpec | None = None
) -> list[Comparison]:
    return [compare(r, calibration, cluster) for r in records if r.status == "ok" and r.measured is not None]


def distribution(comparisons: list[Comparison]) -> dict[str, dict[str, float]]:
    steps = [(c.predicted_step_s, c.measured_step_s) for c in comparisons if c.step_error is not None]
    mems = [
        (c.trainer_memory_bytes, c.measured_memory_bytes) for c in comparisons if c.memory_error("trainer") is not None
    ]
    return {
        "step_time": error_stats([a for a, _ in steps], [b for _, b in steps]),
        "peak_memory": error_stats([a for a, _ in mems], [b for _, b in mems]),
    }


def prediction_source(estimate: StepEstimate | None) -> str | None:
    """Where the cost model's parameters came from, as the estimate's note records it
    (``planner.estimate``: "cost model: <source> parameters for <device>"), or None."""
    for note in () if estimate is None else estimate.notes:
        if note.startswith("cost model: ") and " parameters for " in note:
            return note[len("cost model: ") : note.rindex(" parameters for ")]
    return None


def calibrated_on(estimate: StepEstimate | None, host: str) -> bool:
    """Was this prediction made with parameters measured on ``host``? True for a calibration by
    ``exatrain bench`` there (source "exatrain bench (<host>)") or fitted by ``exatrain calibrate``
    to runs that include that host's (source "exatrain calibrate (<n> runs; <host>, ...)")."""
    source = prediction_source(estimate) or ""
    if not source.startswith(("exatrain bench (", "exatrain calibrate (")) or not source.endswith(")"):
        return False
    inside = source[source.index("(") + 1 : -1]
    if source.startswith("exatrain calibrate ("):
        if "; " not in inside:
            return False
        inside = inside.split("; ", 1)[1]
    return host in inside.split(", ")


def size(nbytes: float) -> str:
    """Bytes in the unit that fits: MiB under 1 GiB, else GiB."""
    return f"{nbytes / 2**20:,.0f} MiB" if nbytes < 2**30 else f"{nbytes / 2**30:,.2f} GiB"


def summary_lines(c: Comparison, calibrated: bool) -> list[str]:
    """What `exatrain train` prints after a run: the measured step time, with the prediction beside
    it only when ``calibrated`` (made with parameters measured on this machine), and peak memory."""
    lines = []
    if c.measured_step_s is not None:
        if calibrated and c.step_error is not None:
            line = f"step time: predicted {c.predicted_step_s:.3f} s"
            if c.predicted_range_s is not None:
                low, high = c.predicted_range_s
                line += f" (band {low:.3f}–{high:.3f} s" + (f", {c.band_text})" if c.band_text else ")")
            line += f", measured {c.measured_step_s:.3f} s (prediction {c.step_error:+.1%})"
            if c.in_band is not None:
                line += (
                    ": inside the band"
                    if c.in_band
                    else (
                        ": outside the band, " + ("slower" if c.measured_step_s > c.predicted_range_s[1] else "faster")
                    )
                )
            lines.append(line)
            if c.load_line is not None and c.load_factor is not None and not 1 / CHANGED <= c.load_factor <= CHANGED:
                lines.append(c.load_line)
        else:
            lines.append(
                f"step time: measured {c.measured_step_s:.3f} s; no prediction shown, uncalibrated for "
                "this machine: run `exatrain bench`, then train with --calibration"
            )
    if c.measured_memory_bytes:
        kind = "device memory" if c.device_memory else "peak RSS of a rank (process, not comparable)"
        parts = [f"measured {size(c.measured_memory_bytes)} {kind}"]
        if c.trainer_memory_bytes is not None:
            e = c.memory_error("trainer")
            parts.append(f"trainer model {size(c.trainer_memory_bytes)}" + (f" ({e:+.1%})" if e is not None else ""))
        if c.predicted_memory_bytes is not None:
            parts.append(f"planner {size(c.predicted_memory_bytes)}")
        lines.append("peak memory: " + ", ".join(parts))
    return lines


__all__ = [
    "recorded_overlap",
    "Comparison",
    "calibrated_on",
    "cluster_for",
    "compare",
    "compare_all",
    "distribution",
    "layout_label",
    "prediction_source",
    "size",
    "summary_lines",
]
