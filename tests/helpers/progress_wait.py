"""Waiting on slow multi-process work without wall-clock deadlines on a correct run.

A loaded machine makes correct runs slow; a deadline would fail them. These helpers fail only when
nothing moves for ``idle_s`` seconds: no file under the watched paths grows, appears or changes, and
the caller's own progress value stays the same. A hang still ends the test (and kills what it started).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

import pytest

IDLE_S = 300.0  # generous: a correct run on a busy 2-core machine writes something far more often


def _walk(root: Path) -> list[Path]:
    """Every path under ``root``, skipping folders that vanish while they are listed (a checkpoint's
    ``.tmp-step-*`` folder is renamed into place while a test polls: ``rglob`` would raise)."""
    found = []
    for folder, dirs, files in os.walk(root, onerror=lambda exc: None):
        found.extend(Path(folder) / name for name in (*dirs, *files))
    return sorted(found)


def tree_state(paths: Sequence[Path]) -> tuple:
    """Names, sizes and modification times of every file under ``paths`` (files or folders)."""
    out = []
    for root in paths:
        root = Path(root)
        items = [root] if root.is_file() else _walk(root) if root.is_dir() else []
        for p in items:
            try:
                st = p.stat()
            except OSError:
                continue
            out.append((str(p), st.st_size, st.st_mtime_ns))
    return tuple(out)


def wait_for(
    done: Callable[[], bool],
    *,
    watch: Sequence[Path] = (),
    progress: Callable[[], object] = lambda: None,
    idle_s: float = IDLE_S,
    poll_s: float = 0.05,
    what: str = "the run",
    on_idle: Callable[[], str] = lambda: "",
) -> None:
    """Poll until ``done()``; pytest.fail when neither the files under ``watch`` nor ``progress()``
    changed for ``idle_s`` seconds (``on_idle`` returns text for the failure message)."""
    mark: object = None
    moved = time.monotonic()
    while not done():
        now = time.monotonic()
        state = (tree_state(watch), progress())
        if state != mark:
            mark, moved = state, now
        elif now - moved > idle_s:
            pytest.fail(f"{what} made no progress for {idle_s:.0f} s\n{on_idle()}")
        time.sleep(poll_s)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def start(cmd: Sequence[str], out_dir: Path, name: str, **popen) -> tuple[subprocess.Popen, Path, Path]:
    """Start ``cmd`` in its own process group with stdout and stderr in files under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stdout, stderr = out_dir / f"{name}.out", out_dir / f"{name}.err"
    with open(stdout, "w") as o, open(stderr, "w") as e:
        proc = subprocess.Popen(list(cmd), stdout=o, stderr=e, start_new_session=True, **popen)
    return proc, stdout, stderr


def finish(
    procs: Sequence[subprocess.Popen],
    watch: Sequence[Path],
    logs: Sequence[Path],
    idle_s: float = IDLE_S,
    what: str = "the command",
) -> None:
    """Wait for every process while anything under ``watch`` (and the logs) still moves; on a stall,
    kill their process groups and fail with the logs' tails."""

    def tails() -> str:
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if Path(p).is_file())

    try:
        wait_for(
            lambda: all(p.poll() is not None for p in procs),
            watch=[*watch, *logs],
            idle_s=idle_s,
            poll_s=0.2,
            what=what,
            on_idle=tails,
        )
    finally:
        for p in procs:
            if p.poll() is None:
                kill_group(p)


def run(
    cmd: Sequence[str], out_dir: Path, name: str, watch: Sequence[Path] = (), idle_s: float = IDLE_S, **popen
) -> tuple[int, str, str]:
    """Run ``cmd`` to its end (unless it stalls): (exit status, stdout, stderr)."""
    proc, stdout, stderr = start(cmd, out_dir, name, **popen)
    finish([proc], watch, [stdout, stderr], idle_s, what=" ".join(map(str, cmd[:6])))
    return proc.returncode, stdout.read_text(errors="replace"), stderr.read_text(errors="replace")


__all__ = ["IDLE_S", "finish", "kill_group", "run", "start", "tree_state", "wait_for"]
