"""Shared launches for the multi-rank checkpoint tests (test_reshard.py, test_resume.py,
test_reshard_ep_cp.py).

A launch (ranks started, torch imported in each, a process group) costs more than a case, so cases of
one world size run in one set of spawned ranks (trainer/spawn.py ``launch_local`` runs its configs one
after another) wherever their order allows: a resume runs after the save it reads. Four launches:
two ranks (resharding, of tp/pp and of ep/cp: the saves, then their resumes on two ranks), four (the resume tests'
straight run, its same-layout resume and llama; resharding's resumes on four ranks), then two and eight (the
resume tests' other layouts, from the four-rank checkpoint). A case is ``group.name`` on disk and is
handed back as ``runs[group][name]``; each module keeps its own folder (``ckpt_out / group``). A
launch fails only when no rank makes progress for ``STALL_S`` (a hang, not a deadline).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.ckpt_runs import Run, run_cases

STALL_S = 900.0


def _launch(out: Path, name: str, groups: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Run]]:
    cases = {f"{group}.{case}": kw for group, of in groups.items() for case, kw in of.items()}
    runs: dict[str, dict[str, Run]] = {group: {} for group in groups}
    for key, run in run_cases(out / name, cases, timeout_s=STALL_S).items():
        group, case = key.split(".", 1)
        runs[group][case] = run
    return runs


@pytest.fixture(scope="session")
def ckpt_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("checkpoint-launches")
    for group in ("reshard", "resume", "reshard_ep_cp"):
        (out / group).mkdir()
    return out


@pytest.fixture(scope="session")
def launch_two(ckpt_out: Path) -> dict[str, dict[str, Run]]:
    from tests.checkpoint import test_reshard, test_reshard_ep_cp

    return _launch(
        ckpt_out,
        "two",
        {
            "reshard": test_reshard.cases_on_two(ckpt_out / "reshard"),
            "reshard_ep_cp": test_reshard_ep_cp.cases_on_two(ckpt_out / "reshard_ep_cp"),
        },
    )


@pytest.fixture(scope="session")
def launch_four(ckpt_out: Path, launch_two: dict) -> dict[str, dict[str, Run]]:
    from tests.checkpoint import test_reshard, test_resume

    return _launch(
        ckpt_out,
        "four",
        {
            "resume": test_resume.cases_on_four(ckpt_out / "resume"),
            "reshard": test_reshard.cases_on_four(ckpt_out / "reshard"),
        },
    )


@pytest.fixture(scope="session")
def launch_two_after_four(ckpt_out: Path, launch_four: dict) -> dict[str, dict[str, Run]]:
    from tests.checkpoint import test_resume

    return _launch(ckpt_out, "two-after-four", {"resume": test_resume.cases_after_four(ckpt_out / "resume", 2)})


@pytest.fixture(scope="session")
def launch_eight(ckpt_out: Path, launch_four: dict) -> dict[str, dict[str, Run]]:
    from tests.checkpoint import test_resume

    return _launch(ckpt_out, "eight", {"resume": test_resume.cases_after_four(ckpt_out / "resume", 8)})
