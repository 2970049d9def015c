"""Predicted vs published, for every row of the calibration table (catalog/data/published_runs.csv).

One set of cost-model parameters per cluster (planner/cost/coefficients.py DEFAULTS), no per-row tuning.
Prints each row, then the distribution of absolute relative errors (median, p90, max) per source
and overall.

    python benchmarks/prediction_error.py
"""

from __future__ import annotations

import numpy as np

from exatrain.planner.cost.published import published_runs, predicted_metric
from exatrain.planner.estimate import estimate_plan

UNITS = {"hardware_tflops_per_gpu": "TFLOPS/GPU", "step_s": "s/iteration", "mfu": "MFU"}


def main() -> None:
    errors: dict[str, list[float]] = {}
    print(f"{'source':16} {'run':54} {'metric':12} {'published':>10} {'predicted':>10} {'error':>8}")
    for run in published_runs():
        est = estimate_plan(run.plan, run.cluster, overlap=run.overlap)  # the overlaps the run had
        pred = predicted_metric(run, est)
        err = pred / run.measured - 1
        errors.setdefault(run.source, []).append(abs(err))
        print(f"{run.source:16} {run.name[:54]:54} {UNITS[run.metric]:12} {run.measured:10.3f} {pred:10.3f} "
              f"{err:+8.1%}")
    print()
    allerr = [e for v in errors.values() for e in v]
    for name, errs in [*errors.items(), ("all", allerr)]:
        a = np.array(errs)
        print(f"{name:16} n={a.size:2d}  median {np.median(a):6.1%}  p90 {np.percentile(a, 90):6.1%}  "
              f"max {a.max():6.1%}")


if __name__ == "__main__":
    main()
