"""Closing the loop between the cost model and real measurements: ``bench`` (measure this machine
into a calibration file), ``calibrate`` (refit shared factors to recorded runs) and ``compare``
(predicted vs measured of recorded runs, per run and as a distribution)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from exatrain.errors import UserError
from exatrain.paths import check_input_file, check_output_file


def _records(path: str | Path):
    from exatrain.records import read_run_records

    records = read_run_records(check_input_file(path, "runs file"))
    if not records:
        raise UserError(
            f"{path}: no RunRecords in it (lines of kind 'run_record', written by `exatrain train --metrics-file`)"
        )
    return records


def _cluster(name: str | None):
    from exatrain.catalog import get_cluster

    return get_cluster(name) if name else None


def _calibration(path: str | Path | None):
    from exatrain.planner.cost.coefficients import load_calibration

    return None if path is None else load_calibration(check_input_file(path, "--calibration"))


def bench(
    *,
    out: str | Path,
    device: str = "cpu",
    ranks: int | None = None,
    dtype: str | None = None,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
):
    """Micro-benchmarks of this machine (GEMMs, attention, bandwidth, overheads, collectives over
    ``ranks`` local ranks, the trainer's framework costs) fitted into a calibration file at ``out``
    (what ``calibration=`` elsewhere reads). Returns a BenchResult. ``ranks``: default 2 on the CPU,
    every GPU on cuda; ``dtype``: default float32 on the CPU, bfloat16 on GPUs (as ``train``)."""
    check_output_file(out, "--out")
    from exatrain.bench.machine import measure
    from exatrain.planner.cost.coefficients import save_calibration

    result = measure(device=device, ranks=ranks, dtype=dtype, quick=quick, progress=progress)
    save_calibration(out, result.calibration)
    return result


def calibrate(*, runs: str | Path, out: str | Path, calibration: str | Path | None = None, cluster: str | None = None):
    """Fit a few cost-model factors, shared by all runs of a device, to the RunRecords in ``runs``
    (starting from ``calibration``, e.g. ``bench``'s); write the calibration to ``out``. ``cluster``:
    for runs whose plan names none. Returns a CalibrateResult (error before and after per device)."""
    records = _records(runs)
    base = _calibration(calibration)
    check_output_file(out, "--out")
    from exatrain.bench.fit import fit_calibration
    from exatrain.planner.cost.coefficients import save_calibration

    result = fit_calibration(records, base=base, cluster=_cluster(cluster), runs_label=str(runs))
    save_calibration(out, result.calibration)
    return result


@dataclass(frozen=True)
class CompareResult:
    comparisons: tuple  # planner.compare.Comparison per successful run
    distribution: dict  # |error| statistics of step time and peak memory
    prediction: str  # "stored in each record" or "calibration <file>"

    def to_dict(self) -> dict:
        return {
            "runs": [c.to_dict() for c in self.comparisons],
            "distribution": self.distribution,
            "prediction": self.prediction,
        }


def compare(*, runs: str | Path, calibration: str | Path | None = None, cluster: str | None = None) -> CompareResult:
    """Each successful run's prediction (the one stored in its RunRecord, or a new one made with
    ``calibration``) against what it measured, and the distribution of the errors."""
    from exatrain.planner.compare import compare_all, distribution

    records = _records(runs)
    cal = _calibration(calibration)
    comps = compare_all(records, cal, _cluster(cluster))
    if not comps:
        raise UserError(f"{runs}: no successful run with measurements to compare")
    return CompareResult(
        tuple(comps), distribution(comps), f"calibration {calibration}" if cal is not None else "stored in each record"
    )


__all__ = ["CompareResult", "bench", "calibrate", "compare"]
