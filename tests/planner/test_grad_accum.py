"""The dtype bfloat16 training accumulates and reduces its gradients in (``--grad-accum``, ``Plan.grad_accum``):
the runtimes that offer each (their state tables), the memory and collectives of the engine variant it selects,
DeepSpeed's BF16_Optimizer pass over the gradients every micro-batch and, without it, autograd's adds into the kept
bf16 .grad, the exports, the refusals.

Broken on purpose and seen to fail here: the accumulation pass left out of ``cost.step.step_times`` (the pass
test), the BF16_Optimizer's gradients reduce-scattered like the other ZeRO-1 optimizers' (the collectives test),
``evaluate`` ignoring ``grad_accum`` for the runtime's memory (the memory test), GRAD_ACCUM_RUNTIMES offering
bfloat16 to torchtitan (the state-table test), the search not checking it first (the CLI test), the trainer's
refusal dropped (the trainer test), ``plan_stage_times`` without the pass (the timeline test), DeepSpeed's adds into
its bf16 .grad priced from the first micro-batch on (``m`` for ``m - 1``) or at ZeRO-2 too (the later-adds test),
the BF16_Optimizer's pass priced with a zeroing of the bf16 gradients and autograd's add into them (26 bytes a
parameter, where its clear_lp_grads sets them to None: the pass test)."""

from __future__ import annotations

import numpy as np
import pytest

from exatrain.accounting.engines import get_engine
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.engine_configs.megatron import deepspeed_config, render_megatron
from exatrain.errors import UserError
from exatrain.settings import GRAD_ACCUM, GRAD_ACCUM_RUNTIMES, RUNTIMES
from exatrain.planner import plan_cost
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.estimate import estimate_plan
from tests.helpers.cli import refused_by_planner, saved_plan
from tests.helpers.passes import pass_seconds
from tests.helpers.plan_fields import check_round_trip, trainer_refuses

A100 = get_cluster("dgx-a100")


def test_the_runtimes_offered_each_dtype_are_their_state_tables() -> None:
    for accum in GRAD_ACCUM:
        offers = {
            name for name in RUNTIMES if any(d == "bfloat16" and a == accum for (d, _, a), _ in get_engine(name).states)
        }
        assert offers == set(GRAD_ACCUM_RUNTIMES[accum]), accum


def test_the_plan_file_round_trip(tmp_path) -> None:
    check_round_trip(tmp_path, A100, "grad_accum", "float32")


def _plan(runtime: str, accum: str = "", **kw):
    args = dict(gpus=16, tp=1, pp=1, micro_batch=1, global_batch=64, zero=1, recompute="full", runtime=runtime)
    args.update(kw)
    return make_plan("llama3-8b", A100, grad_accum=accum or None, **args)


def test_memory_follows_the_engine_variant() -> None:
    # the gradients' bytes scale as the variant's state rule says against the runtime's own
    for runtime, accum in (("megatron-deepspeed", "float32"), ("megatron-core", "bfloat16")):
        plan = _plan(runtime, accum)
        est, own = estimate_plan(plan, A100), estimate_plan(_plan(runtime), A100)
        grads = get_engine(runtime).with_grad_accum(accum).state_rule("bfloat16", 1).bytes_per_param(plan.dp)[1]
        grads_own = get_engine(runtime).state_rule("bfloat16", 1).bytes_per_param(plan.dp)[1]
        assert grads != grads_own
        assert est.memory_bytes.gradients / own.memory_bytes.gradients == pytest.approx(grads / grads_own, rel=1e-9)
        assert any(f"accumulated and reduced in {accum}" in n for n in est.notes)


def test_deepspeed_bf16_optimizer_passes_over_the_gradients_every_micro_batch() -> None:
    # pp 1, tp 1: the rank holds every parameter; 4 micro-batches a step; the pass is the only compute change
    plan = _plan("megatron-deepspeed", "float32")
    params = default_params(A100.device.name)
    with_pass = estimate_plan(plan, A100, params).time_s
    without = estimate_plan(plan.replace(grad_accum="bfloat16"), A100, params).time_s
    m = plan.num_microbatches
    # against bf16 accumulation, which pays autograd's adds into its kept bf16 .grad from the second micro-batch on;
    # BF16_Optimizer's own pass is update_hp_grads' cast and add (2 + 4, 4 + 4 + 4 bytes): clear_lp_grads sets the
    # bf16 gradients to None, so neither a zeroing nor autograd's add into a kept .grad comes before it
    extra = float(pass_seconds(plan, A100, 18.0 * m - 6.0 * (m - 1))[0, 0])
    assert get_engine("megatron-deepspeed").with_grad_accum("float32").accum_pass("bfloat16") == 18.0
    assert with_pass.compute - without.compute == pytest.approx(extra, rel=1e-9)
    # no other engine makes such a pass, and none in fp32 training
    for runtime in ("megatron-core", "torchtitan", "exatrain"):
        assert get_engine(runtime).accum_pass("bfloat16") == 0.0
    assert get_engine("megatron-deepspeed").with_grad_accum("float32").accum_pass("float32") == 0.0


@pytest.mark.parametrize(("zero", "adds"), [(0, True), (1, True), (2, False)])
def test_deepspeed_adds_later_micro_batches_into_its_bf16_grads(zero: int, adds: bool) -> None:
    # ZeRO-0/1 keep .grad between micro-batches (autograd adds into it, 6 bytes a parameter, from the second on);
    # ZeRO-2 reduces each micro-batch's gradients in its backward and keeps none; BF16_Optimizer's own pass covers
    # its adds (the test above)
    import dataclasses

    from exatrain.accounting import engines

    plan = _plan("megatron-deepspeed", zero=zero)
    params = default_params(A100.device.name)
    got = estimate_plan(plan, A100, params)
    plain = dataclasses.replace(engines.MEGATRON_DEEPSPEED, later_accum_bytes=())
    try:
        engines.ENGINES["megatron-deepspeed"] = plain
        without = estimate_plan(plan, A100, params).time_s.compute
    finally:
        engines.ENGINES["megatron-deepspeed"] = engines.MEGATRON_DEEPSPEED
    m = plan.num_microbatches
    expect = float(pass_seconds(plan, A100, 6.0 * (m - 1))[0, 0]) if adds else 0.0
    assert m == 4 and got.time_s.compute - without == pytest.approx(expect, rel=1e-9, abs=1e-12)
    assert any("autograd adds each micro-batch's gradient after the first" in n for n in got.notes) == adds
    assert get_engine("megatron-deepspeed").with_grad_accum("float32").later_accum("bfloat16", 1) == 0.0
    assert {name for name in RUNTIMES if get_engine(name).later_accum("bfloat16", 1)} == {"megatron-deepspeed"}


def test_the_bf16_optimizer_all_reduces_fp32_gradients() -> None:
    fp32 = plan_cost.comm_bytes(_plan("megatron-deepspeed", "float32"))["dp"]
    bf16 = plan_cost.comm_bytes(_plan("megatron-deepspeed"))["dp"]
    # ZeRO-1 in bf16: reduce-scatter 2 bytes + all-gather 2 bytes a parameter (ring: (d-1)/d each); the
    # BF16_Optimizer: all-reduce 4 bytes (2 (d-1)/d) + the same all-gather: (8 + 2) / (2 + 2)
    assert fp32 / bf16 == pytest.approx(10 / 4, rel=1e-3)


def test_exports_carry_it() -> None:
    assert deepspeed_config(_plan("megatron-deepspeed", "float32"))["data_types"] == {"grad_accum_dtype": "fp32"}
    assert "data_types" not in deepspeed_config(_plan("megatron-deepspeed"))
    assert "--grad-reduce-in-bf16" in render_megatron(_plan("megatron-core", "bfloat16")).text
    assert "--grad-reduce-in-bf16" not in render_megatron(_plan("megatron-core")).text


def test_refusals_are_one_line() -> None:
    with pytest.raises(UserError, match="torchtitan accumulates bfloat16 gradients in float32 only"):
        _plan("torchtitan", "bfloat16", zero=2)
    with pytest.raises(UserError, match="trains in float32: drop it"):
        _plan("megatron-core", "float32", dtype="float32")
    with pytest.raises(UserError, match="no ZeRO stage 2 for bfloat16 training with float32 gradients"):
        estimate_plan(_plan("megatron-deepspeed", "float32", zero=2), A100)


def test_the_cli_refuses_with_exit_2(capsys) -> None:
    refused_by_planner(
        capsys,
        "exatrain accumulates bfloat16 gradients in float32 only",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-a100",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--runtime",
        "exatrain",
        "--grad-accum",
        "bfloat16",
    )


def test_a_saved_plan_keeps_it(tmp_path, capsys) -> None:
    saved = saved_plan(
        capsys,
        tmp_path / "p.json",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-a100",
        "--gpus",
        "16",
        "--zero",
        "1",
        "--runtime",
        "megatron-deepspeed",
        "--grad-accum",
        "float32",
    )
    assert saved["grad_accum"] == "float32"


def test_the_trainer_refuses_bf16_accumulation_and_the_search_carries_it() -> None:
    from exatrain.planner.search.search import search
    from exatrain.planner.search.space import SpaceOptions

    trainer_refuses(
        "the exatrain trainer accumulates and reduces its gradients in float32",
        zero=1,
        runtime="megatron-core",
        grad_accum="bfloat16",
    )
    res = search(
        get_model("llama3-8b"),
        A100,
        8,
        64,
        top=3,
        runtime="megatron-deepspeed",
        options=SpaceOptions(grad_accum="float32"),
    )
    # the BF16_Optimizer runs at ZeRO-1 only: every candidate is ZeRO-1 and carries the setting
    assert res.ranked and all(p.grad_accum == "float32" and p.zero_stage == 1 for p in res.ranked)


def test_the_timeline_replays_the_same_pass() -> None:
    # the per-stage seconds the schedule simulator replays carry the pass as the step time does
    from exatrain.planner.plan_cost import plan_stage_times

    plan = _plan("megatron-deepspeed", "float32", gpus=16, pp=2)
    params = default_params(A100.device.name)
    extra = (
        plan_stage_times(plan, A100, params).bwd
        - plan_stage_times(plan.replace(grad_accum="bfloat16"), A100, params).bwd
    )
    m = plan.num_microbatches  # the bf16 variant pays autograd's adds from the second micro-batch on (per micro-batch)
    assert np.allclose(extra[0], pass_seconds(plan, A100, 18.0 - 6.0 * (m - 1) / m)[0], rtol=1e-9)


def test_an_export_that_cannot_carry_it_says_so() -> None:
    from exatrain.engine_configs import export

    tt = export(_plan("torchtitan", "float32", zero=3), "deepspeed")
    assert "data_types" not in tt.text and any("keeps its bfloat16 default" in n for n in tt.notes)
    mc = export(_plan("megatron-core", "bfloat16"), "torchtitan")
    assert any("torchtitan reduces them in float32" in n for n in mc.notes)
