"""Every picture of a report, for a tiny plan (gpt-tiny on 2 CPU ranks, pp 2: MiB per rank on a
16 GiB device, two stages) and a huge one (gpt-1t on 3,072 Frontier GCDs, tp 8 · pp 64), laid out
so that it reads at a glance: no text cut off by the canvas, data that fill their axes, at least
three labelled ticks on every numeric axis, one colour per series, legends off the data.

The figures are captured as they are saved (at a low DPI: the layout scales with it) and checked
by ``report_helpers.layout_problems``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tests.helpers.report_helpers import layout_problems, write_json

from exatrain.catalog import get_cluster
from exatrain.plan import Measured, RunRecord
from exatrain.planner.cost.coefficients import default_params
from exatrain.report import memory, runs, scaling, search, steptime, style, timeline
from exatrain.report.inputs import plan_from_json, read_runs, read_scaling, read_search

# Axes whose ticks name categories (axes index, axis) per picture: pipeline stages, ranks, row labels.
CATEGORICAL = {
    "memory": {(0, "x")},
    "step-time": {(0, "y")},
    "timeline": {(i, "y") for i in range(4)},
    "landscape": {(1, "y")},
}


@pytest.fixture()
def drawn(monkeypatch) -> dict:
    """Each saved picture's matplotlib Figure by file stem, drawn at 40 DPI."""
    figs: dict = {}
    real = style.save

    def capture(fig, path, palette=None):
        real(fig, path, palette)
        figs[Path(path).stem] = fig

    monkeypatch.setattr(style, "DPI", 40)
    for mod in (memory, runs, scaling, search, steptime, timeline):
        monkeypatch.setattr(mod, "save", capture)
    return figs


def _check(fig, kind: str) -> None:
    problems = layout_problems(fig, CATEGORICAL.get(kind, set()), draw=False)  # as saved
    assert not problems, "\n".join(problems)


@pytest.fixture(params=["tiny", "huge"])
def plan_json(request, est_tiny_pp2: dict, est_1t: dict) -> dict:
    return {"tiny": est_tiny_pp2, "huge": est_1t}[request.param]


def test_memory_per_stage_reads_at_a_glance(plan_json: dict, drawn: dict, tmp_path: Path) -> None:
    plan = plan_from_json(plan_json, "test")
    fig = memory.memory_by_stage_figure(plan, tmp_path / "memory.png")
    _check(drawn["memory"], "memory")
    ax = drawn["memory"].axes[0]
    worst = max(s["total"] for s in plan_json["memory_by_stage"])
    # The unit fits the amounts: MiB for a few MiB per rank, GiB for tens of GiB.
    assert fig.numbers["unit"] == ("GiB" if worst >= 2**30 else "MiB") and fig.numbers["unit"] in ax.get_ylabel()
    # Stage ticks are whole stages, starting at the first.
    assert ax.get_xticks()[0] == 0 and all(float(t).is_integer() for t in ax.get_xticks())
    cap = plan_json["capacity_bytes"]
    assert fig.numbers["capacity_drawn"] is (cap <= memory.CAPACITY_ON_AXIS * worst)
    words = " ".join(t.get_text() for t in drawn["memory"].findobj(lambda a: hasattr(a, "get_text")))
    assert style.human_bytes(cap) in words  # the capacity is said, on the axis or in words


def test_step_time_reads_at_a_glance(plan_json: dict, drawn: dict, tmp_path: Path) -> None:
    from exatrain.plan import TimeBreakdown

    plan = plan_from_json(plan_json, "test")
    t = TimeBreakdown(**plan_json["time_s"])
    steptime.step_time_breakdown(
        [(plan.label, t), ("the same again", t)], tmp_path / "step-time.png", f"step time — {style.describe(plan)}"
    )
    _check(drawn["step-time"], "step-time")


def test_timeline_reads_at_a_glance(plan_json: dict, drawn: dict, tmp_path: Path) -> None:
    plan = plan_from_json(plan_json, "test")
    cluster = get_cluster(plan.cluster)
    fig = timeline.pipeline_timeline(plan, cluster, default_params(cluster.device.name), tmp_path / "timeline.png")
    _check(drawn["timeline"], "timeline")
    # Every panel's time axis holds its whole step (the dotted line) inside the frame.
    lo, hi = drawn["timeline"].axes[0].get_xlim()
    assert all(lo < r["step_s"] < hi for r in fig.numbers["schedules"])


def test_neighbouring_ranks_stay_apart_in_the_timeline() -> None:
    """A small pipeline's ranks are bands with a white line between them, so a scaled-up picture
    never blends one rank's colours into the next; a deep one keeps one pixel row per rank."""
    img = np.zeros((2, 5, 3))
    img[1] = 0.5
    out = timeline.banded(img)
    n = timeline.ROW_PIXELS
    assert out.shape == (2 * n, 5, 3)
    assert (out[: n - 1] == 0.0).all() and (out[n - 1] == 1.0).all()
    assert (out[n : 2 * n - 1] == 0.5).all() and (out[2 * n - 1] == 1.0).all()
    deep = np.zeros((timeline.GAP_MAX_PP + 1, 5, 3))
    assert timeline.banded(deep).shape == deep.shape


@pytest.fixture(params=["tiny", "mid"])
def search_input(request, search_tiny: dict, search_json: dict, tmp_path: Path):
    return read_search(write_json(tmp_path / "s.json", {"tiny": search_tiny, "mid": search_json}[request.param]))


def test_search_landscape_reads_at_a_glance(search_input, drawn: dict, tmp_path: Path) -> None:
    fig = search.search_landscape(search_input, tmp_path / "landscape.png")
    _check(drawn["landscape"], "landscape")
    top = max(fig.numbers["memory_bytes"])
    assert fig.numbers["unit"] == ("GiB" if top >= 2**30 else "MiB")
    memory_fig = memory.memory_by_stage_figure(search_input.ranked[0], tmp_path / "memory.png")  # the best's memory
    assert memory_fig.numbers["worst_stage"] >= 0
    _check(drawn["memory"], "memory")


def test_landscape_gives_each_family_its_own_colour_and_groups_the_tail(
    search_json: dict, tmp_path: Path, drawn: dict
) -> None:
    """More tp·pp families than the palette has colours: the first eight keep theirs, the rest
    are one grey "other" series — never two families in one colour."""
    import dataclasses

    from exatrain.plan import ParallelDims

    s = read_search(write_json(tmp_path / "s.json", search_json))
    families = [(tp, pp) for pp in (1, 2, 3) for tp in (1, 2, 4, 8)]
    # Twelve families: the layouts recast (the picture reads only tp, pp and the estimate).
    ranked = tuple(p.replace(dims=ParallelDims(tp=tp, pp=pp, dp=p.dp)) for p, (tp, pp) in zip(s.ranked, families))
    s = dataclasses.replace(s, ranked=ranked)
    search.search_landscape(s, tmp_path / "landscape.png")
    _check(drawn["landscape"], "landscape")
    labels = [t.get_text() for t in drawn["landscape"].axes[0].get_legend().get_texts()]
    assert labels[:8] == [f"tp{tp}·pp{pp}" for tp, pp in families[:8]] and labels[8] == "4 other tp·pp families"


@pytest.fixture(params=["tiny", "weak-175b", "strong-22b"])
def scaling_input(request, scaling_strong_tiny, scaling_weak_175b, scaling_strong_22b, tmp_path: Path):
    d = {"tiny": scaling_strong_tiny, "weak-175b": scaling_weak_175b, "strong-22b": scaling_strong_22b}
    return read_scaling(write_json(tmp_path / "sc.json", d[request.param]))


def test_scaling_reads_at_a_glance(scaling_input, drawn: dict, tmp_path: Path) -> None:
    scaling.scaling_curves(scaling_input, tmp_path / "scaling.png")
    _check(drawn["scaling"], "scaling")


def _runs_file(path: Path, *ests: dict) -> Path:
    """Run records of the given estimates, measured 20% slow and 10% heavy per stage, each after
    its per-step lines; the first plan is run twice (same label, two runs)."""
    lines = []
    for k, est in enumerate((ests[0], *ests)):
        plan = plan_from_json(est, "test")
        lines += [{"kind": "step", "step": i, "loss": 10.0 / i + k} for i in range(1, 30)]
        by_stage = tuple(1.1 * s["total"] for s in est["memory_by_stage"])
        m = Measured(
            steps=20,
            step_time_s=1.2 * est["time_s"]["step"] * (1 + 0.1 * k),
            tokens_per_s=1.0,
            peak_memory_bytes=max(by_stage),
            peak_memory_by_stage=by_stage,
        )
        device = "cpu" if plan.cluster == "local-cpu" else "MI250X"
        lines.append(RunRecord(plan=plan, measured=m, device=device).to_dict())
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def test_runs_pictures_read_at_a_glance(est_tiny_pp2: dict, est_1t: dict, drawn: dict, tmp_path: Path) -> None:
    r = read_runs(_runs_file(tmp_path / "runs.jsonl", est_tiny_pp2, est_1t))
    fig = runs.predicted_vs_measured(r, tmp_path / "pvm.png")
    _check(drawn["pvm"], "pvm")
    # Every point is named: the legend keys each run's number to its label, and the numbers are
    # written beside the points.
    legend = [t.get_text() for t in drawn["pvm"].legends[0].get_texts()]
    for n, label in fig.numbers["run_labels"].items():
        assert f"{n}: {label}" in legend
    written = {t.get_text() for t in drawn["pvm"].axes[0].texts}
    assert written == {str(n) for n in fig.numbers["run"]} == {"1", "2", "3"}
    loss = runs.loss_curves(r, tmp_path / "loss.png")
    _check(drawn["loss"], "loss")
    names = [t.get_text() for t in drawn["loss"].legends[0].get_texts()]
    assert len(set(names)) == len(loss.numbers["runs"]) == 3  # the repeated run is told apart by name too


def test_the_layout_check_catches_what_it_is_for(tmp_path: Path) -> None:
    """The checker is not vacuous: a clipped title, bars squashed under a far capacity line, a log
    axis with one tick and two series in one colour are each reported."""
    fig, ax = style.new_figure(4.0, 3.0)
    ax.bar([0, 1], [2.0, 3.0])
    ax.axhline(100.0, linestyle="--")
    ax.set_ylim(0, 110)
    ax.set_title("a title far too long for a four-inch figure to hold on one line of nine-point text", fontsize=9)
    problems = "\n".join(layout_problems(fig, {(0, "x")}))
    assert "reaches outside the canvas" in problems and "of the y axis" in problems

    fig, ax = style.new_figure(4.0, 3.0)
    ax.scatter([1.0, 2.0], [8e3, 3e4], color="C0", label="a")
    ax.scatter([1.5], [1e4], color="C0", label="b")
    ax.set_yscale("log")
    ax.legend(loc="lower right")
    problems = "\n".join(layout_problems(fig))
    assert "need 3" in problems and "share a colour" in problems
    # ... and the report's own log axis fixes the tick count for the same range.
    fig, ax = style.new_figure(4.0, 3.0)
    ax.scatter([1.0, 2.0], [8e3, 3e4])
    assert style.log_or_linear(ax, "y", 7e3, 3.5e4) == "log"
    assert "need 3" not in "\n".join(layout_problems(fig))
