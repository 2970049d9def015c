"""A new run setting is one record: a throwaway setting registered in a fresh interpreter (its record appended to
the registry and its ``RunSettings`` field and ``SettingsView`` property added, as a real one writes them, before
anything else of exatrain loads) gets its flag,
its rule (in ``Plan.validate`` and in ``check_settings`` before a search), its estimate note, each engine's own
value and its plan-JSON key with nothing else written; and docs/architecture.md's list of the places a real one
goes names four.

Broken on purpose and seen to fail here: ``estimate_notes`` skipping the settings NOTE_ORDER does not name (the
note test); ``resolve`` reading only ``Setting.own`` and not ``Setting.engines`` (the engine-default test);
``check_settings`` skipping the records marked ``before_search`` (the check_settings test).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Registers ``toy_knob`` (choices low, high; each engine's own: high, exatrain low) and runs exatrain's CLI with the
# arguments after the script name.
_SCRIPT = r"""
import sys

import exatrain.registry as registry
from exatrain.registry.exports import label
from exatrain.registry.record import Own, Setting
from exatrain.registry.vocab import RUNTIMES

def _rule(v, p):
    if v and v not in ("low", "high"):
        return f"--toy-knob must be one of low, high, got {v!r}"
    if v == "high" and p.runtime == "exatrain":
        return "--toy-knob high is not run by exatrain: use --runtime megatron-core, or drop it"
    return None

TOY = Setting(
    "toy_knob",
    str,
    "",
    choices=("low", "high"),
    help="a throwaway knob: low or high; default: the runtime's",
    problem=_rule,
    before_search=True,
    label=label("toy {v}"),
    note=lambda f: f"toy knob: {f.run.toy_knob} ({f.plan.runtime}'s own: {TOY.engines[f.plan.runtime].source})",
    engines={rt: Own("low" if rt == "exatrain" else "high", f"{rt} toy source") for rt in RUNTIMES},
)
registry.SETTINGS = registry.SETTINGS + (TOY,)
registry.BY_NAME = {s.name: s for s in registry.SETTINGS}
registry.NAMES = tuple(registry.BY_NAME)
registry.FLAG_SETTINGS = registry.FLAG_SETTINGS + (TOY,)

import dataclasses

import exatrain.run_settings as run_settings


@dataclasses.dataclass(frozen=True)
class RunSettings(run_settings.RunSettings):  # the field a real setting writes into run_settings.RunSettings
    toy_knob: str = ""


run_settings.RunSettings = RunSettings
run_settings.SettingsView.toy_knob = property(lambda self: self.settings.toy_knob)

if sys.argv[1] == "--check":  # check_settings(values, runtime=...) as a search runs it before it enumerates
    from exatrain.errors import UserError
    from exatrain.settings import check_settings

    try:
        check_settings({"toy_knob": sys.argv[2]}, runtime=sys.argv[3])
    except UserError as e:
        sys.exit(f"refused: {e}")
    sys.exit(0)

from exatrain.cli import main

sys.exit(main(sys.argv[1:]))
"""
_PLAN = ["--model", "gpt-1.4b", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "2", "--global-batch", "16"]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )


@pytest.fixture(scope="module")
def megatron() -> dict:
    """An estimate for Megatron-Core with the knob left to the engine's own."""
    done = _run("estimate", *_PLAN, "--runtime", "megatron-core", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_flag_and_the_json_key() -> None:
    """The flag exists with its record's choices; a value given is the plan JSON's flat key and in its label."""
    helped = _run("estimate", "--help")
    assert "--toy-knob" in helped.stdout and "{low,high}" in helped.stdout
    done = _run("estimate", *_PLAN, "--runtime", "megatron-core", "--toy-knob", "high", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["plan"]["toy_knob"] == "high"


def test_the_engine_default_and_the_note(megatron: dict) -> None:
    """Left unset, the plan JSON has no key, and the estimate's note reads the engine's own value and source."""
    assert "toy_knob" not in megatron["plan"]
    notes = megatron["notes"]
    assert "toy knob: high (megatron-core's own: megatron-core toy source)" in notes
    done = _run("estimate", *_PLAN, "--runtime", "exatrain", "--json")
    assert "toy knob: low (exatrain's own: exatrain toy source)" in json.loads(done.stdout)["notes"]


def test_the_rule_refuses_a_plan() -> None:
    """The record's rule is a plan's: one line, exit status 2, no traceback."""
    done = _run("estimate", *_PLAN, "--runtime", "exatrain", "--toy-knob", "high")
    assert done.returncode == 2
    assert "--toy-knob high is not run by exatrain" in done.stderr and "Traceback" not in done.stderr


def test_check_settings_runs_the_rule_before_a_search() -> None:
    """``before_search``: ``check_settings`` (a search's check before it enumerates) runs the record's rule."""
    refused = _run("--check", "high", "exatrain")
    assert refused.returncode == 1 and "refused: --toy-knob high is not run by exatrain" in refused.stderr
    assert _run("--check", "high", "megatron-core").returncode == 0


def test_the_rule_refuses_a_search() -> None:
    """A search with the value refuses it with the rule's line."""
    done = _run(
        "search",
        "--model",
        "gpt-1.4b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "8",
        "--global-batch",
        "16",
        "--runtime",
        "exatrain",
        "--toy-knob",
        "high",
    )
    assert done.returncode == 2
    assert "--toy-knob high is not run by exatrain" in done.stderr and "Traceback" not in done.stderr


def test_the_doc_names_four_places() -> None:
    """docs/architecture.md's "Where a new setting goes" is a list of four, each naming files that exist."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("### Where a new setting goes", 1)[1].split("\n#", 1)[0]
    items = re.findall(r"^(\d+)\. \*\*(.+?)\*\*", section, flags=re.M)
    assert [n for n, _ in items] == ["1", "2", "3", "4"], items
    for _, where in items:
        for path in re.findall(r"`(src/[^`]+|tests/[^`]+)`", where):
            assert (ROOT / path.rstrip("/").split("...")[0]).exists(), path
