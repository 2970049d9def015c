"""`exatrain train`: bad input is one line and exit 2 before any rank starts; flags resolve onto the
embedded default or a --plan; the ranks really start (spawned here, or by torchrun)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exatrain.catalog import get_model
from exatrain.cli import main
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.records import read_run_records
from exatrain.trainer import spawn


def gpu_plan(tmp_path: Path) -> str:
    path = tmp_path / "frontier.json"
    Plan(
        model=get_model("gpt-tiny"), dims=ParallelDims(tp=2, pp=2, dp=2), shape=TrainShape(1, 16), cluster="frontier"
    ).validate().save(path)
    return str(path)


BAD = {
    "heads not divisible by tp": (["--model", "gpt-tiny", "--tp", "3"], "not divisible by tp 3"),
    "more stages than layers": (["--model", "gpt-tiny", "--pp", "8"], "at least one layer"),
    "cuda on a cpu-only machine": (["--model", "gpt-tiny", "--device", "cuda"], "no CUDA/ROCm device"),
    "gpu plan on a cpu-only machine": (["--plan", "GPU_PLAN"], "pass --device cpu"),
    "vocab too small for bytes": (["--model", "gpt-tiny", "--vocab", "128"], "needs 256 token ids"),
    "zero bubble with fsdp": (
        ["--model", "gpt-tiny", "--pp", "2", "--dp", "2", "--zero", "3", "--schedule", "zero_bubble"],
        "zero_bubble schedule cannot run with FSDP",
    ),
    "model states beyond memory": (["--model", "gpt-175b"], "GiB of model states"),
    "bad steps": (["--steps", "0"], "positive integer"),
    "negative watchdog": (["--watchdog", "-5"], "--watchdog"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_exit_2_before_any_rank(
    case: str, tmp_path: Path, no_launch: list, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this is a CPU-only machine
    argv, message = BAD[case]
    argv = [gpu_plan(tmp_path) if a == "GPU_PLAN" else a for a in argv]
    assert exit_code(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert no_launch == []


def test_degrees_must_match_the_launchers_world_size(
    no_launch: list, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "--model", "gpt-tiny", "--tp", "2", "--dp", "2"]) == 2
    err = capsys.readouterr().err
    assert "needs tp*pp*dp = 2*1*2 = 4 ranks but the launcher started 2" in err and no_launch == []


def test_no_flags_is_the_embedded_3d_default(no_launch: list) -> None:
    assert main(["train"]) == 0
    (cfg,) = no_launch
    p = cfg.plan
    assert (p.model.name, p.tp, p.pp, p.dp, p.schedule, p.dtype) == ("gpt-small", 2, 2, 2, "1f1b", "float32")
    assert p.num_microbatches == 4 and cfg.device == "cpu" and cfg.steps == 100 and not cfg.quiet
    if _has_estimator():  # the CLI attaches the planner's prediction for the RunRecord
        assert p.estimate is not None and p.estimate.model_flops_per_step > 0


def test_calibration_sets_the_recorded_prediction(
    tmp_path: Path, no_launch: list, capsys: pytest.CaptureFixture
) -> None:
    """--calibration: the prediction carried into the RunRecord is the estimate with that file's
    parameters (here a device 4x slower than the prior), even over a --plan's stored estimate."""
    from exatrain.catalog import get_cluster
    from exatrain.planner.cost.coefficients import Calibration, default_params, save_calibration
    from exatrain.planner.estimate import estimate_plan

    prior = default_params("cpu")
    slow = prior.replace(peak_flops=(prior.peak_flops or 1e11) / 4, source="test")
    cal = tmp_path / "calib.json"
    save_calibration(cal, Calibration(devices={"cpu": slow}))
    plan_file = tmp_path / "plan.json"
    base = Plan(
        model=get_model("gpt-tiny"),
        dims=ParallelDims(tp=1, pp=1, dp=2),
        shape=TrainShape(2, 8),
        cluster="local-cpu",
        dtype="float32",
    ).validate()
    base.with_estimate(estimate_plan(base, get_cluster("local-cpu"))).save(plan_file)
    assert main(["train", "--plan", str(plan_file), "--calibration", str(cal), "--quiet"]) == 0
    (cfg,) = no_launch
    want = estimate_plan(cfg.plan.with_estimate(None), get_cluster("local-cpu"), slow).time_s.step
    assert cfg.plan.estimate.time_s.step == pytest.approx(want, rel=1e-12)
    assert want > 1.5 * Plan.load(plan_file).estimate.time_s.step  # not the stored prior estimate
    assert main(["train", "--plan", str(plan_file), "--calibration", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "none.json" in err


def test_flags_override_a_plan(tmp_path: Path, no_launch: list) -> None:
    path = tmp_path / "plan.json"
    Plan(
        model=get_model("llama-tiny"),
        dims=ParallelDims(tp=2, pp=1, dp=2),
        shape=TrainShape(2, 8),
        zero_stage=1,
        cluster="local-cpu",
    ).validate().save(path)
    assert (
        main(
            [
                "train",
                "--plan",
                str(path),
                "--dp",
                "1",
                "--zero",
                "0",
                "--steps",
                "7",
                "--seed",
                "3",
                "--dtype",
                "bfloat16",
                "--lr",
                "5e-4",
                "--quiet",
            ]
        )
        == 0
    )
    (cfg,) = no_launch
    p = cfg.plan
    assert (p.model.name, p.tp, p.dp, p.zero_stage, p.dtype, p.micro_batch) == ("llama-tiny", 2, 1, 0, "bfloat16", 2)
    assert p.global_batch == 8  # the plan's batch, now over 4 micro-batches of dp 1
    assert (cfg.steps, cfg.seed, cfg.lr, cfg.quiet) == (7, 3, 5e-4, True)
    assert cfg.watchdog_s == 0.0  # the default limit
    no_launch.clear()
    assert main(["train", "--plan", str(path), "--watchdog", "1200", "--quiet"]) == 0
    assert no_launch[0].watchdog_s == 1200.0
    no_launch.clear()
    assert main(["train", "--plan", str(path), "--layers", "2"]) == 0
    assert no_launch[0].plan.model.layers == 2 and no_launch[0].plan.model.kv_heads == 2


@pytest.mark.slow
def test_spawns_its_own_ranks_and_writes_metrics(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "exatrain.train",
            "--model",
            "gpt-tiny",
            "--dp",
            "2",
            "--steps",
            "3",
            "--global-batch",
            "4",
            "--metrics-file",
            str(metrics),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "dp2" in out.stdout and "first loss" in out.stdout and "last loss" in out.stdout
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["step"] * 3 + ["run_record"]
    (rec,) = read_run_records(metrics)
    assert rec.plan.dp == 2 and rec.measured.steps == 3 and rec.device == "cpu"
    assert rec.env["world_size"] == 2 and rec.env["backend"] == "gloo"


@pytest.mark.slow
def test_runs_under_torchrun(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    metrics = tmp_path / "m.jsonl"
    out = subprocess.run(
        [
            torchrun,
            "--nproc-per-node",
            "2",
            "--master-port",
            str(spawn._free_port()),
            "-m",
            "exatrain.train",
            "--model",
            "gpt-tiny",
            "--tp",
            "2",
            "--steps",
            "2",
            "--quiet",
            "--metrics-file",
            str(metrics),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "loss" not in out.stdout  # --quiet
    (rec,) = read_run_records(metrics)
    assert rec.plan.tp == 2 and rec.measured.steps == 2


def _has_estimator() -> bool:
    import importlib.util

    return importlib.util.find_spec("exatrain.planner.estimate") is not None


def exit_code(argv: list[str]) -> int:
    """main's return value, or the status of a usage error (argparse exits)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)
