"""llm-foundry's runtime: Composer's PyTorch FSDP1 (``accounting.engines.LLM_FOUNDRY``), the FlashAttention-1 class
Triton kernel its MPT models run (``cost.compute.with_attention_kernel``), and the slowdown of compute beside
data-parallel collectives (``CostParams.comm_contention``).

Broken on purpose and seen to fail here: the flat gradient's copy dropped from the backward (the copy test), the
pre-divide priced on the compute stream instead of before the reduce-scatter (the reduce test), the reduction priced
in fp32 under Composer's DEFAULT mixed precision (the collectives test), the Triton kernel at FlashAttention-2's rate
(the kernel test), the contention priced on the exposed seconds instead of the hidden ones (the contention test), the
rule refusing tp > 1 dropped (the rule test)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from exatrain.accounting import comms
from exatrain.accounting.engines import get_engine
from exatrain.accounting.params import stage_params
from exatrain.catalog import get_cluster, get_model
from exatrain.errors import PlanError, UserError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.planner.cost import compute
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.cost.overlap import engine_collectives
from exatrain.planner.plan_cost import plan_stage_times
from exatrain.planner.estimate import estimate_plan

A100, H100 = get_cluster("dgx-a100"), get_cluster("dgx-h100")


def _plan(
    model: str = "llama3-8b",
    cluster=H100,
    dp: int = 8,
    mb: int = 2,
    gb: int = 32,
    zero: int = 3,
    runtime: str = "llm-foundry",
    **kw,
) -> Plan:
    return Plan(
        model=get_model(model),
        dims=ParallelDims(1, 1, dp),
        shape=TrainShape(mb, gb),
        zero_stage=zero,
        recompute="none",
        cluster=cluster.name,
        runtime=runtime,
        **kw,
    ).validate(cluster)


class _Ops(TorchDispatchMode):
    """The elements each aten op writes."""

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            name = func.overloadpacket.__name__
            self.written[name] = self.written.get(name, 0) + out.numel()
        return out


def test_autograd_builds_a_flat_gradient_from_its_views_with_one_copy() -> None:
    """FSDP1 makes each parameter a view of its unit's FlatParameter by torch.split and view (flat_param.py
    _use_unsharded_views); the split's backward concatenates the views' gradients into the flat one: a copy of the
    whole flat gradient, which the profile prices on the compute stream (2 x 2 bytes a parameter in bf16)."""
    flat = torch.randn(12 + 4, requires_grad=True)
    x = torch.randn(2, 4)
    with _Ops() as ops:
        w, b = (t.view(s) for t, s in zip(torch.split(flat, [12, 4]), ((3, 4), (4,))))
        ((x @ w.t()).sum() + b.sum()).backward()
    assert ops.written.get("cat") == flat.numel()
    engine = get_engine("llm-foundry")
    assert engine.flat_grad_copy_bytes("bfloat16") == 4.0 and engine.flat_grad_copy_bytes("float32") == 8.0
    assert get_engine("torchtitan").flat_grad_copy_bytes("bfloat16") == 0.0


def _step(plan, params, overlap="none"):
    return estimate_plan(plan, H100, params, overlap=overlap).time_s


def test_the_flat_gradients_copy_lengthens_each_backward_by_its_bytes(monkeypatch) -> None:
    """Per micro-batch, llm-foundry's backward is longer than the same profile's without FSDP1's passes by 4 bytes a
    parameter of the rank at the element-wise bandwidth; its forward is not."""
    from exatrain.accounting import engines

    plan, params = _plan(), default_params("h100-sxm")
    with_copy = plan_stage_times(plan, H100, params)
    monkeypatch.setitem(
        engines.ENGINES, "llm-foundry", dataclasses.replace(engines.ENGINES["llm-foundry"], flat_param_grad_copy=False)
    )
    without = plan_stage_times(plan, H100, params)
    dev = compute.device_for(H100, "bfloat16", params, plan.gpus)
    expected = compute.elementwise_time_s(4.0 * stage_params(plan)[0], dev)
    assert float(with_copy.bwd[0, 0] - without.bwd[0, 0]) == pytest.approx(expected, rel=1e-9)
    assert float(with_copy.fwd[0, 0]) == pytest.approx(float(without.fwd[0, 0]), rel=1e-12)


def test_the_pre_divide_lengthens_the_reduction_not_the_compute(monkeypatch) -> None:
    """With every overlap off FSDP1's pre-divide lands in the exposed data-parallel seconds: a pass of 4 bytes a
    parameter (read and write bf16) before each of the step's reduce-scatters, one per micro-batch; the flat
    gradient's copy lands in the compute, once per micro-batch too."""
    from exatrain.accounting import engines

    plan = _plan(mb=2, gb=32)  # 2 micro-batches of 2 on 8 ranks
    params = default_params("h100-sxm").replace(comm_contention=0.0)
    full = _step(plan, params)
    monkeypatch.setitem(
        engines.ENGINES, "llm-foundry", dataclasses.replace(engines.ENGINES["llm-foundry"], flat_param_grad_copy=False)
    )
    bare = _step(plan, params)
    dev = compute.device_for(H100, "bfloat16", params, plan.gpus)
    pass_s = compute.elementwise_time_s(4.0 * stage_params(plan)[0], dev)
    assert plan.num_microbatches == 2
    assert full.dp_comm - bare.dp_comm == pytest.approx(2 * pass_s, rel=1e-6)
    assert full.compute - bare.compute == pytest.approx(2 * pass_s, rel=1e-6)


def test_composer_reduces_in_bf16_after_every_micro_batch() -> None:
    """Composer's DEFAULT and PURE mixed precision leave FSDP1 reducing in the bf16 param dtype (2 bytes a gradient),
    reduce-scattered after every micro-batch's backward; --grad-accum float32 (a reduce_dtype of fp32) sends 4."""
    m = get_model("gpt-22b")
    kw = dict(tp=1, pp=1, dp=8, num_microbatches=4, dtype="bfloat16", params_here=1e9, pipeline_end=False)
    engine = get_engine("llm-foundry")
    assert engine.accum_dtype("bfloat16") == "bfloat16" and engine.reduce_each_microbatch
    sent = engine_collectives(comms.dp_collectives_for(m, zero_stage=3, **kw), engine, dtype="bfloat16")
    assert {(c.kind, float(c.message_bytes / 1e9)) for c in sent} == {("reduce_scatter", 2.0), ("all_gather", 2.0)}
    fp32 = engine.with_grad_accum("float32")
    sent = engine_collectives(comms.dp_collectives_for(m, zero_stage=3, **kw), fp32, dtype="bfloat16")
    assert ("reduce_scatter", 4.0) in {(c.kind, float(c.message_bytes / 1e9)) for c in sent}
    # the post-backward stream's work before each reduce-scatter: the pre-divide (bf16), or a cast then the divide
    assert engine.reduce_prep_bytes("bfloat16") == 4.0 and fp32.reduce_prep_bytes("bfloat16") == 2 + 4 + 8


@pytest.mark.parametrize("device", ["a100-80gb", "h100-sxm"])
def test_the_triton_kernel_runs_at_half_flashattention2s_rate(device: str) -> None:
    """llm-foundry's attn_impl triton (flash_attn_triton.py, FlashAttention-1 class) at about half of FA2's rate at
    long keys on the same device (101 against 199 TFLOPS on an A100, FlashAttention-2's Figure 4(d)), falling off
    at short keys over 470 more keys than FA2 (coefficients.A100_TRITON_CURVE)."""
    p = default_params(device)
    fa2, triton = (compute.with_attention_kernel(p, k) for k in ("fa2", "triton"))
    assert triton.attn_eff == pytest.approx(0.5073 * fa2.attn_eff, rel=1e-3)
    assert triton.attn_seq_half - fa2.attn_seq_half == pytest.approx(469.83, rel=1e-4)
    assert triton.fa2_attn_ratio == 1.0
    assert get_engine("llm-foundry").attention_kernel() == "triton"


def test_llm_foundry_prices_its_kernel_and_fa2_when_the_run_names_it() -> None:
    """The same long-sequence plan under llm-foundry's own kernel takes longer than with --attention-kernel fa2 by
    the attention's seconds (twice FA2's)."""
    model = get_model("llama3-8b").replace(seq_len=16384)
    base = Plan(
        model=model,
        dims=ParallelDims(1, 1, 8),
        shape=TrainShape(1, 16),
        zero_stage=3,
        recompute="full",
        cluster=A100.name,
        runtime="llm-foundry",
    )
    own = estimate_plan(base.validate(A100), A100).time_s.compute
    fa2 = estimate_plan(base.replace(attention_kernel="fa2").validate(A100), A100).time_s.compute
    assert own > fa2 * 1.2


def test_contention_slows_compute_by_its_share_of_the_hidden_collectives() -> None:
    """A ZeRO-3 step whose gathers and reductions hide behind its compute: the step with comm_contention c is longer
    than with 0 by c times the hidden data-parallel seconds; with nothing to communicate (dp 1) nothing changes."""
    plan = _plan(model="llama3-8b", dp=8, mb=2, gb=16)
    p = default_params("h100-sxm")
    from exatrain.accounting.engines import plan_run
    from exatrain.planner.evaluate import evaluate
    from exatrain.planner.layouts import Layouts

    def run(c):
        ev = evaluate(
            Layouts.from_plan(plan),
            plan.model,
            H100,
            p.replace(comm_contention=c),
            global_batch=plan.global_batch,
            memory=(),
            run=plan_run(plan),
            by_rank=True,
        )
        return ev.time, ev.hidden

    t0, h0 = run(0.0)
    t1, h1 = run(0.189)
    assert float(h0["dp"][0]) > 0.0 and float(t0["dp_comm"][0]) == pytest.approx(0.0, abs=1e-12)
    assert float(t1["step"][0] - t0["step"][0]) == pytest.approx(0.189 * float(h0["dp"][0]), rel=1e-9)
    assert float(h1["dp"][0]) == pytest.approx(float(h0["dp"][0]), rel=1e-12)
    single = _plan(model="llama3-8b", dp=1, mb=2, gb=2, zero=0)
    a = estimate_plan(single, H100, p.replace(comm_contention=0.0)).time_s.step
    b = estimate_plan(single, H100, p.replace(comm_contention=0.189)).time_s.step
    assert a == b


def test_llm_foundry_shards_over_data_parallelism_alone() -> None:
    with pytest.raises(PlanError, match="--runtime llm-foundry shards with Composer's FSDP over data parallelism"):
        Plan(
            model=get_model("llama3-8b"),
            dims=ParallelDims(2, 1, 4),
            shape=TrainShape(1, 8),
            zero_stage=3,
            runtime="llm-foundry",
        ).validate(H100)
    with pytest.raises(UserError, match="no ZeRO stage 1"):
        estimate_plan(_plan(zero=1), H100)
    assert _plan(zero=2).zero_stage == 2 and _plan(zero=0, dp=8).zero_stage == 0


def test_the_estimate_names_the_engine_version_it_prices() -> None:
    """Megatron-Core's and llm-foundry's profiles price one span of their engine's versions, and the estimate says
    which and how to plan an older one (Megatron-LM of 2021-22: --overlap, --grad-accum-fusion off); the torchtitan
    profile dates its settings one by one and states no span."""
    plan = Plan(
        model=get_model("llama3-8b"),
        dims=ParallelDims(1, 1, 8),
        shape=TrainShape(1, 8),
        zero_stage=1,
        runtime="megatron-core",
    ).validate(H100)
    notes = " ".join(estimate_plan(plan, H100).notes)
    assert "engine version priced: Megatron-Core of 2024-26" in notes
    assert "--overlap dp_grad_reduce" in notes and "--grad-accum-fusion off" in notes
    assert "engine version priced: llm-foundry of 2023-07 to 2024-01" in " ".join(estimate_plan(_plan(), H100).notes)
    titan = plan.replace(runtime="torchtitan", zero_stage=3).validate(H100)
    assert "engine version priced" not in " ".join(estimate_plan(titan, H100).notes)
