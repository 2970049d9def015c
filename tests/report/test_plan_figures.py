"""Pictures of one plan: each draws exactly the numbers `exatrain estimate --json` printed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exatrain.catalog import get_cluster
from exatrain.plan import TimeBreakdown
from exatrain.planner.cost.coefficients import default_params
from exatrain.report.inputs import plan_from_json
from exatrain.report.memory import memory_by_stage_figure
from exatrain.report.steptime import step_time_breakdown
from exatrain.report.style import MEMORY_KINDS, TIME_TERMS
from exatrain.report.timeline import pipeline_timeline

from tests.helpers.report_helpers import assert_png_drawn


def _timeline(est: dict, path: Path):
    plan = plan_from_json(est, "test")
    cluster = get_cluster(plan.cluster)
    return plan, pipeline_timeline(plan, cluster, default_params(cluster.device.name), path)


def test_memory_bars_are_the_estimates_bytes(est_1t: dict, tmp_path: Path) -> None:
    fig = memory_by_stage_figure(plan_from_json(est_1t, "test"), tmp_path / "m.png")
    stages = est_1t["memory_by_stage"]
    assert fig.numbers["stage"] == list(range(64)) and len(stages) == 64
    for kind in MEMORY_KINDS:
        assert fig.numbers[kind] == [s[kind] for s in stages]
    assert fig.numbers["total"] == pytest.approx([s["total"] for s in stages], rel=1e-12)
    assert fig.numbers["capacity_bytes"] == est_1t["capacity_bytes"]
    assert fig.numbers["fits"] is est_1t["fits"]
    worst = int(np.argmax([s["total"] for s in stages]))
    assert fig.numbers["worst_stage"] == worst
    assert est_1t["memory_bytes"]["total"] == pytest.approx(stages[worst]["total"])
    assert_png_drawn(tmp_path / "m.png")


def test_step_time_bars_are_the_estimates_terms(est_1t: dict, tmp_path: Path) -> None:
    t = est_1t["time_s"]
    fig = step_time_breakdown([("1T", TimeBreakdown(**t))], tmp_path / "t.png", "step")
    for term in TIME_TERMS:  # (the JSON leaves out a zero straggler or offload term)
        assert fig.numbers[term] == [t.get(term, 0.0)]
    assert fig.numbers["step"] == [t["step"]]
    # The stacked parts reach the step total (the bar ends where the label says).
    assert sum(fig.numbers[k][0] for k in TIME_TERMS) == pytest.approx(t["step"], rel=1e-9)
    assert_png_drawn(tmp_path / "t.png")


def test_timeline_of_the_plans_schedule_is_its_estimate(est_22b: dict, tmp_path: Path) -> None:
    plan, fig = _timeline(est_22b, tmp_path / "tl.png")
    rows = {r["schedule"]: r for r in fig.numbers["schedules"]}
    assert list(rows) == ["gpipe", "1f1b", "interleaved", "zero_bubble"] and not fig.numbers["skipped"]
    own = rows["1f1b"]
    assert own["own"] and sum(r["own"] for r in rows.values()) == 1
    t = est_22b["time_s"]
    assert own["time_s"] == pytest.approx(t, rel=1e-9)  # same stage times, same simulator
    # The pipeline drawn is the step less what follows it (DP exposure, optimizer, overhead, the slowest GPU's lag).
    assert own["makespan_s"] == pytest.approx(t["compute"] + t["bubble"] + t["tp_comm"] + t["pp_comm"], rel=1e-9)
    assert own["makespan_s"] == pytest.approx(
        t["step"] - t["dp_comm"] - t["optimizer"] - t["other"] - t.get("straggler", 0.0), rel=1e-9
    )


def test_timeline_draws_every_op_and_the_simulated_idle_time(est_22b: dict, tmp_path: Path) -> None:
    plan, fig = _timeline(est_22b, tmp_path / "tl.png")
    pp, m = plan.pp, plan.num_microbatches
    assert (pp, m) == (4, 8)
    for r in fig.numbers["schedules"]:
        v = r["interleave"]
        assert v == (1 if r["schedule"] in ("gpipe", "1f1b") else 2)
        split = r["schedule"] == "zero_bubble"
        assert r["ops"] == {"F": pp * m * v, "B": pp * m * v, "W": pp * m * v if split else 0}
        # Grey covers exactly each rank's idle time in the simulation.
        expected = np.asarray(r["idle_s"]) / r["makespan_s"]
        assert r["drawn_idle_share"] == pytest.approx(expected.tolist(), abs=1e-9)
        assert min(expected) > 0.0  # every rank waits somewhere: the picture has idle to show
        assert r["makespan_s"] == pytest.approx(r["busy_s"][0] + r["idle_s"][0], rel=1e-12)
    # The simulated schedules differ as the literature says: interleaving and zero bubble shrink it.
    ms = {r["schedule"]: r["makespan_s"] for r in fig.numbers["schedules"]}
    assert ms["zero_bubble"] < ms["1f1b"] and ms["interleaved"] < ms["1f1b"] <= ms["gpipe"] + 1e-12
    rgb = assert_png_drawn(tmp_path / "tl.png")
    assert rgb.shape[1] == 1200


def test_timeline_names_schedules_it_cannot_draw(est_tiny: dict, tmp_path: Path) -> None:
    plan, fig = _timeline(est_tiny, tmp_path / "tl.png")
    drawn = [r["schedule"] for r in fig.numbers["schedules"]]
    assert drawn == ["gpipe", "1f1b"]
    assert set(fig.numbers["skipped"]) == {"interleaved", "zero_bubble"}
    assert all("pipeline stages" in why or "layers" in why for why in fig.numbers["skipped"].values())
    assert "interleaved not drawn" in fig.caption
    assert_png_drawn(tmp_path / "tl.png")


def test_1t_timeline_matches_its_estimate_and_stays_small(est_1t: dict, tmp_path: Path) -> None:
    """The picture of docs/planning.md: 64 ranks × 256 micro-batches under four schedules, ≤ 200 KB."""
    plan, fig = _timeline(est_1t, tmp_path / "tl.png")
    own = next(r for r in fig.numbers["schedules"] if r["own"])
    assert own["schedule"] == "1f1b" and own["step_s"] == pytest.approx(est_1t["time_s"]["step"], rel=1e-9)
    assert len(fig.numbers["schedules"]) == 4
    for r in fig.numbers["schedules"]:
        assert r["drawn_idle_share"] == pytest.approx((np.asarray(r["idle_s"]) / r["makespan_s"]).tolist(), abs=1e-9)
    assert (tmp_path / "tl.png").stat().st_size <= 200_000
    assert_png_drawn(tmp_path / "tl.png")
