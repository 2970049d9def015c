"""The trainer tests' shared launches (tests/trainer/conftest.py): one per world size, each module's
cases of that size in one set of spawned ranks.

The one-rank launch keeps one core busy for its whole length (its rank alone: no peer to share the
work with), so when a session will need it, tests/conftest.py starts it before the first test, in a
thread whose spawned rank runs at the lowest priority (nice 19): it takes only CPU the rest of the
suite leaves idle, and the ``world1`` fixture waits for what is left of it. Its cases, configs, stall
limit and checks are those of a launch in the foreground.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable

from tests.helpers.trainer_runs import Run, default_data, run_batch

STALL_S = 900.0  # a launch fails when no rank makes progress for this long (a hang, not a deadline)
NICE = 19


def groups() -> dict[str, Callable[[Path], dict[int, dict[str, dict[str, Any]]]]]:
    from tests.trainer import (
        test_compile,
        test_context_parallel,
        test_fp8,
        test_moe,
        test_parity,
        test_schedules_parity,
    )

    return {
        "parity": test_parity.launch_cases,
        "compile": test_compile.launch_cases,
        "moe": test_moe.launch_cases,
        "cp": test_context_parallel.launch_cases,
        "fp8": test_fp8.launch_cases,
        "schedules": test_schedules_parity.launch_cases,
    }


def launch(out: Path, world: int) -> dict[str, dict[str, Run]]:
    """Every module's cases of ``world`` ranks in one launch; ``runs[group][name]``."""
    cases = {}
    for group, of in groups().items():
        (out / group).mkdir(exist_ok=True)
        cases.update({f"{group}.{name}": kw for name, kw in of(out / group).get(world, {}).items()})
    runs: dict[str, dict[str, Run]] = {group: {} for group in groups()}
    for key, run in run_batch(out / f"world{world}", cases, timeout_s=STALL_S).items():
        group, name = key.split(".", 1)
        runs[group][name] = run
    return runs


class _Early:
    """A launch running in a thread of its own; ``get`` waits for it and hands back what ``launch``
    returned or raises what it raised."""

    def __init__(self, out: Path, world: int) -> None:
        self.out, self.world = out, world
        self.runs: dict[str, dict[str, Run]] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"early-launch-{world}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            try:  # this thread only (Linux: a thread's nice value), inherited by the ranks it spawns
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
            except OSError:
                pass
            self.runs = launch(self.out, self.world)
        except BaseException as exc:  # noqa: B036 - raised again in the fixture that waits
            self.error = exc
        finally:
            self.done.set()

    def get(self) -> dict[str, dict[str, Run]]:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.runs is not None
        return self.runs


_early: dict[tuple[Path, int], _Early] = {}


def start_early(out: Path, world: int) -> None:
    """Start the ``world``-rank launch now, in the background. The dataset is found here first (in the
    calling thread, before any test can patch what finding it uses)."""
    default_data()
    if (out, world) not in _early:
        _early[(out, world)] = _Early(out, world)


def launched(out: Path, world: int) -> dict[str, dict[str, Run]]:
    """The launch's runs: waited for when it was started early, else launched now."""
    early = _early.get((out, world))
    return early.get() if early is not None else launch(out, world)
