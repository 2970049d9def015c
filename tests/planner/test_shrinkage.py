"""A calibration on one or two runs takes the share of their miss that their cluster shares (planner/cost/shrinkage.py):
the weight's limits and formula, the spreads recovered from grouped ratios, the shipped figures, the one-run scale
fit applying the weight; and the term fit: one run moves the term its own breakdown makes the most uncertain
(compute-bound: gemm_eff; communication-bound: link_eff), by the share of its miss the term's prior spread takes,
the rest at the prior; two runs fit two terms; the term spreads recovered from grouped ratios and shares.

Broken on purpose and seen to fail here: the weight without its 1/n (two runs weighed as one); fit_runs ignoring the
shrinkage (step_scale the whole miss); the term picked by its share alone, not its prior spread (the
communication-bound anchor with a small communication spread still moved link_eff); the other terms' prior variance
left out of the noise (the one-run share taken too large); two runs fitting one term; estimate_terms pairing each
run with itself (sigma absorbed the runs' own spread); shares differentiating the wrong way for a rate (negative
shares, clipped to 0: nothing picked).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from exatrain.catalog import get_cluster, get_model
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.planner.cost import shrinkage
from exatrain.planner.cost.calibrate import RunPoint, fit_runs, fit_terms, predict_runs
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


# ---- the term fit ------------------------------------------------------------------------------------------------
EVEN = shrinkage.TermPrior({k: 0.2 for k in shrinkage.TERM_NAMES}, 0.1)  # every term as uncertain as the others


def _run(cluster_name: str, model: str, dims: tuple, shape: tuple, miss: float) -> RunPoint:
    cluster = get_cluster(cluster_name)
    plan = Plan(
        model=get_model(model),
        dims=ParallelDims(*dims),
        shape=TrainShape(*shape),
        cluster=cluster.name,
        runtime="megatron-core",
    ).validate(cluster)
    base = default_params(cluster.device.name)
    return RunPoint(plan, cluster, miss * float(predict_runs([RunPoint(plan, cluster, 1.0)], base)[0]))


@pytest.fixture(scope="module")
def compute_bound() -> RunPoint:
    """llama3-8b on one A100 node, data parallel: half its step is GEMM, a sixth communication."""
    return _run("dgx-a100", "llama3-8b", (1, 1, 8), (1, 8), 1.3)


@pytest.fixture(scope="module")
def comm_bound() -> RunPoint:
    """gpt-1.3b with tensor parallelism over two A100 nodes: a third of its step is communication, a tenth GEMM."""
    return _run("dgx-a100", "gpt-1.3b", (16, 1, 4), (1, 16), 1.3)


def _shares(p: RunPoint) -> np.ndarray:
    return shrinkage.shares(lambda q: predict_runs([p], q), default_params(p.cluster.device.name))[0]


def _moved(fit, base) -> set[str]:
    a, b = fit.params.to_dict(), base.to_dict()
    return {k for k in a if a[k] != b[k] and k != "source"}


def test_shares_are_each_terms_part_of_the_step(compute_bound, comm_bound) -> None:
    names = list(shrinkage.TERM_NAMES)
    g, c = _shares(compute_bound), _shares(comm_bound)
    assert (g >= 0).all() and (c >= 0).all() and g.sum() < 1.05 and c.sum() < 1.05
    assert names[int(np.argmax(g))] == "gemm" and g[names.index("gemm")] > 0.4
    assert names[int(np.argmax(c))] == "communication" and c[names.index("communication")] > 0.3
    # a term's seconds doubled lengthen the step by its share (to first order)
    base = default_params("a100-80gb")
    doubled = shrinkage.scaled(base, "communication", math.log(2))
    assert doubled.link_eff == pytest.approx(base.link_eff / 2) and doubled.gemm_eff == base.gemm_eff
    assert shrinkage.scaled(base, "overhead", math.log(2)).step_overhead_s == pytest.approx(2 * base.step_overhead_s)


@pytest.mark.parametrize("which, term, field", [("compute", "gemm", "gemm_eff"), ("comm", "communication", "link_eff")])
def test_one_run_moves_the_term_its_breakdown_makes_uncertain(which, term, field, compute_bound, comm_bound) -> None:
    point = compute_bound if which == "compute" else comm_bound
    base = default_params("a100-80gb")
    with shrinkage.using(shrinkage.Shrinkage(0.1, 0.1, terms=EVEN)):
        fit = fit_runs([point], base)
    assert fit.terms == (term,) and field in fit.factors
    assert _moved(fit, base) == set(shrinkage.fields_of(term, base))  # the rest stay at the prior
    assert getattr(fit.params, field) < getattr(base, field)  # 30% slow: that term's rate falls
    # the share of the miss taken: the term's prior variance on the run over the run's whole (to first order: a
    # slower link also exposes what an overlap hid, so communication's share grows as it is fitted)
    g = _shares(point)
    var = EVEN.variances()
    k = shrinkage.TERM_NAMES.index(term)
    expected = var[k] * g[k] ** 2 / (float(var @ g**2) + EVEN.within**2)
    assert 0 < fit.taken < 1 and fit.taken == pytest.approx(expected, rel=0.2)
    before, after = fit.before["rms_log"], fit.after["rms_log"]
    assert after == pytest.approx((1 - fit.taken) * before, rel=1e-6)


def test_the_prior_spread_decides_not_the_share_alone(comm_bound) -> None:
    """A communication term the published runs show to be well known (small sigma) leaves the miss to GEMM."""
    base = default_params("a100-80gb")
    sure = shrinkage.TermPrior({**EVEN.sigma, "communication": 0.01, "overhead": 0.01, "elementwise": 0.01}, 0.1)
    fit = fit_terms([comm_bound], base, sure)
    assert fit.terms == ("gemm",) and _moved(fit, base) == {"gemm_eff"}


def test_two_runs_fit_two_terms(compute_bound, comm_bound) -> None:
    base = default_params("a100-80gb")
    with shrinkage.using(shrinkage.Shrinkage(0.1, 0.1, terms=EVEN)):
        fit = fit_runs([compute_bound, comm_bound], base)
    assert fit.terms == ("gemm", "communication")
    assert _moved(fit, base) == {"gemm_eff", *shrinkage.fields_of("communication", base)}
    assert fit.params.gemm_eff < base.gemm_eff and fit.params.link_eff < base.link_eff
    assert fit.after["rms_log"] < fit.before["rms_log"]
    # a third run: the physical factors, unshrunk (calibrate.run_factors)
    with shrinkage.using(shrinkage.Shrinkage(0.1, 0.1, terms=EVEN)):
        three = fit_runs([compute_bound, comm_bound, compute_bound], base, max_iter=3)
    assert three.terms == () and three.factors == ("gemm_eff",)


def test_estimate_terms_recovers_each_terms_spread() -> None:
    rng = np.random.default_rng(11)
    sigma = np.array([0.15, 0.0, 0.05, 0.3, 0.0])
    samples = {}
    for s in range(80):
        theta = rng.normal(0.0, 1.0, size=5) * sigma
        g = rng.dirichlet(np.ones(5), size=10)
        y = g @ theta + rng.normal(0.0, 0.05, size=10)
        samples[f"s{s}"] = list(zip(y, g))
    got = shrinkage.estimate_terms(samples)
    assert got.within == pytest.approx(0.05, rel=0.2)
    assert got.sigma["gemm"] == pytest.approx(0.15, abs=0.06) and got.sigma["communication"] == pytest.approx(
        0.3, abs=0.1
    )
    assert got.sigma["attention"] < 0.08 and got.sigma["overhead"] < 0.08
    # one term of share 1 on every run is the whole step's spread (``estimate``)
    flat = {k: [(y, [1.0, 0, 0, 0, 0]) for y, _ in v] for k, v in samples.items()}
    whole = shrinkage.estimate({k: [y for y, _ in v] for k, v in samples.items()})
    assert shrinkage.estimate_terms(flat).sigma["gemm"] == pytest.approx(whole.between, abs=1e-5)
    assert shrinkage.estimate_terms(flat).within == pytest.approx(whole.within, abs=1e-5)
    with pytest.raises(ValueError):
        shrinkage.estimate_terms({"only": [(0.1, [1, 0, 0, 0, 0])] * 2})
