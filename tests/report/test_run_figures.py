"""Pictures of runs: predicted-vs-measured pairs are the RunRecords' numbers, loss curves are the
per-step lines, split into runs where the step count restarts or a RunRecord closes a run.

Broken on purpose and seen to fail here: a CPU run's peak RSS drawn against its predicted memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers.report_helpers import assert_png_drawn

from exatrain.plan import Measured, RunRecord
from exatrain.report.inputs import plan_from_json, read_runs
from exatrain.report.runs import MEMORY_NOT_COMPARABLE, loss_curves, predicted_vs_measured


def _record(est: dict, step_s: float, by_stage: list[float], device: str = "NVIDIA H200") -> dict:
    plan = plan_from_json(est, "test")
    m = Measured(
        steps=20,
        step_time_s=step_s,
        tokens_per_s=1e4,
        peak_memory_bytes=max(by_stage) if by_stage else 3e9,
        peak_memory_by_stage=tuple(by_stage),
        first_loss=10.9,
        last_loss=7.5,
    )
    return RunRecord(plan=plan, measured=m, device=device).to_dict()


def _step(i: int, loss: float, **kw) -> dict:
    return {
        "kind": "step",
        "step": i,
        "loss": loss,
        "grad_norm": 1.0,
        "lr": 1e-4,
        "step_time_s": 0.5,
        "tokens_per_s": 1000.0,
        "model_tflops_per_gpu": None,
        "mfu": None,
        "peak_memory_bytes": [1, 2],
        **kw,
    }


@pytest.fixture()
def runs_file(tmp_path: Path, est_22b: dict, est_tiny: dict) -> Path:
    oom = RunRecord(plan=plan_from_json(est_tiny, "t"), measured=None, status="oom", device="cpu").to_dict()
    lines = [
        *(_step(i, 11.0 - 0.5 * i) for i in range(1, 5)),  # run 1: steps 1-4 ...
        _record(est_22b, 2.0, [40e9, 38e9, 37e9, 36e9]),  # ... closed by its record
        *(_step(i, 9.0 - 0.25 * i) for i in range(1, 4)),  # run 2: steps 1-3, no record
        {"kind": "note", "text": "resumed"},
        {"step": 7},  # tolerated: not step lines
        *(_step(i, 8.0 - 0.1 * i) for i in range(1, 3)),  # run 3 restarts at step 1 ...
        _record(est_tiny, 0.01, [], device="cpu"),  # ... closed by a record without
        # per-stage memory (worst stage)
        oom,
    ]
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + "\n", encoding="utf-8")
    return path


def test_predicted_vs_measured_pairs_are_the_records(
    runs_file: Path, est_22b: dict, est_tiny: dict, tmp_path: Path
) -> None:
    fig = predicted_vs_measured(read_runs(runs_file), tmp_path / "pm.png")
    n = fig.numbers
    assert n["predicted_step_s"] == [est_22b["time_s"]["step"], est_tiny["time_s"]["step"]]
    assert n["measured_step_s"] == [2.0, 0.01]
    assert n["labels"] == ["gpt-22b tp2·pp4·dp4 mb1 on NVIDIA H200", "gpt-tiny tp1·pp4·dp1 mb1 on cpu"]
    # Per pipeline stage where the run measured device memory by stage, against the trainer's own memory model
    # (an exatrain run); the CPU run's peak (a process's RSS) is not drawn.
    assert n["predicted_memory_bytes"] == [s["total"] for s in est_22b["trainer_memory_by_stage"]]
    assert n["measured_memory_bytes"] == [40e9, 38e9, 37e9, 36e9]
    assert n["skipped"] == {"status oom, nothing measured": 1, MEMORY_NOT_COMPARABLE: 1}
    assert "not comparable" in fig.caption
    assert "1 (status oom" in fig.caption
    assert_png_drawn(tmp_path / "pm.png")


def test_loss_curves_split_runs_and_name_them_after_their_records(runs_file: Path, tmp_path: Path) -> None:
    fig = loss_curves(read_runs(runs_file), tmp_path / "loss.png")
    runs = fig.numbers["runs"]
    assert [r["label"] for r in runs] == [
        "gpt-22b tp2·pp4·dp4 mb1 on NVIDIA H200",
        "run 2",
        "gpt-tiny tp1·pp4·dp1 mb1 on cpu",
    ]
    assert [r["step"] for r in runs] == [[1, 2, 3, 4], [1, 2, 3], [1, 2]]
    assert runs[0]["loss"] == [11.0 - 0.5 * i for i in range(1, 5)]
    assert runs[1]["loss"] == [9.0 - 0.25 * i for i in range(1, 4)]
    assert runs[2]["loss"] == [8.0 - 0.1 * i for i in range(1, 3)]
    assert_png_drawn(tmp_path / "loss.png")


def test_step_lines_alone_give_loss_curves_and_no_scatter(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps({"step": i, "loss": 5.0 / i}) + "\n" for i in range(1, 30)))
    runs = read_runs(path)
    assert predicted_vs_measured(runs, tmp_path / "pm.png") is None and not (tmp_path / "pm.png").exists()
    fig = loss_curves(runs, tmp_path / "loss.png")
    assert fig.numbers["runs"] == [
        {"label": "run 1", "step": list(range(1, 30)), "loss": [5.0 / i for i in range(1, 30)]}
    ]
    assert_png_drawn(tmp_path / "loss.png")
