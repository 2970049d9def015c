"""The cost model against published measurements, with one set of parameters per cluster."""

from __future__ import annotations

import pytest

from exatrain.catalog import get_cluster, get_model
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.planner.cost.published import published_runs, predicted_metric
from exatrain.planner.estimate import estimate_plan

RUNS = published_runs()
TOLERANCE = {"narayanan2021": 0.10, "korthikanti2022": 0.10, "dash2023": 0.15}


def test_every_row_is_used() -> None:
    by = {}
    for r in RUNS:
        by[r.source] = by.get(r.source, 0) + 1
    assert by == {"narayanan2021": 10, "korthikanti2022": 10, "dash2023": 3}


@pytest.mark.parametrize("run", RUNS, ids=[f"{r.source}:{r.name}" for r in RUNS])
def test_published_row_within_tolerance(run) -> None:
    est = estimate_plan(run.plan, run.cluster, overlap=run.overlap)
    assert est.fits, f"{run.name}: the published layout must fit ({est.memory_bytes.total / 2**30:.1f} GiB)"
    predicted = predicted_metric(run, est)
    assert predicted == pytest.approx(run.measured, rel=TOLERANCE[run.source])


def _frontier_plan(model: str, tp: int, pp: int, dp: int, gb: int) -> Plan:
    return Plan(
        model=get_model(model).replace(dropout=0.1),
        dims=ParallelDims(tp, pp, dp),
        shape=TrainShape(1, gb),
        zero_stage=1,
        recompute="full",
        runtime="megatron-deepspeed",
    )


@pytest.mark.parametrize(
    "model, tp, pp, dp0, gb0, gpus",
    [
        ("gpt-175b", 4, 16, 2, 640, (128, 256, 512, 1024)),
        ("gpt-1t", 8, 64, 2, 1280, (1024, 2048, 3072)),
    ],
)
def test_weak_scaling_at_least_95_percent(model, tp, pp, dp0, gb0, gpus) -> None:
    frontier = get_cluster("frontier")
    base = None
    for n in gpus:
        dp = n // (tp * pp)
        est = estimate_plan(_frontier_plan(model, tp, pp, dp, gb0 * dp // dp0).validate(frontier), frontier)
        per_gpu = est.tokens_per_s / n
        base = base or per_gpu
        assert per_gpu / base >= 0.95


def test_strong_scaling_loses_to_the_bubble() -> None:
    """Fixed global batch: more replicas mean fewer micro-batches per pipeline, so a bigger bubble."""
    frontier = get_cluster("frontier")
    effs = []
    base = None
    for n in (128, 256, 512, 1024):
        est = estimate_plan(_frontier_plan("gpt-175b", 4, 16, n // 64, 1280).validate(frontier), frontier)
        base = base or est.tokens_per_s
        effs.append(est.tokens_per_s / base / (n / 128))
        assert est.time_s.bubble / est.time_s.step == pytest.approx(15 / (1280 / (n // 64) + 15), rel=0.35)
    assert effs == sorted(effs, reverse=True) and 0.6 < effs[-1] < 1.0
