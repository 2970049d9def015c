"""Engines whose sharded-gradient stages (ZeRO-2/3) reduce-scatter after every micro-batch's backward
(``EngineProfile.reduce_each_microbatch``: torchtitan's FSDP2 without a pipeline, DeepSpeed ZeRO-2/3) send
the reduction once a micro-batch; the others (Megatron-Core, exatrain's trainer, any pipeline schedule) once a
step. Counted in the estimate's bytes and priced in its dp time, the reduction hidden behind every backward.

Broken on purpose and seen to fail here: the count left at one a step (``engine_dp_collectives`` without the
``reduce_each_microbatch`` branch: the bytes test)."""

from __future__ import annotations

import pytest

from exatrain.accounting.engines import get_engine
from exatrain.accounting.params import stage_params
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.planner.estimate import estimate_plan

H100 = get_cluster("dgx-h100")
LLAMA = get_model("llama3-8b").replace(seq_len=4096)


def _bytes(runtime: str, zero: int, pp: int = 1, micro_batch: int = 1, global_batch: int = 64):
    plan = make_plan(
        LLAMA, H100, gpus=16, pp=pp, micro_batch=micro_batch, global_batch=global_batch, zero=zero, runtime=runtime
    )
    return plan, estimate_plan(plan, H100)


def test_the_engines_that_reduce_each_micro_batch() -> None:
    assert get_engine("torchtitan").reduce_each_microbatch and get_engine("megatron-deepspeed").reduce_each_microbatch
    assert not get_engine("megatron-core").reduce_each_microbatch and not get_engine("exatrain").reduce_each_microbatch
    for name in ("torchtitan", "megatron-deepspeed"):
        assert get_engine(name).reduce_each_microbatch_source


def test_torchtitan_fsdp_reduces_every_micro_batch_without_a_pipeline() -> None:
    """ZeRO-3 on 16 ranks, 4 micro-batches: the fp32 reduce-scatter 4 times and the bf16 all-gather twice a
    micro-batch, (dp-1)/dp of a rank's P parameters each; one micro-batch of 4x the size sends the same
    gathers once and the reduction once."""
    plan, est = _bytes("torchtitan", 3)
    dp, m = plan.dp, plan.num_microbatches
    P = float(stage_params(plan)[0])
    assert (dp, m) == (16, 4)
    share = (dp - 1) / dp * P
    assert est.comm_bytes["dp"] == pytest.approx(share * (4 * m + 2 * 2 * m), rel=1e-9)
    # ZeRO-2 (no reshard after forward): the gather once, the reduction each micro-batch
    plan2, est2 = _bytes("torchtitan", 2)
    assert est2.comm_bytes["dp"] == pytest.approx(share * (4 * m + 2), rel=1e-9)
    # the step still prices every reduction, hidden behind the backward it follows
    assert est.time_s.step >= est.time_s.compute


def test_a_pipeline_or_megatron_reduces_once_a_step() -> None:
    plan, est = _bytes("torchtitan", 2, pp=2)
    dp, m = plan.dp, plan.num_microbatches
    assert (dp, m) == (8, 8)
    # the busiest stage's parameters: the reduction once, the gather once
    per_stage = [float(x) for x in stage_params(plan)]
    assert est.comm_bytes["dp"] == pytest.approx(max((dp - 1) / dp * p * (4 + 2) for p in per_stage), rel=1e-9)
    plan, est = _bytes("megatron-core", 3)
    P = float(stage_params(plan)[0])
    once = (plan.dp - 1) / plan.dp * P
    grads = 4 if get_engine("megatron-core").grad_accum_dtype == "float32" else 2
    assert est.comm_bytes["dp"] == pytest.approx(once * (grads + 2 * 2 * plan.num_microbatches), rel=1e-9)
