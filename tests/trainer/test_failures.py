"""Slow, stopped, killed, failing and interrupted ranks, for real (gpt-tiny, CPU ranks on gloo).

* a rank made slow (EXATRAIN_SLOW_RANK spins 0.3 s of CPU in its forward) is named a straggler, with its
  tp/pp/dp place, in the metrics, the RunRecord and rank 0's log, after two windows running;
* a rank computing for 12 s under a 5 s watchdog (EXATRAIN_SLOW_RANK) while its peer waits for it in a
  collective: the run finishes, neither rank is called hung (the watchdog counts a CPU rank's phase from
  the last beat that saw it or a peer use CPU);
* a rank stopped with SIGSTOP: its peer's watchdog (10 s) names it, every other rank ends itself with
  status 5 and the launcher raises RankHung; the last checkpoint verifies and a run resumes from it;
* a rank killed with SIGKILL under `exatrain train`: exit status 4 and exactly one line on stderr naming
  the rank, its step, the last checkpoint, the resume command and the rank's log; a failed RunRecord;
  the resume command finishes the run and the metrics file holds every step once (redone ones marked);
* a rank whose first checkpoint save fails (FileExistsError): RankFailed naming it, a failed RunRecord;
* Ctrl-C (SIGINT to the process group): exit status 130, one line, an interrupted RunRecord (more paths:
  test_signals.py).

Every wait polls for progress and fails only when nothing moves for a long time (tests/helpers/progress_wait.py).

Broken on purpose and seen to fail here: the watchdog judging CPU ranks by wall-clock age, and the
waiting rank not reading its peers' CPU time (both: the 12 s rank is called hung, RankHung).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers.progress_wait import IDLE_S, finish, start, wait_for
from tests.helpers.slurm_standins import install
from tests.helpers.trainer_runs import config, lines, steps

from exatrain.errors import RankFailed, RankHung
from exatrain.records import read_run_records
from exatrain.trainer.checkpoint import files as ckpt_files
from exatrain.trainer.health import SLOW_RANK_ENV
from exatrain.trainer.spawn import launch_local

pytestmark = pytest.mark.slow


def pid_of(run_dir: Path, rank: int) -> int:
    return int(json.loads((run_dir / f"heartbeat-{rank}.json").read_text())["pid"])


def newest_step(ckpt: Path) -> int:
    return max(s for s, p in ckpt_files.list_checkpoints(ckpt) if (p / "manifest.json").is_file())


class Launch:
    """launch_local in a thread, so the test can act on the ranks while they run."""

    def __init__(self, configs: list, watch: Path) -> None:
        self.error: BaseException | None = None
        self.watch = watch
        self.thread = threading.Thread(target=self._go, args=(configs,), daemon=True)
        self.thread.start()

    def _go(self, configs: list) -> None:
        try:
            launch_local(configs, stall_s=IDLE_S)
        except BaseException as exc:  # noqa: B036 - handed to the test
            self.error = exc

    def wait_until(self, cond) -> None:
        wait_for(lambda: cond() or not self.thread.is_alive(), watch=[self.watch], what="the ranks")
        assert self.thread.is_alive(), f"the run ended early: {self.error!r}"

    def join(self) -> BaseException | None:
        wait_for(lambda: not self.thread.is_alive(), watch=[self.watch], what="the launch")
        return self.error


def test_a_slow_rank_is_named_a_straggler_after_two_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOW_RANK_ENV, "3:0.3")
    c = replace(config(tmp_path, "slow", tp=2, dp=2, steps=6), straggler_every=2)  # three windows
    err = Launch([c], tmp_path).join()
    assert err is None, err
    metrics = tmp_path / "slow.jsonl"
    windows = [x for x in lines(metrics) if x["kind"] == "ranks"]
    assert [(w["first_step"], w["last_step"]) for w in windows] == [(1, 2), (3, 4), (5, 6)]
    assert windows[0]["coords"][3] == [1, 0, 1]  # tp, pp, dp
    assert windows[0]["stragglers"] == []  # one slow window is not yet a straggler
    assert windows[1]["stragglers"] == windows[2]["stragglers"] == [3]
    (rec,) = read_run_records(metrics)
    assert rec.status == "ok" and rec.rank_times["stragglers"] == [3] and rec.rank_times["steps"] == 6
    compute = rec.rank_times["compute_s"]
    assert compute[3] > 1.3 * max(compute[:3])
    log = (tmp_path / "slow.ranks" / "rank-0.log").read_text()
    assert "straggler: rank 3 (tp 1, pp 0, dp 1) computes" in log


def test_a_rank_computing_past_the_watchdog_limit_is_waited_for_not_called_hung(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rank 1 spends 12 s of CPU in its forward under a 5 s watchdog; rank 0 waits for it in the gradient
    # all-reduce using no CPU: rank 1's heartbeat shows it computing, so neither is ended (a hang is a
    # collective nobody computes towards: the stopped-rank test below)
    monkeypatch.setenv(SLOW_RANK_ENV, "1:12")
    c = replace(config(tmp_path, "busy", dp=2, steps=1), watchdog_s=5.0)
    err = Launch([c], tmp_path).join()
    assert err is None, err
    assert steps(tmp_path / "busy.jsonl") == [1]
    (rec,) = read_run_records(tmp_path / "busy.jsonl")
    assert rec.status == "ok"


def test_a_stopped_rank_is_named_the_others_exit_and_the_checkpoint_resumes(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    c = replace(config(tmp_path, "stop", dp=2, steps=10), checkpoint_dir=str(ckpt), save_every=4, watchdog_s=10.0)
    metrics, run_dir = tmp_path / "stop.jsonl", ckpt / "ranks"
    run = Launch([c], tmp_path)
    run.wait_until(lambda: len(steps(metrics)) >= 5 and (ckpt / "step-00000004" / "manifest.json").is_file())
    os.kill(pid_of(run_dir, 1), signal.SIGSTOP)
    err = run.join()

    assert isinstance(err, RankHung) and err.exit_code == 5, err
    msg = str(err)
    assert msg.startswith(
        "rank 1 did not arrive within the watchdog's 10 s: rank 1 (tp 0, pp 0, dp 1) was last heard from "
    ), msg
    assert "; rank 0 waited in " in msg and f"; last checkpoint step {newest_step(ckpt)} in {ckpt};" in msg
    assert msg.endswith(f"; log: {run_dir / 'rank-1.log'}") and "\n" not in msg
    own = json.loads((run_dir / "failure-0.json").read_text())  # rank 0 ended itself, by its watchdog
    assert own["kind"] == "hung" and own["exit_code"] == 5 and own["not_arrived"] == [1]
    assert not (run_dir / "failure-1.json").exists()  # the stopped rank said nothing
    rec = read_run_records(metrics)[-1]
    assert rec.status == "failed" and rec.failure["kind"] == "hung" and rec.failure["rank"] == 1
    assert rec.failure["not_arrived"] == [1] and rec.error == msg

    done = newest_step(ckpt)
    manifest = ckpt_files.verify(ckpt / ckpt_files.step_dir_name(done))  # every file against its sha256
    err = Launch([replace(c, resume_from=str(manifest.path), watchdog_s=0.0)], tmp_path).join()
    assert err is None, err
    got = lines(metrics)
    assert [x["step"] for x in got if x["kind"] == "step"] == list(range(1, 11))
    redone = [x["line"]["step"] for x in got if x["kind"] == "superseded" and "step" in x["line"]]
    assert redone and all(s > done for s in redone)
    assert read_run_records(metrics)[-1].status == "ok"


def train_cmd(tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "exatrain",
        "train",
        "--model",
        "gpt-tiny",
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "2",
        "--micro-batch",
        "2",
        "--global-batch",
        "4",
        "--steps",
        "12",
        "--lr",
        "3e-3",
        "--quiet",
        "--metrics-file",
        str(tmp_path / "m.jsonl"),
        *extra,
    ]


def test_a_killed_rank_is_one_line_exit_4_and_the_resume_command_finishes_the_run(tmp_path: Path) -> None:
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    proc, out, err = start(train_cmd(tmp_path, "--checkpoint-dir", str(ckpt), "--save-every", "4"), tmp_path, "crash")
    try:
        wait_for(
            lambda: proc.poll() is not None or (len(steps(metrics)) >= 6 and newest_step_or_0(ckpt) >= 4),
            watch=[tmp_path],
            what="the run",
        )
        assert proc.poll() is None, err.read_text()
        os.kill(pid_of(ckpt / "ranks", 1), signal.SIGKILL)
    finally:
        finish([proc], [tmp_path], [out, err])
    stderr = err.read_text()
    assert proc.returncode == 4, stderr
    (line,) = stderr.splitlines()  # one line: no torch teardown, no traceback
    done = newest_step(ckpt)
    assert line.startswith("exatrain train: error: rank 1 (tp 0, pp 0, dp 1) failed at step "), line
    assert f": killed by SIGKILL; last checkpoint step {done} in {ckpt}; resume with: exatrain train " in line
    assert line.endswith(f" --resume auto; log: {ckpt / 'ranks' / 'rank-1.log'}")
    rec = read_run_records(metrics)[-1]
    assert rec.status == "failed" and rec.failure["rank"] == 1 and rec.failure["kind"] == "signal"
    assert rec.measured is not None and rec.measured.steps >= 6 and rec.error == line.split("error: ", 1)[1]

    resume = shlex.split(line.split("; resume with: ")[1].split("; log: ")[0])
    assert resume[:2] == ["exatrain", "train"] and resume[-2:] == ["--resume", "auto"]
    proc, out, err = start([sys.executable, "-m", "exatrain", *resume[1:]], tmp_path, "resume")
    finish([proc], [tmp_path], [out, err])
    assert proc.returncode == 0, err.read_text()
    got = lines(metrics)
    assert [x["step"] for x in got if x["kind"] == "step"] == list(range(1, 13))  # each step once
    redone = [x["line"]["step"] for x in got if x["kind"] == "superseded"]
    assert (
        redone
        and all(s > done for s in redone)
        and all(x["resumed_from_step"] == done for x in got if x["kind"] == "superseded")
    )
    assert [r.status for r in read_run_records(metrics)] == ["failed", "ok"]


def newest_step_or_0(ckpt: Path) -> int:
    try:
        return newest_step(ckpt)
    except ValueError:
        return 0


def test_a_failed_first_checkpoint_save_names_the_rank_and_leaves_a_failed_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    # A leftover in the save's place is cleared by the first save now, so the failure is injected.
    monkeypatch.setenv("EXATRAIN_FAIL_SAVE_STEP", "2")
    c = replace(config(tmp_path, "save", dp=2, steps=4), checkpoint_dir=str(ckpt), save_every=2)
    err = Launch([c], tmp_path).join()
    assert isinstance(err, RankFailed) and err.exit_code == 4, err
    msg = str(err)
    assert msg.startswith("rank 0 (tp 0, pp 0, dp 0) failed saving the checkpoint of step 2: FileExistsError: "), msg
    assert f"; no complete checkpoint in {ckpt} yet; restart with: " in msg
    (rec,) = read_run_records(tmp_path / "save.jsonl")
    assert rec.status == "failed" and rec.failure["rank"] == 0 and rec.failure["phase"] == "checkpoint"
    assert rec.measured.steps == 2 and rec.error == msg
    assert "Traceback" in (ckpt / "ranks" / "rank-0.log").read_text()  # the details are in the rank's log


def test_under_srun_the_failing_rank_reports_once(tmp_path: Path) -> None:
    from exatrain.trainer.spawn import _free_port

    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    ckpt.mkdir()
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
        EXATRAIN_FAIL_SAVE_STEP="2",
    )
    cmd = [
        "srun",
        "--ntasks=2",
        "--kill-on-bad-exit=1",
        sys.executable,
        "-m",
        "exatrain.train",
        "--model",
        "gpt-tiny",
        "--dp",
        "2",
        "--micro-batch",
        "2",
        "--global-batch",
        "4",
        "--steps",
        "4",
        "--quiet",
        "--metrics-file",
        str(metrics),
        "--checkpoint-dir",
        str(ckpt),
        "--save-every",
        "2",
        "--resume",
        "auto",
    ]
    proc, out, err = start(cmd, tmp_path / "logs", "srun", env=env)
    finish([proc], [tmp_path], [out, err])
    assert proc.returncode != 0
    (line,) = err.read_text().splitlines()  # one rank reported; the other's lost peer stayed in its log
    assert line.startswith(
        "exatrain train: error: rank 0 (tp 0, pp 0, dp 0) failed saving the checkpoint of step 2: FileExistsError: "
    ), line
    assert line.endswith(
        f"; no complete checkpoint in {ckpt} yet; restart with: the same launch (it passes --resume "
        f"auto); log: {ckpt / 'ranks' / 'rank-0.log'}"
    )
    (rec,) = read_run_records(metrics)
    assert rec.status == "failed" and rec.failure["rank"] == 0 and rec.measured.steps == 2


def test_ctrl_c_is_status_130_one_line_and_an_interrupted_record(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    proc, out, err = start(train_cmd(tmp_path, "--steps", "40"), tmp_path, "interrupted")
    try:
        wait_for(lambda: proc.poll() is not None or len(steps(metrics)) >= 3, watch=[tmp_path], what="the run")
        assert proc.poll() is None, err.read_text()
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    finally:
        finish([proc], [tmp_path], [out, err])
    stderr = err.read_text()
    assert proc.returncode == 130, stderr
    (line,) = stderr.splitlines()
    assert line.startswith("exatrain train: error: interrupted (SIGINT) "), line
    rec = read_run_records(metrics)[-1]
    assert rec.status == "interrupted" and rec.failure["kind"] == "interrupted" and rec.failure["exit_code"] == 130
