"""How an engine launches a MoE layer's local expert GEMMs (``EngineProfile.expert_gemms``): Megatron-Core
(Transformer Engine's GroupedLinear, one cuBLAS GEMM per expert) and DeepSpeed (a loop over its experts)
pay the per-call GEMM time once per local expert; torchtitan and exatrain's trainer (torch's grouped_mm)
once per grouped GEMM. Exact differences in the layer time, and the step time's ordering.

Broken on purpose and seen to fail here: Megatron-Core's profile set to "grouped" (the profile test),
``cost_layer.layer_times`` ignoring ``expert_gemms`` (the layer test), ``cost.step.stage_times`` not passing
the engine's ``expert_gemms`` on (the estimate test)."""

from __future__ import annotations

import numpy as np
import pytest

from exatrain.accounting.engines import Resolved
from exatrain import api
from exatrain.accounting.engines import get_engine
from exatrain.catalog import get_cluster, get_model
from exatrain.planner.cost import compute
from exatrain.planner.cost import fp8 as cost_fp8
from exatrain.planner.cost import layer as cost_layer
from exatrain.planner.cost.coefficients import default_params
from exatrain.settings import RUNTIMES
from exatrain.planner.estimate import estimate_plan


def test_each_profile_says_how_it_launches_expert_gemms_and_why() -> None:
    want = {
        "megatron-core": "per_expert",
        "megatron-deepspeed": "per_expert",
        "torchtitan": "grouped",
        "exatrain": "grouped",
        "llm-foundry": "grouped",
    }
    assert set(want) == set(RUNTIMES)
    for name, how in want.items():
        engine = get_engine(name)
        assert engine.expert_gemms == how
        assert engine.expert_gemms_source


@pytest.mark.parametrize("fp8", ["", "current"])
def test_per_expert_launches_pay_the_call_time_once_per_local_expert(fp8: str) -> None:
    # Qwen3-30B-A3B at ep 16: 128 / 16 = 8 local experts, two expert GEMMs (fc1, fc2) a layer
    m, cluster = get_model("qwen3-30b-a3b"), get_cluster("dgx-h100")
    params = default_params(cluster.device.name)
    dev = compute.device_for(cluster, "bfloat16", params)
    speed = cost_fp8.fp8_speedup(cluster, "bfloat16", params) if fp8 else 1.0

    def layer(how: str):
        return cost_layer.layer_times(
            m,
            1,
            1,
            moe=True,
            ep=16,
            cp=1,
            sequence_parallel=False,
            dev=dev,
            run=Resolved(fp8=fp8, expert_gemms=how),
            speedup=speed,
        )

    grouped, per_expert = layer("grouped"), layer("per_expert")
    extra = 2 * (m.experts // 16 - 1) * params.gemm_overhead_s
    assert float(np.asarray(per_expert.dense_gemm_fwd - grouped.dense_gemm_fwd)) == pytest.approx(extra, rel=1e-9)
    assert float(np.asarray(per_expert.fwd - grouped.fwd)) == pytest.approx(extra, rel=1e-9)
    assert float(np.asarray(per_expert.bwd - grouped.bwd)) == pytest.approx(2 * extra, rel=1e-9)
    # a dense layer has no expert GEMM: the same either way
    dense = [
        cost_layer.layer_times(
            m,
            1,
            1,
            moe=False,
            ep=16,
            cp=1,
            sequence_parallel=False,
            dev=dev,
            run=Resolved(fp8=fp8, expert_gemms=how),
            speedup=speed,
        ).fwd
        for how in ("grouped", "per_expert")
    ]
    assert float(np.asarray(dense[0])) == float(np.asarray(dense[1]))


def test_the_estimate_prices_the_engines_launches(monkeypatch) -> None:
    # a Megatron-Core MoE plan, and the same engine told it groups its expert GEMMs: the step's compute
    # differs by the extra calls of the busiest stage's MoE layers, every micro-batch, forward and backward
    # (three GEMM passes), two GEMMs each: 7 more calls a GEMM at 8 local experts
    from exatrain.accounting import engines

    cluster = get_cluster("dgx-h100")
    plan = api.make_plan(
        "qwen3-30b-a3b", cluster, gpus=16, ep=16, micro_batch=1, global_batch=256, runtime="megatron-core"
    )
    params = default_params(cluster.device.name)
    per_expert = estimate_plan(plan, cluster, params).time_s
    grouped_engine = engines.ENGINES["megatron-core"].__class__(
        **{**engines.ENGINES["megatron-core"].__dict__, "expert_gemms": "grouped"}
    )
    monkeypatch.setitem(engines.ENGINES, "megatron-core", grouped_engine)
    grouped = estimate_plan(plan, cluster, params).time_s
    calls = plan.num_microbatches * plan.model.layers * 3 * 2 * (plan.model.experts // 16 - 1)
    assert per_expert.compute - grouped.compute == pytest.approx(calls * params.gemm_overhead_s, rel=1e-6)
