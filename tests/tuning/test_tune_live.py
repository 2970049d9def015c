"""Tuning for real: gpt-tiny over 2 CPU ranks (gloo), each trial a real `exatrain train` run.

The tuner (a separate process, as a user runs it) is SIGKILLed while its second trial runs, then the
same command is run again, this time through a launcher template (`srun -n 2 {cmd}` with the srun
stand-in of tests/helpers/slurm_standins.py, which starts 2 ranks the way SLURM does). The rerun must mark the cut-off
trial interrupted, run its layout again, never rerun the finished one, and finish with 3 measured
trials whose best is the reported best. Every subprocess runs in its own process group, killed whole
on the way out; waits poll for progress (files under the test's folder changing) and fail only after a
long stall, never on a deadline (tests/helpers/progress_wait.py).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from exatrain.plan import Plan
from exatrain.records import read_run_records

from tests.helpers.progress_wait import finish, kill_group, start, wait_for
from tests.helpers.slurm_standins import install  # (the srun stand-in the launch tests use)

pytestmark = pytest.mark.slow


def test_tune_real_runs_survives_sigkill_and_resumes_through_a_launcher(tmp_path: Path) -> None:
    study = tmp_path / "tune.db"
    argv = [
        sys.executable,
        "-m",
        "exatrain",
        "tune",
        "--model",
        "gpt-tiny",
        "--gpus",
        "2",
        "--global-batch",
        "8",
        "--trials",
        "3",
        "--steps",
        "3",
        "--candidates",
        "64",
        "--trial-timeout",
        "300",
        "--study",
        str(study),
        "--json",
    ]
    trials_root = tmp_path / "tune.trials"
    first, _, first_err = start(argv, tmp_path / "logs", "first")
    try:
        wait_for(
            lambda: first.poll() is not None or bool(list(trials_root.glob("*/trial-0001/command.txt"))),
            watch=[tmp_path],
            poll_s=0.2,
            what="the tuner",
        )
        assert first.poll() is None, first_err.read_text()
        first.send_signal(signal.SIGKILL)  # the tuner only: its trial's ranks live on, orphaned
        first.wait()
    finally:
        if first.poll() is None:
            kill_group(first)
    records = read_run_records(tmp_path / "tune.runs.jsonl")
    assert len(records) == 1 and records[0].status == "ok"  # trial 0 finished before the kill
    first_layout = records[0].plan.with_estimate(None)

    bin_dir = install(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", SRUN_LOG=str(tmp_path / "srun.jsonl"))
    rerun, out, err = start([*argv, "--launcher", "srun -n 2 {cmd}"], tmp_path / "logs", "rerun", env=env)
    finish([rerun], [tmp_path], [out, err], what="the tuner's rerun")
    assert rerun.returncode == 0, err.read_text()
    d = json.loads(out.read_text())

    by_number = {t["number"]: t for t in d["trials"]}
    assert by_number[1]["status"] == "interrupted"
    retry = next(t for t in d["trials"] if t["source"] == "retry")
    assert retry["plan"] == by_number[1]["plan"] and retry["status"] == "ok"
    ok = [t for t in d["trials"] if t["status"] == "ok"]
    assert d["finished"] == 3 and len(ok) == 3 and d["ran"] == 2
    best = max(ok, key=lambda t: t["measured_tokens_per_s"])
    assert d["best"]["number"] == best["number"] and d["trials"][0]["number"] == best["number"]
    assert Plan.load(d["best_file"]) == Plan.from_dict(d["best"]["plan"])

    records = read_run_records(tmp_path / "tune.runs.jsonl")
    layouts = [r.plan.with_estimate(None) for r in records]
    assert len(records) == 3 and len(set(layouts)) == 3 and layouts.count(first_layout) == 1
    for r in records:  # measured by the real trainer on 2 ranks, predicted by the cost model
        assert r.status == "ok" and r.device == "cpu" and r.env["world_size"] == 2
        assert r.measured.tokens_per_s > 0 and r.predicted.tokens_per_s > 0
    assert {r.env["tune_trial"] for r in records} == {t["number"] for t in ok}
    srun_calls = [json.loads(x) for x in (tmp_path / "srun.jsonl").read_text().splitlines()]
    started_by_rerun = [t for t in d["trials"] if t["number"] >= 2]  # the retry, then new picks
    assert len(srun_calls) == len(started_by_rerun) >= 2 and all(c["options"]["--ntasks"] == "2" for c in srun_calls)
    assert all(c["command"][1:3] == ["-m", "exatrain.train"] for c in srun_calls)
