"""Single-process commands whose output a test only reads, run on the otherwise idle core.

Most of the suite keeps one core busy (one pytest process, or one CLI subprocess it waits on), and a
few tests start a long single-process command (the memory traces, `estimate --trace`) and only read
what it printed. A test module lists those commands in ``BACKGROUND_JOBS`` (name -> ``Job``); before
the first test runs, tests/conftest.py starts them one after another in a thread, each subprocess at
the lowest priority (nice 19, OMP_NUM_THREADS=1), so it takes only CPU that the rest of the suite leaves
idle, and moves that module's tests to the end of the session. A test gets the finished command with
``result(name)``: the same ``subprocess.CompletedProcess`` that ``subprocess.run(argv,
capture_output=True, text=True)`` gives, and its checks are unchanged. The command's ``timeout_s``
counts from when a test starts waiting for it (a deadline while it is only soaking up idle time would
fail a correct run on a busy machine); past it the command is killed and ``TimeoutExpired`` raised.

Outside such a session (a job never started: a module run alone under xdist, an import from a script)
``result`` runs the command itself, in the foreground, once: modules that list one job under one name
(tests/helpers/trace_jobs.py) share its result.
"""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Iterable, Sequence

NICE = 19


@dataclass
class Job:
    argv: Sequence[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the environment of the session's start
    timeout_s: float = 600.0
    cwd: str | None = None  # default: the session's working directory when the jobs were started
    proc: subprocess.Popen | None = field(default=None, repr=False)
    result: subprocess.CompletedProcess | None = field(default=None, repr=False)
    done: threading.Event = field(default_factory=threading.Event, repr=False)
    error: BaseException | None = field(default=None, repr=False)


_jobs: dict[str, Job] = {}
_foreground: dict[str, subprocess.CompletedProcess] = {}  # jobs never started, run by ``result``
_lock = threading.Lock()
_stopping = threading.Event()


def start(jobs: dict[str, Job]) -> None:
    """Run ``jobs`` one after another in a daemon thread. The environment and working directory are
    taken now, before any test can change them."""
    if not jobs:
        return
    env, cwd = dict(os.environ), os.getcwd()
    with _lock:
        fresh = {name: job for name, job in jobs.items() if name not in _jobs}
        _jobs.update(fresh)
    threading.Thread(target=_work, args=(list(fresh.values()), env, cwd), name="background-jobs", daemon=True).start()


def _work(jobs: list[Job], env: dict[str, str], cwd: str) -> None:
    for job in jobs:
        if _stopping.is_set():
            job.error = RuntimeError("the session ended before this background job ran")
            job.done.set()
            continue
        try:
            job.proc = subprocess.Popen(
                list(job.argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**env, "OMP_NUM_THREADS": "1", **job.env},
                cwd=job.cwd or cwd,
            )
            try:
                os.setpriority(os.PRIO_PROCESS, job.proc.pid, NICE)
            except OSError:
                pass  # it ran a moment at normal priority, or a platform without it: only slower
            out, err = job.proc.communicate()
            job.result = subprocess.CompletedProcess(list(job.argv), job.proc.returncode, out, err)
        except BaseException as exc:  # noqa: B036 - handed to the test that waits for it
            job.error = exc
        finally:
            job.done.set()


def result(name: str, jobs: dict[str, Job]) -> subprocess.CompletedProcess:
    """The finished command ``name`` of ``jobs`` (a module's ``BACKGROUND_JOBS``): waited for when it
    runs in the background, run here when it was never started."""
    with _lock:
        job = _jobs.get(name)
    if job is None:
        if name not in _foreground:
            own = jobs[name]
            _foreground[name] = subprocess.run(
                list(own.argv),
                capture_output=True,
                text=True,
                timeout=own.timeout_s,
                env={**os.environ, "OMP_NUM_THREADS": "1", **own.env},
                cwd=own.cwd,
            )
        return _foreground[name]
    if not job.done.wait(job.timeout_s):
        if job.proc is not None:
            job.proc.kill()
        raise subprocess.TimeoutExpired(list(job.argv), job.timeout_s)
    if job.error is not None:
        raise job.error
    assert job.result is not None
    return job.result


def stop() -> None:
    """Kill what still runs (the session ended first: an interrupt, -x, a deselected consumer)."""
    _stopping.set()
    with _lock:
        running = [job.proc for job in _jobs.values() if job.proc is not None and job.proc.poll() is None]
    for proc in running:
        proc.kill()


def of_modules(modules: Iterable[object]) -> dict[str, Job]:
    """Every job the given test modules declare, in module order."""
    found: dict[str, Job] = {}
    for module in modules:
        found.update(getattr(module, "BACKGROUND_JOBS", None) or {})
    return found


__all__ = ["Job", "of_modules", "result", "start", "stop"]
