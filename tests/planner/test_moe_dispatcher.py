"""The MoE token dispatcher (``Plan.moe_dispatcher``): the deduplicated copies of DeepEP / HybridEP against
their hypergeometric closed form, the all-to-all time they give against the pairwise all-to-all, and the
setting through the plan file, the search, the exports, the CLI's refusals and the trainer's.

Broken on purpose and seen to fail here: the network copies counted per rank instead of per node (the
closed-form and the time tests); the dedup branch ignored in ``a2a_time_s`` (the time test); the
dispatcher dropped from ``plan_at`` (the search test); the flex flags left out of the Megatron export."""

from __future__ import annotations

import math

import pytest

from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.cli import main
from exatrain.plan import Plan
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.cost.moe import a2a_time_s, dedup_copies
from exatrain.planner.estimate import estimate_plan
from exatrain.planner.search.search import search
from exatrain.planner.search.space import SpaceOptions
from tests.helpers.plan_fields import trainer_refuses

H100 = get_cluster("dgx-h100")


def _none(experts: int, k: int, held: int) -> float:
    return math.comb(experts - held, k) / math.comb(experts, k)


@pytest.mark.parametrize(
    "model,ep,local",
    [("qwen3-30b-a3b", 16, 8), ("qwen3-30b-a3b", 8, 8), ("deepseek-v3", 64, 8), ("mixtral-8x7b", 8, 4)],
)
def test_dedup_copies_are_the_hypergeometric_counts(model: str, ep: int, local: int) -> None:
    """A token reaches each other rank holding one of its top_k experts once, and each other node once."""
    m = get_model(model)
    ranks, remote = dedup_copies(m, ep, local)
    per_rank = m.experts // ep
    assert float(ranks) == pytest.approx((ep - 1) * (1 - _none(m.experts, m.top_k, per_rank)), rel=1e-12)
    nodes = math.ceil(ep / local)
    assert float(remote) == pytest.approx((nodes - 1) * (1 - _none(m.experts, m.top_k, per_rank * local)), rel=1e-12)
    # never more than the all-to-all's copies, which send all top_k of them
    assert float(ranks) <= m.top_k * (ep - 1) / ep + 1e-12


def test_dedup_dispatch_is_faster_across_nodes() -> None:
    """Qwen3-30B-A3B, ep 16 over two DGX H100 nodes: the all-to-all sends 4 of a token's 8 copies over the
    network, a deduplicating dispatcher about one; the time falls by that ratio (the network is the slower
    side), and within one node (ep 8) it falls less (copies to distinct ranks only)."""
    m = get_model("qwen3-30b-a3b").replace(seq_len=4096)
    p = default_params("h100-sxm")
    kw = dict(micro_batch=1, tp=1, cp=1, sequence_parallel=False, dtype="bfloat16")
    pairwise = float(a2a_time_s(m, H100, p, ep=16, **kw))
    dedup = float(a2a_time_s(m, H100, p, ep=16, dispatcher="hybridep", **kw))
    _, remote = dedup_copies(m, 16, 8)
    lat = 15 * H100.tiers[-1].latency_s
    assert (dedup - lat) / (pairwise - lat) == pytest.approx(float(remote) / 4.0, rel=1e-9)
    one_node = float(a2a_time_s(m, H100, p, ep=8, **kw))
    one_node_dedup = float(a2a_time_s(m, H100, p, ep=8, dispatcher="deepep", **kw))
    ranks, _ = dedup_copies(m, 8, 8)
    lat8 = 7 * H100.tiers[0].latency_s
    assert (one_node_dedup - lat8) / (one_node - lat8) == pytest.approx(float(ranks) / 7.0, rel=1e-9)


def test_plan_file_search_and_exports_carry_the_dispatcher(tmp_path) -> None:
    plan = make_plan(
        "qwen3-30b-a3b",
        H100,
        gpus=16,
        ep=16,
        micro_batch=1,
        global_batch=64,
        zero=1,
        runtime="megatron-core",
        moe_dispatcher="hybridep",
    )
    path = tmp_path / "p.json"
    plan.save(path)
    assert Plan.load(path).moe_dispatcher == "hybridep"
    assert "moe_dispatcher" not in plan.replace(moe_dispatcher="alltoall").to_dict()
    from exatrain.engine_configs import export

    text = export(plan, "megatron").text
    assert "--moe-token-dispatcher-type flex" in text and "--moe-flex-dispatcher-backend hybridep" in text
    assert "--moe-token-dispatcher-type alltoall" in export(plan.replace(moe_dispatcher="alltoall"), "megatron").text
    assert "hybridep dispatcher" in export(plan.replace(runtime="torchtitan"), "torchtitan").text
    # the estimate counts fewer bytes on the wire, and the search's plans keep the dispatcher
    dedup = estimate_plan(plan, H100, overlap="none")
    pairwise = estimate_plan(plan.replace(moe_dispatcher="alltoall"), H100, overlap="none")
    assert dedup.comm_bytes["ep"] < pairwise.comm_bytes["ep"]
    assert dedup.time_s.ep_comm < pairwise.time_s.ep_comm
    m = get_model("qwen3-30b-a3b").replace(seq_len=4096)
    res = search(
        m,
        H100,
        16,
        64,
        top=3,
        runtime="megatron-core",
        options=SpaceOptions(ep=(16,), zero_stage=(1,), moe_dispatcher="deepep"),
    )
    assert res.ranked and all(p.moe_dispatcher == "deepep" for p in res.ranked)


def test_bad_dispatcher_is_one_line_and_exit_2(capsys) -> None:
    assert (
        main(
            [
                "estimate",
                "--model",
                "llama3-8b",
                "--cluster",
                "dgx-h100",
                "--gpus",
                "8",
                "--global-batch",
                "8",
                "--moe-dispatcher",
                "deepep",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no experts" in err and "Traceback" not in err
    assert (
        main(["estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--global-batch", "8", "--moe-dispatcher", "nccl"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'nccl'" in err
    trainer_refuses(
        "exatrain trainer dispatches MoE tokens with its own all-to-all",
        "moe-tiny",
        ep=2,
        dtype="float32",
        moe_dispatcher="deepep",
    )
