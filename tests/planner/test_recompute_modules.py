"""Megatron-Core's selective recomputation by module (``Plan.recompute_modules``, its --recompute-modules): what
each module stops keeping against its closed form, what it reruns in the backward (GEMMs, element-wise passes, the
TP collectives inside it, a MoE layer's all-to-alls), the hardware FLOPs it adds, the rules that refuse it where no
engine runs it, the plan file, the search, the exported flags and the trainer's refusal.

Broken on purpose and seen to fail here:
- the "mlp" drop applied to MoE layers too (``and not moe`` dropped in layer_activation_bytes):
  test_moe_modules_drop_the_routed_and_shared_parts;
- "moe_act" dropping only the activation's output (``act_recompute`` per copy keeping silu(gate)):
  test_moe_modules_drop_the_routed_and_shared_parts;
- the rerun modules' TP pairs not added to the backward (``pairs * tp_one_f`` dropped in stage_times):
  test_mlp_reruns_its_gemms_and_its_tp_pair;
- "moe" not rerunning the all-to-alls (``moe_rerun`` only under full): test_moe_reruns_its_all_to_alls;
- "core_attn" not rerunning the attention core in ``module_rerun_s``: test_core_attn_alone_is_the_default;
- "layernorm" dropping the fused norms of a dense layer (the ``if moe`` test of its drop removed; or a drop
  added to the plain count): test_dense_layer_modules_by_hand;
- hardware FLOPs adding the attention core without "core_attn": test_hardware_flops_follow_the_modules;
- the bytes sent without the rerun modules' TP pairs (``_module_pairs`` 0 in accounting.comms), or without "moe"'s
  all-to-alls again (``moe_again`` the full share only): test_bytes_count_the_reruns.
"""

from __future__ import annotations

import numpy as np
import pytest

from exatrain.accounting.engines import Resolved
from exatrain.accounting import memory, moe as moe_acc
from exatrain.accounting.context import kv_width
from exatrain.accounting.flops import hardware_flops_per_step, layer_gemms, model_flops_per_step
from exatrain.api.plans import make_plan, space_options
from exatrain.catalog import get_cluster, get_model
from exatrain.engine_configs import export
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.settings import recompute_modules_of
from exatrain.planner.cost import compute
from exatrain.planner.cost import layer as cost_layer
from exatrain.planner.cost import recompute as cost_recompute
from exatrain.planner import plan_cost
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.plan_cost import plan_stage_times
from exatrain.planner.estimate import estimate_plan
from tests.helpers.cli import refusals, run
from tests.helpers.plan_fields import trainer_refuses

H100 = get_cluster("dgx-h100")
LLAMA = get_model("llama3-8b")  # dense, SwiGLU, GQA: the plain (non-extended) accounting path
QWEN = get_model("qwen3-30b-a3b")  # MoE in every layer, no shared experts
DSV3 = get_model("deepseek-v3")  # latent attention, 3 dense layers first, one shared expert


def _bytes(m, modules, *, recompute="selective", moe=None, tp=2, sp=True, **kw):
    return memory.layer_activation_bytes(
        m, 1, tp, sequence_parallel=sp, recompute=recompute, flash=True, moe=moe, recompute_modules=tuple(modules), **kw
    )


def test_names_are_checked_and_put_in_megatron_order() -> None:
    assert recompute_modules_of("moe_act, layernorm,moe_act") == ("layernorm", "moe_act")
    assert recompute_modules_of(["mlp", "core_attn"]) == ("core_attn", "mlp")
    assert recompute_modules_of("") == () and recompute_modules_of(None) == ()
    with pytest.raises(UserError, match="unknown module 'attn'; choose among core_attn, layernorm"):
        recompute_modules_of("attn,mlp")


def test_dense_layer_modules_by_hand() -> None:
    h, f, e, tp = LLAMA.hidden, LLAMA.ffn_hidden, 2, 2
    s = LLAMA.seq_len
    none = _bytes(LLAMA, (), recompute="none")
    # the default selective is exactly core_attn alone: no attention statistics kept
    assert _bytes(LLAMA, ("core_attn",)) == _bytes(LLAMA, ()) == none - s * 4.0 * LLAMA.heads / tp
    # mlp: the MLP input (sequence-parallel shard) and the SwiGLU interior (gate, silu, up, product) go
    assert none - _bytes(LLAMA, ("mlp",)) == pytest.approx(s * (h * e / tp + 4 * f * e / tp))
    # the norms of a dense layer are fused into its GEMMs (Transformer Engine's spec): nothing to drop, on the
    # plain count and on the extended one (a dense layer of a model with its own head width, QK-norm and the like)
    assert _bytes(LLAMA, ("layernorm",)) == none
    qk = LLAMA.replace(qk_norm=True)
    assert _bytes(qk, ("layernorm",)) == _bytes(qk, (), recompute="none")
    # modules of MoE layers and latent attention change nothing on a dense model
    assert _bytes(LLAMA, ("moe", "moe_act", "shared_experts", "mla_up_proj")) == none
    # outside selective the list is not read
    assert _bytes(LLAMA, ("mlp",), recompute="full") == _bytes(LLAMA, (), recompute="full")


def test_latent_attention_modules_by_hand() -> None:
    e, tp, s = 2, 2, DSV3.seq_len
    none = _bytes(DSV3, (), recompute="none", moe=False)
    up = none - _bytes(DSV3, ("mla_up_proj",), moe=False)
    assert up == pytest.approx(s * (DSV3.q_width + kv_width(DSV3)) * e / tp)
    # latent attention's input norm stands alone: its output (the down-projections' input) goes
    assert none - _bytes(DSV3, ("layernorm",), moe=False) == pytest.approx(s * DSV3.hidden * e / tp)


def test_moe_modules_drop_the_routed_and_shared_parts() -> None:
    e, tp, s = 2, 2, QWEN.seq_len
    none = _bytes(QWEN, (), recompute="none", moe=True)
    copies = moe_acc.received_copies_per_rank(QWEN, 1, tp, sequence_parallel=True)
    f = QWEN.expert_width
    # moe_act: a routed copy keeps its fc1 output (2f) and neither silu(gate) nor the product (fc2's input)
    assert none - _bytes(QWEN, ("moe_act",), moe=True) == pytest.approx(copies * (f * e + f * e))
    # the pre-MLP norm stands alone in a MoE layer: its output, the MLP input, goes
    assert none - _bytes(QWEN, ("layernorm",), moe=True) == pytest.approx(s * QWEN.hidden * e / tp)
    # mlp is a dense layer's: a MoE layer keeps all it kept
    assert _bytes(QWEN, ("mlp",), moe=True) == none
    # moe: nothing past the layer's input — the router's and the routed copies' tensors all go
    router = moe_acc.router_activation_bytes(QWEN, 1, tp, sequence_parallel=True)
    routed = moe_acc.expert_activation_bytes(QWEN, 1, tp, sequence_parallel=True)
    assert none - _bytes(QWEN, ("moe",), moe=True) == pytest.approx(router + routed)
    # shared experts (DeepSeek-V3's one): their interior, sharded over tp
    shared = moe_acc.shared_expert_interior_elements(DSV3) * e / tp * DSV3.seq_len
    d_none = _bytes(DSV3, (), recompute="none", moe=True)
    assert d_none - _bytes(DSV3, ("shared_experts",), moe=True) == pytest.approx(shared)


def _dev(cluster=H100, gpus=8):
    params = default_params(cluster.device.name)
    return compute.device_for(cluster, "bfloat16", params, gpus)


def test_core_attn_alone_is_the_default() -> None:
    dev = _dev()
    lt = cost_layer.layer_times(DSV3, 1, 2, moe=True, ep=8, cp=1, sequence_parallel=True, dev=dev, run=Resolved())
    rerun = cost_recompute.module_rerun_s(
        DSV3,
        1,
        2,
        moe=True,
        ep=8,
        cp=1,
        sequence_parallel=True,
        dev=dev,
        run=Resolved(recompute_modules=("core_attn",)),
        attention_core_fwd=lt.attention_core_fwd,
    )
    assert rerun == pytest.approx(lt.attention_core_fwd)
    plan = make_plan(LLAMA, H100, gpus=8, tp=2, sequence_parallel=True, recompute="selective", runtime="megatron-core")
    same = estimate_plan(plan.replace(recompute_modules=("core_attn",)), H100)
    assert same.time_s.step == estimate_plan(plan, H100).time_s.step
    assert same.memory_bytes.total == estimate_plan(plan, H100).memory_bytes.total


def test_mlp_reruns_its_gemms_and_its_tp_pair() -> None:
    params = default_params("h100-sxm")
    dev = _dev()
    # one GPU: the rerun is the MLP's forward — fc1, fc2, the SwiGLU pass and its fused norm — in every layer
    one = make_plan(LLAMA, H100, gpus=1, micro_batch=1, global_batch=8, recompute="none", runtime="megatron-core")
    mlp = one.replace(recompute="selective", recompute_modules=("mlp",))
    diff = plan_stage_times(mlp, H100, params).bwd - plan_stage_times(one, H100, params).bwd
    gemms = [g for g in layer_gemms(LLAMA, 1, 1) if g.name in ("fc1", "fc2")]
    by_hand = (
        sum(compute.gemm_time_s(g, dev, in_bytes=2, out_bytes=2) for g in gemms)
        + compute.elementwise_time_s(LLAMA.seq_len * 2 * (3.0 * LLAMA.ffn_hidden + 2.0 * LLAMA.hidden), dev)
        + 2 * dev.params.op_overhead_s
    )
    assert float(diff.sum()) == pytest.approx(LLAMA.layers * by_hand, rel=1e-9)
    # tp 2 with sequence parallelism, no overlap: each layer's MLP gathers and reduce-scatters again
    two = make_plan(
        LLAMA,
        H100,
        gpus=2,
        tp=2,
        sequence_parallel=True,
        micro_batch=1,
        global_batch=8,
        recompute="none",
        runtime="megatron-core",
    )
    base = plan_stage_times(two, H100, params, overlap="none")
    again = plan_stage_times(
        two.replace(recompute="selective", recompute_modules=("mlp",)), H100, params, overlap="none"
    )
    L = LLAMA.layers
    pair = float(base.tp_fwd.sum()) / (2 * L + 1)  # 2 pairs a layer and the embedding's all-reduce
    assert float((again.tp_bwd - base.tp_bwd).sum()) == pytest.approx(L * pair, rel=1e-9)
    assert float((again.tp_fwd - base.tp_fwd).sum()) == 0.0


def test_moe_reruns_its_all_to_alls() -> None:
    params = default_params("h100-sxm")
    plan = make_plan(
        QWEN, H100, gpus=8, ep=8, micro_batch=1, global_batch=64, recompute="none", runtime="megatron-core"
    )
    base = plan_stage_times(plan, H100, params, overlap="none")
    moe = plan_stage_times(
        plan.replace(recompute="selective", recompute_modules=("moe",)), H100, params, overlap="none"
    )
    # dispatch and combine once more in the backward: the forward's all-to-alls again
    assert float((moe.ext_bwd - base.ext_bwd).sum()) == pytest.approx(float(base.ext_fwd.sum()), rel=1e-9)
    act = plan_stage_times(
        plan.replace(recompute="selective", recompute_modules=("moe_act",)), H100, params, overlap="none"
    )
    assert float((act.ext_bwd - base.ext_bwd).sum()) == 0.0
    # the whole layer's rerun costs more than its activation's, which costs more than nothing
    assert float(moe.bwd.sum()) > float(act.bwd.sum()) > float(base.bwd.sum())


def test_bytes_count_the_reruns() -> None:
    from exatrain.accounting import comms

    plan = make_plan(
        LLAMA,
        H100,
        gpus=8,
        tp=2,
        sequence_parallel=True,
        global_batch=64,
        recompute="selective",
        runtime="megatron-core",
    )
    rs = [
        next(c.count for c in comms.tp_collectives(p, 0) if c.kind == "reduce_scatter")
        for p in (plan, plan.replace(recompute_modules=("mlp",)), plan.replace(recompute_modules=("layernorm",)))
    ]
    mb, L = plan.num_microbatches, LLAMA.layers
    assert rs == [4 * L * mb, 5 * L * mb, 4 * L * mb]  # the layers' (the embedding's is one of its own)
    moe = make_plan(QWEN, H100, gpus=8, ep=8, global_batch=64, recompute="selective", runtime="megatron-core")
    ep = plan_cost.comm_bytes(moe)["ep"]
    assert plan_cost.comm_bytes(moe.replace(recompute_modules=("moe",)))["ep"] == pytest.approx(1.5 * ep)
    assert plan_cost.comm_bytes(moe.replace(recompute_modules=("moe_act",)))["ep"] == ep


def test_modules_trade_memory_for_time_within_none_and_full() -> None:
    plan = make_plan(
        DSV3,
        H100,
        gpus=256,
        tp=2,
        pp=8,
        ep=32,
        sequence_parallel=True,
        micro_batch=1,
        global_batch=512,
        zero=1,
        recompute="none",
        runtime="megatron-core",
    )
    none, full = (estimate_plan(plan.replace(recompute=r), H100) for r in ("none", "full"))
    for mods in (("mla_up_proj", "mlp"), ("layernorm", "moe_act"), ("moe",)):
        est = estimate_plan(plan.replace(recompute="selective", recompute_modules=mods), H100)
        assert full.memory_bytes.activations < est.memory_bytes.activations < none.memory_bytes.activations, mods
        assert none.time_s.step < est.time_s.step <= full.time_s.step, mods
        assert est.time_s.step >= est.time_s.compute


def test_hardware_flops_follow_the_modules() -> None:
    gb = 8
    tokens = gb * LLAMA.seq_len
    base = model_flops_per_step(LLAMA, gb)
    assert hardware_flops_per_step(LLAMA, gb, "selective", ("core_attn",)) == hardware_flops_per_step(
        LLAMA, gb, "selective"
    )
    # mlp: one more forward of fc1 (gate and up) and fc2 in every layer, nothing for the attention core
    mlp = 2.0 * 3 * LLAMA.hidden * LLAMA.ffn_hidden
    assert hardware_flops_per_step(LLAMA, gb, "selective", ("mlp",)) == pytest.approx(
        base + tokens * LLAMA.layers * mlp
    )
    assert hardware_flops_per_step(LLAMA, gb, "selective", ("layernorm",)) == base


def test_rules_refuse_where_no_engine_runs_it(capsys) -> None:
    args = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "64")
    refusals(
        capsys,
        args,
        [
            (
                "estimate",
                ("--runtime", "torchtitan", "--recompute", "selective", "--recompute-modules", "mlp"),
                "Megatron-Core's choice of what selective recomputation reruns",
            ),
            (
                "estimate",
                ("--runtime", "megatron-core", "--recompute", "full", "--recompute-modules", "mlp"),
                "use --recompute selective",
            ),
            (
                "estimate",
                ("--runtime", "megatron-core", "--recompute", "selective", "--recompute-modules", "mlp,ffn"),
                "unknown module 'ffn'",
            ),
            ("search", ("--runtime", "exatrain", "--recompute-modules", "mlp"), "runtime exatrain reruns its own"),
            (
                "search",
                ("--runtime", "megatron-core", "--recompute", "none", "--recompute-modules", "mlp"),
                "use --recompute selective",
            ),
        ],
    )


def test_search_tries_selective_only(capsys) -> None:
    options = space_options(recompute_modules="layernorm,mlp")
    assert options.recompute == ("selective",) and options.recompute_modules == ("layernorm", "mlp")
    code, out, err = run(
        capsys,
        "search",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--runtime",
        "megatron-core",
        "--recompute-modules",
        "mlp",
        "--top",
        "3",
        "--json",
    )
    assert code == 0, err
    import json

    ranked = json.loads(out)["ranked"]
    assert ranked and all(
        r["plan"]["recompute"] == "selective" and r["plan"]["recompute_modules"] == ["mlp"] for r in ranked
    )


def test_plan_file_export_and_trainer(tmp_path) -> None:
    plan = make_plan(
        QWEN, H100, gpus=8, ep=8, recompute="selective", runtime="megatron-core", recompute_modules="moe_act,layernorm"
    )
    assert plan.recompute_modules == ("layernorm", "moe_act")
    assert "recompute modules layernorm,moe_act" in plan.settings_label
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path).recompute_modules == ("layernorm", "moe_act")
    assert "recompute_modules" not in make_plan(QWEN, H100, gpus=8, ep=8).to_dict()
    # kept from a base plan
    assert make_plan(QWEN, H100, gpus=8, base=Plan.load(path), runtime="megatron-core").recompute_modules == (
        "layernorm",
        "moe_act",
    )
    text = export(plan, "megatron").text
    assert "--recompute-granularity selective" in text and "--recompute-modules layernorm moe_act" in text
    trainer_refuses(
        "selective recomputation reruns the attention core",
        runtime="megatron-core",
        recompute="selective",
        recompute_modules="mlp",
    )


def test_estimate_json_carries_them(capsys) -> None:
    import json

    code, out, err = run(
        capsys,
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "8",
        "--tp",
        "2",
        "--global-batch",
        "64",
        "--runtime",
        "megatron-core",
        "--recompute",
        "selective",
        "--recompute-modules",
        "mlp,core_attn",
        "--json",
    )
    assert code == 0, err
    est = json.loads(out)
    assert est["plan"]["recompute_modules"] == ["core_attn", "mlp"]
    assert np.isfinite(est["time_s"]["step"]) and est["time_s"]["step"] >= est["time_s"]["compute"]
