"""Search landscape and scaling curves: the numbers drawn are the ones `search --json` and
`scaling --json` printed, and the Frontier study's points appear exactly where model and cluster match."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers.report_helpers import assert_png_drawn, write_json

from exatrain.report.inputs import read_scaling, read_search
from exatrain.report.scaling import scaling_curves, study_point
from exatrain.report.search import search_landscape


def test_landscape_points_are_the_ranked_layouts(search_json: dict, tmp_path: Path) -> None:
    s = read_search(write_json(tmp_path / "s.json", search_json))
    fig = search_landscape(s, tmp_path / "l.png")
    ranked = search_json["ranked"]
    assert len(ranked) == 30 and fig.numbers["rank"] == list(range(1, 31))
    assert fig.numbers["memory_bytes"] == [r["memory_bytes"]["total"] for r in ranked]
    assert fig.numbers["tokens_per_s"] == [r["tokens_per_s"] for r in ranked]
    assert fig.numbers["family"] == [f"tp{r['plan']['tp']}·pp{r['plan']['pp']}" for r in ranked]
    assert fig.numbers["layout"] == [f"tp{r['plan']['tp']}·pp{r['plan']['pp']}·dp{r['plan']['dp']}" for r in ranked]
    assert len(set(fig.numbers["family"])) > 1  # several tp·pp families to tell apart
    assert fig.numbers["capacity_bytes"] == ranked[0]["capacity_bytes"]
    assert fig.numbers["rejected"] == search_json["rejected"]
    assert (fig.numbers["examined"], fig.numbers["legal"], fig.numbers["feasible"]) == (
        search_json["examined"],
        search_json["legal"],
        search_json["feasible"],
    )
    assert_png_drawn(tmp_path / "l.png")


def test_weak_scaling_curve_ideal_line_and_the_studys_point(scaling_weak_175b: dict, tmp_path: Path) -> None:
    sc = read_scaling(write_json(tmp_path / "w.json", scaling_weak_175b))
    fig = scaling_curves(sc, tmp_path / "w.png")
    pts = scaling_weak_175b["points"]
    n = fig.numbers
    assert n["mode"] == "weak" and (n["model"], n["cluster"]) == ("gpt-175b", "frontier")
    assert n["gpus"] == [p["gpus"] for p in pts] == [128, 256, 512]
    assert n["global_batch"] == [p["global_batch"] for p in pts] == [640, 1280, 2560]
    assert n["tokens_per_s"] == [p["tokens_per_s"] for p in pts]
    assert n["efficiency"] == [p["efficiency"] for p in pts]
    # The ideal line is the first point scaled by the GPU count; the CLI's efficiency is the
    # predicted curve over it.
    assert n["ideal_tokens_per_s"][0] == n["tokens_per_s"][0]
    for t, ideal, eff in zip(n["tokens_per_s"], n["ideal_tokens_per_s"], n["efficiency"]):
        assert t / ideal == pytest.approx(eff, rel=1e-12)
    assert n["study"] == {"gpus": 1024, "efficiency": 1.0, "source": n["study"]["source"]}
    assert "Dash et al." in n["study"]["source"] and "red diamond" in fig.caption
    assert_png_drawn(tmp_path / "w.png")


def test_strong_scaling_of_a_model_the_study_did_not_run_has_no_study_point(
    scaling_strong_22b: dict, tmp_path: Path
) -> None:
    sc = read_scaling(write_json(tmp_path / "s.json", scaling_strong_22b))
    fig = scaling_curves(sc, tmp_path / "s.png")
    assert fig.numbers["mode"] == "strong" and fig.numbers["study"] is None
    assert fig.numbers["global_batch"] == [256, 256]
    assert fig.numbers["efficiency"] == [p["efficiency"] for p in scaling_strong_22b["points"]]
    assert "red diamond" not in fig.caption
    assert_png_drawn(tmp_path / "s.png")


@pytest.mark.parametrize(
    "model,cluster,mode,expected",
    [
        ("gpt-175b", "frontier", "weak", (1024, 1.00)),
        ("gpt-175b", "frontier", "strong", (1024, 0.89)),
        ("gpt-1t", "frontier", "weak", (3072, 1.00)),
        ("gpt-1t", "frontier", "strong", (3072, 0.87)),
        ("gpt-1t", "dgx-a100", "weak", None),
        ("megatron-1t", "frontier", "weak", None),
        ("gpt-175b*", "frontier", "weak", None),  # a preset with overridden fields is not the study's model
    ],
)
def test_study_points_only_where_model_and_cluster_are_the_studys(model, cluster, mode, expected) -> None:
    got = study_point(model, cluster, mode)
    assert (None if got is None else (got["gpus"], got["efficiency"])) == expected
