"""`exatrain launch` and `exatrain export-config`: output, files, and bad input as one line + exit 2.

Broken on purpose and seen to fail here: a plan that does not fit written without --force (api/jobs.py
``check_fits`` not raising): test_a_plan_that_does_not_fit_is_refused_without_force_and_a_tight_one_said_so.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from exatrain.catalog import get_model
from exatrain.cli import main
from exatrain.plan import ParallelDims, Plan, TrainShape


@pytest.fixture()
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    Plan(
        model=get_model("gpt-175b"),
        dims=ParallelDims(4, 16, 2),
        shape=TrainShape(1, 640),
        zero_stage=1,
        recompute="full",
        cluster="frontier",
    ).save(path)
    return path


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_launch_slurm_to_stdout_and_file(plan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "launch",
                "--plan",
                str(plan_file),
                "--scheduler",
                "slurm",
                "--account",
                "ABC123",
                "--time",
                "02:00:00",
                "--checkpoint-dir",
                "ck",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "#SBATCH --nodes=16" in text and "#SBATCH --account=ABC123" in text  # cluster from the plan
    assert f'CHECKPOINT_DIR="{os.path.abspath("ck")}"' in text
    out = tmp_path / "job.sbatch"
    assert (
        main(["launch", "--plan", str(plan_file), "--scheduler", "slurm", "--cluster", "dgx-h100", "--out", str(out)])
        == 0
    )
    assert out.stat().st_mode & stat.S_IXUSR and "export NCCL_SOCKET_IFNAME" not in out.read_text()


def test_launch_torchrun(plan_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            ["launch", "--plan", str(plan_file), "--scheduler", "torchrun", "--nodes", "16", "--master", "node0:29500"]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "--nnodes=16 --nproc-per-node=8" in text and f"--plan {plan_file}" in text


def test_export_config_cli(plan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(
        capsys,
        ["export-config", "--plan", str(plan_file), "--for", "torchtitan"],
        "torchtitan has no model like gpt-175b",
    )  # no GPT-2-style model there: refused, not substituted
    llama = tmp_path / "llama.json"
    Plan(
        model=get_model("llama3-70b"),
        dims=ParallelDims(4, 16, 2),
        shape=TrainShape(1, 640),
        zero_stage=1,
        recompute="full",
    ).validate().save(llama)
    assert main(["export-config", "--plan", str(llama), "--for", "torchtitan"]) == 0
    captured = capsys.readouterr()
    assert tomllib.loads(captured.out)["parallelism"]["tensor_parallel_degree"] == 4
    assert "note: torchtitan has no ZeRO-1" in captured.err
    assert main(["export-config", "--plan", str(llama), "--for", "torchtitan-0.3"]) == 0
    captured = capsys.readouterr()
    assert "--module llama3\n  --config llama3_70b" in captured.out and "note: torchtitan has no ZeRO-1" in captured.err
    out = tmp_path / "out" / "ds_args.sh"
    assert main(["export-config", "--plan", str(plan_file), "--for", "deepspeed", "--out", str(out)]) == 0
    ds_config = tmp_path / "out" / "ds_config.json"
    assert ds_config.is_file() and f"--deepspeed_config {ds_config}" in out.read_text()


def test_launch_bad_input(plan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["launch", "--plan", str(plan_file)]
    one_line_error(capsys, base + ["--scheduler", "pbs"], "invalid choice: 'pbs'")
    one_line_error(capsys, base + ["--scheduler", "slurm", "--nodes", "4"], "--nodes 4 hold 32 devices")
    one_line_error(capsys, base + ["--scheduler", "slurm", "--time", "soon"], "--time")
    one_line_error(capsys, base + ["--scheduler", "torchrun", "--master", "node0"], "--master must be host:port")
    one_line_error(capsys, base + ["--scheduler", "slurm", "--master", "n:1"], "--master is for --scheduler torchrun")
    one_line_error(capsys, base + ["--scheduler", "slurm", "--cluster", "nowhere"], "unknown cluster 'nowhere'")
    one_line_error(capsys, ["launch", "--plan", str(tmp_path / "missing.json"), "--scheduler", "slurm"], "no such file")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    one_line_error(capsys, ["launch", "--plan", str(garbage), "--scheduler", "slurm"], "not valid JSON")
    one_line_error(capsys, ["export-config", "--plan", str(garbage), "--for", "megatron"], "not valid JSON")
    one_line_error(capsys, ["export-config", "--plan", str(plan_file), "--for", "colossal"], "invalid choice")


def test_plan_needing_more_devices_per_node_than_the_cluster_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wide = tmp_path / "wide.json"
    Plan(model=get_model("gpt-1t"), dims=ParallelDims(16, 1, 1), shape=TrainShape(1, 1)).save(wide)
    for scheduler in ("slurm", "torchrun"):
        one_line_error(
            capsys,
            ["launch", "--plan", str(wide), "--scheduler", scheduler, "--cluster", "frontier"],
            "tp 16 needs 16 devices in one node but a frontier node has 8",
        )


def test_entry_point_exit_status(plan_file: Path) -> None:
    """The installed command line: one line on stderr and status 2, no traceback."""
    out = subprocess.run(
        [sys.executable, "-m", "exatrain", "launch", "--plan", str(plan_file), "--scheduler", "slurm", "--nodes", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "exatrain launch: error: --nodes 3 hold 24 devices (8 per frontier node) but the plan needs 128: "
        "use at least 16 nodes"
    ]


def test_a_plan_that_does_not_fit_is_refused_without_force_and_a_tight_one_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan above even its band's low end on a 64 GiB GCD (tp 2 without recomputation: 77 GiB as the trainer runs
    it, more as Megatron-Core does): launch and export-config refuse it in one line (nothing written) unless --force,
    which writes it with one warning line; a tight plan (63.6 GiB, inside the band) is written with one warning line
    saying so."""
    big = tmp_path / "big.json"
    Plan(
        model=get_model("gpt-175b"),
        dims=ParallelDims(2, 8, 8),
        shape=TrainShape(1, 640),
        zero_stage=1,
        cluster="frontier",
    ).save(big)
    job = tmp_path / "job.sbatch"
    for argv, runtime in (
        (["launch", "--plan", str(big), "--scheduler", "slurm", "--out", str(job)], "exatrain"),
        (["export-config", "--plan", str(big), "--for", "megatron", "--out", str(job)], "megatron-core"),
    ):
        one_line_error(capsys, argv, f"{big} does not fit: its worst stage is predicted at")
        assert main(argv) == 2 and f"as {runtime} runs it" in capsys.readouterr().err
        assert not job.exists()
        assert main(argv + ["--force"]) == 0 and job.exists()
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "does not fit" in err and "--force" in err, err
        job.unlink()
    tight = tmp_path / "tight.json"
    Plan(
        model=get_model("gpt-175b"),
        dims=ParallelDims(4, 16, 2),
        shape=TrainShape(1, 640),
        zero_stage=2,
        sequence_parallel=True,
        schedule="1f1b",
        cluster="frontier",
    ).save(tight)
    assert main(["launch", "--plan", str(tight), "--scheduler", "slurm"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("#!/bin/bash")
    assert (
        captured.err.count("\n") == 1
        and f"{tight} is tight: its worst stage is predicted at 63.6 GiB" in captured.err
        and "may run out of memory" in captured.err
    ), captured.err
