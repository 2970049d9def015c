"""One launch per world size for the multi-rank trainer tests.

Starting ranks (a process and a torch import each, then the process group) costs more than most
cases, so the parity, compile, mixture-of-experts, context-parallel, FP8 and pipeline-schedule cases of a world
size run in one set of spawned ranks (trainer/spawn.py ``launch_local`` runs its configs one after another),
shared by the session.
Each module names its cases by world size (``launch_cases``); a case is ``group.name`` on disk and
is handed back as ``runs[group][name]``. Each launch still fails when no rank makes progress for
``STALL_S`` (a hang, not a deadline). The launches themselves are in tests/helpers/trainer_launches.py;
the one-rank launch starts with the session, in the background (see there).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.trainer_launches import launch, launched
from tests.helpers.trainer_runs import Run

# (trainer_out, the launches' folder, is in tests/conftest.py, which may start the one-rank launch early)


def _announced(request: pytest.FixtureRequest, world: int, start) -> dict[str, dict[str, Run]]:
    """``start()`` (a launch), with a line on the terminal before and after it: a shared launch runs minutes
    before the first test that needs it finishes, and ``pytest -q`` prints nothing meanwhile."""
    import time

    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    capman = request.config.pluginmanager.get_plugin("capturemanager")

    def say(text: str) -> None:
        if tr is not None and capman is not None:
            with capman.global_and_fixture_disabled():
                tr.write_line(text)

    say(f"[trainer tests: the {world}-rank cases of every module, one shared launch; minutes on a few cores]")
    t0 = time.perf_counter()
    runs = start()
    say(f"[trainer tests: the {world}-rank launch took {time.perf_counter() - t0:.0f} s]")
    return runs


@pytest.fixture(scope="session")
def world1(request: pytest.FixtureRequest, trainer_out: Path) -> dict[str, dict[str, Run]]:
    return _announced(request, 1, lambda: launched(trainer_out, 1))


@pytest.fixture(scope="session")
def world2(request: pytest.FixtureRequest, trainer_out: Path) -> dict[str, dict[str, Run]]:
    return _announced(request, 2, lambda: launch(trainer_out, 2))


@pytest.fixture(scope="session")
def world4(request: pytest.FixtureRequest, trainer_out: Path) -> dict[str, dict[str, Run]]:
    return _announced(request, 4, lambda: launch(trainer_out, 4))


@pytest.fixture(scope="session")
def world8(request: pytest.FixtureRequest, trainer_out: Path) -> dict[str, dict[str, Run]]:
    return _announced(request, 8, lambda: launch(trainer_out, 8))


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
