"""Stop signals: SIGTERM, SIGINT and SIGHUP to the launcher, SIGTERM to its whole process group (a
scheduler's time limit or preemption), SIGTERM to one rank of ``python -m exatrain.train`` under srun
(the torchrun/srun entry, as a launch script runs it, with --kill-on-bad-exit), and a launcher killed
outright (gpt-tiny, two CPU ranks on gloo, for real).

Each path is held to the same promises: every rank process is gone within HANG_S of the signal (a
bound that only catches a hang or an orphan: a correct stop takes about a second, and a run left alone
would go on for thousands of steps); both ranks stop after the same step; that step's checkpoint is
saved and verifies when the run has a checkpoint directory; the exit status is 128 + the signal; stderr
holds one line that says so; the metrics file ends with a RunRecord of status ``interrupted`` whose
failure names the step. In process: the step loop stops at the boundary after the request and saves
there; a request in the last step lets the run finish; the grace and the cause of a stop request; a
rank that does not report waits for the one that does; the launcher's report needs no torch.

Broken on purpose and seen to fail here:
* the launcher not catching the signals (``_StopSignals.__enter__`` returning at once): the train
  command's own handler then ends the launcher, which kills the ranks: no checkpoint, no RunRecord (the
  SIGTERM-launcher and SIGTERM-group cases fail);
* the ranks not watching their launcher (``launcher_fd`` left None): after the launcher's SIGKILL the
  ranks train on (the killed-launcher case fails on HANG_S);
* the stop vote left out of the step's last collective (``stop_vote`` returning 0): no rank stops at a
  boundary, each ends where it is after the grace, without a checkpoint (the group case fails on
  ``stopped_after``; the in-process loop never stops);
* a peer's vote ignored (``stop_votes`` keeping this rank's vote only): under srun rank 1 stops and
  waits in its checkpoint save for rank 0, which trains on into the next step's collectives; both wait
  past HANG_S;
* no save at the stop (``_stop`` without ``checkpointer.save``): the in-process loop test finds no checkpoint;
* the RunRecord of a stop written as ``failed`` (failures.write_failed_record): the SIGINT- and
  SIGHUP-launcher cases fail on the status;
* failures.py taking ``coordinates`` from parallel/mesh.py (which imports torch) again: the launcher's
  report loads torch (the no-torch test fails).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.progress_wait import finish, start, wait_for
from tests.helpers.slurm_standins import install
from tests.helpers.trainer_runs import steps

from exatrain.procs import pid_alive
from exatrain.records import read_run_records
from exatrain.trainer.checkpoint import files as ckpt_files
from exatrain.trainer.health import STOP_MAX_S, STOP_MIN_S, RankMonitor, Stopped, Terminated

HANG_S = 120.0  # from the signal to every rank gone: a correct stop takes about a second
STEPS = 20000  # far more than a test waits for: a rank that does not stop would run on for many minutes


def rank_pids(run_dir: Path) -> list[int]:
    return [int(json.loads((run_dir / f"heartbeat-{r}.json").read_text())["pid"]) for r in range(2)]


def wait_gone(pids: list[int], since: float) -> float:
    """Seconds from ``since`` until every process in ``pids`` has ended; past HANG_S, kills what is left
    (orphans would outlive the test) and fails."""
    while any(pid_alive(p) for p in pids):
        if time.monotonic() - since > HANG_S:
            left = [p for p in pids if pid_alive(p)]
            for p in left:
                os.kill(p, signal.SIGKILL)
            pytest.fail(f"ranks {left} still ran {HANG_S:.0f} s after the signal")
        time.sleep(0.05)
    return time.monotonic() - since


def train_args(tmp_path: Path, checkpoint: bool) -> list[str]:
    args = [
        "--model",
        "gpt-tiny",
        "--dp",
        "2",
        "--micro-batch",
        "2",
        "--global-batch",
        "4",
        "--steps",
        str(STEPS),
        "--quiet",
        "--metrics-file",
        str(tmp_path / "m.jsonl"),
    ]
    if checkpoint:  # no save of its own before the last step: the one saved is the stop's
        args += ["--checkpoint-dir", str(tmp_path / "ckpt"), "--save-every", str(10 * STEPS)]
    return args


def check_stopped(tmp_path: Path, line: str, sig: signal.Signals, checkpoint: bool, cause: str | None = None) -> int:
    """The promises every path shares (module docstring); returns the step the ranks stopped after."""
    metrics, ckpt = tmp_path / "m.jsonl", tmp_path / "ckpt"
    rec = read_run_records(metrics)[-1]
    assert rec.status == "interrupted", rec
    done = int(rec.failure["stopped_after"])
    assert rec.failure["kind"] == "interrupted" and rec.failure["exit_code"] == 128 + sig
    assert rec.failure["step"] == done and rec.failure["phase"] == "stopped"
    assert steps(metrics) == list(range(1, done + 1))  # every step once, none cut off
    assert rec.measured is not None and rec.measured.steps == done
    run_dir = ckpt / "ranks" if checkpoint else tmp_path / "m.ranks"
    for r in range(2):  # both ranks stopped after the same step
        own = json.loads((run_dir / f"failure-{r}.json").read_text())
        assert own["kind"] == "interrupted" and own["stopped_after"] == done, own
    cause = cause or f"interrupted ({sig.name})"
    assert line.startswith(f"exatrain train: error: {cause} after step {done}; "), line
    assert rec.error == line.split("error: ", 1)[1]
    if checkpoint:
        assert [s for s, _ in ckpt_files.list_checkpoints(ckpt)] == [done]
        ckpt_files.verify(ckpt / ckpt_files.step_dir_name(done))  # every file against its sha256
        assert f"; last checkpoint step {done} in {ckpt}; resume with: " in line
    else:
        assert "; no checkpoint (the run has no --checkpoint-dir)" in line
    return done


def start_training(tmp_path: Path, checkpoint: bool):
    """`exatrain train` on two CPU ranks in its own process (proc, stdout file, stderr file)."""
    cmd = [sys.executable, "-m", "exatrain", "train", *train_args(tmp_path, checkpoint)]
    return start(cmd, tmp_path / "logs", "run", env={**os.environ, "OMP_NUM_THREADS": "1"})


def running_ranks(proc, err: Path, metrics: Path, run_dir: Path, tmp_path: Path) -> list[int]:
    """Once the run has taken three steps, its ranks' pids (the run must still be going)."""
    wait_for(lambda: proc.poll() is not None or len(steps(metrics)) >= 3, watch=[tmp_path], what="the run")
    assert proc.poll() is None, err.read_text()
    return rank_pids(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize(
    "target, sig, checkpoint",
    [
        ("launcher", signal.SIGTERM, True),  # kill, timeout
        ("launcher", signal.SIGINT, False),  # a SIGINT to the launcher alone; no checkpoint directory
        ("launcher", signal.SIGHUP, True),  # a closed terminal
        ("group", signal.SIGTERM, True),  # SLURM's time limit and preemption: every process of the job
    ],
    ids=["SIGTERM-launcher", "SIGINT-launcher", "SIGHUP-launcher", "SIGTERM-group"],
)
def test_a_stop_signal_stops_every_rank_after_one_step_with_a_checkpoint_and_a_record(
    tmp_path: Path, target: str, sig: signal.Signals, checkpoint: bool
) -> None:
    metrics = tmp_path / "m.jsonl"
    run_dir = tmp_path / "ckpt" / "ranks" if checkpoint else tmp_path / "m.ranks"
    proc, out, err = start_training(tmp_path, checkpoint)
    try:
        pids = running_ranks(proc, err, metrics, run_dir, tmp_path)
        t0 = time.monotonic()
        (os.killpg if target == "group" else os.kill)(proc.pid, sig)
        wait_gone(pids, t0)
    finally:
        finish([proc], [tmp_path], [out, err])
    stderr = err.read_text()
    assert proc.returncode == 128 + sig, stderr
    (line,) = stderr.splitlines()
    check_stopped(tmp_path, line, sig, checkpoint)


@pytest.mark.slow
def test_sigterm_to_one_rank_under_srun_stops_both_with_a_checkpoint_and_one_report(tmp_path: Path) -> None:
    # `python -m exatrain.train` as a launch script runs it: one task per rank under srun (the stand-in,
    # tests/helpers/slurm_standins.py), --kill-on-bad-exit=1 (the first task to exit has the rest killed)
    from exatrain.trainer.spawn import _free_port

    metrics, run_dir = tmp_path / "m.jsonl", tmp_path / "ckpt" / "ranks"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    }
    env.update(
        PATH=f"{install(tmp_path / 'bin')}{os.pathsep}{env['PATH']}",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        OMP_NUM_THREADS="1",
    )
    cmd = [
        "srun",
        "--ntasks=2",
        "--kill-on-bad-exit=1",
        sys.executable,
        "-m",
        "exatrain.train",
        *train_args(tmp_path, True),
    ]
    proc, out, err = start(cmd, tmp_path / "logs", "srun", env=env)
    try:
        wait_for(lambda: proc.poll() is not None or len(steps(metrics)) >= 3, watch=[tmp_path], what="the ranks")
        assert proc.poll() is None, err.read_text()
        pids = rank_pids(run_dir)
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGTERM)
        wait_gone(pids, t0)
    finally:
        finish([proc], [tmp_path], [out, err])
    assert proc.returncode == 143, err.read_text()
    (line,) = err.read_text().splitlines()  # one rank reports, once
    # rank 1 got the signal; rank 0 learnt of it in the step's last collective (whichever reports)
    cause = "interrupted (SIGTERM)" if "(SIGTERM) after" in line else "interrupted (SIGTERM to rank 1)"
    check_stopped(tmp_path, line, signal.SIGTERM, True, cause)
    assert line.endswith("; resume with: the same launch with --resume auto added to exatrain's arguments")


@pytest.mark.slow
def test_ranks_whose_launcher_is_killed_stop_save_and_record_it(tmp_path: Path) -> None:
    metrics, run_dir = tmp_path / "m.jsonl", tmp_path / "ckpt" / "ranks"
    proc, out, err = start_training(tmp_path, True)
    try:
        pids = running_ranks(proc, err, metrics, run_dir, tmp_path)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)  # nothing of the launcher's own runs after this
        proc.wait()
        wait_gone(pids, t0)
    finally:
        finish([proc], [tmp_path], [out, err])
    assert err.read_text() == ""
    rec = read_run_records(metrics)[-1]  # written by a rank, which reported the run itself
    assert rec.status == "interrupted" and rec.failure["cause"] == "interrupted (the launcher ended)"
    done = int(rec.failure["stopped_after"])
    assert steps(metrics) == list(range(1, done + 1)) and rec.failure["exit_code"] == 128 + signal.SIGHUP
    ckpt_files.verify(tmp_path / "ckpt" / ckpt_files.step_dir_name(done))
    assert rec.error.startswith(f"interrupted (the launcher ended) after step {done}; last checkpoint step {done} ")


# --- in process --------------------------------------------------------------------------------------------
class StopAt:
    """The trainer's stepper, asking for a stop (as a signal would) during its ``at``-th call."""

    def __init__(self, trainer, at: int, signum: int = signal.SIGTERM) -> None:
        self.trainer, self.inner, self.at, self.signum, self.calls = trainer, trainer.stepper, at, signum, 0

    def __call__(self, *args, **kw):
        self.calls += 1
        if self.calls == self.at:
            self.trainer.health.request_stop(self.signum)
        return self.inner(*args, **kw)


def small_config(tmp_path: Path, steps_: int):
    from exatrain.catalog import get_model
    from exatrain.plan import ParallelDims, Plan, TrainShape
    from exatrain.trainer.config import TrainConfig

    plan = Plan(
        model=get_model("gpt-tiny"), dims=ParallelDims(), shape=TrainShape(2, 4), dtype="float32", cluster="local-cpu"
    ).validate()
    return TrainConfig(
        plan=plan,
        steps=steps_,
        quiet=True,
        metrics_file=str(tmp_path / "m.jsonl"),
        checkpoint_dir=str(tmp_path / "ckpt"),
    )


def test_a_stop_request_ends_the_loop_after_its_step_with_that_steps_checkpoint(one_rank: None, tmp_path: Path) -> None:
    from exatrain.trainer.train import Trainer

    trainer = Trainer(small_config(tmp_path, 6))
    trainer.stepper = StopAt(trainer, 3)
    with pytest.raises(Stopped) as got:
        trainer.run()
    assert got.value.step == 3 and got.value.votes == {0: signal.SIGTERM} and got.value.signum == signal.SIGTERM
    assert trainer.stepper.calls == 3 and trainer.health.phase == "stopped"
    assert [s for s, _ in ckpt_files.list_checkpoints(tmp_path / "ckpt")] == [3]
    assert steps(tmp_path / "m.jsonl") == [1, 2, 3]
    (rec,) = read_run_records(tmp_path / "m.jsonl")
    assert rec.status == "interrupted" and rec.measured.steps == 3

    # a request during the last step: the run is complete, and ends as such
    (tmp_path / "last").mkdir()
    trainer = Trainer(small_config(tmp_path / "last", 2))
    trainer.stepper = StopAt(trainer, 2)
    assert len(trainer.run()) == 2
    assert read_run_records(tmp_path / "last" / "m.jsonl")[-1].status == "ok"


def test_a_stop_request_waits_for_the_boundary_within_its_grace() -> None:
    m = RankMonitor(0, 2, None, supervised=True, watch=False)
    with pytest.raises(Terminated):  # outside the step loop: at once
        m._on_signal(signal.SIGTERM, None)
    assert m.stop_signal == 0
    m.stoppable = True
    m._on_signal(signal.SIGTERM, None)  # in the step loop: a request, no exception
    m._on_signal(signal.SIGINT, None)  # a second one changes nothing
    assert m.stop_signal == signal.SIGTERM and m.stop_cause == "interrupted (SIGTERM)"
    assert m.stop_vote() == signal.SIGTERM
    assert m.stop_grace_s() == STOP_MIN_S  # no step timed yet
    m.step_times.extend([20.0] * 5)
    assert m.stop_grace_s() == 60.0  # three median steps
    m.step_times.extend([100.0] * 10)
    assert m.stop_grace_s() == STOP_MAX_S
    m.step_times.clear()
    m.enter("forward")
    assert not m._stop_overdue()
    m._stop_t -= STOP_MIN_S + 1
    assert m._stop_overdue()
    m.enter("checkpoint")  # a save in progress is waited for, and restarts the wait
    assert not m._stop_overdue()
    m.enter("metrics")
    assert not m._stop_overdue()
    assert m.terminated(signal.SIGTERM) == ("interrupted", "interrupted (SIGTERM)", 143)
    assert m.stop_agreed(7, {0: signal.SIGTERM}) == "interrupted (SIGTERM)" and m.stopping
    assert not m._stop_overdue()  # at the boundary: the grace no longer runs

    peer = RankMonitor(1, 2, None, supervised=False, watch=False)  # a rank that only saw the vote
    assert peer.stop_agreed(7, {0: signal.SIGTERM}) == "interrupted (SIGTERM to rank 0)"
    assert peer.terminated(signal.SIGHUP) == ("terminated", "interrupted (SIGHUP)", 129)


def test_a_rank_that_does_not_report_waits_for_the_report(tmp_path: Path) -> None:
    from exatrain.trainer import failures

    assert failures.claim(tmp_path, 0) and not failures.claim(tmp_path, 0)  # one reporter per run
    t0 = time.monotonic()
    assert not failures.wait_reported(tmp_path, 0, 0.3)  # not written yet: waits out its bound, then goes
    assert time.monotonic() - t0 >= 0.3
    failures.mark_reported(tmp_path, 0)
    assert failures.wait_reported(tmp_path, 0, 30.0)
    assert not failures.wait_reported(tmp_path, 1, 0.0)  # another run's report is not this one's


def test_the_launchers_report_imports_no_torch(tmp_path: Path) -> None:
    # after the ranks end, the launcher names the stop and writes the RunRecord: importing torch there took
    # 5-15 s on a loaded 2-core machine, between the ranks' exit and the one line
    script = f"""
import json, sys, time
from pathlib import Path
from exatrain.catalog import get_model
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.records import read_run_records
from exatrain.trainer import failures
run_dir, metrics = Path({str(tmp_path / "ranks")!r}), Path({str(tmp_path / "m.jsonl")!r})
run_dir.mkdir()
plan = Plan(model=get_model("gpt-tiny"), dims=ParallelDims(dp=2), shape=TrainShape(2, 4)).validate()
versions = {{"torch": "9.9.9", "hip": None, "cuda": None}}
for r in range(2):
    failures.write_failure(run_dir, {{"rank": r, "run": 0, "completed": 5, "phase": "stopped", "kind": "interrupted",
                                      "cause": "interrupted (SIGTERM)", "exit_code": 143, "stopped_after": 5,
                                      "time": time.time(), "versions": versions}})
metrics.write_text(json.dumps({{"kind": "step", "step": 5, "loss": 5.0}}) + "\\n")
beats, fails = failures.read_ranks(run_dir, 2)
ctx = failures.RunContext(plan=plan, run=0, checkpoint_dir=None, run_dir=run_dir, resume=None)
diag = failures.diagnose(ctx, beats, fails, exit_codes={{0: 143, 1: 143}}, interrupted=15)
failures.write_failed_record(str(metrics), plan, diag, device="cpu", wall_s=1.0, measure_after=2,
                             versions=failures.versions_of(fails))
rec = read_run_records(metrics)[-1]
print(json.dumps([str(diag.error), diag.error.exit_code, rec.status, rec.env["torch"], "torch" in sys.modules]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line, code, status, version, torch_loaded = json.loads(out.stdout)
    assert line == "interrupted (SIGTERM) after step 5; no checkpoint (the run has no --checkpoint-dir)"
    assert (code, status, version) == (143, "interrupted", "9.9.9")
    assert not torch_loaded
