"""Fixtures shared by tests in several packages, and how `make test` splits the suite over two processes.

`make test` runs pytest-xdist (``-n 2 --dist loadscope``): two pytest processes, each handed whole work units.
A unit is a module, or the modules that share a session-scoped launch or output (``SHARED_UNITS``), which run
in one process so that it is made once; the longest units are handed out first (``FIRST``). Under xdist the
one-rank trainer launch and the background jobs (tests/helpers/background.py) are not started early: the
other process takes the idle core they would soak up, and each runs when a test first needs it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import background

_BACKGROUND: dict[str, background.Job] = {}

# Modules (or folders) whose tests share a session-scoped fixture: one work unit each.
SHARED_UNITS = {
    "tests/trainer/test_parity.py": "trainer launches",
    "tests/trainer/test_compile.py": "trainer launches",
    "tests/trainer/test_moe.py": "trainer launches",
    "tests/trainer/test_context_parallel.py": "trainer launches",
    "tests/trainer/test_fp8.py": "trainer launches",
    "tests/trainer/test_schedules_parity.py": "trainer launches",
    "tests/checkpoint/test_reshard.py": "checkpoint launches",
    "tests/checkpoint/test_resume.py": "checkpoint launches",
    "tests/checkpoint/test_reshard_ep_cp.py": "checkpoint launches",
    "tests/report/": "report",  # tests/report/conftest.py's CLI outputs
    # tests/helpers/trace_jobs.py's one trace process
    "tests/bench/test_trace.py": "trace matrix",
    "tests/bench/test_trace_fast.py": "trace matrix",
    "tests/bench/test_trace_moe_cp.py": "trace matrix",
    "tests/bench/test_trace_counted.py": "trace matrix",
}
# The launches SHARED_UNITS exist for: a module whose tests use one must be listed there.
SHARED_FIXTURES = {"world1", "world2", "world4", "world8"} | {
    "launch_two",
    "launch_four",
    "launch_two_after_four",
    "launch_eight",
}
# The longest units (multi-rank launches, refits, traces: a minute or more each on two quiet cores), handed out
# before the rest in this order, so that no long one starts last. The modules with BACKGROUND_JOBS are among them:
# under xdist their commands run when their tests need them.
FIRST = (
    "trainer launches",
    "tests/bench/test_prediction_error.py",
    "checkpoint launches",
    "trace matrix",
    "tests/trainer/test_failures.py",
    "tests/test_readme_examples.py",
    "tests/cli/test_cli_surface.py",
    "tests/planner/test_search.py",
    "tests/checkpoint/test_crash.py",
    "tests/tuning/test_tune_live.py",
    "tests/launch/test_launch_live.py",
    "tests/planner/test_calibration.py",
    "tests/api/test_demo.py",
)
XDIST_WORKER = "PYTEST_XDIST_WORKER" in os.environ


TERMINAL_ENV = ("COLUMNS", "LINES")  # readline sets them in an xdist worker (80 x 24); a serial session has none


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(xdist's controller) Hand each worker this session's terminal size variables, unset ones included."""
    node.workerinput["terminal_env"] = {name: os.environ.get(name) for name in TERMINAL_ENV}


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist worker, the controller's terminal size variables: commands that size their tables by COLUMNS
    (report/text.py: 160 columns when it is unset) print what they print in one pytest process."""
    for name, value in getattr(config, "workerinput", {}).get("terminal_env", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def unit_of(nodeid: str) -> str:
    """The work unit of a test under ``--dist loadscope``: its module, or the shared unit it belongs to."""
    module = nodeid.split("::", 1)[0]
    for prefix, unit in SHARED_UNITS.items():
        if module == prefix or (prefix.endswith("/") and module.startswith(prefix)):
            return unit
    return module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope`` with this suite's units (``unit_of``), the ``FIRST`` ones handed out first."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the queue is complete before the first unit is handed out
                self.ordered = True
                rank = {unit: n for n, unit in enumerate(FIRST)}
                units = sorted(self.workqueue.items(), key=lambda kv: rank.get(kv[0], len(rank)))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return Units(config, log)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests of a module that declares ``BACKGROUND_JOBS`` (tests/helpers/background.py) run last, in
    their order, so that their commands have the rest of the session to finish on the idle core."""
    modules = []
    for item in items:
        module = getattr(item, "module", None)
        if getattr(module, "BACKGROUND_JOBS", None) and module not in modules:
            modules.append(module)
    for item in items:
        shared = SHARED_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if shared and unit_of(item.nodeid) == item.nodeid.split("::", 1)[0]:
            raise pytest.UsageError(
                f"{item.nodeid} uses the shared launch {sorted(shared)[0]}: list its module in tests/conftest.py's "
                "SHARED_UNITS, or each xdist process launches it again"
            )
    if not modules:
        return
    late = [item for item in items if getattr(item, "module", None) in modules]
    items[:] = [item for item in items if getattr(item, "module", None) not in modules] + late
    _BACKGROUND.update(background.of_modules(modules))


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    if not session.config.option.collectonly and not XDIST_WORKER:
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
    if XDIST_WORKER:
        return
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
