"""FP8 weights gathered in FP8 (``Plan.fp8_param_gather``: Megatron-Core --fp8-param-gather, torchtitan's
enable_fsdp_float8_all_gather): what it changes (the data-parallel gathers of the GEMM weights at one
byte a parameter, the GEMMs' 16-bit copy replaced by the FP8 one) and what it leaves alone, and the
setting through the plan file, the search, the exports, the CLI's and the trainer's refusals and the
published-runs benchmark.

Broken on purpose and seen to fail here: the gathers left in the compute dtype (``step.dp_collective_times``
ignoring ``fp8_gathered``: the gather test), ``Fp8Recipe.fp8_params`` not passed by ``evaluate`` (the memory
test), the search space keeping ZeRO stages the runtime cannot gather from (the search test), torchtitan's
tensor-parallel all-gathers left 16-bit under tensorwise FP8 (``fp8_tp_gather`` ignored in ``stage_times``: the
TP gather test)."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest

from exatrain.accounting.engines import get_engine
from exatrain.accounting.fp8 import gemm_weights
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.cli import main
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.planner import plan_cost
from exatrain.planner.cost import network, step
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.estimate import estimate_plan
from exatrain.planner.search.search import search
from exatrain.planner.search.space import FP8_GATHER_REASON, SpaceOptions
from tests.helpers import benchmarks
from tests.helpers.plan_fields import trainer_refuses
from tests.helpers.upstream_names import MEGATRON_LM_OPTIONS, TORCHTITAN_FIELDS

H100 = get_cluster("dgx-h100")
LLAMA = get_model("llama3-8b").replace(seq_len=4096)


def _plan(runtime="torchtitan", zero=3, **kw) -> Plan:
    return make_plan(
        LLAMA, H100, gpus=16, micro_batch=1, global_batch=16, zero=zero, fp8="current", runtime=runtime, **kw
    )


def test_the_gathers_send_the_gemm_weights_at_one_byte() -> None:
    """A ZeRO-3 rank's gathers shrink by exactly its GEMM weights x (2 - 1) bytes a call; the reduction
    does not move."""
    cp = default_params("h100-sxm").replace(collective_overhead_s=0.0)
    n, L = 16, LLAMA.layers
    params = np.array([[8.0e9]])
    gemm = L * gemm_weights(LLAMA, False, 1)
    dense, routed = step.fp8_gathered_params(LLAMA, np.array([1]), np.array([L]), 1)
    assert float(dense[0, 0]) == pytest.approx(gemm) and float(routed[0, 0]) == 0.0
    from exatrain.accounting.engines import Resolved, get_engine

    kw = dict(
        tp=np.array([[1]]),
        pp=1,
        dp=np.array([[n]]),
        zero_stage=3,
        params_here=params,
        num_microbatches=np.array([[1]]),
        run=Resolved(engine=get_engine("torchtitan")),
        pipeline_end=True,
    )
    red16, gat16 = step.dp_collective_times(H100, cp, LLAMA, **kw)
    red8, gat8 = step.dp_collective_times(H100, cp, LLAMA, fp8_gathered=(dense, routed), **kw)
    assert np.asarray(red8).item() == np.asarray(red16).item()
    # the dp group spans two nodes, all 8 ranks of each: its bus rate is the node's (network.node_bus_bandwidth)
    bus = network.node_bus_bandwidth(H100, n, network.dp_span(1, n), cp)[0]
    per_call = (n - 1) / n * gemm * 1.0 / np.asarray(bus).item()
    # ZeRO-3: a forward and a backward gather
    assert np.asarray(gat16 - gat8).item() == pytest.approx(2 * per_call, rel=1e-9)


def test_memory_drops_the_gemms_16_bit_copy() -> None:
    """Megatron-Core with the distributed optimizer keeps its GEMM weights in FP8 (and their transpose) in
    place of the 16-bit compute copy: 2 bytes a GEMM weight fewer, nothing else moves."""
    base = estimate_plan(_plan("megatron-core", zero=1), H100)
    fp8w = estimate_plan(_plan("megatron-core", zero=1, fp8_param_gather=True), H100)
    saved = base.memory_bytes.weights - fp8w.memory_bytes.weights
    assert saved == pytest.approx(LLAMA.layers * gemm_weights(LLAMA, False, 1) * 2.0, rel=1e-9)
    for f in ("gradients", "optimizer", "activations"):
        assert getattr(base.memory_bytes, f) == getattr(fp8w.memory_bytes, f)
    # and its parameter all-gather after the optimizer step is cheaper, never dearer
    assert fp8w.time_s.step <= base.time_s.step


def test_estimates_bytes_sent_are_the_runtimes_own() -> None:
    """estimate's dp "bytes sent per rank" are those its dp time is priced from: Megatron-Core's distributed
    optimizer reduce-scatters fp32 main gradients and all-gathers bf16 weights, (dp-1)/dp x P x (4 + 2) for
    a rank holding P parameters; --fp8-param-gather takes (dp-1)/dp x 1 byte off each GEMM weight; the
    exatrain trainer's count (fp32 all-reduce, then each shard broadcast) is accounting.comms' own.
    Broken on purpose and seen to fail: ``experts.comm_bytes`` returning the trainer's count for every runtime."""
    from exatrain.accounting import comms
    from exatrain.accounting.params import stage_params

    dp = 16
    mc = _plan("megatron-core", zero=1)
    P = float(stage_params(mc)[0])
    assert (mc.tp, mc.pp, mc.dp) == (1, 1, dp)
    assert estimate_plan(mc, H100).comm_bytes["dp"] == pytest.approx((dp - 1) / dp * P * (4 + 2), rel=1e-9)
    fp8w = estimate_plan(_plan("megatron-core", zero=1, fp8_param_gather=True), H100).comm_bytes["dp"]
    gemm = LLAMA.layers * gemm_weights(LLAMA, False, 1)
    assert fp8w == pytest.approx((dp - 1) / dp * (P * (4 + 2) - gemm), rel=1e-9)
    own = _plan("exatrain", zero=1).replace(fp8="")
    assert estimate_plan(own, H100).comm_bytes["dp"] == comms.comm_bytes_per_rank(own)["dp"]


def test_plan_file_search_and_exports_carry_it(tmp_path) -> None:
    plan = _plan(fp8_param_gather=True)
    path = tmp_path / "p.json"
    plan.save(path)
    assert Plan.load(path).fp8_param_gather and Plan.load(path).to_dict() == plan.to_dict()
    assert "fp8_param_gather" not in _plan().to_dict()  # older readers see nothing new
    assert make_plan(LLAMA, H100, gpus=16, base=Plan.load(path), runtime="torchtitan").fp8_param_gather
    assert ", FP8 parameter gather" in plan.settings_label
    from exatrain.engine_configs import export

    meg = export(_plan("megatron-core", zero=1, fp8_param_gather=True), "megatron").text
    assert "--fp8-param-gather" in meg.split() and "--fp8-param-gather" in MEGATRON_LM_OPTIONS
    assert "--fp8-param-gather" not in export(_plan("megatron-core", zero=1), "megatron").text.split()
    toml = tomllib.loads(export(plan, "torchtitan").text)
    f8 = toml["quantize"]["linear"]["float8"]
    assert f8 == {"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True}
    assert set(f8) <= TORCHTITAN_FIELDS["quantize.linear.float8"]
    toml = tomllib.loads(export(_plan(), "torchtitan").text)
    assert toml["quantize"]["linear"]["float8"] == {"recipe_name": "tensorwise"}
    # the search prices every candidate with it and keeps only the ZeRO stages that can gather
    res = search(
        LLAMA,
        H100,
        16,
        16,
        top=3,
        runtime="torchtitan",
        options=SpaceOptions(tp=(1,), pp=(1,), fp8="current", fp8_param_gather=True),
    )
    assert res.ranked and all(p.fp8_param_gather and p.zero_stage >= 2 for p in res.ranked)
    assert res.rejected.get(FP8_GATHER_REASON, 0) > 0
    for p in res.ranked[:2]:
        est = estimate_plan(p, H100, default_params("h100-sxm"), "all")
        assert p.estimate.time_s.step == pytest.approx(est.time_s.step, rel=1e-9)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--fp8-param-gather"], "it needs --fp8"),
        (["--fp8", "current", "--fp8-param-gather", "--runtime", "exatrain"], "runtime exatrain has no such switch"),
        (
            ["--fp8", "current", "--fp8-param-gather", "--runtime", "megatron-deepspeed", "--zero", "1"],
            "runtime megatron-deepspeed has no such switch",
        ),
        (["--fp8", "delayed", "--fp8-param-gather", "--runtime", "torchtitan", "--zero", "3"], "--fp8 current"),
        (["--fp8", "current", "--fp8-param-gather", "--runtime", "torchtitan", "--zero", "1"], "ZeRO-2 or higher"),
        (["--fp8", "current", "--fp8-param-gather", "--runtime", "megatron-core", "--zero", "0"], "ZeRO-1 or higher"),
    ],
)
def test_bad_use_is_one_line_and_exit_2(argv, message, capsys) -> None:
    assert (
        main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8", *argv])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_a_plan_file_with_a_bad_value_and_the_trainer_are_refused(tmp_path, capsys) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**_plan().to_dict(), "fp8_param_gather": "yes"}))
    with pytest.raises(UserError, match="must be true or false"):
        Plan.load(path).validate(H100)
    assert main(["export-config", "--plan", str(path), "--for", "torchtitan"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    # a plan made for torchtitan, handed to exatrain's trainer
    trainer_refuses(
        "gathers and keeps its weights in 16 bits",
        zero=3,
        dtype="bfloat16",
        fp8="current",
        runtime="torchtitan",
        fp8_param_gather=True,
    )


def test_the_published_rows_that_gathered_in_fp8_are_planned_so() -> None:
    """The two H200 torchtitan runs enabled float8 all-gather (their ``overlap`` column), and the Megatron-Bridge FP8
    runs' recipes set fp8_param_gather (benchmarks/data/README.md); no other row."""
    pe = benchmarks.load("prediction_error")
    rows = [r for r in pe.load_rows() if r.plan is not None]
    gathered = [r for r in rows if r.plan.fp8_param_gather]
    bridge_fp8 = [r for r in rows if "Megatron-Bridge" in r.name and r.plan.fp8]
    assert len(bridge_fp8) >= 18 and all(r in gathered for r in bridge_fp8)
    rest = [r for r in gathered if r not in bridge_fp8]
    assert len(rest) == 2 and all("h200_202506" in r.source for r in rest)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_torchtitans_tensorwise_fp8_all_gathers_the_tp_inputs_in_fp8(recompute) -> None:
    """Under tensorwise FP8 (``current``) torchtitan casts a sequence-sharded GEMM input to FP8 before its TP
    all-gather: the forward's two all-gathers a layer (and a full recomputation's rerun) send one byte an
    element, the backward's collectives stay 16-bit; not under rowwise (``block``) scaling, not for Megatron."""
    assert get_engine("torchtitan").fp8_tp_gather == ("current",) and not get_engine("megatron-core").fp8_tp_gather
    layers = LLAMA.layers

    def tp_times(fp8, runtime="torchtitan"):
        plan = make_plan(
            LLAMA,
            H100,
            gpus=16,
            tp=4,
            micro_batch=1,
            global_batch=16,
            zero=1 if runtime != "torchtitan" else 3,
            fp8=fp8,
            runtime=runtime,
            recompute=recompute,
            sequence_parallel=True,
        )
        st = plan_cost.plan_stage_times(plan, H100, default_params("h100-sxm"), overlap="none")
        return float(st.tp_fwd[0].sum()), float(st.tp_bwd[0].sum())

    msg = 1 * LLAMA.seq_len * LLAMA.hidden * 2  # micro-batch 1, bf16
    ag16, ag8 = (
        step.tp_collectives_s(H100, default_params("h100-sxm"), np.array([4]), m, ("all_gather",))[0][0]
        for m in (msg, msg / 2)
    )
    saved = 2 * layers * (ag16 - ag8)
    assert saved > 0
    (f_cur, b_cur), (f_blk, b_blk) = tp_times("current"), tp_times("block")
    assert f_blk - f_cur == pytest.approx(saved, rel=1e-9)
    assert b_blk - b_cur == pytest.approx(saved if recompute == "full" else 0.0, rel=1e-9, abs=1e-12)
    assert tp_times("current", "megatron-core") == tp_times("block", "megatron-core")
    # the estimate's bytes sent per rank are those priced: (t-1)/t of each all-gather's message, one byte an element
    sent = {
        fp8: estimate_plan(
            make_plan(
                LLAMA,
                H100,
                gpus=16,
                tp=4,
                micro_batch=1,
                global_batch=16,
                zero=3,
                fp8=fp8,
                runtime="torchtitan",
                recompute=recompute,
                sequence_parallel=True,
            ),
            H100,
        ).comm_bytes["tp"]
        for fp8 in ("current", "block")
    }
    gathers = 2 * layers * (2 if recompute == "full" else 1) * 4  # 4 micro-batches (dp 4)
    assert sent["block"] - sent["current"] == pytest.approx(gathers * 3 / 4 * msg / 2, rel=1e-12)
