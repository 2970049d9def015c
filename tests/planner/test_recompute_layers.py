"""Full recomputation of only some layers: the first N of each pipeline stage (``Plan.recompute_layers``,
Megatron-Core's --recompute-method block --recompute-num-layers N) or one in N of a rank's (``Plan.recompute_every``,
torchtitan's layer-level selective checkpointing): which layers, the memory of the rerun and the kept layers, the
rerun forward and the communication it repeats in that share, the bytes counted, the rules, the plan file, the
search, the export and the trainer's refusal.

Broken on purpose and seen to fail here:
- the share ignored in the step (``share`` 1 in stage_times), or a plan's layers dropped on its way to the batch of
  one (``Layouts.from_plan`` without them): test_time_moves_linearly_between_none_and_full;
- the kept layers counted as recomputed in memory (``partial`` ignored in rank_memory):
  test_memory_mixes_rerun_and_kept_layers_by_hand;
- the TP bytes counting every layer's rerun (``recomputed_layers_of_rank`` returning all layers):
  test_bytes_repeat_the_rerun_layers_only;
- the block method's count taken per rank instead of per virtual stage (``min(n, stages[v])`` over the rank's
  whole share): test_interleaved_stages_count_each_chunk;
- the export writing the uniform method, or the hardware FLOPs rerunning every layer (``rerun_share`` ignored):
  test_plan_file_export_and_trainer;
- one layer in N counted per stage from its own first layer instead of over the rank's stages in order
  (``before`` reset per stage in plan.full_rerun_layers): test_one_in_n_counts_over_a_ranks_stages;
- torchtitan's export writing mode "full" for one layer in N: test_one_in_n_is_torchtitans_layer_checkpointing;
- the search's fit reading one layer's saving off the wrong count (``held - rerun[0]`` as ``held``), or taking
  the largest N that fits (``argmax`` over reversed N): test_search_fits_the_fewest_layers;
- sequence parallelism ignored in the rerun forward's TP collectives (``full * ar`` for ``full * tp_one_f`` in
  stage_times): test_the_rerun_forwards_tp_collectives_are_its_own_formula.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from exatrain.accounting import comms, memory
from exatrain.api.plans import make_plan, space_options
from exatrain.catalog import get_cluster, get_model
from exatrain.engine_configs import export
from exatrain.plan import Plan
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.plan_cost import plan_stage_times
from exatrain.planner.estimate import estimate_plan
from tests.helpers.cli import refusals, run
from tests.helpers.plan_fields import trainer_refuses

H100 = get_cluster("dgx-h100")
LLAMA70 = get_model("llama3-70b")  # 80 layers: 20 a stage at pp 4
QWEN = get_model("qwen3-30b-a3b")


def _plan(**kw):
    return make_plan(
        LLAMA70,
        H100,
        **{
            "gpus": 64,
            "tp": 4,
            "pp": 4,
            "micro_batch": 1,
            "global_batch": 256,
            "zero": 1,
            "sequence_parallel": True,
            "runtime": "megatron-core",
            **kw,
        },
    )


def test_time_moves_linearly_between_none_and_full() -> None:
    params = default_params("h100-sxm")
    none, full = (plan_stage_times(_plan(recompute=r), H100, params, overlap="none") for r in ("none", "full"))
    for n in (1, 5, 10):
        part = plan_stage_times(_plan(recompute="full", recompute_layers=n), H100, params, overlap="none")
        share = n / 20
        for field in ("bwd", "tp_bwd", "ext_bwd"):
            a, b, c = (getattr(x, field) for x in (none, part, full))
            np.testing.assert_allclose(b, a + share * (c - a), rtol=1e-12, err_msg=f"{field} at {n}")
        np.testing.assert_allclose(part.fwd, none.fwd, rtol=1e-12)
    # as many layers as a stage holds, or more: every layer, as without the flag
    for n in (20, 30):
        same = plan_stage_times(_plan(recompute="full", recompute_layers=n), H100, params, overlap="none")
        np.testing.assert_allclose(same.bwd, full.bwd, rtol=1e-12)
    # a plan's own step time (calibration's path) reads the plan's layers as the estimate does
    from exatrain.planner.plan_cost import step_time

    five = _plan(recompute="full", recompute_layers=5)
    assert step_time(five, H100, params)[0].step == estimate_plan(five, H100, params).time_s.step
    assert step_time(five, H100, params)[0].step < step_time(_plan(recompute="full"), H100, params)[0].step
    steps = [estimate_plan(_plan(recompute="full", recompute_layers=n), H100).time_s.step for n in (1, 5, 10, 19)]
    assert steps == sorted(steps) and estimate_plan(_plan(), H100).time_s.step < steps[0]


def test_memory_mixes_rerun_and_kept_layers_by_hand() -> None:
    plan = _plan(recompute="full", recompute_layers=5)
    st = memory.stage_memory(plan, 0)
    kw = dict(sequence_parallel=True, flash=True, dtype="bfloat16")
    full = memory.layer_activation_bytes(LLAMA70, 1, 4, recompute="full", **kw)
    none = memory.layer_activation_bytes(LLAMA70, 1, 4, recompute="none", **kw)
    held = memory.inflight_microbatches(plan, 0)
    whole = memory.stage_memory(plan.replace(recompute_layers=0), 0)
    # five layers keep their input, fifteen everything, for each micro-batch in flight; the working set is the same
    assert st.activations - whole.activations == pytest.approx(15 * (none - full) * held, rel=1e-12)
    est = estimate_plan(plan, H100)
    assert (
        estimate_plan(_plan(recompute="full"), H100).memory_bytes.activations
        < est.memory_bytes.activations
        < estimate_plan(_plan(recompute="none"), H100).memory_bytes.activations
    )


def test_bytes_repeat_the_rerun_layers_only() -> None:
    def ag(plan):
        return next(c.count for c in comms.tp_collectives(plan, 0) if c.kind == "reduce_scatter")

    mb = _plan().num_microbatches
    assert ag(_plan(recompute="none")) == 4 * 20 * mb
    assert ag(_plan(recompute="full")) == 6 * 20 * mb
    assert ag(_plan(recompute="full", recompute_layers=5)) == (4 * 20 + 2 * 5) * mb
    moe = make_plan(
        QWEN, H100, gpus=8, ep=8, global_batch=64, recompute="full", runtime="megatron-core", recompute_layers=12
    )
    a2a = next(
        c
        for c in comms.moe_collectives_for(
            QWEN,
            micro_batch=1,
            tp=1,
            ep=8,
            sequence_parallel=False,
            dtype="bfloat16",
            moe_layers=48,
            num_microbatches=1,
            rerun=0.25,
        )
        if c.kind == "all_to_all"
    )
    assert a2a.count == 2 * 2.25 * 48
    from exatrain.planner.plan_cost import comm_bytes

    assert comm_bytes(moe)["ep"] < comm_bytes(moe.replace(recompute_layers=0))["ep"]


def test_interleaved_stages_count_each_chunk() -> None:
    plan = _plan(recompute="full", recompute_layers=3, schedule="interleaved", interleave=2)
    # 8 chunks of 10 layers, two on each rank: 3 of each chunk rerun, 6 of a rank's 20
    assert plan.layers_per_stage() == (10,) * 8
    assert [plan.recomputed_layers_of_rank(r) for r in range(4)] == [6, 6, 6, 6]
    assert [_plan(recompute="full").recomputed_layers_of_rank(r) for r in range(4)] == [20] * 4
    assert _plan(recompute="selective").recomputed_layers_of_rank(0) == 0


ARGS = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "64")


def test_rules_refuse_where_no_engine_runs_it(capsys) -> None:
    refusals(
        capsys,
        ARGS,
        [
            (
                "estimate",
                ("--runtime", "torchtitan", "--recompute", "full", "--recompute-layers", "2"),
                "--recompute-method block --recompute-num-layers",
            ),
            (
                "estimate",
                ("--runtime", "megatron-core", "--recompute", "selective", "--recompute-layers", "2"),
                "use --recompute full",
            ),
            ("estimate", ("--runtime", "megatron-core", "--recompute-layers", "0"), "--recompute-layers"),
            (
                "search",
                ("--runtime", "megatron-core", "--recompute-layers", "2", "--recompute-modules", "mlp"),
                "choose one",
            ),
        ],
    )


def test_search_tries_full_only(capsys) -> None:
    assert space_options(recompute_layers=4).recompute == ("full",)
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
        "--recompute-layers",
        "4",
        "--top",
        "3",
        "--json",
    )
    assert code == 0, err
    ranked = json.loads(out)["ranked"]
    assert ranked and all(r["plan"]["recompute"] == "full" and r["plan"]["recompute_layers"] == 4 for r in ranked)


def test_plan_file_export_and_trainer(tmp_path) -> None:
    plan = _plan(recompute="full", recompute_layers=5)
    assert "the first 5 layers of each stage recomputed" in plan.settings_label
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path).recompute_layers == 5
    assert "recompute_layers" not in _plan(recompute="full").to_dict()
    text = export(plan, "megatron").text
    assert "--recompute-method block" in text and "--recompute-num-layers 5" in text
    assert "--recompute-method uniform" in export(_plan(recompute="full"), "megatron").text
    est = estimate_plan(plan, H100)
    assert any("first 5 layers of each stage" in n for n in est.notes)
    # the hardware FLOPs rerun the forward of 5 of each stage's 20 layers
    full, none = (estimate_plan(_plan(recompute=r), H100) for r in ("full", "none"))
    assert est.hardware_flops_per_step == pytest.approx(
        none.hardware_flops_per_step + (full.hardware_flops_per_step - none.hardware_flops_per_step) / 4
    )
    trainer_refuses(
        "full recomputation reruns every layer", runtime="megatron-core", recompute="full", recompute_layers=1
    )


def test_one_in_n_counts_over_a_ranks_stages() -> None:
    from exatrain.settings import full_rerun_layers

    # one stage of 32 layers, one in 2: 16; in 3: 10 (the 3rd, 6th, ..., 30th)
    assert full_rerun_layers((32,), 1, every=2) == (16,) and full_rerun_layers((32,), 1, every=3) == (10,)
    # interleaved: rank 0 holds stages 0 and 2 (5 layers each): its 3rd, 6th and 9th layers, 1 + 2;
    # rank 1 stages 1 and 3 the same
    assert full_rerun_layers((5, 5, 5, 5), 2, every=3) == (1, 1, 2, 2)
    assert full_rerun_layers((5, 5, 5, 5), 2, first=3) == (3, 3, 3, 3)
    assert full_rerun_layers((5, 5, 5, 5), 2) == (5, 5, 5, 5)


def _titan(**kw):
    return make_plan(
        get_model("llama3-8b"),
        get_cluster("dgx-a100"),
        **{"gpus": 64, "zero": 3, "micro_batch": 1, "global_batch": 64, "runtime": "torchtitan", **kw},
    )


def test_one_in_n_is_torchtitans_layer_checkpointing(tmp_path) -> None:
    params = default_params("a100-80gb")
    cluster = get_cluster("dgx-a100")
    none, full = (plan_stage_times(_titan(recompute=r), cluster, params) for r in ("none", "full"))
    half = plan_stage_times(_titan(recompute="full", recompute_every=2), cluster, params)
    np.testing.assert_allclose(half.bwd, none.bwd + 0.5 * (full.bwd - none.bwd), rtol=1e-12)
    plan = _titan(recompute="full", recompute_every=2)
    assert plan.recomputed_layers_of_rank(0) == 16 and "one layer in 2 recomputed" in plan.settings_label
    text = export(plan, "torchtitan").text
    assert 'mode = "selective"' in text and 'selective_ac_option = "2"' in text
    assert 'mode = "full"' in export(_titan(recompute="full"), "torchtitan").text
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path).recompute_every == 2
    assert any("one layer in 2" in n for n in estimate_plan(plan, cluster).notes)
    trainer_refuses("full recomputation reruns every layer", runtime="torchtitan", recompute="full", recompute_every=2)


def test_one_in_n_rules(capsys) -> None:
    refusals(
        capsys,
        ARGS,
        [
            (
                "estimate",
                ("--runtime", "megatron-core", "--recompute", "full", "--recompute-every", "2"),
                "torchtitan's layer-level selective checkpointing",
            ),
            (
                "estimate",
                ("--runtime", "megatron-core", "--recompute", "full", "--recompute-every", "2"),
                "(Megatron-Core: --recompute-layers",
            ),
            (
                "estimate",
                ("--runtime", "torchtitan", "--recompute", "full", "--recompute-layers", "2"),
                "--recompute-every",
            ),
            (
                "search",
                ("--runtime", "torchtitan", "--recompute", "selective", "--recompute-every", "2"),
                "use --recompute full",
            ),
        ],
    )
    assert space_options(recompute_every=2).recompute == ("full",)


def test_search_fits_the_fewest_layers(capsys) -> None:
    """--recompute-layers auto: each full-recomputation layout of the search recomputes the fewest layers of each
    stage with which every rank fits; one fewer does not fit."""
    from exatrain.api import search

    res = search(
        model="llama3-70b",
        cluster="dgx-h100",
        gpus=64,
        global_batch=256,
        tp=4,
        pp=4,
        runtime="megatron-core",
        recompute_layers="auto",
        top=20,
    )
    partial = [p for p in res.ranked if p.recompute == "full" and p.recompute_layers]
    assert partial, [p.recompute_label for p in res.ranked]
    capacity = H100.device.hbm_bytes
    twin = lambda p, r: (p.label, p.zero_stage, p.micro_batch, p.schedule, p.sequence_parallel, r)  # noqa: E731
    ranked = {twin(p, p.recompute) for p in res.ranked}
    for plan in partial[:4]:
        assert plan.estimate.memory_bytes.total <= capacity
        if plan.recompute_layers > 1:
            fewer = plan.replace(recompute_layers=plan.recompute_layers - 1)
            assert estimate_plan(fewer, H100).memory_bytes.total > capacity, plan.label
        else:  # one layer a stage: its twin without recomputation does not fit, or the search ranks that twin too
            fewer = plan.replace(recompute="none", recompute_layers=0)
            assert estimate_plan(fewer, H100).memory_bytes.total > capacity or twin(plan, "none") in ranked
    # its best full recomputation is faster than the best without it, which recomputes every layer
    plain = search(
        model="llama3-70b",
        cluster="dgx-h100",
        gpus=64,
        global_batch=256,
        tp=4,
        pp=4,
        runtime="megatron-core",
        recompute="full",
        top=5,
    )
    full_auto = min(p.estimate.time_s.step for p in partial)
    full_every = min(p.estimate.time_s.step for p in plain.ranked if p.recompute == "full")
    assert full_auto < full_every
    code, out, err = run(
        capsys,
        "search",
        "--model",
        "llama3-70b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "64",
        "--global-batch",
        "256",
        "--tp",
        "4",
        "--pp",
        "4",
        "--runtime",
        "megatron-core",
        "--recompute-layers",
        "auto",
        "--top",
        "1",
    )
    assert code == 0 and res.ranked[0].recompute_label in out, err
    # ZeRO-1, micro-batch 1, 1F1B: tp4·pp4·dp4 fits with 3 of each stage's 20 layers recomputed, not with 2
    # (Megatron-Core's fused SwiGLU keeps 3f of a token's MLP interior, not 4f: accounting.memory)
    pinned = search(
        model="llama3-70b",
        cluster="dgx-h100",
        gpus=64,
        global_batch=256,
        tp=4,
        pp=4,
        zero=1,
        micro_batch=1,
        sequence_parallel=True,
        schedule="1f1b",
        runtime="megatron-core",
        recompute_layers="auto",
        top=10,
    )
    dp4 = next(p for p in pinned.ranked if p.dp == 4 and p.cp == 1 and p.recompute == "full")
    assert dp4.recompute_layers == 3 and dp4.recompute_label == "full 3/stage"
    assert estimate_plan(dp4.replace(recompute_layers=2), H100).memory_bytes.total > capacity


def test_auto_is_the_searchs(capsys) -> None:
    refusals(
        capsys,
        ARGS,
        [
            (
                "estimate",
                ("--runtime", "megatron-core", "--recompute", "full", "--recompute-layers", "auto"),
                "one plan takes a number",
            ),
            ("search", ("--runtime", "torchtitan", "--recompute-layers", "auto"), "--recompute-method block"),
            ("search", ("--runtime", "megatron-core", "--recompute-layers", "some"), "expected a positive integer"),
        ],
    )


@pytest.mark.parametrize("sp", [True, False])
def test_the_rerun_forwards_tp_collectives_are_its_own_formula(sp: bool) -> None:
    """Full recomputation reruns each layer's forward and with it the forward's two TP collectives a layer, in the
    backward: with sequence parallelism an all-gather and a reduce-scatter each, without it an all-reduce, of the
    micro-batch's b x s x h activations (Korthikanti et al. 2022, Sec. 4.2). Nothing else in the TP seconds moves."""
    from exatrain.planner.cost.step import tp_collectives_s

    m = get_model("llama3-70b")
    params = default_params(H100.device.name)

    def stage(recompute: str):
        plan = make_plan(
            "llama3-70b",
            H100,
            gpus=8,
            tp=8,
            pp=1,
            micro_batch=1,
            global_batch=8,
            zero=1,
            recompute=recompute,
            sequence_parallel=sp,
            runtime="megatron-core",
        )
        return plan_stage_times(plan, H100, params, overlap="none")

    none, full = stage("none"), stage("full")
    message = 1 * m.seq_len * m.hidden * 2  # bf16
    ag, rs, ar = (
        float(x) for x in tp_collectives_s(H100, params, 8, message, ("all_gather", "reduce_scatter", "all_reduce"))
    )
    per_layer = ag + rs if sp else ar
    assert float(full.tp_bwd[0, 0] - none.tp_bwd[0, 0]) == pytest.approx(2 * m.layers * per_layer, rel=1e-9)
    assert float(full.tp_fwd[0, 0]) == pytest.approx(float(none.tp_fwd[0, 0]), rel=1e-12)
