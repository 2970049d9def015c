"""What `exatrain train` does with the ep and cp layouts `exatrain search --runtime exatrain` finds:
it accepts them as searched and refuses, in one line, the changes the trainer does not run (the rules
of scope "trainer"/"run", exatrain.rules). No ranks are started (the no-launch fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exatrain.cli import main


def _searched(tmp_path: Path, capsys: pytest.CaptureFixture, *argv: str) -> Path:
    out = tmp_path / "best.json"
    assert main(["search", *argv, "--cluster", "local-cpu", "--top", "1", "--json", "--out", str(out)]) == 0
    capsys.readouterr()
    return out


def _refused(argv: list[str], words: str, no_launch: list, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and words in errors[0] and "Traceback" not in err, err
    assert not no_launch


def test_a_searched_ep_layout_trains_and_zero_1_is_refused(
    no_launch: list, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = _searched(
        tmp_path, capsys, "--model", "moe-tiny", "--gpus", "8", "--global-batch", "16", "--ep", "2", "--tp", "1"
    )  # tp 1: --compile is refused for the MoE model, not for tp
    plan = json.loads(path.read_text())
    assert (plan["ep"], plan["zero_stage"]) == (2, 0)
    assert main(["train", "--plan", str(path), "--steps", "2", "--quiet"]) == 0
    (config,) = no_launch
    assert (config.plan.ep, config.plan.dp, config.plan.zero_stage) == (2, plan["dp"], 0)
    no_launch.clear()
    _refused(["--plan", str(path), "--zero", "1", "--quiet"], "--ep 2 runs with --zero 0 only", no_launch, capsys)
    _refused(
        ["--plan", str(path), "--compile", "--quiet"],
        "--compile does not run mixture-of-experts models",
        no_launch,
        capsys,
    )


def test_a_searched_cp_layout_trains_and_compile_is_refused(
    no_launch: list, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """llama-tiny at 8,192 tokens (a long context: the search offers cp)."""
    path = _searched(
        tmp_path,
        capsys,
        "--model",
        "llama-tiny",
        "--seq-len",
        "8192",
        "--gpus",
        "4",
        "--global-batch",
        "8",
        "--cp",
        "2",
        "--tp",
        "1",
    )
    plan = json.loads(path.read_text())
    assert plan["cp"] == 2 and plan["model"]["seq_len"] == 8192
    assert main(["train", "--plan", str(path), "--steps", "2", "--quiet"]) == 0
    (config,) = no_launch
    assert (config.plan.cp, config.plan.gpus) == (2, 4)
    no_launch.clear()
    _refused(["--plan", str(path), "--compile", "--quiet"], "--cp 2 does not run with --compile yet", no_launch, capsys)
