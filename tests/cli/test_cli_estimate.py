"""`exatrain models / hardware / estimate` as a user drives them, bad input included.

Broken on purpose and seen to fail here: the parameter count printed in billions whatever its size
(test_a_small_models_parameters_are_counted_in_a_unit_that_shows_them); the planner commands' --runtime help given
its "default exatrain" clause a second time (test_runtime_help_says_its_default_once).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from exatrain.cli import main
from exatrain.plan import Plan

from tests.helpers.cli import run

ONE_T = [
    "--model",
    "gpt-1t",
    "--cluster",
    "frontier",
    "--gpus",
    "3072",
    "--tp",
    "8",
    "--pp",
    "64",
    "--micro-batch",
    "1",
    "--global-batch",
    "1536",
    "--zero",
    "1",
    "--recompute",
    "full",
]


def test_estimate_json_shape(capsys, tmp_path) -> None:
    code, out, _ = run(capsys, "estimate", *ONE_T, "--json", "--out", str(tmp_path / "p.json"))
    assert code == 0
    d = json.loads(out)
    for key in ("params", "memory_bytes", "memory_by_stage", "capacity_bytes", "fits", "plan"):
        assert key in d
    assert set(d["memory_bytes"]) == {"weights", "gradients", "optimizer", "activations", "other", "total"}
    assert len(d["memory_by_stage"]) == 64
    assert d["plan"]["dp"] == 6 and d["plan"]["num_microbatches"] == 256
    for key in (
        "tp",
        "pp",
        "dp",
        "micro_batch",
        "global_batch",
        "num_microbatches",
        "zero_stage",
        "recompute",
        "sequence_parallel",
        "interleave",
        "schedule",
    ):
        assert key in d["plan"]
    assert d["fits"] is True and d["capacity_bytes"] == 64 * 2**30
    # The saved plan carries the estimate, and the JSON printed is itself loadable as a plan.
    saved = Plan.load(tmp_path / "p.json")
    assert saved.estimate is not None and saved.estimate.params == d["params"]
    (tmp_path / "printed.json").write_text(out)
    assert Plan.load(tmp_path / "printed.json").gpus == 3072


def test_estimate_table(capsys) -> None:
    code, out, _ = run(capsys, "estimate", *ONE_T)
    assert code == 0
    assert "memory per rank" in out and "fits" in out and "1,008.04B params" in out


def test_a_small_models_parameters_are_counted_in_a_unit_that_shows_them(capsys) -> None:
    """gpt-small's 2.7 million parameters read 2.74M, not 0.00B; its stage's 2.743M; gpt-175b's stay in billions."""
    from exatrain.units import count_text

    assert main(["estimate", "--model", "gpt-small", "--cluster", "local-cpu", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "gpt-small (2.74M params)" in out and "│ 2.743M │" in out and "0.00B" not in out
    assert (count_text(174.62e9), count_text(51_200), count_text(12)) == ("174.62B", "51.20K", "12")


def test_runtime_help_says_its_default_once(capsys) -> None:
    assert main(["estimate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    start = text.index("--runtime ENGINE the engine")
    runtime = text[start : text.index("--overlap WHICH", start)]
    assert runtime.count("default exatrain") == 1, runtime


def test_model_flags_override_a_preset(capsys) -> None:
    code, out, _ = run(capsys, "estimate", "--model", "gpt-1t", "--layers", "64", "--gpus", "8", "--tp", "8", "--json")
    d = json.loads(out)
    assert code == 0 and d["plan"]["model"]["layers"] == 64 and d["plan"]["model"]["name"] == "gpt-1t*"
    code, out, _ = run(
        capsys,
        "estimate",
        "--layers",
        "2",
        "--hidden",
        "64",
        "--heads",
        "4",
        "--seq-len",
        "32",
        "--vocab",
        "128",
        "--json",
    )
    assert code == 0 and json.loads(out)["params"] == 2 * (12 * 64 * 64 + 13 * 64) + 160 * 64 + 128


def test_models_and_hardware(capsys) -> None:
    code, out, _ = run(capsys, "models", "--json")
    names = {m["name"] for m in json.loads(out)["models"]}
    assert code == 0 and {"gpt-1t", "llama3-405b"} <= names
    code, out, _ = run(capsys, "hardware", "--json")
    d = json.loads(out)
    assert code == 0 and {c["name"] for c in d["clusters"]} >= {"frontier", "dgx-a100", "dgx-h100", "dgx-h200"}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "gpt-9t"], "unknown model preset 'gpt-9t'"),
        (["--model", "gpt-1t", "--tp", "3"], "not divisible by tp 3"),
        (["--model", "gpt-1t", "--pp", "256"], "every stage needs at least one layer"),
        (["--model", "gpt-1t", "--gpus", "100", "--tp", "8"], "--gpus 100 is not divisible by tp*pp"),
        (["--model", "gpt-1t", "--gpus", "16", "--global-batch", "3"], "not divisible by micro-batch x dp"),
        (["--model", "gpt-1t", "--runtime", "deepspeed"], "--runtime must be one of megatron-core, megatron-deepspeed"),
        (["--model", "gpt-1t", "--runtime", "torchtitan", "--gpus", "16", "--zero", "1"], "has no ZeRO stage 1"),
        (["--model", "gpt-1t", "--hidden", "-5"], "expected a positive integer"),
        (["--model", "gpt-1t", "--cluster", "summit"], "unknown cluster 'summit'"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, message) -> None:
    code = main(["estimate", *argv])
    out, err = capsys.readouterr()
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert out == ""


def test_malformed_files_from_the_shell(tmp_path) -> None:
    bad = tmp_path / "m.toml"
    bad.write_text("layers = [")
    cl = tmp_path / "c.json"
    cl.write_text('{"device": "h100-sxm"}')
    for extra in (["--model-file", str(bad)], ["--model", "gpt-1t", "--cluster-file", str(cl)]):
        r = subprocess.run([sys.executable, "-m", "exatrain.cli", "estimate", *extra], capture_output=True, text=True)
        assert r.returncode == 2
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
