"""A calibration on one or two runs takes the share of their miss that their cluster shares (planner/cost/shrinkage.py):
the weight's limits and formula, the spreads recovered from grouped ratios, the shipped figures, and the one-run fit
applying the weight.

Broken on purpose and seen to fail here: the weight without its 1/n (two runs weighed as one); fit_runs ignoring the
shrinkage (step_scale the whole miss).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from exatrain.catalog import get_cluster, get_model
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.planner.cost import shrinkage
from exatrain.planner.cost.calibrate import RunPoint, fit_runs, predict_runs
from exatrain.planner.cost.coefficients import default_params


def test_weight_limits_and_formula() -> None:
    s = shrinkage.Shrinkage(between=0.1, within=0.2)
    assert s.weight(1) == pytest.approx(0.01 / (0.01 + 0.04))
    assert s.weight(2) == pytest.approx(0.01 / (0.01 + 0.02))
    assert s.weight(1) < s.weight(2) < s.weight(10) < 1.0
    assert s.weight(0) == 0.0
    assert shrinkage.Shrinkage(between=0.1, within=0.0).weight(1) == 1.0  # runs with no noise of their own
    assert shrinkage.Shrinkage(between=0.0, within=0.1).weight(5) == 0.0  # clusters that never differ


def test_estimate_recovers_between_and_within() -> None:
    rng = np.random.default_rng(7)
    centres = rng.normal(0.0, 0.15, size=60)
    groups = {f"s{i}": list(c + rng.normal(0.0, 0.05, size=12)) for i, c in enumerate(centres)}
    s = shrinkage.estimate(groups)
    assert s.within == pytest.approx(0.05, rel=0.15)
    assert s.between == pytest.approx(0.15, rel=0.25)
    assert s.runs == 720 and s.sources == 60
    # a bias every source shares is the clusters' too: it moves between, not within
    shifted = shrinkage.estimate({k: [x + 0.2 for x in v] for k, v in groups.items()})
    assert shifted.within == pytest.approx(s.within, rel=0.05) and shifted.between > s.between + 0.05
    # exact on two sources of two runs: products 0.01 and 0.0375 shared
    exact = shrinkage.estimate({"a": [0.1, 0.1], "b": [0.15, 0.25]})
    assert exact.between == pytest.approx(math.sqrt((0.01 + 0.0375) / 2))
    # one source alone cannot tell the two spreads apart
    with pytest.raises(ValueError):
        shrinkage.estimate({"only": [0.1, 0.2], "single": [0.3]})


def test_shipped_figures_are_published_run_spreads() -> None:
    d = json.loads(shrinkage.SHRINKAGE_PATH.read_text(encoding="utf-8"))
    assert d["kind"] == "exatrain-calibration-shrinkage" and d["command"].startswith("python benchmarks/")
    assert d["runs"] >= 200 and d["sources"] >= 10
    s = shrinkage.current()
    assert s is not None and 0 < s.between < 1 and 0 < s.within < 1
    assert 0.2 < s.weight(1) < 0.9


@pytest.fixture(scope="module")
def point() -> RunPoint:
    cluster = get_cluster("dgx-h100")
    plan = Plan(
        model=get_model("llama3-8b"),
        dims=ParallelDims(1, 1, 8),
        shape=TrainShape(1, 8),
        cluster=cluster.name,
        runtime="torchtitan",
    ).validate(cluster)
    predicted = float(predict_runs([RunPoint(plan, cluster, 1.0, overlap=None)], default_params("h100-sxm"))[0])
    return RunPoint(plan, cluster, 1.3 * predicted, overlap=None)


def test_one_run_takes_the_weighted_share_of_its_miss(point) -> None:
    base = default_params("h100-sxm")
    s = shrinkage.Shrinkage(between=0.1, within=0.1)
    with shrinkage.using(s):
        fit = fit_runs([point], base)
    assert fit.factors == ("step_scale",)
    assert fit.params.step_scale == pytest.approx(math.exp(0.5 * math.log(1.3)), rel=1e-9)
    # two runs with the same miss: their weight, 0.01 / (0.01 + 0.01 / 2)
    with shrinkage.using(s):
        two = fit_runs([point, point], base)
    assert two.params.step_scale == pytest.approx(1.3 ** (2 / 3), rel=1e-9)
    # no spread within a source: the whole miss, as before shrinkage
    with shrinkage.using(shrinkage.Shrinkage(between=0.1, within=0.0)):
        assert fit_runs([point], base).params.step_scale == pytest.approx(1.3, rel=1e-9)
    assert shrinkage.current() is not s  # the override ends with its block
