"""The uncertainty band every step-time estimate carries (planner/band.py)."""

from __future__ import annotations

import json

import pytest

from exatrain.catalog import get_cluster, get_model
from exatrain.cli import main
from exatrain.plan import ParallelDims, Plan, StepEstimate, TrainShape
from exatrain.planner.band import BANDS_PATH, MIN_RUNS, WIDE_DEFAULT, band_for, load_bands
from exatrain.planner.estimate import estimate_plan


def _estimate(cluster_name: str, runtime: str = "exatrain"):
    cluster = get_cluster(cluster_name)
    plan = Plan(model=get_model("gpt-1.4b"), dims=ParallelDims(1, 1, 8), shape=TrainShape(4, 64),
                cluster=cluster.name, runtime=runtime).validate(cluster)
    return plan, estimate_plan(plan, cluster)


def test_stored_table_has_provenance_and_the_default_is_wider() -> None:
    t = load_bands()
    assert t["kind"] == "exatrain-error-bands" and t["date"] and "prediction_error.py" in t["command"]
    assert t["cells"]["all/all"]["n"] >= MIN_RUNS
    for c in t["cells"].values():
        assert c["n"] >= 1 and c["ratio_low"] <= c["ratio_high"]
        assert WIDE_DEFAULT[0] < c["ratio_low"] and c["ratio_high"] < WIDE_DEFAULT[1]
    assert BANDS_PATH.name == "error_bands.json"


def test_band_attached_with_its_cell() -> None:
    plan, est = _estimate("dgx-a100", runtime="megatron-core")
    cell = load_bands()["cells"]["megatron-core/A100"]
    lo, hi = est.step_range_s
    assert lo == pytest.approx(est.time_s.step * cell["ratio_low"])
    assert hi == pytest.approx(est.time_s.step * cell["ratio_high"])
    tlo, thi = est.tokens_per_s_range
    assert tlo == pytest.approx(plan.tokens_per_step / hi) and thi == pytest.approx(plan.tokens_per_step / lo)
    assert est.band["cell"] == "megatron-core/A100" and est.band["n"] == cell["n"]
    assert "out of sample" in est.band["text"] and f"n={cell['n']}" in est.band["text"]


def test_runtime_without_runs_falls_back_to_its_family() -> None:
    _, est = _estimate("dgx-a100")  # exatrain's own trainer: no published runs
    assert est.band["cell"] == "all/A100" and est.band["n"] == load_bands()["cells"]["all/A100"]["n"]


def test_unknown_family_gets_the_wide_default_and_says_so() -> None:
    _, est = _estimate("mi300x-platform")
    assert est.band["basis"] == "default" and est.band["n"] == 0
    assert (est.band["ratio_low"], est.band["ratio_high"]) == WIDE_DEFAULT
    assert "no published runs" in est.band["text"] and "wide default" in est.band["text"]
    assert est.step_range_s == pytest.approx((est.time_s.step * WIDE_DEFAULT[0], est.time_s.step * WIDE_DEFAULT[1]))


def test_few_runs_fall_back_to_all_widened_by_their_own() -> None:
    table = {"cells": {"all/all": {"n": 30, "ratio_low": 0.9, "ratio_high": 1.2},
                       "megatron-deepspeed/MI250X": {"n": 3, "ratio_low": 0.95, "ratio_high": 2.1},
                       "all/MI250X": {"n": 3, "ratio_low": 0.95, "ratio_high": 2.1}}}
    b = band_for("megatron-deepspeed", "mi250x-gcd", table)
    assert (b.low, b.high, b.n, b.cell) == (0.9, 2.1, 30, "all/all")
    assert "widened to the n=3 MI250X runs" in b.describe()
    assert band_for("torchtitan", "b200", table).basis == "default"


def test_json_round_trip_and_old_plans_still_load(tmp_path) -> None:
    plan, est = _estimate("dgx-h100", runtime="torchtitan")
    saved = plan.with_estimate(est)
    saved.save(tmp_path / "p.json")
    back = Plan.load(tmp_path / "p.json").estimate
    assert back.step_range_s == pytest.approx(est.step_range_s)
    assert back.tokens_per_s_range == pytest.approx(est.tokens_per_s_range)
    assert back.band == est.band
    old = est.to_dict()
    for k in ("step_range_s", "tokens_per_s_range", "band"):
        old.pop(k)
    legacy = StepEstimate.from_dict(old)
    assert legacy.step_range_s is None and legacy.band is None and "band" not in legacy.to_dict()


def test_estimate_text_prints_the_range(capsys) -> None:
    assert main(["estimate", "--model", "gpt-1.4b", "--cluster", "dgx-a100", "--gpus", "8",
                 "--micro-batch", "4", "--global-batch", "64"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("step "))
    assert "–" in line and "out of sample" in line and "A100" in line
    assert main(["estimate", "--model", "gpt-1.4b", "--cluster", "dgx-a100", "--gpus", "8",
                 "--micro-batch", "4", "--global-batch", "64", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["step_range_s"]) == 2 and d["band"]["cell"] == "all/A100"
