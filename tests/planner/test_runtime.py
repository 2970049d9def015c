"""The runtime (the engine that runs a plan): its overlaps, what it sends, tp across nodes, and the
--runtime / --overlap flags through the API, the CLI and the plan JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from exatrain import api
from exatrain.accounting import comms
from exatrain.accounting.engines import get_engine, resolve_settings
from exatrain.run_settings import RunSettings
from exatrain.settings import RUNTIMES
from exatrain.catalog import get_cluster, get_model
from exatrain.cli import main
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.cost.overlap import engine_collectives, exposed, overlap_rules
from exatrain.planner.cost.step import TIME_FIELDS, tp_collective_time_s, tp_overlap_exposed
from exatrain.planner.evaluate import evaluate
from exatrain.planner.search.batch import layouts_of
from exatrain.planner.search.space import enumerate_space

ON = ("tp", "dp_grad_reduce", "dp_param_gather", "pp_p2p", "ep_a2a")


def _on(rules) -> set[str]:
    return {c for c in ON if getattr(rules, c)}


@pytest.mark.parametrize(
    "runtime, offered, by_default",
    [
        ("megatron-core", set(ON), {"pp_p2p"}),
        ("megatron-deepspeed", {"dp_grad_reduce", "dp_param_gather"}, set()),
        ("torchtitan", {"tp", "dp_grad_reduce", "dp_param_gather"}, {"dp_grad_reduce", "dp_param_gather"}),
        ("exatrain", {"dp_grad_reduce", "dp_param_gather"}, {"dp_grad_reduce", "dp_param_gather"}),
    ],
)
def test_each_profile_overlaps_what_it_offers(runtime, offered, by_default) -> None:
    assert _on(overlap_rules(runtime, "all")) == offered
    assert _on(overlap_rules(runtime, "default")) == by_default
    assert _on(overlap_rules(runtime)) == by_default  # not stated: the engine's defaults, never its best case
    assert _on(overlap_rules(runtime, "none")) == set()
    assert len(overlap_rules(runtime, "all").switches) == len(offered)
    missing = sorted(set(ON) - offered)
    if missing:
        with pytest.raises(UserError, match=f"runtime {runtime} cannot overlap {missing[0]}"):
            overlap_rules(runtime, missing[0])
    with pytest.raises(UserError, match="--overlap must be"):
        overlap_rules(runtime, "everything")


def test_an_unstated_overlap_is_priced_at_the_engines_defaults_and_the_band_reaches_every_one_on() -> None:
    """--overlap left unset: the step is the engine's defaults' (not its best case), the notes say so and give the
    every-overlap-on step, and the band's low end reaches that step's own low end. (Broken on purpose: with the
    unset value priced as ``all`` again, the step equalled the all-on one and this failed; with the band left as
    it was, its low end stayed above the best case's.)"""
    kw = dict(tp=8, pp=2, sequence_parallel=True, runtime="megatron-core", gpus=64)
    unset, default, best = (
        _estimate(**kw).estimate,
        _estimate(overlap="default", **kw).estimate,
        _estimate(overlap="all", **kw).estimate,
    )
    assert unset.time_s.step == default.time_s.step > best.time_s.step
    note = next(n for n in unset.notes if n.startswith("--overlap not stated"))
    assert f"{best.time_s.step:.4g} s" in note
    assert not any(n.startswith("--overlap not stated") for n in default.notes)
    ratio = best.time_s.step / unset.time_s.step
    assert unset.band["ratio_low"] == pytest.approx(default.band["ratio_low"] * ratio)
    assert unset.band["ratio_high"] == pytest.approx(default.band["ratio_high"])
    assert unset.step_range_s[0] == pytest.approx(best.time_s.step * default.band["ratio_low"])
    assert any("--overlap not stated" in w for w in unset.band["widened"])
    # an engine whose defaults are every overlap it offers has nothing to widen
    fsdp = _estimate(runtime="llm-foundry", zero=3, tp=1, pp=1).estimate
    assert not any(n.startswith("--overlap not stated") for n in fsdp.notes)


def test_exposed_is_never_negative() -> None:
    assert list(exposed([1.0, 2.0, 3.0], [2.0, 2.0, 0.5])) == [0.0, 0.0, 2.5]


def _estimate(**kw) -> Plan:
    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=64, micro_batch=1, global_batch=256)
    return api.estimate(**{**base, **kw})


def test_tp_overlap_hides_tp_comm_behind_gemms_only_with_sequence_parallelism() -> None:
    for sp in (True, False):
        kw = dict(tp=8, pp=1, sequence_parallel=sp, runtime="megatron-core")
        on, off = _estimate(overlap="all", **kw).estimate, _estimate(overlap="none", **kw).estimate
        assert off.time_s.tp_comm > 0
        if sp:
            assert on.time_s.tp_comm < off.time_s.tp_comm and on.time_s.step < off.time_s.step
        else:
            assert on.time_s.tp_comm == off.time_s.tp_comm
        assert on.time_s.compute == off.time_s.compute
    # megatron-deepspeed has no TP overlap: its TP time is the same with every overlap on
    kw = dict(tp=8, sequence_parallel=True, runtime="megatron-deepspeed")
    assert (
        _estimate(overlap="all", **kw).estimate.time_s.tp_comm
        == _estimate(overlap="none", **kw).estimate.time_s.tp_comm
    )


def test_decomposed_tp_overlap_hides_each_collective_behind_its_own_gemm() -> None:
    """The closed form of a collective cut into tp chunks pipelined with the GEMM beside it: all of
    it hidden while the GEMM's (tp-1)/tp is longer, else the rest exposed; the backward pairs each
    transpose with twice the forward GEMM (input and weight gradients). (Broken on purpose: without
    the (tp-1)/tp share, and with the backward paired with the forward GEMM only, this failed.)"""
    tp = np.array([4])
    ag, rs = np.array([1.0]), np.array([2.0])
    g = (np.array([0.8]), np.array([1.0]), np.array([8.0]), np.array([8.0]))  # qkv, proj, fc1, fc2
    fwd, bwd = tp_overlap_exposed(ag, rs, tp, g, mlp=True)
    # forward: ag - 0.6 (qkv) + rs - 0.75 (proj); the MLP's GEMMs hide theirs
    assert fwd[0] == pytest.approx(0.4 + 1.25)
    # backward: rs beside 2 x qkv (1.2) and ag beside 2 x proj (1.5)
    assert bwd[0] == pytest.approx(0.8 + 0.0)
    attn_only = tp_overlap_exposed(ag, rs, tp, (g[0], g[1], np.array([0.0]), np.array([0.0])), mlp=False)
    assert attn_only[0][0] == pytest.approx(fwd[0])
    # a tp-1 group has nothing to send
    assert tp_overlap_exposed(0 * ag, 0 * rs, np.array([1]), g, mlp=True)[0][0] == 0.0


def test_tp_overlap_exposes_what_a_small_projection_cannot_hide() -> None:
    """Llama 3 8B at tp 8 with sequence parallelism on a DGX H100 (the torchtitan async-TP case): the
    layer's GEMMs together outlast its TP collectives, yet the output projection's reduce-scatter is
    longer than the projection, so part of it stays exposed; still less than with no overlap, and
    compute unchanged. (Broken on purpose: the old pooled rule, every collective behind all of the
    layer's GEMMs, priced tp_comm 0 here and this failed.)"""
    kw = dict(tp=8, pp=1, sequence_parallel=True, runtime="torchtitan", micro_batch=4)
    on, off = _estimate(overlap="all", **kw).estimate, _estimate(overlap="none", **kw).estimate
    assert 0 < on.time_s.tp_comm < off.time_s.tp_comm
    assert on.time_s.compute == off.time_s.compute and on.time_s.step >= on.time_s.compute


def test_expert_all_to_all_overlap_hides_it_behind_moe_compute_only() -> None:
    """Megatron-Core's --overlap-moe-expert-parallel-comm: the all-to-alls hide behind the MoE
    layers' compute of another micro-batch, never below zero and never touching compute; off, or
    under an engine that does not offer it, the all-to-all is all exposed. (Broken on purpose: the
    overlap applied whatever the switch, ``--overlap none`` hid the all-to-all too and this failed.)"""
    kw = dict(
        model="mixtral-8x7b",
        cluster="dgx-h100",
        gpus=64,
        global_batch=256,
        micro_batch=1,
        tp=2,
        pp=1,
        ep=8,
        zero=1,
        runtime="megatron-core",
    )
    on, off = (api.estimate(overlap=o, **kw).estimate.time_s for o in ("ep_a2a", "none"))
    assert off.ep_comm > 0 and 0 <= on.ep_comm < off.ep_comm
    assert on.compute == off.compute and on.step >= on.compute
    assert off.ep_comm - on.ep_comm <= on.compute  # nothing hides behind more than the compute there is
    both = api.estimate(overlap="all", **kw).estimate.time_s
    assert both.ep_comm == on.ep_comm
    with pytest.raises(UserError, match="runtime torchtitan cannot overlap ep_a2a"):
        api.estimate(overlap="ep_a2a", **{**kw, "runtime": "torchtitan"})


def test_grad_reduce_overlap_and_exatrains_pipeline_exception() -> None:
    on = _estimate(tp=1, pp=1, runtime="megatron-core", overlap="dp_grad_reduce").estimate
    off = _estimate(tp=1, pp=1, runtime="megatron-core", overlap="none").estimate
    assert 0 <= on.time_s.dp_comm < off.time_s.dp_comm
    # exatrain's DDP overlaps backward only without a pipeline schedule
    kw = dict(tp=2, pp=4, zero=0, runtime="exatrain")
    assert (
        _estimate(overlap="all", **kw).estimate.time_s.dp_comm
        == _estimate(overlap="none", **kw).estimate.time_s.dp_comm
    )


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_overlap_never_makes_a_step_shorter_than_its_compute(runtime) -> None:
    """Over 400 legal layouts per runtime on two clusters: with every overlap on the step is at least
    the busiest rank's compute, never longer than with none, and its parts still add up to it."""
    rng = np.random.default_rng(3)
    for name, cl, gpus, gb in (
        ("gpt-175b", "frontier", 1024, 1536),
        ("llama3-8b", "dgx-h100", 64, 256),
        ("mixtral-8x7b", "dgx-h100", 64, 256),
    ):
        m, c = get_model(name), get_cluster(cl)
        space = enumerate_space(m, c, gpus, gb, runtime=runtime)
        if not len(space):  # llm-foundry runs data parallelism alone: no layout of gpt-175b fits 1,024 GCDs
            assert runtime == "llm-foundry" and name == "gpt-175b"
            continue
        lay = layouts_of(space).take(rng.choice(len(space), size=min(200, len(space)), replace=False))
        cp = default_params(c.device.name)
        run = resolve_settings(RunSettings(runtime=runtime), m)
        t_all = evaluate(lay, m, c, cp, global_batch=gb, memory=(), run=run, overlap="all").time
        t_none = evaluate(lay, m, c, cp, global_batch=gb, memory=(), run=run, overlap="none").time
        assert np.all(t_all["step"] >= t_all["compute"])
        assert np.all(t_all["step"] <= t_none["step"] * (1 + 1e-12))
        for t in (t_all, t_none):
            parts = sum(t[f] for f in TIME_FIELDS if f != "step")
            assert np.all(np.abs(parts - t["step"]) <= 1e-9 * t["step"])
            assert all(np.all(t[f] >= 0) for f in TIME_FIELDS)


def test_what_each_engine_sends_over_data_parallelism() -> None:
    """ZeRO-3: parameters gathered in bf16 by every engine; gradients reduce-scattered in the
    engine's accumulation dtype (DeepSpeed bf16, torchtitan fp32). ZeRO-1 beyond exatrain's trainer:
    reduce-scatter of gradients + all-gather of bf16 weights instead of all-reduce + fp32 broadcast."""
    m, params = get_model("gpt-22b"), 1e9
    kw = dict(tp=1, pp=1, dp=8, num_microbatches=4, dtype="bfloat16", params_here=params, pipeline_end=False)

    def sent(engine, zero):
        cs = engine_collectives(
            comms.dp_collectives_for(m, zero_stage=zero, **kw), get_engine(engine), dtype="bfloat16"
        )
        return {(c.kind, float(c.message_bytes / params)) for c in cs}

    assert sent("megatron-deepspeed", 3) == {("reduce_scatter", 2.0), ("all_gather", 2.0)}
    assert sent("torchtitan", 3) == {("reduce_scatter", 4.0), ("all_gather", 2.0)}
    assert sent("megatron-core", 1) == {("reduce_scatter", 4.0), ("all_gather", 2.0)}
    assert sent("megatron-deepspeed", 1) == {("reduce_scatter", 2.0), ("all_gather", 2.0)}
    assert sent("exatrain", 1) == {("all_reduce", 4.0), ("broadcast", 4.0)}


def test_zero3_step_is_faster_with_bf16_reduce_scatter() -> None:
    kw = dict(model="llama3-8b", cluster="dgx-h100", gpus=128, micro_batch=1, global_batch=256, zero=3, overlap="none")
    ds = api.estimate(runtime="megatron-deepspeed", **kw).estimate.time_s.dp_comm
    tt = api.estimate(runtime="torchtitan", **kw).estimate.time_s.dp_comm
    assert ds < tt


def test_tp_across_nodes_is_priced_on_the_network() -> None:
    """tp 16 on 8-device nodes: a legal plan, its collectives across the network; a byte costs more than
    under tp 8 inside a node where the node's NICs together are slower than its NVLink (DGX A100: 8 x
    200 Gb/s against NVLink3), about the same where they are not (DGX H100: 8 x 400 Gb/s against NVLink4),
    never the several times one NIC would cost (cost.network.collective_s); the estimate says so."""
    msg = 1 << 28
    for name, lo, hi in (("dgx-a100", 1.05, 1.5), ("dgx-h100", 0.9, 1.3)):
        c = get_cluster(name)
        cp = default_params(c.device.name)
        per_byte = [
            float(tp_collective_time_s(c, cp, np.array([tp]), msg, np.array([True]))[0]) / msg for tp in (8, 16)
        ]
        assert lo * per_byte[0] < per_byte[1] < hi * per_byte[0], name
    plans = {
        tp: _estimate(
            model="gpt-1t",
            gpus=256,
            tp=tp,
            pp=16,
            recompute="full",
            sequence_parallel=True,
            runtime="megatron-core",
            overlap="none",
        )
        for tp in (8, 16)
    }
    e8, e16 = plans[8].estimate, plans[16].estimate
    assert e16.time_s.tp_comm / e16.comm_bytes["tp"] < 1.3 * e8.time_s.tp_comm / e8.comm_bytes["tp"]
    assert any("spans 2 dgx-h100 nodes" in n for n in e16.notes)
    assert not any("spans" in n for n in e8.notes)


def test_search_under_a_runtime_offers_only_its_zero_stages_and_names_it() -> None:
    r = api.search(model="llama3-8b", cluster="dgx-h100", gpus=64, global_batch=256, top=20, runtime="torchtitan")
    assert 1 not in {p.zero_stage for p in r.ranked} and r.rejected["ZeRO stage the runtime does not offer"] > 0
    assert all(p.runtime == "torchtitan" for p in r.ranked)
    r = api.search(model="llama3-8b", cluster="dgx-h100", gpus=64, global_batch=256, top=5, runtime="megatron-core")
    assert r.rejected.get("ZeRO stage the runtime does not offer", 0) == 0  # Megatron-FSDP gives it 2 and 3
    assert all(p.tp <= 8 for p in r.ranked)  # tp across nodes only when pinned


def test_runtime_round_trips_through_the_cli_and_plan_json(tmp_path, capsys) -> None:
    out = tmp_path / "plan.json"
    argv = [
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "16",
        "--tp",
        "2",
        "--zero",
        "3",
        "--runtime",
        "torchtitan",
        "--out",
        str(out),
        "--json",
    ]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["runtime"] == "torchtitan"
    assert any(n.startswith("runtime torchtitan") for n in d["notes"])
    assert Plan.load(out).runtime == "torchtitan"
    assert main(argv[:-3]) == 0
    assert "runtime torchtitan" in capsys.readouterr().out
    assert (
        main(
            [
                "search",
                "--model",
                "gpt-small",
                "--cluster",
                "local-cpu",
                "--gpus",
                "4",
                "--global-batch",
                "16",
                "--dtype",
                "float32",
                "--runtime",
                "megatron-deepspeed",
                "--top",
                "2",
                "--json",
            ]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert all(p["plan"]["runtime"] == "megatron-deepspeed" for p in d["ranked"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["estimate", "--model", "gpt-22b", "--runtime", "nemo"],
            "--runtime must be one of megatron-core, megatron-deepspeed, torchtitan, exatrain, llm-foundry, got 'nemo'",
        ),
        (
            ["search", "--model", "gpt-22b", "--gpus", "8", "--global-batch", "8", "--runtime", "megatron"],
            "(Megatron-LM is megatron-core)",
        ),
        (
            ["scaling", "--model", "gpt-22b", "--gpus", "8,16", "--global-batch", "8", "--runtime", "x"],
            "--runtime must be",
        ),
        (
            ["estimate", "--model", "gpt-22b", "--runtime", "megatron-deepspeed", "--overlap", "tp"],
            "runtime megatron-deepspeed cannot overlap tp",
        ),
        (
            ["tune", "--model", "gpt-tiny", "--gpus", "2", "--global-batch", "4", "--runtime", "torchtitan"],
            "tune runs exatrain's own trainer: --runtime must be exatrain",
        ),
    ],
)
def test_bad_runtime_is_one_line_exit_2(capsys, argv, message) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_each_collective_call_costs_the_libraries_base_latency() -> None:
    """A fixed cost per collective call (NCCL's 8.4 us, RCCL's 17 us): small micro-batches under tp 2
    pay it on every TP collective, so their TP time grows by about calls x base, a large message's
    barely moves."""
    c = get_cluster("dgx-h100")
    cp = default_params(c.device.name)
    assert cp.collective_overhead_s == pytest.approx(8.4e-6)
    assert default_params("mi250x-gcd").collective_overhead_s == pytest.approx(17e-6)
    bare = cp.replace(collective_overhead_s=0.0)
    small = [float(tp_collective_time_s(c, p, np.array([2]), 4096, np.array([False]))[0]) for p in (cp, bare)]
    big = [float(tp_collective_time_s(c, p, np.array([2]), 1 << 30, np.array([False]))[0]) for p in (cp, bare)]
    assert small[0] - small[1] == pytest.approx(8.4e-6) and small[0] > 2 * small[1]
    assert big[0] / big[1] - 1 < 1e-2
    plan = _estimate(model="llama3-8b", gpus=8, tp=2, micro_batch=1, global_batch=32)
    with_base = api.estimate(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=2, micro_batch=1, global_batch=32)
    from exatrain.planner.estimate import estimate_plan

    without = estimate_plan(plan, c, bare)
    assert with_base.estimate.time_s.tp_comm > without.time_s.tp_comm


def test_async_tp_hides_the_forward_collectives_only() -> None:
    """torchtitan's async TP hides the forward's TP collectives, and a full recomputation's rerun forward's
    as the forward's (inductor's micro-pipeline pass runs on the compiled backward graph, which holds the
    rerun forward), and leaves the backward's own exposed (Overlap.passes "forward": its announcement
    measured ~20-29% forward and ~8% end-to-end speed-up); Megatron-Core's --tp-comm-overlap covers both
    passes. Seen to catch: the torchtitan profile's passes set back to "both" (its backward TP time then
    falls without recomputation); the rerun forward's collectives left exposed (the full-recompute case)."""
    from exatrain.catalog import get_cluster
    from exatrain.planner.plan_cost import plan_stage_times

    assert overlap_rules("torchtitan", "all").tp_backward is False
    assert overlap_rules("megatron-core", "all").tp_backward is True
    assert get_engine("torchtitan").overlap("tp").passes_source
    cluster = get_cluster("dgx-h100")
    params = default_params("h100-sxm")
    for runtime, backward_hidden in (("torchtitan", False), ("megatron-core", True)):
        for recompute in ("none", "full"):
            plan = api.make_plan(
                "llama3-70b",
                cluster,
                gpus=64,
                tp=8,
                global_batch=64,
                zero=3 if runtime == "torchtitan" else 1,
                recompute=recompute,
                sequence_parallel=True,
                runtime=runtime,
            )
            on = plan_stage_times(plan, cluster, params, overlap="tp")
            off = plan_stage_times(plan, cluster, params, overlap="none")
            hidden_fwd = float(off.tp_fwd[0, 0]) - float(on.tp_fwd[0, 0])
            hidden_bwd = float(off.tp_bwd[0, 0]) - float(on.tp_bwd[0, 0])
            assert hidden_fwd > 0
            if backward_hidden:
                assert hidden_bwd > (hidden_fwd if recompute == "full" else 0.0)
            elif recompute == "full":  # the rerun forward's collectives, hidden as the forward's are
                assert hidden_bwd == pytest.approx(hidden_fwd, rel=1e-9)
            else:
                assert hidden_bwd == pytest.approx(0.0, abs=1e-15)


def test_ring_collectives_on_the_network_reach_net_eff_of_line_rate() -> None:
    """NCCL's rings over the NICs come within 0.92 of line rate (coefficients._IB_RING_EFF, cited),
    the node's NVLink ring at link_eff; an all-to-all keeps link_eff on both tiers. (Broken on purpose:
    with tier_arrays ignoring net_eff this failed.)"""
    from exatrain.planner.cost import moe as cost_moe
    from exatrain.planner.cost import network

    c = get_cluster("dgx-h100")
    cp = default_params(c.device.name)
    assert (cp.net_eff, cp.link_eff) == (pytest.approx(0.92), pytest.approx(0.75))
    msg, n = float(1 << 30), 16  # 16 ranks: two nodes, so the network carries the ring
    bare = cp.replace(collective_overhead_s=0.0)
    for span, rate in ((8, c.tiers[0].bytes_per_s * 0.75), (n, c.network.bytes_per_s * 0.92)):
        bw, lat = network.tier_arrays(c, np.array([span]), bare)
        t = float(network.collective_time_s("all_gather", span, msg, bw, lat, bare)[0])
        assert t == pytest.approx((span - 1) * float(lat[0]) + (span - 1) / span * msg / rate)
    # without params (the all-to-all's and the cp ring's callers) the network stays at link_eff
    bw, _ = network.tier_arrays(c, np.array([n]))
    assert float(bw[0]) == c.network.bytes_per_s
    # a calibration that measured the only tier there is leaves nothing at the catalog's rate
    assert cp.replace(net_eff=None).net_eff is None
    # the MoE all-to-all across nodes is priced as before: link_eff on the network
    m = get_model("mixtral-8x7b")
    a2a = cost_moe.a2a_time_s(
        m,
        c,
        cp,
        np.array([1]),
        np.array([1]),
        ep=16,
        cp=1,
        sequence_parallel=False,
        dtype="bfloat16",
        dp=np.array([16]),
    )
    a2a_same = cost_moe.a2a_time_s(
        m,
        c,
        cp.replace(net_eff=None),
        np.array([1]),
        np.array([1]),
        ep=16,
        cp=1,
        sequence_parallel=False,
        dtype="bfloat16",
        dp=np.array([16]),
    )
    assert float(np.asarray(a2a).ravel()[0]) == float(np.asarray(a2a_same).ravel()[0])


def test_zero3_gathers_and_reduction_share_the_backward_they_hide_behind() -> None:
    """ZeRO-3 sends its forward gathers beside the forward, and its backward gathers and gradient
    reduction beside the backward, over one set of links: the seconds hidden never exceed the compute
    they hide behind, and a step whose data-parallel traffic outlasts its compute exposes at least the
    difference. (torchtitan's Llama 3.1 8B on 32 H200s: 62 GB a rank per step against 1.3 s of compute;
    counting each collective against the whole backward alone had hidden 1.66 s behind 1.27 s. Broken on
    purpose: with that old rule restored this failed.)"""
    kw = dict(
        model="llama3-8b",
        cluster="dgx-h200",
        gpus=32,
        micro_batch=2,
        global_batch=64,
        zero=3,
        recompute="selective",
        runtime="torchtitan",
        fp8="current",
        attention_kernel="fa2",
        elementwise="fused",
    )
    est = api.estimate(seq_len=8192, vocab=128256, **kw).estimate
    none = api.estimate(seq_len=8192, vocab=128256, overlap="none", **kw).estimate
    t, t0 = est.time_s, none.time_s
    hidden = t0.dp_comm - t.dp_comm
    assert 0 < hidden <= t.compute
    assert t.dp_comm >= t0.dp_comm - t.compute - 1e-9
    assert t.step >= t.compute + t0.dp_comm - t.compute - 1e-9
