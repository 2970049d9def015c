"""The rendered launchers, run for real on this machine (CPU ranks, gloo, the tiny GPT):

* a SLURM batch script from `exatrain launch --scheduler slurm`, executed by bash with stand-in
  `srun`/`scontrol` first on PATH (tests/helpers/slurm_standins.py): 2 "nodes" x 2 ranks train;
* the torchrun script from `exatrain launch --scheduler torchrun --nodes 2 --master 127.0.0.1:PORT`,
  run by two launcher processes (two "nodes", c10d rendezvous on 127.0.0.1): 2 ranks train.

Training happened when the metrics file holds one step line per requested step with a finite loss.
Every launch runs in its own process group; a launch that makes no progress (no file under the test's
folder changes) for a long time fails the test and its whole group is killed, so a hang does not block
the suite while a correct but slow launch on a loaded machine still passes (tests/helpers/progress_wait.py).
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
from pathlib import Path

import pytest

from tests.helpers.progress_wait import finish
from tests.helpers.slurm_standins import install, job_environment

from exatrain.cli import main
from exatrain.catalog import get_model
from exatrain.plan import ParallelDims, Plan, TrainShape

pytestmark = pytest.mark.slow
STEPS = 3


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def wait_all(procs: list[subprocess.Popen], logs: list[Path], folder: Path) -> None:
    """Wait for every launcher while anything under ``folder`` still changes; on a stall kill their
    process groups and fail with their logs."""
    finish(procs, [folder], logs, what="the launch")
    for p, log in zip(procs, logs):
        assert p.returncode == 0, f"launcher exited {p.returncode}:\n{log.read_text()[-4000:]}"


def step_lines(metrics: Path) -> list[dict]:
    assert metrics.is_file(), f"no metrics file at {metrics}"
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("kind") == "step"]


def assert_trained(metrics: Path) -> None:
    steps = step_lines(metrics)
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1)), steps
    assert all(math.isfinite(s["loss"]) and s["loss"] > 0 for s in steps)


def tiny_plan(path: Path, tp: int, dp: int) -> Path:
    Plan(
        model=get_model("gpt-tiny"),
        dims=ParallelDims(tp=tp, pp=1, dp=dp),
        shape=TrainShape(1, 2 * dp),
        cluster="local-cpu",
    ).validate().save(path)
    return path


def test_rendered_slurm_script_trains(tmp_path: Path) -> None:
    plan = tiny_plan(tmp_path / "plan.json", tp=2, dp=2)  # 4 ranks: a tp pair on each of 2 "nodes"
    script = tmp_path / "job.sbatch"
    assert (
        main(
            [
                "launch",
                "--plan",
                str(plan),
                "--scheduler",
                "slurm",
                "--cluster",
                "local-cpu",
                "--nodes",
                "2",
                "--steps",
                str(STEPS),
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "--master-port",
                str(free_port()),
                "--out",
                str(script),
            ]
        )
        == 0
    )
    bin_dir = install(tmp_path / "bin")
    env = job_environment(bin_dir, nodes=2, job_id=4242, SRUN_LOG=str(tmp_path / "srun.log"))
    log = tmp_path / "job.out"
    wait_all([start(["bash", str(script)], env, tmp_path, log)], [log], tmp_path)

    assert_trained(tmp_path / "ckpt" / "metrics-4242.jsonl")
    assert (tmp_path / "ckpt" / f"step-{STEPS:08d}" / "manifest.json").is_file()  # --checkpoint-dir saved the end
    # the plan the ranks trained is the embedded copy beside the checkpoints, equal to plan.json
    assert Plan.load(tmp_path / "ckpt" / "plan-4242.json") == Plan.load(plan)
    (srun,) = [json.loads(line) for line in (tmp_path / "srun.log").read_text().splitlines()]
    assert srun["options"]["--ntasks"] == "4" and srun["options"]["--ntasks-per-node"] == "2"
    assert srun["command"][:2] == ["bash", "-c"] and srun["command"][4:7] == ["python", "-m", "exatrain.train"]


def test_two_node_torchrun_trains(tmp_path: Path) -> None:
    plan = tiny_plan(tmp_path / "plan.json", tp=1, dp=2)
    script = tmp_path / "run.sh"
    metrics = tmp_path / "metrics.jsonl"
    assert (
        main(
            [
                "launch",
                "--plan",
                str(plan),
                "--scheduler",
                "torchrun",
                "--cluster",
                "local-cpu",
                "--nodes",
                "2",
                "--master",
                f"127.0.0.1:{free_port()}",
                "--steps",
                str(STEPS),
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "--metrics-file",
                str(metrics),
                "--out",
                str(script),
            ]
        )
        == 0
    )
    text = script.read_text()
    assert "--nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d" in text
    env = job_environment(tmp_path, nodes=2)  # no stand-ins needed: PATH leads to this interpreter's torchrun
    logs = [tmp_path / f"node{i}.out" for i in range(2)]
    procs = [start(["bash", str(script)], env, tmp_path, log) for log in logs]
    wait_all(procs, logs, tmp_path)
    assert_trained(metrics)
    assert (tmp_path / "ckpt" / f"step-{STEPS:08d}" / "manifest.json").is_file()
