"""Fixtures shared by tests in several packages."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import background

_BACKGROUND: dict[str, background.Job] = {}


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests of a module that declares ``BACKGROUND_JOBS`` (tests/helpers/background.py) run last, in
    their order, so that their commands have the rest of the session to finish on the idle core."""
    modules = []
    for item in items:
        module = getattr(item, "module", None)
        if getattr(module, "BACKGROUND_JOBS", None) and module not in modules:
            modules.append(module)
    if not modules:
        return
    late = [item for item in items if getattr(item, "module", None) in modules]
    items[:] = [item for item in items if getattr(item, "module", None) not in modules] + late
    _BACKGROUND.update(background.of_modules(modules))


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    if not session.config.option.collectonly:
        background.start(_BACKGROUND)


def pytest_sessionfinish(session: pytest.Session) -> None:
    background.stop()


@pytest.fixture(scope="session")
def trainer_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the trainer tests' shared launches (tests/helpers/trainer_launches.py)."""
    return tmp_path_factory.mktemp("trainer-launches")


@pytest.fixture(scope="session", autouse=True)
def early_one_rank_launch(request: pytest.FixtureRequest) -> None:
    """When a selected test needs the trainer tests' one-rank launch (``world1``), start it before the
    first test, in the background at the lowest priority (tests/helpers/trainer_launches.py)."""
    if any("world1" in getattr(item, "fixturenames", ()) for item in request.session.items):
        from tests.helpers.trainer_launches import start_early

        start_early(request.getfixturevalue("trainer_out"), 1)


def _process_group_up() -> bool:
    dist = sys.modules.get("torch.distributed")  # never import torch just to ask
    return dist is not None and dist.is_available() and dist.is_initialized()


@pytest.fixture(autouse=True)
def no_leaked_process_group(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves a process group initialised fails itself, instead of every later test that
    needs one (``init_process_group`` refuses a second default group). The group is torn down so the
    rest of the run is unaffected. Module-scoped ``one_rank`` groups are set up before this check."""
    before = _process_group_up()
    yield
    if not before and _process_group_up():
        import torch.distributed as dist

        dist.destroy_process_group()
        pytest.fail(
            f"{request.node.nodeid} left a process group initialised: run it in a subprocess or tear the group down",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A one-rank gloo process group in this process, for tests that drive a Trainer directly."""
    import torch.distributed as dist

    store: Path = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
