"""Context parallelism as each engine runs it (``accounting.context.CpExchange``, ``Plan.cp_comm``): which
exchange each engine offers and picks, what each one exposes against its closed form, its kernel calls, its
traffic and working set, the rules that refuse what an engine cannot run, and the settings each exported
config carries.

Broken on purpose and seen to fail here:
- every exchange priced as the p2p ring (``cp_exposed_s`` ignoring ``exchange``): the closed-form tests fail;
- TE's all-gather not gathering again in the backward (``regather`` dropped): test_all_gather_exposed_by_hand;
- the a2a all-to-alls counted once a pass instead of twice (Q,K,V and the output): test_a2a_by_hand;
- ``kernel_calls`` ignored by ``layer_times`` (always cp calls): test_kernel_calls_follow_the_exchange;
- megatron-core's entry dropped from plan.CP_COMMS_WITHOUT_WINDOWS:
  test_a_windowed_model_needs_an_exchange_that_runs_windows;
- megatron-core's sinks entry dropped from plan.CP_COMMS_WITHOUT_SINKS: test_attention_sinks_need_the_all_to_all;
- the heads check dropped (``_a2a_heads_broken`` all False): test_a2a_needs_cp_to_divide_the_heads_a_rank_holds;
- Megatron's "allgather" spelling replaced by TE's "all_gather" in the export: test_exports_carry_the_exchange.
"""

from __future__ import annotations

import numpy as np
import pytest

from exatrain.accounting.engines import Resolved
from exatrain.accounting import comms, context, memory
from exatrain.accounting.engines import ENGINES, get_engine
from exatrain.accounting.flops import layer_gemms
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.engine_configs import export
from exatrain.errors import UserError
from exatrain.planner.cost import network
from exatrain.planner.cost import context as cost_context
from exatrain.planner.cost import layer as cost_layer
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.cost.compute import device_for, flash_attention_s
from exatrain.planner.estimate import estimate_plan
from exatrain.plan import Plan
from exatrain.settings import CP_COMM_RUNTIMES
from tests.helpers.cli import refused, refused_by_planner
from tests.helpers.plan_fields import check_round_trip, trainer_refuses
from tests.helpers.memory import rank_memory

H100 = get_cluster("dgx-h100")
LONG = get_model("llama3.1-8b-128k")  # 32 heads, 8 K,V heads of 128


def test_each_engine_offers_and_picks_its_own() -> None:
    # the rules' table (plan.CP_COMM_RUNTIMES) and the priced exchanges are the same list, in the same order
    assert {n: tuple(x.comm for x in e.cp_exchanges) for n, e in ENGINES.items() if e.cp_exchanges} == CP_COMM_RUNTIMES
    # llm-foundry runs no context parallelism (its rule refuses cp > 1): no exchange to price
    assert get_engine("llm-foundry").cp_exchange() is None
    picks = {name: ENGINES[name].cp_exchange().comm for name in CP_COMM_RUNTIMES}
    assert picks == {
        "megatron-core": "p2p",
        "megatron-deepspeed": "a2a",
        "torchtitan": "all_gather",
        "exatrain": "all_gather",
    }
    # a model with sliding windows: Transformer Engine's ring does not run them, its all-to-all does
    assert get_engine("megatron-core").cp_exchange("", get_model("gpt-oss-20b")).comm == "a2a"
    assert get_engine("megatron-core").cp_exchange("all_gather").calls == "chunks"
    with pytest.raises(
        UserError, match="torchtitan does not run context parallelism that way; it offers all_gather, p2p"
    ):
        get_engine("torchtitan").cp_exchange("a2a")
    with pytest.raises(UserError, match="--cp-comm must be one of p2p, all_gather, a2a"):
        get_engine("megatron-core").cp_exchange("ring")


def _exposed(exchange, attn_fwd=1e-3, cp=4, tp=2, b=1):
    params = default_params("h100-sxm")
    return cost_context.cp_exposed_s(
        LONG,
        H100,
        params,
        b,
        tp,
        cp=cp,
        dtype="bfloat16",
        attn_fwd=attn_fwd,
        attn_bwd=2.5 * attn_fwd,
        exchange=exchange,
    )


def _tier(cp=4, tp=2, net=False):
    params = default_params("h100-sxm")
    return network.tier_arrays(H100, (cp - 1) * tp + 1, params if net else None), params


def test_p2p_is_the_ring_as_before() -> None:
    ring = get_engine("megatron-core").cp_exchange("p2p")
    assert _exposed(ring) == _exposed(None)
    (bw, lat), params = _tier()
    send = lat + context.kv_block_bytes(LONG, 1, 2, 4) / (bw * params.link_eff)
    fwd, bwd = _exposed(ring, attn_fwd=0.0)  # nothing to hide behind: every send shows
    assert fwd == pytest.approx(3 * send) and bwd == pytest.approx(3 * 2 * send)


def test_all_gather_exposed_by_hand() -> None:
    (bw, lat), params = _tier(net=True)
    whole = 4 * context.kv_block_bytes(LONG, 1, 2, 4)
    gather = params.collective_overhead_s + 3 * lat + 0.75 * whole / (bw * params.link_eff)
    scatter = gather  # a reduce-scatter of the same buffer: as many steps and bytes
    te = get_engine("megatron-core").cp_exchange("all_gather")
    fwd, bwd = _exposed(te, attn_fwd=10.0)  # exposed whatever the attention
    assert fwd == pytest.approx(gather) and bwd == pytest.approx(gather + scatter)
    # exatrain's trainer keeps the gathered K,V for the backward: only the reduce-scatter
    fwd, bwd = _exposed(get_engine("exatrain").cp_exchange(), attn_fwd=10.0)
    assert fwd == pytest.approx(gather) and bwd == pytest.approx(scatter)


def test_torch_all_gather_hides_behind_the_local_block() -> None:
    tt = get_engine("torchtitan").cp_exchange()
    (bw, lat), params = _tier()
    send = lat + context.kv_block_bytes(LONG, 1, 2, 4) / (bw * params.link_eff)
    fwd, bwd = _exposed(tt, attn_fwd=10.0)  # long attention: the gathers and ring hops hide, the last hop does not
    assert fwd == 0.0 and bwd == pytest.approx(send)
    fwd0, bwd0 = _exposed(tt, attn_fwd=0.0)
    exposed_te = _exposed(get_engine("megatron-core").cp_exchange("all_gather"), attn_fwd=0.0)
    assert fwd0 == pytest.approx(exposed_te[0])  # nothing to hide behind: the whole gather
    assert bwd0 == pytest.approx(exposed_te[0] + 4 * send)  # the gather again and cp dK,dV hops


def test_a2a_by_hand() -> None:
    (bw, lat), params = _tier()
    tokens = LONG.seq_len / 4 / 2  # s/cp tokens, heads over tp 2
    qkv, out = tokens * (32 * 128 + 2 * 8 * 128) * 2, tokens * 32 * 128 * 2
    assert context.a2a_tensor_bytes(LONG, 1, 2, 4) == pytest.approx((qkv, out))
    one_pass = 2 * (params.collective_overhead_s + 3 * lat) + 0.75 * (qkv + out) / (bw * params.link_eff)
    fwd, bwd = _exposed(get_engine("megatron-deepspeed").cp_exchange(), attn_fwd=10.0)
    assert fwd == pytest.approx(one_pass) and bwd == pytest.approx(one_pass)
    # traffic: 3/4 of Q,K,V and of the output, each pass; full recomputation repeats the forward's
    assert context.cp_bytes_per_layer(LONG, 1, 2, 4, comm="a2a") == pytest.approx(2 * 0.75 * (qkv + out))
    assert context.cp_bytes_per_layer(LONG, 1, 2, 4, comm="a2a", recompute="full") == pytest.approx(
        3 * 0.75 * (qkv + out)
    )
    cs = comms.cp_collectives_for(
        LONG, micro_batch=1, tp=2, cp=4, dtype="bfloat16", layers=32, num_microbatches=3, comm="a2a"
    )
    assert sum(float(c.bytes_per_rank) for c in cs) == pytest.approx(2 * 0.75 * (qkv + out) * 32 * 3)
    # the working set: the received Q,K,V and the output before it goes back
    assert context.cp_buffer_bytes(LONG, 1, 2, 4, comm="a2a") == pytest.approx(qkv + out)


def test_kernel_calls_follow_the_exchange() -> None:
    dev = device_for(H100, "bfloat16", default_params("h100-sxm"), 16)
    calls = {name: ENGINES[name].cp_exchange().kernel_calls(8) for name in CP_COMM_RUNTIMES}
    assert calls == {"megatron-core": 8, "megatron-deepspeed": 1, "torchtitan": 8, "exatrain": 1}
    assert get_engine("megatron-core").cp_exchange("all_gather").kernel_calls(8) == 2
    assert get_engine("megatron-core").cp_exchange().kernel_calls(1) == 1
    kw = dict(moe=False, ep=1, cp=8, sequence_parallel=False, dev=dev, run=Resolved())
    core = [
        g for g in layer_gemms(LONG, 1, 1, moe=False, ep=1, cp=8, sequence_parallel=False) if g.name.startswith("attn_")
    ]
    for n in (1, 2, 8):
        lt = cost_layer.layer_times(LONG, 1, 1, cp_calls=n, **kw)
        assert lt.attention_core_fwd == pytest.approx(flash_attention_s(core, dev, calls=n)[0])
    # fewer, longer calls run the kernel at a better rate
    assert cost_layer.layer_times(LONG, 1, 1, cp_calls=1, **kw).fwd < cost_layer.layer_times(LONG, 1, 1, **kw).fwd


def test_the_plan_carries_its_choice(tmp_path) -> None:
    path = check_round_trip(tmp_path, H100, "cp_comm", "p2p")
    assert Plan.load(path).settings_label.endswith("cp p2p")
    a2a = make_plan(LONG, H100, gpus=16, cp=8, runtime="megatron-core", cp_comm="a2a")
    ring = a2a.replace(cp_comm="p2p")
    est_a, est_r = estimate_plan(a2a, H100), estimate_plan(ring, H100)
    assert est_a.time_s.step != est_r.time_s.step
    assert any("a2a (--cp-comm-type a2a; set by --cp-comm" in n for n in est_a.notes)
    assert any("p2p (--cp-comm-type p2p, the default; set by --cp-comm" in n for n in est_r.notes)
    # the bytes a rank sends: the all-to-all's over all the rank's layers and micro-batches
    qkv, out = context.a2a_tensor_bytes(LONG, 1, 1, 8)
    assert est_a.comm_bytes["cp"] == pytest.approx(2 * 7 / 8 * (qkv + out) * LONG.layers * a2a.num_microbatches)


def test_memory_counts_the_exchange_s_working_set() -> None:
    kw = dict(
        dtype="bfloat16",
        zero_stage=1,
        recompute="selective",
        sequence_parallel=True,
        flash=True,
        tp=2,
        dp=1,
        micro_batch=1,
        pp=1,
        interleave=1,
        params_here=4e9,
        layers_here=32,
        inflight_mb=1,
        is_last=True,
        cp=4,
    )
    *_, other_a2a = rank_memory(LONG, cp_comm="a2a", **kw)
    *_, other_ring = rank_memory(LONG, cp_comm="p2p", **kw)
    diff = context.cp_buffer_bytes(LONG, 1, 2, 4, comm="a2a") - context.cp_buffer_bytes(LONG, 1, 2, 4, comm="p2p")
    assert other_a2a - other_ring == pytest.approx(diff * (1 + memory.FRAGMENTATION_ALLOWANCE))


def test_a_windowed_model_needs_an_exchange_that_runs_windows(capsys) -> None:
    refused_by_planner(
        capsys,
        "megatron-core's p2p context parallelism does not run sliding-window attention and "
        "attention sinks, which gpt-oss-20b has: use --cp-comm a2a",
        "--model",
        "gpt-oss-20b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "16",
        "--cp",
        "2",
        "--global-batch",
        "16",
        "--runtime",
        "megatron-core",
        "--cp-comm",
        "p2p",
    )
    windows_only = get_model("gpt-oss-20b").replace(attention_sinks=False)
    from exatrain.settings import cp_comm_problem

    assert cp_comm_problem("p2p", "megatron-core", windows_only) == (
        "megatron-core's p2p context parallelism does not run sliding-window attention, which gpt-oss-20b has: use "
        "--cp-comm a2a or all_gather"
    )
    assert cp_comm_problem("all_gather", "megatron-core", windows_only) is None
    # left to itself, Megatron-Core's plan for it runs the all-to-all
    plan = make_plan("gpt-oss-20b", H100, gpus=16, cp=2, ep=8, global_batch=16, runtime="megatron-core")
    assert any("a2a (--cp-comm-type a2a;" in n for n in estimate_plan(plan, H100).notes)


def test_attention_sinks_need_the_all_to_all(capsys) -> None:
    # GPT-OSS's learned sinks: Transformer Engine runs them under cp only through its fused all-to-all path
    refused_by_planner(
        capsys,
        "megatron-core's all_gather context parallelism does not run attention sinks, which "
        "gpt-oss-20b has: use --cp-comm a2a",
        "--model",
        "gpt-oss-20b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "16",
        "--cp",
        "2",
        "--global-batch",
        "16",
        "--runtime",
        "megatron-core",
        "--cp-comm",
        "all_gather",
    )
    sinks_only = get_model("llama3.1-8b-128k").replace(attention_sinks=True)
    assert get_engine("megatron-core").cp_exchange("", sinks_only).comm == "a2a"
    assert get_engine("torchtitan").cp_exchange("", sinks_only).comm == "all_gather"  # listed for TE only


def test_a2a_needs_cp_to_divide_the_heads_a_rank_holds(capsys) -> None:
    # 32 heads and 8 K,V heads: at tp 2 a rank holds 16 and 4, which cp 8 does not divide
    line = refused(
        capsys,
        "estimate",
        "--model",
        "llama3.1-8b-128k",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "16",
        "--tp",
        "2",
        "--cp",
        "8",
        "--global-batch",
        "8",
        "--runtime",
        "megatron-deepspeed",
    )
    assert line.endswith(
        "--cp 8 by all-to-all splits the 16 heads and 4 K,V heads a rank holds at tp 2 into cp "
        "groups: cp must divide both (or use another --cp-comm)"
    ), line
    make_plan(LONG, H100, gpus=16, tp=2, cp=4, runtime="megatron-deepspeed")  # 16 and 4 heads by 4: fine
    from exatrain.api import search

    result = search(
        model="llama3.1-8b-128k",
        cluster="dgx-h100",
        gpus=16,
        global_batch=16,
        cp=8,
        runtime="megatron-core",
        cp_comm="a2a",
    )
    assert result.rejected["cp exchange the runtime does not run for this layout"] > 0
    assert all((p.model.kv_heads // p.tp) % 8 == 0 for p in result.ranked)


def test_an_exchange_the_runtime_does_not_offer_is_one_line(capsys) -> None:
    refused_by_planner(
        capsys,
        "--cp-comm a2a: torchtitan does not run context parallelism that way; it offers all_gather",
        "--model",
        "llama3.1-8b-128k",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "16",
        "--cp",
        "8",
        "--global-batch",
        "8",
        "--runtime",
        "torchtitan",
        "--cp-comm",
        "a2a",
    )


def test_the_trainer_refuses_another_exchange() -> None:
    trainer_refuses(
        "the exatrain trainer runs context parallelism by all-gathering K,V; plan --cp-comm p2p",
        cp_comm="p2p",
        runtime="megatron-core",
    )


def test_exports_carry_the_exchange() -> None:
    for comm, flag in (("", "p2p"), ("a2a", "a2a"), ("all_gather", "allgather")):
        plan = make_plan(LONG, H100, gpus=16, cp=8, runtime="megatron-core", cp_comm=comm or None)
        assert f"--cp-comm-type {flag}" in export(plan, "megatron").text, comm
    for comm, method in (("", "allgather"), ("p2p", "alltoall")):
        plan = make_plan(LONG, H100, gpus=16, cp=8, runtime="torchtitan", cp_comm=comm or None)
        assert f'context_parallel_rotate_method = "{method}"' in export(plan, "torchtitan").text, comm


def test_every_exchange_leaves_the_step_no_shorter_than_its_compute() -> None:
    for runtime in ENGINES:
        for x in get_engine(runtime).cp_exchanges:
            plan = make_plan(LONG, H100, gpus=16, cp=4, tp=2, runtime=runtime, cp_comm=x.comm)
            t = estimate_plan(plan, H100).time_s
            assert t.step >= t.compute, (runtime, x.comm)
            assert np.isfinite(t.step)
