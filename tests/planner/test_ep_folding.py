"""Expert parallelism wider than dp (Megatron-Core's MoE parallel folding): which runtimes take it, the
ranks its groups span, what each rank keeps, and the search that offers it.

Broken on purpose to see these tests fail (each then reverted):
  * ``rules.ep_fits`` without the folded case (ep | dp for megatron-core too): the rules, memory and
    search tests and the published-row test (tests/bench/test_prediction_error.py) fail;
  * ``cost.cost_moe.ep_span`` / ``edp_span`` pricing a folded group as if it were strided by tp*cp
    inside dp: the span test fails (63 ranks instead of 32 for tp 2, dp 16, ep 32);
  * ``cost.cost_moe.a2a_time_s`` counting a folded group's members per node as gpus_per_node //
    (tp*cp) (4 instead of 8): the all-to-all test fails;
  * ``accounting.moe.expert_dp`` as dp / ep (leaving tp and cp out): the memory test fails;
  * ``search.space.enumerate_space`` not passing its runtime to the rules: the search test fails.
"""

from __future__ import annotations

import pytest

from exatrain import rules
from exatrain.accounting.params import layer_params, stage_layer_kinds, stage_params_split
from exatrain.catalog import get_cluster, get_model
from exatrain.errors import PlanError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.planner.cost import moe as cost_moe
from exatrain.accounting import moe as moe_acc
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.estimate import estimate_plan
from exatrain.planner.search.search import search
from exatrain.planner.search.space import SpaceOptions, enumerate_space
from exatrain.trainer.config import TrainConfig

H100 = get_cluster("dgx-h100")
EP_REASON = "ep without experts, or ep does not divide experts / dp"


def _qwen(runtime: str = "megatron-core", *, ep: int = 32, sp: bool = True, tp: int = 2, dp: int = 16) -> Plan:
    """Qwen3-30B-A3B (128 experts) as Megatron-Bridge lays out Qwen3-235B-A22B on 256 H100s:
    tp 2, pp 8, dp 16, ep 32, ZeRO-1 (the distributed optimizer), sequence parallel."""
    return Plan(
        model=get_model("qwen3-30b-a3b"),
        dims=ParallelDims(tp=tp, pp=8, dp=dp, ep=ep),
        shape=TrainShape(1, 512),
        zero_stage=1,
        recompute="full",
        sequence_parallel=sp,
        runtime=runtime,
        cluster=H100.name,
    )


def test_megatron_core_folds_ep_and_the_other_runtimes_keep_theirs() -> None:
    """ep 32 at tp 2 · dp 16: legal for megatron-core (32 divides tp*cp*dp = 32) and for torchtitan
    (its expert-tensor-parallel-1 layout: tp*cp = 2 divides 32); refused for megatron-deepspeed and
    exatrain (ep | dp), and by exatrain's trainer whatever the plan's runtime, each with its line."""
    for runtime in ("megatron-core", "torchtitan"):
        plan = _qwen(runtime).validate(H100)
        assert rules.problems(plan, H100) == []
    for runtime in ("megatron-deepspeed", "exatrain"):
        with pytest.raises(rules.RuleError) as err:
            _qwen(runtime).validate(H100)
        assert err.value.reason == EP_REASON
        assert str(err.value).startswith("dp 16 is not divisible by ep 32: expert parallelism splits the dp ranks")
    # a megatron-core plan handed to exatrain's trainer: refused by the trainer rule, in one line
    plan = _qwen().validate(H100)
    broken = rules.problems(plan, H100, scopes=("plan", "trainer"))
    assert broken[0].reason == "ep wider than dp (the exatrain trainer refuses it)"  # reported first
    with pytest.raises(PlanError, match="^qwen3-30b-a3b: the trainer does not build"):
        TrainConfig(plan=plan).check()  # the model it does not build (QK-norm, its head width) is said first
    built = plan.replace(model=plan.model.replace(kv_channels=0, qk_norm=False)).validate(H100)
    with pytest.raises(PlanError) as err:
        TrainConfig(plan=built).check()
    assert str(err.value).startswith("--ep 32 is wider than dp 16: exatrain's trainer splits the experts over dp")
    assert "\n" not in str(err.value)
    # ep | dp stays legal everywhere; a folded ep still has to divide tp*cp*dp and the experts
    assert _qwen("megatron-deepspeed", ep=16).validate(H100).ep == 16
    with pytest.raises(rules.RuleError, match="tp\\*cp\\*dp = 32 is not divisible by ep 64"):
        _qwen(ep=64).validate(H100)
    # ep 4 over part of a tp group (tp 8, dp 2): Megatron-Core folds it; torchtitan's etp-1 layout needs
    # all of tp in the ep group (tp*cp | ep), and 4 is not inside dp 2 either
    mix = Plan(
        model=get_model("mixtral-8x7b"),
        dims=ParallelDims(tp=8, dp=2, ep=4),
        shape=TrainShape(1, 8),
        zero_stage=1,
        sequence_parallel=True,
        runtime="megatron-core",
    )
    assert mix.validate(H100).ep == 4
    with pytest.raises(rules.RuleError, match="nor is ep 4 a multiple of tp\\*cp = 8"):
        mix.replace(runtime="torchtitan").validate(H100)
    # each tp rank dispatches its own tokens only under sequence parallelism (Megatron-LM requires it)
    with pytest.raises(rules.RuleError) as err:
        _qwen(sp=False).validate(H100)
    assert err.value.reason == "ep wider than dp with tp > 1 and no sequence parallelism"
    assert _qwen(sp=False, ep=16).validate(H100).ep == 16  # inside dp, priced as before


def test_expert_states_per_rank_are_local_experts_sharded_over_edp() -> None:
    """Per stage, the model states of the estimate = the dense part sharded over dp (16) + experts/ep
    local experts of each of the stage's MoE layers (3*h*f weights each, SwiGLU) sharded over the
    expert-data-parallel group edp = tp*cp*dp/ep, at Megatron-Core's distributed-optimizer bytes per
    parameter, bf16 weights and fp32 gradients: 6 + 12/d (Megatron-Core docs, "Distributed
    Optimizer"). ep 32 > dp: 4 local experts, edp 1; ep 8 | dp: 16 local experts, edp 4."""
    for ep, local, edp in ((32, 4, 1), (8, 16, 4)):
        plan = _qwen(ep=ep).validate(H100)
        m = plan.model
        est = estimate_plan(plan, H100)
        split = stage_params_split(m, tp=2, pp=8, interleave=1, layers_per_stage=plan.layers_per_stage(), ep=ep)
        kinds = stage_layer_kinds(m, pp=8, interleave=1, layers_per_stage=plan.layers_per_stage())
        per_expert = 3 * m.hidden * m.expert_width
        assert layer_params(m, moe=True).experts == m.experts * per_expert
        for r, got in enumerate(est.memory_by_stage):
            dense, routed = split[r]
            assert routed == kinds[r][1] * local * per_expert
            states = got.weights + got.gradients + got.optimizer
            assert states == pytest.approx(dense * (6 + 12 / 16) + routed * (6 + 12 / edp), rel=1e-9), (ep, r)


def _megatron_expert_groups(tp: int, cp: int, dp: int, ep: int) -> tuple[list[list[int]], list[list[int]]]:
    """Megatron-Core's expert groups within one pipeline stage, etp 1: its expert rank grid, order
    tp-cp-ep-dp-pp with etp 1 and no cp, numbers a stage's tp*cp*dp ranks as edp_rank * ep + ep_rank."""
    n = tp * cp * dp
    ep_groups = [[r for r in range(n) if r // ep == g] for g in range(n // ep)]
    edp_groups = [[r for r in range(n) if r % ep == k] for k in range(ep)]
    return ep_groups, edp_groups


@pytest.mark.parametrize("tp, cp, dp, ep", [(2, 1, 16, 32), (2, 1, 4, 8), (4, 2, 2, 8), (8, 1, 2, 4), (2, 2, 4, 16)])
def test_folded_groups_span_the_ranks_megatron_core_gives_them(tp, cp, dp, ep) -> None:
    """A folded ep group is ep consecutive ranks, taking in the tp (and cp) ranks of its dp ranks;
    the edp group is the ranks ep apart; ``ep_span``/``edp_span`` are the spans of those groups."""
    ep_groups, edp_groups = _megatron_expert_groups(tp, cp, dp, ep)
    span = lambda g: max(g) - min(g) + 1  # noqa: E731
    assert dp % ep != 0 and cost_moe.folded(dp, ep)
    assert int(cost_moe.ep_span(tp, cp, ep, dp)) == max(span(g) for g in ep_groups) == ep
    assert int(cost_moe.edp_span(tp, dp, cp, ep)) == max(span(g) for g in edp_groups)
    for g in ep_groups:  # consecutive ranks: whole tp groups when ep >= tp, part of one when ep < tp
        assert g == list(range(g[0], g[0] + ep))
        assert len({r % tp for r in g}) == min(tp, ep)
    # inside dp (ep | dp) the spans are what they were: ep dp ranks strided by tp*cp
    inner = 2 if dp % 2 == 0 else 1
    assert int(cost_moe.ep_span(tp, cp, inner, dp)) == (inner - 1) * tp * cp + 1 == int(cost_moe.ep_span(tp, cp, inner))


def test_folded_all_to_all_goes_over_the_node_then_the_network() -> None:
    """One all-to-all of a folded group, by hand (``cost.moe`` module doc): ep 32 over 4 DGX
    nodes has 7 peers on its node (NVLink) and 24 beyond (the network); ep 8 at tp 2 · dp 4 is one
    node's 8 consecutive ranks, all on NVLink (the strided placement would have reached 15 ranks)."""
    m, params = get_model("qwen3-30b-a3b"), default_params(H100.device.name)
    node, net = H100.tiers[0], H100.network
    msg = moe_acc.a2a_message_bytes(m, 1, 2, sequence_parallel=True, cp=1, capacity_factor=moe_acc.LOAD_IMBALANCE)
    eff = params.link_eff
    got = cost_moe.a2a_time_s(m, H100, params, 1, 2, ep=32, cp=1, sequence_parallel=True, dtype="bfloat16", dp=16)
    want = 31 * net.latency_s + max(7 * msg / 32 / (node.bytes_per_s * eff), 24 * msg / 32 / (net.bytes_per_s * eff))
    assert float(got) == pytest.approx(want, rel=1e-12)
    got = cost_moe.a2a_time_s(m, H100, params, 1, 2, ep=8, cp=1, sequence_parallel=True, dtype="bfloat16", dp=4)
    assert float(got) == pytest.approx(7 * node.latency_s + 7 * msg / 8 / (node.bytes_per_s * eff), rel=1e-12)
    # inside dp the group is as before, whether or not dp is given
    same = [
        cost_moe.a2a_time_s(m, H100, params, 1, 2, ep=4, cp=1, sequence_parallel=True, dtype="bfloat16", **kw)
        for kw in ({}, {"dp": 8})
    ]
    assert float(same[0]) == float(same[1])


def test_search_offers_a_folded_ep_for_megatron_core_only() -> None:
    """8 GPUs at tp 4 leave dp 2: megatron-core's search keeps ep 4 and 8 (folded over tp*dp = 8)
    and ranks them; exatrain's drops them under the ep rule, counted."""
    opts = SpaceOptions(
        tp=(4,), pp=(1,), micro_batch=(1,), zero_stage=(1,), recompute=("full",), sequence_parallel=(True,), cp=(1,)
    )
    mc = enumerate_space(get_model("qwen3-30b-a3b"), get_cluster("dgx-h200"), 8, 16, opts, runtime="megatron-core")
    assert sorted(mc.ep.tolist()) == [1, 2, 4, 8] and set(mc.dp.tolist()) == {2}
    assert mc.rejected[EP_REASON] == 4  # ep 16, 32, 64, 128 do not divide tp*dp = 8
    own = enumerate_space(
        get_model("qwen3-30b-a3b"),
        get_cluster("dgx-h200"),
        8,
        16,
        SpaceOptions(**{**opts.__dict__, "zero_stage": (0,)}),
        runtime="exatrain",
    )
    assert sorted(own.ep.tolist()) == [1, 2] and own.rejected[EP_REASON] == 6
    res = search(
        get_model("qwen3-30b-a3b"), get_cluster("dgx-h200"), 8, 16, top=4, options=opts, runtime="megatron-core"
    )
    wide = [p for p in res.ranked if p.ep > p.dp]
    assert wide and all(p.runtime == "megatron-core" and p.sequence_parallel for p in wide)
    again = estimate_plan(wide[0], get_cluster("dgx-h200"))
    assert again.time_s == wide[0].estimate.time_s
