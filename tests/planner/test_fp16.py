"""float16 training (``--dtype float16``): mixed precision over fp32 master weights with dynamic loss scaling, planned
for the runtimes that run it (settings.FLOAT16_RUNTIMES), exported as each writes it, refused where a runtime has
none (torchtitan). Priced as the runtime's own 16-bit-gradient variant of bfloat16 training (the same states, the
same GEMM peak) plus the loss scaler's work every step: the unscale of the gradients (a pass in the optimizer step,
``EngineProfile.step_pass_bytes``) and the found-inf all-reduce before the update (``cost.step.loss_scaling_s``).

Broken on purpose and seen to fail here: ``loss_scaling_s`` left out of ``step_times`` (the optimizer test), the
unscale's 8 bytes dropped from Megatron-Core's float16 step-pass row (the optimizer test), FLOAT16_RUNTIMES offering
torchtitan (the refusal tests), the DeepSpeed config without its fp16 block (the export test), the Megatron-LM
reader keeping --fp16 as bfloat16 (the round-trip test)."""

from __future__ import annotations

import numpy as np
import pytest

from exatrain.accounting.engines import get_engine
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster
from exatrain.engine_configs import export
from exatrain.engine_configs.megatron import deepspeed_config, render_megatron
from exatrain.errors import UserError
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.cost.step import loss_scaling_s
from exatrain.planner.estimate import estimate_plan
from exatrain.settings import FLOAT16_RUNTIMES, dtype_problem
from tests.helpers.cli import refused_by_planner, run
from tests.helpers.passes import pass_seconds

A100 = get_cluster("dgx-a100")
FRONTIER = get_cluster("frontier")


def _plan(runtime: str, dtype: str = "float16", **kw):
    args = dict(gpus=16, tp=1, pp=1, micro_batch=1, global_batch=64, zero=1, recompute="full", runtime=runtime)
    args.update(kw)
    return make_plan("llama3-8b", A100, dtype=dtype, **args)


# The bfloat16 plan each runtime's float16 is priced against (its 16-bit-gradient variant) and the bytes a
# parameter the loss scaler's unscale adds to its optimizer step, on (the stage, the gradients held, the shard)
AGAINST = {
    "megatron-core": ({"grad_accum": "bfloat16"}, (0.0, 0.0, 8.0)),
    "megatron-deepspeed": ({}, (0.0, 0.0, 2.0)),
    "exatrain": ({}, (0.0, 8.0, 0.0)),
}


@pytest.mark.parametrize("runtime", FLOAT16_RUNTIMES)
def test_states_and_compute_are_the_16_bit_variants_and_the_optimizer_pays_the_loss_scaling(runtime: str) -> None:
    settings, (whole_b, held_b, shard_b) = AGAINST[runtime]
    fp16, bf16 = _plan(runtime), _plan(runtime, "bfloat16", **settings)
    params = default_params(A100.device.name)
    got, ref = estimate_plan(fp16, A100, params), estimate_plan(bf16, A100, params)
    assert got.memory_bytes == ref.memory_bytes
    assert got.time_s.compute == ref.time_s.compute and got.time_s.dp_comm == pytest.approx(ref.time_s.dp_comm)
    # pp 1, ZeRO-1 over dp 16: the rank holds every parameter and updates a sixteenth of them
    unscale = float(pass_seconds(fp16, A100, whole_b + held_b + shard_b / fp16.dp)[0, 0])
    found_inf = float(loss_scaling_s(A100, params, "float16", np.array([fp16.gpus]))[0])
    assert found_inf > 0
    assert got.time_s.optimizer - ref.time_s.optimizer == pytest.approx(unscale + found_inf, rel=1e-9)
    assert any("dynamic loss scaling" in n for n in got.notes)
    assert not any("dynamic loss scaling" in n for n in ref.notes)


def test_the_loss_scaling_costs_nothing_outside_float16() -> None:
    params = default_params(A100.device.name)
    for dtype in ("bfloat16", "float32"):
        assert float(loss_scaling_s(A100, params, dtype, np.array([16]))[0]) == 0.0
    # a latency-bound all-reduce of one flag: more ranks, more hops
    small, big = loss_scaling_s(A100, params, "float16", np.array([16, 1024]))
    assert 0 < small < big < 1e-3


def test_each_float16_runtime_has_its_state_rows() -> None:
    for runtime in FLOAT16_RUNTIMES:
        engine = get_engine(runtime)
        assert engine.zero_stages("float16"), runtime
        assert engine.loss_scale_source, runtime
        for z in engine.zero_stages("float16"):  # the same bytes as its 16-bit-gradient bfloat16 variant
            accum = engine.accum_dtype("float16")
            bf16 = engine.with_grad_accum("bfloat16" if accum == "float16" else accum)
            got, want = engine.state_rule("float16", z), bf16.state_rule("bfloat16", z)
            if (runtime, z) == ("megatron-deepspeed", 0):
                # except DeepSpeed without ZeRO: bf16 runs its BF16_Optimizer (fp32 master partitioned over dp),
                # fp16 its FP16_Optimizer, the ZeRO paper's baseline of 16 bytes a parameter, nothing partitioned
                assert got.bytes_per_param(8) == (6.0, 2.0, 8.0) != want.bytes_per_param(8)
                continue
            assert got.bytes_per_param(8) == want.bytes_per_param(8), (runtime, z)


def test_the_frontier_175b_run_estimates_and_exports_fp16(capsys, tmp_path) -> None:
    args = (
        "--model",
        "gpt-175b",
        "--cluster",
        "frontier",
        "--gpus",
        "128",
        "--tp",
        "4",
        "--pp",
        "16",
        "--micro-batch",
        "1",
        "--global-batch",
        "640",
        "--zero",
        "1",
        "--recompute",
        "full",
        "--runtime",
        "megatron-deepspeed",
        "--dtype",
        "float16",
    )
    code, out, err = run(capsys, "estimate", *args, "--out", str(tmp_path / "p.json"))
    assert code == 0, err
    assert "float16" in out
    code, out, err = run(capsys, "export-config", "--plan", str(tmp_path / "p.json"), "--for", "megatron")
    assert code == 0, err
    assert "--fp16" in out and "--bf16" not in out


def test_exports_write_fp16() -> None:
    ds = deepspeed_config(_plan("megatron-deepspeed"))
    assert ds["fp16"] == {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": 16,
        "loss_scale_window": 1000,
        "hysteresis": 2,
        "min_loss_scale": 1,
    }
    assert ds["bf16"] == {"enabled": False}
    assert "fp16" not in deepspeed_config(_plan("megatron-deepspeed", "bfloat16"))
    for runtime in ("megatron-core", "megatron-deepspeed"):
        text = render_megatron(_plan(runtime)).text
        assert "--fp16" in text and "--bf16" not in text
        assert "--bf16" in render_megatron(_plan(runtime, "bfloat16")).text
    with pytest.raises(UserError, match="torchtitan .*float16"):
        export(_plan("megatron-core"), "torchtitan")


@pytest.mark.parametrize("target", ["megatron", "deepspeed"])
def test_an_exported_fp16_launch_reads_back_as_float16(capsys, tmp_path, target: str) -> None:
    import json

    runtime = {"megatron": "megatron-core", "deepspeed": "megatron-deepspeed"}[target]
    plan_file, args = tmp_path / "plan.json", tmp_path / "args.sh"
    code, out, err = run(
        capsys,
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-a100",
        "--runtime",
        runtime,
        "--gpus",
        "16",
        "--zero",
        "1",
        "--dtype",
        "float16",
        "--out",
        str(plan_file),
        "--json",
    )
    assert code == 0, err
    want = json.loads(out)["plan"]
    assert want["dtype"] == "float16"
    # (megatron-deepspeed's ZeRO-1 plan is predicted above the A100's memory: --force writes it all the same)
    assert (
        run(capsys, "export-config", "--plan", str(plan_file), "--for", target, "--out", str(args), "--force")[0] == 0
    )
    code, out, err = run(capsys, "estimate", "--from", str(args), "--cluster", "dgx-a100", "--json")
    assert code == 0, err
    assert json.loads(out)["plan"] == want


def test_torchtitan_is_refused_in_one_line() -> None:
    assert "torchtitan" not in FLOAT16_RUNTIMES
    assert "no loss scaling" in dtype_problem("float16", "torchtitan")
    assert dtype_problem("bfloat16", "torchtitan") is None and dtype_problem("float16", "exatrain") is None
    with pytest.raises(UserError, match="trains in bfloat16 or float32, not float16"):
        _plan("torchtitan", zero=3)


def test_the_cli_refuses_torchtitan_fp16_with_exit_2(capsys) -> None:
    refused_by_planner(
        capsys,
        "trains in bfloat16 or float32, not float16",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-a100",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--runtime",
        "torchtitan",
        "--dtype",
        "float16",
    )


def test_fp8_stays_bfloat16_only() -> None:
    with pytest.raises(UserError, match="inside bfloat16 training"):
        make_plan(
            "llama3-8b",
            get_cluster("dgx-h100"),
            gpus=8,
            global_batch=64,
            dtype="float16",
            fp8="current",
            runtime="megatron-core",
        )
