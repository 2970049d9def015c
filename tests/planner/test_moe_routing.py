"""How evenly a MoE layer's tokens reach the experts (``Plan.moe_capacity_factor``,
``Plan.moe_force_balance``; ``accounting.moe.moe_load``): the load the busiest expert rank is priced at, what
it scales (expert GEMMs, all-to-all bytes and time, dispatch memory) and what it leaves alone, and the
setting through the plan file, the search, the exports, the CLI's and the trainer's refusals and the
published-runs benchmark's ``moe_routing`` column.

Broken on purpose and seen to fail here: ``moe_load`` returning LOAD_IMBALANCE under forced balance (the
load and scaling tests); the routed copies' element-wise bytes left at LOAD_IMBALANCE in
``cost_layer.layer_times`` (the scaling test's expert-compute ratio); the load dropped from
``search.batch`` (the search test: the ranked plan's step differs from its own estimate); the Megatron
export without ``--moe-pad-expert-input-to-capacity`` (the export test); the benchmark reading the column
as always dropless (the column test)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.cli import main
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.planner.cost import compute
from exatrain.planner.cost.coefficients import default_params
from exatrain.accounting.engines import Resolved
from exatrain.accounting.moe import LOAD_IMBALANCE, moe_load
from exatrain.planner.cost.moe import a2a_time_s
from exatrain.planner.cost.layer import layer_times
from exatrain.planner.estimate import estimate_plan
from exatrain.planner.search.search import search
from exatrain.planner.search.space import SpaceOptions
from tests.helpers import benchmarks
from tests.helpers.plan_fields import trainer_refuses

H100 = get_cluster("dgx-h100")
QWEN = get_model("qwen3-30b-a3b").replace(seq_len=4096)


def _plan(**kw) -> Plan:
    return make_plan(QWEN, H100, gpus=16, ep=16, micro_batch=1, global_batch=64, zero=1, runtime="megatron-core", **kw)


def test_the_load_follows_the_routing() -> None:
    assert LOAD_IMBALANCE == 1.25
    assert moe_load() == LOAD_IMBALANCE  # dropless: the named assumption
    assert moe_load(force_balance=True) == 1.0
    assert moe_load(1.0) == 1.0 and moe_load(1.5) == 1.5
    assert moe_load(2.0, force_balance=True) == 2.0  # padded to capacity: every expert computes C x the mean
    assert _plan(moe_force_balance=True).moe_force_balance and _plan().moe_capacity_factor == 0.0


def test_the_load_scales_expert_compute_and_all_to_all_only() -> None:
    """The all-to-all message and the expert GEMMs and routed-copy element-wise work are the load x the
    mean; attention and the dense parts of the layer do not move."""
    p = default_params("h100-sxm")
    kw = dict(micro_batch=1, tp=1, cp=1, sequence_parallel=False, dtype="bfloat16")
    lat = 15 * H100.tiers[-1].latency_s
    even = float(a2a_time_s(QWEN, H100, p, ep=16, load=1.0, **kw))
    dropless = float(a2a_time_s(QWEN, H100, p, ep=16, **kw))
    assert (dropless - lat) / (even - lat) == pytest.approx(LOAD_IMBALANCE, rel=1e-9)
    dev = compute.device_for(H100, "bfloat16", p)
    lt = dict(moe=True, ep=16, cp=1, sequence_parallel=False)

    def fwd(load: float, **speeds) -> float:
        return float(
            layer_times(QWEN, 1, 1, run=Resolved(moe_load=load), dev=dataclasses.replace(dev, **speeds), **lt).fwd
        )

    assert float(layer_times(QWEN, 1, 1, run=Resolved(moe_load=1.0), dev=dev, **lt).attention_core_fwd) == float(
        layer_times(QWEN, 1, 1, run=Resolved(moe_load=2.0), dev=dev, **lt).attention_core_fwd
    )
    # memory-bound part alone (GEMMs at no cost): the routed copies' bytes grow linearly with the load
    ew = {load: fwd(load, peak_flops=1e30) for load in (1.0, 1.25, 2.0)}
    assert ew[1.25] > ew[1.0] and (ew[2.0] - ew[1.0]) / (ew[1.25] - ew[1.0]) == pytest.approx(4.0, rel=1e-9)
    # compute-bound part alone (bytes at no cost): the expert GEMMs grow with it
    gemm = {load: fwd(load, mem_bytes_per_s=1e30) for load in (1.0, 1.25, 2.0)}
    assert gemm[1.0] < gemm[1.25] < gemm[2.0]


def test_estimate_memory_and_bytes_follow_the_routing() -> None:
    dropless = estimate_plan(_plan(), H100, overlap="none")
    even = estimate_plan(_plan(moe_force_balance=True), H100, overlap="none")
    padded = estimate_plan(_plan(moe_capacity_factor=1.0), H100, overlap="none")
    assert even.comm_bytes["ep"] == pytest.approx(dropless.comm_bytes["ep"] / LOAD_IMBALANCE, rel=1e-9)
    assert padded.comm_bytes == even.comm_bytes and padded.time_s.step == even.time_s.step
    assert even.time_s.ep_comm < dropless.time_s.ep_comm and even.time_s.compute < dropless.time_s.compute
    assert even.memory_bytes.activations < dropless.memory_bytes.activations
    assert even.memory_bytes.weights == dropless.memory_bytes.weights
    wide = estimate_plan(_plan(moe_capacity_factor=2.0), H100, overlap="none")
    assert wide.time_s.step > dropless.time_s.step  # padding to 2x costs more than the 1.25x busiest rank
    assert any("routing forced even" in n for n in even.notes) and any("dropless" in n for n in dropless.notes)


def test_plan_file_search_and_exports_carry_the_routing(tmp_path) -> None:
    plan = _plan(moe_capacity_factor=1.0)
    path = tmp_path / "p.json"
    plan.save(path)
    back = Plan.load(path)
    assert back.moe_capacity_factor == 1.0 and not back.moe_force_balance
    assert Plan.load(path).to_dict() == plan.to_dict()
    d = _plan().to_dict()
    assert "moe_capacity_factor" not in d and "moe_force_balance" not in d  # older readers see nothing new
    assert make_plan(QWEN, H100, gpus=16, base=back).moe_capacity_factor == 1.0  # a base plan's routing is kept
    from exatrain.engine_configs import export

    text = export(plan, "megatron").text
    assert "--moe-expert-capacity-factor 1.0\n" in text and "--moe-pad-expert-input-to-capacity" in text
    assert "--moe-router-force-load-balancing" not in text
    forced = _plan(moe_force_balance=True)
    text = export(forced, "megatron").text
    assert "--moe-router-force-load-balancing" in text and "--moe-expert-capacity-factor" not in text
    import tomllib

    from tests.helpers.upstream_names import TORCHTITAN_FIELDS

    toml = tomllib.loads(export(forced.replace(runtime="torchtitan"), "torchtitan").text)
    assert toml["debug"] == {"moe_force_load_balance": True}
    assert all(set(fields) <= TORCHTITAN_FIELDS[section] for section, fields in toml.items())
    titan = export(plan.replace(runtime="torchtitan"), "torchtitan")
    assert any("capacity factor 1" in n and "dropless" in n for n in titan.notes)
    res = search(
        QWEN,
        H100,
        16,
        64,
        top=2,
        runtime="megatron-core",
        options=SpaceOptions(ep=(16,), zero_stage=(1,), moe_force_balance=True),
    )
    assert res.ranked and all(p.moe_force_balance for p in res.ranked)
    # the vectorised pass that ranks the space prices each candidate as its own estimate does
    from exatrain.planner.search import batch
    from exatrain.planner.search.search import plan_at
    from exatrain.planner.search.space import enumerate_space

    p = default_params("h100-sxm")
    for balance in (False, True):
        space = enumerate_space(
            QWEN,
            H100,
            16,
            64,
            SpaceOptions(ep=(16,), zero_stage=(1,), moe_force_balance=balance),
            runtime="megatron-core",
        )
        ev = batch.evaluate_space(space, QWEN, H100, 64, p, runtime="megatron-core")
        for i in range(min(4, len(space))):
            one = plan_at(space, i, QWEN, 64, H100, "bfloat16", True).replace(runtime="megatron-core").validate(H100)
            assert one.moe_force_balance == balance
            est = estimate_plan(one, H100, p)  # overlap unset in both: the engine's defaults
            assert float(ev.time["step"][i]) == pytest.approx(est.time_s.step, rel=1e-9)
            assert float(ev.memory_total[i]) == pytest.approx(est.memory_bytes.total, rel=1e-9)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model", "llama3-8b", "--moe-force-balance"], "llama3-8b has no experts"),
        (["--model", "llama3-8b", "--moe-capacity-factor", "1"], "llama3-8b has no experts"),
        (
            ["--model", "qwen3-30b-a3b", "--moe-capacity-factor", "1", "--moe-dispatcher", "deepep"],
            "alltoall dispatcher only",
        ),
        (["--model", "qwen3-30b-a3b", "--moe-capacity-factor", "-1"], "expected a non-negative number, got '-1'"),
        (["--model", "qwen3-30b-a3b", "--moe-capacity-factor", "inf"], "expected a non-negative number"),
    ],
)
def test_bad_routing_is_one_line_and_exit_2(argv, message, capsys) -> None:
    assert main(["estimate", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_a_plan_file_with_a_bad_routing_is_refused(tmp_path, capsys) -> None:
    d = _plan().to_dict()
    for key, value, message in (
        ("moe_capacity_factor", "1.0", "must be a number >= 0"),
        ("moe_capacity_factor", True, "must be a number >= 0"),
        ("moe_force_balance", "yes", "must be true or false"),
    ):
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps({**d, key: value}))
        with pytest.raises(UserError, match=message):
            Plan.load(path).validate(H100)
        assert main(["export-config", "--plan", str(path), "--for", "megatron"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err


def test_the_trainer_refuses_a_routing_it_does_not_run() -> None:
    for kw in ({"moe_capacity_factor": 1.0}, {"moe_force_balance": True}):
        trainer_refuses("routes MoE tokens dropless", "moe-tiny", ep=2, dtype="float32", **kw)


def test_the_published_tables_routing_column_is_planned() -> None:
    """The ``moe_routing`` column (data README): every priced Megatron-Bridge MoE row ran force-balanced
    or with token drop at capacity 1.0, padded, and is planned so; dense rows stay dropless."""
    pe = benchmarks.load("prediction_error")
    assert pe._moe_routing("") == (0.0, False)
    assert pe._moe_routing("force-balanced") == (0.0, True)
    assert pe._moe_routing("capacity 1.25 padded") == (1.25, False)
    for bad in ("capacity 0 padded", "balanced", "capacity x padded"):
        with pytest.raises(UserError, match="moe_routing must be"):
            pe._moe_routing(bad)
    rows = {r.index: r for r in pe.load_rows() if r.plan is not None}
    assert {i for i, r in rows.items() if r.plan.moe_force_balance} == {34, 35, 36, 42, 46}
    assert {i: r.plan.moe_capacity_factor for i, r in rows.items() if r.plan.moe_capacity_factor} == {47: 1.0, 48: 1.0}
    assert not any(r.plan.moe_force_balance or r.plan.moe_capacity_factor for r in rows.values() if r.kind != "moe")


def test_a_published_rows_preset_gives_it_the_architecture_its_columns_cannot_say() -> None:
    """The ``preset`` column (data README): the Qwen3 rows attend with 128-wide heads and QK-norm, the
    DeepSeek-V3 row with multi-head latent attention, one shared expert and three dense layers — as
    their sources' model arguments say — while keeping the row's own sequence and vocabulary; a row whose
    shape disagrees with its preset is refused. (Broken on purpose: the column ignored, the Qwen3 rows
    priced with hidden/heads = 64-wide heads, as before it existed.)"""
    pe = benchmarks.load("prediction_error")
    rows = {r.index: r for r in pe.load_rows() if r.plan is not None}
    for i in (35, 36, 42, 47, 48):
        m = rows[i].plan.model
        assert (m.head_dim, m.qk_norm, m.seq_len) == (128, True, 4096), i
    assert rows[36].plan.model.q_width == 8192 and rows[35].plan.model.q_width == 4096
    ds = rows[46].plan.model
    assert ds.mla and (ds.shared_experts, ds.dense_layers, ds.seq_len) == (1, 3, 4096)
    oss = rows[34].plan.model  # GPT-OSS 120B: 64-wide heads at hidden 2880, a 128-key window every other layer
    assert (oss.head_dim, oss.q_width, oss.sliding_window, oss.windowed_layers) == (64, 4096, 128, 18)
    m = get_model("qwen3-30b-a3b")
    with pytest.raises(UserError, match=r"row 7: its shape is not preset qwen3-30b-a3b's \(hidden 1024 != 2048\)"):
        pe._with_preset(m.replace(hidden=1024, kv_channels=0, qk_norm=False), "qwen3-30b-a3b", 7)


def test_the_one_line_descriptions_name_the_settings_a_plan_was_priced_with() -> None:
    """The estimate's header, the reports' one-line description and an export's summary name a non-default
    dispatcher, routing, attention kernel and element-wise mode; a plan at the defaults adds nothing."""
    from exatrain.engine_configs.common import summary
    from exatrain.report.style import describe

    plain = _plan()
    assert plain.settings_label == ""
    set_ = _plan(moe_dispatcher="hybridep", moe_force_balance=True, attention_kernel="fa2", elementwise="eager")
    label = ", hybridep dispatcher, force-balanced routing, attention fa2, element-wise eager"
    assert set_.settings_label == label
    assert _plan(moe_capacity_factor=1.25).settings_label == ", token drop at capacity 1.25, padded"
    assert describe(set_).endswith(label) and summary(set_).endswith(label)
    assert describe(plain) + label == describe(set_)
