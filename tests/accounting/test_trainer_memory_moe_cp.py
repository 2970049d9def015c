"""The trainer memory model for mixture-of-experts and context-parallel layouts, against hand counts;
runtime exatrain's estimate is that model for them (the vectorised path and the one-plan path agree).
Its agreement with a traced step is tests/bench/test_trace_moe_cp.py."""

from __future__ import annotations

import dataclasses

import pytest

from exatrain.accounting.params import stage_params_split
from exatrain.accounting.trainer_memory import trainer_layer_activation_bytes, trainer_stage_memory
from exatrain.catalog import get_cluster, get_model
from exatrain.catalog.models import ModelSpec
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.planner.estimate import estimate_plan

CPU = get_cluster("local-cpu")
MOE = ModelSpec(
    name="moe",
    arch="llama",
    hidden=256,
    heads=8,
    kv_heads=2,
    ffn_hidden=704,
    seq_len=512,
    vocab=256,
    layers=4,
    experts=4,
    top_k=2,
    shared_experts=1,
    expert_ffn_hidden=256,
    dense_layers=1,
)


def _plan(model: ModelSpec, **dims) -> Plan:
    pp, dp = dims.get("pp", 1), dims.get("dp", 1)
    return Plan(
        model=model, dims=ParallelDims(**dims), shape=TrainShape(1, 2 * pp * dp), cluster="local-cpu"
    ).validate()


@pytest.mark.parametrize(
    "dims", [dict(tp=1, pp=2, dp=2, ep=2), dict(tp=2, pp=1, dp=2, ep=2), dict(tp=2, pp=1, dp=1, cp=2)]
)
def test_runtime_exatrain_estimate_is_the_trainer_model(dims) -> None:
    """For MoE (ep) and cp plans the estimate of runtime exatrain is ``trainer_stage_memory`` on
    every stage (the search's batched evaluation and the single plan's count agree), not the
    accounting's engine profile."""
    model = MOE if dims.get("ep", 1) > 1 else get_model("gpt-tiny")
    plan = _plan(model, **dims)
    est = estimate_plan(plan, CPU)
    assert est.trainer_memory_by_stage == est.memory_by_stage
    for r, got in enumerate(est.memory_by_stage):
        want = trainer_stage_memory(plan, r, on_cpu=True)
        for f in ("weights", "gradients", "optimizer", "activations", "other"):
            assert getattr(got, f) == pytest.approx(getattr(want, f), rel=1e-12), (r, f)


def test_expert_parallelism_divides_the_routed_experts_states() -> None:
    """From ep 1 to ep 2 a rank's fp32 gradients lose 4 bytes per routed-expert parameter it no longer
    holds (N/2 of each MoE layer's experts), and nothing else; the 16-bit expert copies go with them."""
    one, two = (_plan(MOE, tp=1, pp=1, dp=2, ep=ep) for ep in (1, 2))
    ((_, x1),) = stage_params_split(MOE, tp=1, pp=1, interleave=1, layers_per_stage=(4,), ep=1)
    ((_, x2),) = stage_params_split(MOE, tp=1, pp=1, interleave=1, layers_per_stage=(4,), ep=2)
    assert x2 * 2 == x1 == 3 * 4 * 3 * 256 * 256  # 3 MoE layers x 4 experts x SwiGLU
    a, b = trainer_stage_memory(one, 0, on_cpu=True), trainer_stage_memory(two, 0, on_cpu=True)
    assert a.gradients - b.gradients == pytest.approx(4.0 * (x1 - x2))
    assert a.optimizer - b.optimizer == pytest.approx(8.0 * (x1 - x2))  # ZeRO-0: all of Adam's states
    assert a.weights - b.weights == pytest.approx(6.0 * (x1 - x2))  # fp32 masters + the cast copies


def test_context_parallel_layer_keeps_the_gathered_keys_and_values() -> None:
    """A layer at cp 2 over a 2S sequence keeps what a layer over S tokens keeps, plus the other
    rank's keys and values (2 e h/tp bytes a token, the whole sequence's K and V being gathered:
    repeated to every query head) and the [S, 2S] mask in bf16."""
    gpt = get_model("gpt-tiny")
    s = gpt.seq_len
    long = dataclasses.replace(gpt, seq_len=2 * s)
    for tp in (1, 2):
        kw = dict(sequence_parallel=False, recompute="none", flash=True, dtype="bfloat16", on_cpu=True)
        base = trainer_layer_activation_bytes(gpt, 1, tp, **kw)
        cp2 = trainer_layer_activation_bytes(long, 1, tp, cp=2, **kw)
        assert cp2 - base == pytest.approx(s * 2 * 2 * gpt.hidden / tp + 2 * s * 2 * s)
