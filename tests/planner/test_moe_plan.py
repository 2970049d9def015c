"""The planner on mixture-of-experts (ep), context-parallel (cp) and FP8 plans: estimates against hand
counts from the accounting, the direction of each new cost term, the search over ep and cp with its
refusal counts, and one-line refusals of bad degrees."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exatrain.accounting.engines import Resolved
from exatrain.accounting.flops import model_flops_per_step
from exatrain.accounting.fp8 import Fp8Recipe
from exatrain.planner.cost.coefficients import default_params
from exatrain.accounting.memory import inflight_microbatches
from exatrain.accounting.params import stage_layer_kinds, stage_params_split
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.cli import main
from exatrain.plan import ParallelDims
from exatrain.accounting.moe import LOAD_IMBALANCE
from tests.helpers.memory import rank_memory
from exatrain.planner.estimate import estimate_plan
from exatrain.planner.search.search import search
from exatrain.planner.search.space import SpaceOptions, enumerate_space

H100 = get_cluster("dgx-h100")
ONE = dict(
    tp=(1,),
    pp=(1,),
    micro_batch=(1,),
    zero_stage=(0,),
    recompute=("none",),
    sequence_parallel=(False,),
    schedules=(("1f1b", 1),),
)


def _mixtral(ep: int, **kw):
    base = dict(gpus=64, tp=2, pp=4, micro_batch=1, global_batch=256, sequence_parallel=True, zero=1)
    return make_plan("mixtral-8x7b", H100, **{**base, **kw}).replace(dims=ParallelDims(2, 4, 8, ep=ep)).validate(H100)


def test_memory_under_ep_is_the_accounting_hand_count() -> None:
    """Every stage of a Mixtral plan with ep 4: the routed experts split over ep (8/4 whole experts per
    rank). The lean reference (``rank_memory``, what the other runtimes' profiles build on) shards their
    optimizer states over the expert-data-parallel group (tp*dp/ep = 4 ranks), the rest over dp (8),
    ZeRO-1 keeping 6 bytes of weights and 4 of gradients per parameter. Runtime exatrain is counted by
    the trainer's own memory model (``trainer_stage_memory``): fp32 weights and gradients of every
    local parameter, and ZeroRedundancyOptimizer's share (1/dp) of their Adam states."""
    from exatrain.accounting.trainer_memory import trainer_stage_memory

    plan = _mixtral(4)
    m = plan.model
    est = estimate_plan(plan, H100)
    split = stage_params_split(m, tp=2, pp=4, interleave=1, layers_per_stage=plan.layers_per_stage(), ep=4)
    kinds = stage_layer_kinds(m, pp=4, interleave=1, layers_per_stage=plan.layers_per_stage())
    assert est.trainer_memory_by_stage == est.memory_by_stage
    for r, got in enumerate(est.memory_by_stage):
        dense, experts = split[r]
        assert experts == kinds[r][1] * 2 * 3 * m.hidden * m.expert_width  # 2 local experts, SwiGLU
        want = rank_memory(
            m,
            dtype="bfloat16",
            zero_stage=1,
            recompute="none",
            sequence_parallel=True,
            flash=True,
            tp=2,
            dp=8,
            micro_batch=1,
            pp=4,
            interleave=1,
            params_here=dense,
            layers_here=sum(kinds[r]),
            inflight_mb=inflight_microbatches(plan, r),
            is_last=r == 3,
            ep=4,
            expert_params_here=experts,
            moe_layers_here=kinds[r][1],
            capacity_factor=LOAD_IMBALANCE,
        )
        assert float(want[0]) == pytest.approx(6.0 * (dense + experts), rel=1e-12)
        assert float(want[1]) == pytest.approx(4.0 * (dense + experts), rel=1e-12)
        assert float(want[2]) == pytest.approx(8.0 * dense / 8 + 8.0 * experts / 4, rel=1e-12)
        assert got.gradients == pytest.approx(4.0 * (dense + experts), rel=1e-12)
        assert got.optimizer == pytest.approx(8.0 * (dense + experts) / 8, rel=1e-12)
        assert got.weights > 4.0 * (dense + experts)  # fp32 masters + autocast's 16-bit copies
        assert got == trainer_stage_memory(plan, r, on_cpu=False)
    # more ep, fewer experts per rank: the worst stage's model states shrink
    states = [
        sum((s.weights, s.gradients, s.optimizer))
        for s in (estimate_plan(_mixtral(ep), H100).memory_bytes for ep in (1, 2, 4, 8))
    ]
    assert states == sorted(states, reverse=True) and states[0] > 1.5 * states[-1]


def test_compute_follows_active_flops() -> None:
    """Twice the experts at the same top_k and width (twice the parameters, the same active FLOPs)
    barely move the compute; top_k 1 instead of 2 cuts it by about the routed experts' share of the
    active FLOPs. Megatron-Core's bf16 parameters: exatrain's trainer also passes over its fp32 parameters
    every micro-batch (autocast's casts, .grad adds; tests/planner/test_parameter_passes.py), which does
    grow with them."""
    mix = get_model("mixtral-8x7b")

    def compute_s(model):
        plan = make_plan(
            model,
            H100,
            gpus=64,
            tp=2,
            pp=4,
            micro_batch=1,
            global_batch=256,
            sequence_parallel=True,
            zero=1,
            runtime="megatron-core",
        )
        return estimate_plan(plan, H100).time_s.compute, model_flops_per_step(model, 256)

    base, flops = compute_s(mix)
    wide, wide_flops = compute_s(dataclasses.replace(mix, name="mixtral-16e", experts=16))
    assert wide_flops == pytest.approx(flops, rel=1e-3)  # only the router grows
    assert wide == pytest.approx(base, rel=0.05)
    top1, top1_flops = compute_s(dataclasses.replace(mix, name="mixtral-top1", top_k=1))
    assert top1_flops < 0.8 * flops
    # the compute saved is of the order of the FLOPs saved (attention, element-wise work and GEMM
    # shapes keep the two from being equal)
    assert 0.5 < (1 - top1 / base) / (1 - top1_flops / flops) < 1.5


def test_all_to_all_grows_with_ep_and_jumps_across_nodes() -> None:
    """ep 1 moves no tokens; with tp 2 an ep group of 2 or 4 stays inside an 8-GPU node, ep 8 spans
    15 ranks and crosses the network: its exposed all-to-all is several times ep 4's."""
    a2a = [estimate_plan(_mixtral(ep), H100).time_s.ep_comm for ep in (1, 2, 4, 8)]
    assert a2a[0] == 0.0
    assert 0 < a2a[1] < a2a[2] < a2a[3]
    assert a2a[3] > 4 * a2a[2]


def test_cp_halves_activations_per_rank() -> None:
    """llama3.1-8b at 128k tokens: each doubling of cp halves every rank's activations (s/cp tokens).
    (Megatron-Core's memory: exatrain's per-tensor trainer model counts no cp.)"""
    base = make_plan(
        "llama3.1-8b-128k",
        H100,
        gpus=32,
        tp=4,
        micro_batch=1,
        global_batch=8,
        sequence_parallel=True,
        zero=1,
        recompute="full",
    )
    acts, steps = [], []
    for cp in (1, 2, 4, 8):
        plan = base.replace(dims=ParallelDims(4, 1, 8 // cp, cp=cp), runtime="megatron-core").validate(H100)
        assert plan.gpus == 32
        est = estimate_plan(plan, H100)
        acts.append(est.memory_bytes.activations)
        steps.append(est.time_s)
    for a, b in zip(acts, acts[1:]):
        assert b == pytest.approx(a / 2, rel=1e-12)
    assert all(t.cp_comm >= 0 for t in steps) and steps[0].cp_comm == 0.0


def test_cp_ring_is_exposed_only_beyond_the_attention_it_hides_under() -> None:
    """At 8k tokens a ring across two nodes (tp 2, cp 8: 15 ranks) carries a micro-batch of 4's K,V block
    more slowly than the ring step's attention call it overlaps: some of it shows, and more at a
    micro-batch of 8; at 128k each call's attention hides it (Megatron-Core's p2p ring, its default)."""

    def ring(model: str, mb: int, **kw):
        plan = make_plan(
            model,
            H100,
            gpus=16,
            tp=2,
            micro_batch=mb,
            global_batch=8 * mb,
            sequence_parallel=True,
            runtime="megatron-core",
            **kw,
        )
        return estimate_plan(plan.replace(dims=ParallelDims(2, 1, 1, cp=8)).validate(H100), H100).time_s

    short4, short8 = ring("llama3.1-8b-8k", 4), ring("llama3.1-8b-8k", 8)
    assert 0 < short4.cp_comm < short8.cp_comm
    assert ring("llama3.1-8b-128k", 8, recompute="full").cp_comm == 0.0


def test_fp8_lowers_gemm_time_and_adds_scale_memory() -> None:
    """FP8 GEMMs run at the FP8 peak (compute falls), keep cached FP8 weight copies (weights grow) and,
    under delayed scaling, amax histories (other grows); MFU stays against the bf16 peak."""
    plan = make_plan(
        "llama3-70b",
        H100,
        gpus=64,
        tp=8,
        pp=2,
        micro_batch=1,
        global_batch=128,
        sequence_parallel=True,
        zero=1,
        recompute="selective",
    )
    plain = estimate_plan(plan, H100)
    for recipe in ("delayed", "block"):
        fp8 = estimate_plan(plan.replace(fp8=recipe).validate(H100), H100)
        assert fp8.time_s.compute < 0.85 * plain.time_s.compute
        assert fp8.memory_bytes.weights > plain.memory_bytes.weights
        assert fp8.mfu == pytest.approx(fp8.model_tflops_per_gpu * 1e12 / H100.device.peak_flops("bfloat16"))
        assert any("against the bfloat16 peak" in n for n in fp8.notes)
    # delayed scaling keeps amax histories that current scaling does not: 4 GEMMs x 40 layers per
    # stage, plus the 5% allocator allowance on them (accounting.memory)
    delayed = estimate_plan(plan.replace(fp8="delayed").validate(H100), H100)
    current = estimate_plan(plan.replace(fp8="current").validate(H100), H100)
    meta = Fp8Recipe("delayed").meta_bytes(4 * 40)
    assert delayed.memory_bytes.other - current.memory_bytes.other == pytest.approx(1.05 * meta, rel=1e-6)


def test_fp8_casts_cost_memory_traffic_by_recipe() -> None:
    """Each FP8 GEMM's input (forward) and output gradient (backward) is cast: read 2 bytes, write it and
    its transposed copy (1 + 1) under delayed or block scaling, one more 2-byte read for the amax under
    current scaling; so a layer's forward under current scaling takes exactly 2 bytes per cast element
    longer. (Broken on purpose: with one price for every recipe this failed.)"""
    from exatrain.accounting.flops import layer_gemms
    from exatrain.planner.cost import compute
    from exatrain.planner.cost import fp8 as cost_fp8
    from exatrain.planner.cost import layer as cost_layer

    m, cl = get_model("llama3-8b"), H100
    dev = compute.device_for(cl, "bfloat16", default_params(cl.device.name))
    sp = cost_fp8.fp8_speedup(cl, "bfloat16", dev.params)
    t = {
        r: cost_layer.layer_times(
            m, 2, 4, moe=False, ep=1, cp=1, sequence_parallel=True, dev=dev, run=Resolved(fp8=r), speedup=sp
        )
        for r in ("delayed", "current", "block")
    }
    cast = sum(
        g.m * g.k * g.count
        for g in layer_gemms(m, 2, 4, sequence_parallel=True)
        if g.name not in ("attn_scores", "attn_values", "router")
    )
    assert cost_fp8.CAST_BYTES == {"delayed": 4.0, "current": 6.0, "block": 4.0, "mxfp8": 4.0}
    assert t["current"].fwd - t["delayed"].fwd == pytest.approx(compute.elementwise_time_s(2.0 * cast, dev))
    assert t["block"].fwd == pytest.approx(t["delayed"].fwd)


def test_search_explores_ep_and_cp_and_counts_refusals() -> None:
    """ep candidates are the experts' divisors, refused (under their own reason) where they do not
    divide dp; cp candidates are powers of two, refused where tp*cp*pp does not divide the GPUs."""
    mix = get_model("mixtral-8x7b")
    sp = enumerate_space(mix, H100, 12, 12, SpaceOptions(**ONE, cp=(1,)), runtime="megatron-core")
    assert sp.examined == 4  # ep 1, 2, 4, 8 on dp 12
    assert sp.rejected["ep without experts, or ep does not divide experts / dp"] == 1
    assert sorted(sp.ep.tolist()) == [1, 2, 4]
    long = get_model("llama3.1-8b-128k")
    sp = enumerate_space(long, H100, 12, 12, SpaceOptions(**ONE), runtime="megatron-core")
    assert sp.examined == 4  # cp 1, 2, 4, 8
    assert sp.rejected["gpus not divisible by tp*cp*pp"] == 1
    assert sorted(sp.cp.tolist()) == [1, 2, 4] and sorted((sp.dp * sp.cp).tolist()) == [12, 12, 12]
    assert enumerate_space(get_model("gpt-22b"), H100, 12, 12, SpaceOptions(**ONE)).examined == 1  # no cp at 2k
    # with ZeRO-1 (Megatron's distributed optimizer) only ep shards the experts' weights and gradients:
    # the search picks ep > 1, and its plan's numbers are that plan's estimate
    res = search(
        mix,
        H100,
        64,
        256,
        top=3,
        options=SpaceOptions(cp=(1,), micro_batch=(1,), zero_stage=(1,)),
        runtime="megatron-core",
    )
    best = res.ranked[0]
    assert best.ep > 1
    again = estimate_plan(best, H100)
    assert again.time_s == best.estimate.time_s
    assert res.rejected["ep without experts, or ep does not divide experts / dp"] > 0


def test_bad_ep_or_cp_is_one_line_and_exit_2(capsys) -> None:
    for argv, words in (
        (["--model", "mixtral-8x7b", "--gpus", "64", "--ep", "3"], "not divisible by ep 3"),
        (["--model", "llama3-8b", "--gpus", "64", "--ep", "2"], "needs a mixture-of-experts model"),
        (["--model", "llama3-8b", "--gpus", "48", "--cp", "3"], "divisible by 2*cp"),
        (["--model", "llama3-8b", "--gpus", "64", "--fp8", "delayed", "--dtype", "float32"], "bfloat16"),
    ):
        code = main(["estimate", "--cluster", "dgx-h100", *argv])
        err = capsys.readouterr().err
        assert code == 2, argv
        assert len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err, err


def test_plan_json_carries_ep_cp_fp8(tmp_path) -> None:
    plan = _mixtral(4).replace(fp8="block").validate(H100)
    est = estimate_plan(plan, H100)
    path = tmp_path / "p.json"
    plan.with_estimate(est).save(path)
    back = type(plan).load(path)
    assert (back.ep, back.cp, back.fp8) == (4, 1, "block")
    assert back.estimate.time_s.ep_comm == pytest.approx(est.time_s.ep_comm)
    assert np.isfinite(back.estimate.time_s.step)


def test_engine_exports_carry_ep_cp_fp8() -> None:
    """Megatron-LM gets the MoE shape, --expert-model-parallel-size, --context-parallel-size and the
    FP8 recipe; torchtitan its parallelism degrees and float8 section; Megatron-DeepSpeed refuses."""
    from exatrain.engine_configs import export
    from exatrain.errors import UserError

    moe = make_plan(
        "mixtral-8x7b",
        H100,
        gpus=64,
        tp=2,
        pp=4,
        ep=4,
        micro_batch=1,
        global_batch=256,
        sequence_parallel=True,
        zero=1,
        fp8="delayed",
    )
    text = export(moe, "megatron").text
    for words in (
        "--num-experts 8",
        "--moe-router-topk 2",
        "--moe-ffn-hidden-size 14336",
        "--expert-model-parallel-size 4",
        "--fp8-format hybrid",
        "--fp8-recipe delayed",
        "--fp8-amax-history-len 1024",
        "--moe-token-dispatcher-type alltoall",
    ):
        assert f"  {words}\n" in text, words
    assert "--moe-layer-freq" not in text and "--context-parallel-size" not in text
    long = make_plan(
        "llama3.1-8b-128k",
        H100,
        gpus=32,
        tp=4,
        cp=8,
        micro_batch=1,
        global_batch=8,
        zero=1,
        sequence_parallel=True,
        fp8="block",
    )
    text = export(long, "megatron").text
    assert "  --context-parallel-size 8\n" in text and "  --fp8-recipe blockwise\n" in text
    assert "world size / (tp*cp*pp)" in text
    toml = export(long, "torchtitan").text
    assert "context_parallel_degree = 8\n" in toml and '[quantize.linear.float8]\nrecipe_name = "rowwise"' in toml
    assert "expert_parallel_degree = 4\n" in export(moe, "torchtitan").text
    with pytest.raises(UserError):
        export(moe, "deepspeed")
    assert (
        export(
            make_plan(
                "deepseek-v3", get_cluster("dgx-h200"), gpus=256, pp=8, ep=8, micro_batch=1, global_batch=512, zero=1
            ),
            "megatron",
        ).text.count("--moe-layer-freq '([0]*3+[1]*58)'")
        == 1
    )
