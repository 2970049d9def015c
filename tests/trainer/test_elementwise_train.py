"""`exatrain train` runs a plan's element-wise ops as the plan was priced (plan.ELEMENTWISE): a plan
made with --elementwise fused needs --compile, an eager one runs without it; each mismatch is one line
and exit 2, and nothing is launched (the no-launch fixture).

Deliberate bug this was seen to catch: the fused-needs-compile check removed from TrainConfig."""

from __future__ import annotations

from pathlib import Path

import pytest

from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster
from exatrain.cli import main


def _plan(tmp_path: Path, elementwise: str) -> Path:
    path = tmp_path / f"{elementwise or 'own'}.json"
    make_plan(
        "gpt-tiny", get_cluster("local-cpu"), gpus=1, global_batch=2, dtype="float32", elementwise=elementwise
    ).save(path)
    return path


@pytest.mark.parametrize(
    "elementwise,flags,words",
    [
        ("fused", [], "train it with --compile"),
        ("eager", ["--compile"], "train it without --compile"),
    ],
)
def test_a_mismatch_is_one_line(elementwise, flags, words, tmp_path, no_launch, capsys) -> None:
    assert main(["train", "--plan", str(_plan(tmp_path, elementwise)), "--steps", "1", "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "error:" in line and words in line] and "Traceback" not in err, err
    assert not no_launch


def test_matching_plans_are_launched(tmp_path, no_launch) -> None:
    assert main(["train", "--plan", str(_plan(tmp_path, "eager")), "--steps", "1", "--quiet"]) == 0
    assert main(["train", "--plan", str(_plan(tmp_path, "")), "--steps", "1", "--quiet"]) == 0
    assert len(no_launch) == 2
