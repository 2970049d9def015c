"""One launch per world size for the multi-rank trainer tests.

Starting ranks (a process and a torch import each, then the process group) costs more than most
cases, so the parity, compile, mixture-of-experts, context-parallel and FP8 cases of a world size run in one set of spawned
ranks (trainer/spawn.py ``launch_local`` runs its configs one after another), shared by the session.
Each module names its cases by world size (``launch_cases``); a case is ``group.name`` on disk and
is handed back as ``runs[group][name]``. Each launch still fails when no rank makes progress for
``STALL_S`` (a hang, not a deadline).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from tests.helpers.trainer_runs import Run, run_batch

STALL_S = 900.0


def _groups() -> dict[str, Callable[[Path], dict[int, dict[str, dict[str, Any]]]]]:
    from tests.trainer import test_compile, test_context_parallel, test_fp8, test_moe, test_parity

    return {"parity": test_parity.launch_cases, "compile": test_compile.launch_cases, "moe": test_moe.launch_cases,
            "cp": test_context_parallel.launch_cases, "fp8": test_fp8.launch_cases}


def _launch(out: Path, world: int) -> dict[str, dict[str, Run]]:
    cases = {}
    for group, of in _groups().items():
        (out / group).mkdir(exist_ok=True)
        cases.update({f"{group}.{name}": kw for name, kw in of(out / group).get(world, {}).items()})
    runs: dict[str, dict[str, Run]] = {group: {} for group in _groups()}
    for key, run in run_batch(out / f"world{world}", cases, timeout_s=STALL_S).items():
        group, name = key.split(".", 1)
        runs[group][name] = run
    return runs


@pytest.fixture(scope="session")
def trainer_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trainer-launches")


@pytest.fixture(scope="session")
def world1(trainer_out: Path) -> dict[str, dict[str, Run]]:
    return _launch(trainer_out, 1)


@pytest.fixture(scope="session")
def world2(trainer_out: Path) -> dict[str, dict[str, Run]]:
    return _launch(trainer_out, 2)


@pytest.fixture(scope="session")
def world4(trainer_out: Path) -> dict[str, dict[str, Run]]:
    return _launch(trainer_out, 4)


@pytest.fixture(scope="session")
def world8(trainer_out: Path) -> dict[str, dict[str, Run]]:
    return _launch(trainer_out, 8)


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> list:
    """Capture the TrainConfigs `exatrain train` would launch instead of starting ranks; clear any
    launcher environment."""
    from exatrain.trainer import spawn

    started: list = []
    monkeypatch.setattr(spawn, "launch_local", lambda configs, **kw: started.extend(configs))
    monkeypatch.setattr(spawn, "run_distributed", lambda config, env: started.append(config))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    return started
