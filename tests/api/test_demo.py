"""`exatrain demo` (what `make run` runs): bench --quick, search with its measurements, train the best
layout, predicted beside measured with the band, everything in one folder.

Break-on-purpose checks (each seen to fail): the search run without the bench's calibration (the plan's
prediction then comes from the prior, not "exatrain bench (<host>)"); train given the prior instead
of the calibration (the RunRecord's prediction is not the searched plan's); the summary's comparison
made with calibrated=False (no predicted step time printed); the training's load not added to its RunRecord.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from exatrain.api.demo import MAX_RANKS, default_out, default_ranks
from exatrain.plan import Plan
from exatrain.records import read_run_records
from exatrain.loadwatch import MachineLoad
from exatrain.planner.compare import compare, prediction_source
from exatrain.planner.cost.coefficients import load_calibration


def test_the_default_ranks_are_one_per_core_a_power_of_two_from_2_to_8() -> None:
    assert [default_ranks(c) for c in (1, 2, 3, 4, 6, 8, 12, 64)] == [2, 2, 2, 4, 4, 8, 8, 8]
    assert MAX_RANKS == 8


def test_the_default_folder_is_new_under_runs(tmp_path: Path) -> None:
    first = default_out(tmp_path)
    assert first.parent == tmp_path and first.name.startswith("demo-") and not first.exists()
    first.mkdir()
    second = default_out(tmp_path)
    assert second != first and not second.exists()


@pytest.mark.slow
def test_demo_measures_searches_trains_and_compares(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(
        [sys.executable, "-m", "exatrain", "demo", "--ranks", "2", "--steps", "4", "--out", str(out), "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(f.name for f in out.iterdir()) == [
        "calib.json",
        "metrics.jsonl",
        "metrics.ranks",
        "plan.json",
        "summary.txt",
    ]
    assert not (tmp_path / "runs").exists()  # --out given: nothing elsewhere

    # 1. the bench's calibration, measured here
    cal = load_calibration(out / "calib.json")
    assert "cpu" in cal.devices
    # 2. the searched plan: 2 ranks, predicted with that calibration
    plan = Plan.load(out / "plan.json")
    assert plan.gpus == 2 and plan.model.name == "gpt-small" and plan.global_batch == 16
    assert prediction_source(plan.estimate) == f"exatrain bench ({platform.node()})"
    # 3. the run of that plan, its prediction the same
    (record,) = read_run_records(out / "metrics.jsonl")
    assert record.status == "ok" and record.measured.steps == 4
    assert record.plan.dims == plan.dims and record.plan.micro_batch == plan.micro_batch
    assert record.predicted.time_s.step == pytest.approx(plan.estimate.time_s.step, rel=1e-9)
    # 4. predicted beside measured, with the band, in the printed summary and in summary.txt
    lines = p.stdout.splitlines()
    summary = (out / "summary.txt").read_text().splitlines()
    assert summary == lines[-len(summary) :]
    step = next(line for line in summary if line.startswith("4. step time: "))
    low, high = compare(record).predicted_range_s  # the band, widened where the machine's load changed
    # the machine's load, during the bench (in calib.json) and during training (in the RunRecord), said in a line
    assert MachineLoad.from_dict(cal.extra["bench"]["load"]) is not None
    assert record.env["bench_load"] == cal.extra["bench"]["load"] and MachineLoad.from_dict(record.env["load"])
    load = next(line for line in summary if line.startswith("   load: "))
    assert " during bench; " in load and " during training" in load
    assert step.startswith(f"4. step time: predicted {record.predicted.time_s.step:.3f} s (band {low:.3f}–{high:.3f} s")
    assert f"measured {record.measured.step_time_s:.3f} s" in step
    assert step.endswith("inside the band") == (low <= record.measured.step_time_s <= high)
    assert summary[-2] == (
        f"wrote {out}/: calib.json (this machine's cost-model parameters), plan.json (the best "
        "layout with its prediction), metrics.jsonl (a line per step, then the RunRecord), "
        "metrics.ranks/ (each rank's log and heartbeat), summary.txt (these lines)"
    )
    assert summary[-1].startswith("took ")
    assert json.loads((out / "plan.json").read_text())["tp"] * plan.pp * plan.dp == 2

    # the same folder again: refused in one line, nothing touched
    before = sorted((f.name, f.stat().st_mtime) for f in out.iterdir())
    again = subprocess.run(
        [sys.executable, "-m", "exatrain", "demo", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert again.returncode == 2 and "already holds files" in again.stderr and again.stderr.count("\n") == 1
    assert sorted((f.name, f.stat().st_mtime) for f in out.iterdir()) == before
