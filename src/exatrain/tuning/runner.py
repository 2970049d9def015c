"""One tuning trial as a real training run: ``python -m exatrain.train`` in a subprocess.

The tuner never imports the trainer (it may not even be installed where the study lives); it writes
the trial's plan, starts the trainer - locally, where ``exatrain train`` spawns the ranks itself, or
through a launcher template such as ``srun -N4 --ntasks-per-node 8 {cmd}`` inside an allocation -
and reads the trainer's metrics file: per-step lines while it runs (so a hopeless run can be stopped
after warm-up), the RunRecord with its post-warm-up medians at the end.

Every run lives in its own process group under a deadline, so a hang or a pruned run is ended with
all its ranks (SIGTERM, then SIGKILL), and whatever happens becomes a status, never an exception:
ok, pruned, timeout, oom (an allocator or the kernel said so), failed (anything else; the error is
the last line the run wrote to stderr), or rejected: the trainer refused the plan before starting
any rank (exit status 2, its one-line error; e.g. a combination it cannot run yet).

A ``preflight`` check (the trainer's own checks that need no torch, handed in by the API) runs
before a process is started: an ``OutOfMemoryPredicted`` refusal is an oom trial and any other
``PlanError`` a rejected one, told apart by their type, without a run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from exatrain.errors import OutOfMemoryPredicted, PlanError, UserError
from exatrain.plan import Measured, Plan, RunRecord

WARMUP_STEPS = 2  # the trainer leaves its first 2 steps out of the RunRecord's medians (measure_after)
# What torch's allocators and the kernel say when memory runs out during a run.
_OOM = re.compile(r"out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory", re.IGNORECASE)
_SIGKILLED = re.compile(r"exited with status -9\b|Killed\b")
_LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT")

StopCheck = Callable[[int, float], bool]  # (step, tokens/s of that step) -> stop the run now?


@dataclass(frozen=True)
class RunOutcome:
    """How one run ended. ``measured`` is the trainer's (ok) or the steps seen so far (pruned, timeout)."""

    status: str  # ok | pruned | oom | timeout | failed | rejected
    measured: Measured | None
    record: RunRecord | None = None  # the trainer's own RunRecord (ok runs)
    error: str = ""
    returncode: int | None = None
    duration_s: float = 0.0


class TrialRunner(Protocol):
    def run(
        self, plan: Plan, trial_dir: Path, *, should_stop: StopCheck, on_start: Callable[[int], None]
    ) -> RunOutcome: ...


def check_launcher(template: str | None) -> str | None:
    """A launcher template must say where the training command goes."""
    if template is not None and "{cmd}" not in template:
        raise UserError(
            f"--launcher {template!r} has no {{cmd}}: write where the training command goes, "
            "e.g. 'srun -N4 --ntasks-per-node 8 {cmd}'"
        )
    return template


@dataclass(frozen=True)
class SubprocessRunner:
    """Runs ``python -m exatrain.train --plan ... --steps N`` (optionally inside ``launcher``)."""

    steps: int = 8
    seed: int = 0
    device: str = "cpu"
    timeout_s: float = 900.0
    launcher: str | None = None  # a template with {cmd}; None: local ranks spawned by the trainer
    python: str = sys.executable
    poll_s: float = 0.25
    term_grace_s: float = 5.0
    preflight: Callable[[Plan], None] | None = None  # raises what the trainer would refuse the plan with

    def command(self, plan_path: Path, metrics_path: Path) -> list[str]:
        """The trainer's command line (what {cmd} stands for)."""
        return [
            self.python,
            "-m",
            "exatrain.train",
            "--plan",
            str(plan_path),
            "--steps",
            str(self.steps),
            "--seed",
            str(self.seed),
            "--device",
            self.device,
            "--metrics-file",
            str(metrics_path),
            "--quiet",
        ]

    def argv(self, plan_path: Path, metrics_path: Path) -> list[str]:
        cmd = self.command(plan_path, metrics_path)
        if self.launcher is None:
            return cmd
        return ["/bin/sh", "-c", self.launcher.replace("{cmd}", shlex.join(cmd))]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.launcher is None:
            # The trainer must spawn its own ranks, even when the tuner runs inside a launcher's
            # environment (e.g. a SLURM batch script): hide the variables that would make it one rank.
            for k in _LAUNCHER_ENV:
                env.pop(k, None)
            return env
        # Ranks started by the launcher meet at MASTER_ADDR:MASTER_PORT (a fresh port per trial).
        env.setdefault("MASTER_ADDR", socket.gethostname() if "SLURM_JOB_ID" in env else "127.0.0.1")
        env.setdefault("MASTER_PORT", str(_free_port()))
        env.setdefault("OMP_NUM_THREADS", "1")  # as the trainer's own spawner and torchrun do
        return env

    def run(
        self, plan: Plan, trial_dir: Path, *, should_stop: StopCheck, on_start: Callable[[int], None]
    ) -> RunOutcome:
        trial_dir.mkdir(parents=True, exist_ok=True)
        refused = self._refusal(plan)
        if refused is not None:
            return refused
        plan_path, metrics = trial_dir / "plan.json", trial_dir / "metrics.jsonl"
        plan.save(plan_path)
        metrics.unlink(missing_ok=True)
        argv = self.argv(plan_path.resolve(), metrics.resolve())
        (trial_dir / "command.txt").write_text(shlex.join(argv) + "\n", encoding="utf-8")
        t0 = time.monotonic()
        reader = _MetricsReader(metrics)
        steps: list[dict] = []
        ended, rc = "", None
        with open(trial_dir / "stdout.txt", "wb") as out, open(trial_dir / "stderr.txt", "wb") as err:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=self.environment(), start_new_session=True
            )
            try:
                on_start(proc.pid)
                while rc is None:
                    rc = proc.poll()
                    for line in reader.new_lines():
                        if line.get("kind") != "step":
                            continue
                        steps.append(line)
                        step = int(line["step"])
                        # every post-warm-up step is reported; a stop only counts while the run goes on
                        if (
                            step > WARMUP_STEPS
                            and should_stop(step, float(line["tokens_per_s"]))
                            and rc is None
                            and not ended
                        ):
                            ended = "pruned"
                    if rc is None and not ended and time.monotonic() - t0 > self.timeout_s:
                        ended = "timeout"
                    if rc is None and ended:
                        break
                    if rc is None:
                        time.sleep(self.poll_s)
            finally:
                if proc.poll() is None or ended:
                    _end_group(proc, self.term_grace_s)
        duration = time.monotonic() - t0
        rc = proc.returncode
        for line in reader.new_lines():
            if line.get("kind") == "step":
                steps.append(line)
        return self._outcome(ended, rc, steps, reader.record, trial_dir, duration)

    def _refusal(self, plan: Plan) -> RunOutcome | None:
        """What ``preflight`` refuses the plan with, as an outcome without a run; None to run it."""
        if self.preflight is not None:
            try:
                self.preflight(plan)
            except OutOfMemoryPredicted as exc:
                return RunOutcome("oom", None, None, f"refused before starting: {exc}", None, 0.0)
            except PlanError as exc:
                return RunOutcome("rejected", None, None, f"refused before starting: {exc}", None, 0.0)
        return None

    def _outcome(
        self, ended: str, rc: int | None, steps: list[dict], record: RunRecord | None, trial_dir: Path, duration: float
    ) -> RunOutcome:
        """The finished run as an outcome: timed out or pruned (by the tuner), ok (its RunRecord), killed for
        memory, refused by the trainer (exit 2 before any step), or failed (the last line of its stderr)."""
        if ended == "timeout":
            return RunOutcome(
                "timeout",
                _partial(steps),
                None,
                f"no result within {self.timeout_s:g} s ({len(steps)} of {self.steps} steps done)",
                rc,
                duration,
            )
        if ended == "pruned":
            return RunOutcome(
                "pruned", _partial(steps), None, "stopped after warm-up: far below the best run", rc, duration
            )
        if rc == 0 and record is not None and record.measured is not None:
            return RunOutcome("ok", record.measured, record, "", rc, duration)
        text = _tail(trial_dir / "stderr.txt")
        error = _last_line(text) or (f"exit status {rc}" if rc else "the run wrote no RunRecord")
        if rc != 0 and (_OOM.search(text) or _SIGKILLED.search(text) or rc in (-9, 137)):
            if not _OOM.search(text):
                error = f"killed by SIGKILL (the kernel's out-of-memory killer?): {error}"
            return RunOutcome("oom", _partial(steps), None, error, rc, duration)
        if rc == 2 and not steps:  # `exatrain train` exits 2 on input it refuses, before any rank starts
            return RunOutcome("rejected", None, None, error, rc, duration)
        if rc == 0:
            error = "the run ended without writing its RunRecord"
        return RunOutcome("failed", _partial(steps), None, error, rc, duration)


class _MetricsReader:
    """Reads the JSON lines the trainer appends, a complete line at a time."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.record = path, 0, None
        self._buf = b""

    def new_lines(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        self._buf += chunk
        *complete, self._buf = self._buf.split(b"\n")
        lines = []
        for raw in complete:
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict):
                lines.append(obj)
                if obj.get("kind") == "run_record":
                    try:
                        self.record = RunRecord.from_dict(obj, source=str(self.path))
                    except UserError:
                        pass
        return lines


def _partial(steps: list[dict]) -> Measured | None:
    """Medians of the post-warm-up steps a stopped run managed (None when it got no further)."""
    kept = [s for s in steps if int(s.get("step", 0)) > WARMUP_STEPS]
    if not kept:
        return None
    return Measured(
        steps=len(steps),
        step_time_s=statistics.median(float(s["step_time_s"]) for s in kept),
        tokens_per_s=statistics.median(float(s["tokens_per_s"]) for s in kept),
        first_loss=steps[0].get("loss"),
        last_loss=steps[-1].get("loss"),
    )


def _end_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the run's process group (launchers forward it to their tasks), SIGKILL what is left."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if not _group_alive(proc.pid):
            break
    if proc.poll() is None:
        proc.wait(timeout=10)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _tail(path: Path, limit: int = 64 * 1024) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


__all__ = ["WARMUP_STEPS", "RunOutcome", "StopCheck", "SubprocessRunner", "TrialRunner", "check_launcher"]
