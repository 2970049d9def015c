"""The errors exatrain reports as one line, and the exit status each one gives.

The CLI turns a `UserError` (or a subclass) into one line on stderr, ``exatrain CMD: error: <message>``,
and returns the exception's ``exit_code``; no traceback. Anything else escaping is a bug in exatrain
and keeps its traceback.

Exit statuses (docs/cli.md, "Exit statuses"):

    0    success
    2    bad input: a missing or malformed file, an unknown preset, an impossible layout (UserError)
    3    a training run stopped itself: a non-finite loss under --nan-policy stop (TrainingStopped)
    4    a rank failed: an exception in it, or a signal that killed it (RankFailed)
    5    a rank hung: a collective or step did not complete within the watchdog's timeout (RankHung)
    129  interrupted by SIGHUP (a closed terminal), or a rank whose launcher went away (Interrupted)
    130  interrupted by SIGINT: Ctrl-C (Interrupted)
    143  interrupted by SIGTERM: kill, timeout, a scheduler's time limit or preemption (Interrupted)

An interrupted run exits with 128 + the signal's number, the status a shell gives a process that the
signal ended, so that a batch script can tell a scheduler's stop (143: requeue) from a user's Ctrl-C (130).
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator


class UserError(Exception):
    """Bad input: an unknown preset, indivisible degrees, a malformed file, ...

    The message names the problem and, where there is one, the fix.
    """

    exit_code = 2


class PlanError(UserError):
    """A layout that cannot run: degrees, batch sizes or stage splits do not fit together."""


class TrainingStopped(UserError):
    """A run that stopped itself (a non-finite loss under --nan-policy stop): one line, exit status 3."""

    exit_code = 3


class OutOfMemoryPredicted(PlanError):
    """A run refused before it starts because its memory is predicted not to fit (e.g. the model
    states of a CPU run beyond the machine's memory). The tuner records such a layout as out of
    memory without running it."""


class RunFailed(UserError):
    """A training run that did not finish for a reason other than its input. Reported like bad input
    (one line, no traceback) because the line says all there is: which rank, at which step, why, where
    the last checkpoint is and how to resume. Its subclasses carry the exit status."""

    exit_code = 4


class RankFailed(RunFailed):
    """A rank raised an exception or was killed by a signal: exit status 4."""

    exit_code = 4


class RankHung(RunFailed):
    """A collective or step did not complete within the watchdog's timeout; the message names the
    ranks that did not arrive and what every rank was doing: exit status 5."""

    exit_code = 5


class Interrupted(RunFailed):
    """The run was stopped by a signal (SIGINT, SIGTERM, SIGHUP): exit status 128 + the signal's number
    (130, 143, 129), the status a shell reports for a process that signal ended."""

    exit_code = 130

    def __init__(self, message: str, signum: int = 2) -> None:
        super().__init__(message)
        self.exit_code = 128 + int(signum)


EXIT_STATUSES = {
    0: "success",
    2: "bad input",
    3: "diverged (--nan-policy stop)",
    4: "a rank failed",
    5: "a rank hung (watchdog)",
    129: "interrupted (SIGHUP, or the launcher went away)",
    130: "interrupted (SIGINT)",
    143: "interrupted (SIGTERM)",
}


def error_line(command: str, exc: UserError) -> str:
    """The one line a UserError becomes, as the CLI prints it (also printed by a rank that reports a
    failure itself, under torchrun or srun, where the rank is the CLI process)."""
    return f"exatrain {command}: error: {exc}\n"


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP inside the block end it as Ctrl-C does: Interrupted, one line, exit status 128 + the
    signal (`exatrain train` while it checks its input or prepares data; once ranks run, the launcher,
    trainer/spawn.py, or the rank's monitor, trainer/health.py, takes the signals over and gives these handlers
    back after)."""

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted(f"interrupted ({signal.Signals(signum).name})", signum)

    names = [n for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)]
    old = {getattr(signal, n): signal.signal(getattr(signal, n), interrupt) for n in names}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


__all__ = [
    "EXIT_STATUSES",
    "Interrupted",
    "OutOfMemoryPredicted",
    "PlanError",
    "RankFailed",
    "RankHung",
    "RunFailed",
    "TrainingStopped",
    "UserError",
    "error_line",
    "interrupt_on_signals",
]
