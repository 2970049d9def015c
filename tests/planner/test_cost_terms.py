"""The cost model's named terms (``cost.stage``, ``cost.step``, ``cost.rerun``): each term against its formula on a
hand-computable case, with the cluster's link numbers read from the catalog, and the stage and step times as the
plain composition of their terms.

Broken on purpose and seen to fail here: the exposed DP collectives dropped from the step's sum
(``compose_step``: the step composition test), the TP message doubled (``stage_inputs``: the TP ring test), the
head's input-gradient all-reduce left out of the last stage (``tp_term``: the TP per-stage test), the partial
recomputation share taken as the layers left out rather than rerun (``rerun_layers`` with ``n - min``: the rerun
test), the expert all-to-all left out of the stage's forward extra seconds (``stage_times``: the stage composition
test)."""

from __future__ import annotations

import numpy as np
import pytest

from exatrain.accounting.engines import Resolved, get_engine, plan_run
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.planner.cost import compute, stage, step
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.cost.overlap import overlap_rules
from exatrain.planner.cost.rerun import rerun_layers, rerun_on_rank, rerun_share
from exatrain.planner.layouts import Layouts
from exatrain.planner.plan_cost import step_time
from exatrain.settings import full_rerun_layers

H100 = get_cluster("dgx-h100")
NVLINK = H100.tiers[0]  # the tier inside a node: every group below fits in it
COEFFS = default_params("h100-sxm")
LLAMA = get_model("llama3-8b")


def _ring_s(steps: float, n: int, message_bytes: float) -> float:
    """A ring collective of ``steps`` passes over n ranks on the node's links: the call's fixed overhead,
    steps (n - 1) hops of latency, steps (n - 1) / n of the buffer at link_eff of the tier's bandwidth."""
    bw = NVLINK.bytes_per_s * COEFFS.link_eff
    return COEFFS.collective_overhead_s + steps * (n - 1) * NVLINK.latency_s + steps * (n - 1) / n * message_bytes / bw


def _inputs(plan, overlap=None):
    """The plan's ``StageInputs`` and ``StageWork``, as ``stage_times`` builds them."""
    run = plan_run(plan)
    coeffs = compute.with_attention_kernel(COEFFS, run.attention_kernel)
    dev = compute.device_for(H100, plan.dtype, coeffs, plan.gpus)
    lay = Layouts.from_plan(plan)
    rules = overlap_rules(run.engine, overlap)
    x = stage.stage_inputs(plan.model, H100, coeffs, dev, lay, run, np.array(plan.layers_per_stage()), rules)
    w = stage.StageWork(*stage._pick(x.sp, lambda s: stage.layer_work(x, s)))
    return x, w, (plan.model, H100, coeffs, dev, lay, run, np.array(plan.layers_per_stage()), rules)


def _plan(**kw):
    base = dict(gpus=8, tp=2, pp=2, micro_batch=1, global_batch=16, zero=0, runtime="megatron-core")
    return make_plan(kw.pop("model", LLAMA), H100, **{**base, **kw})


def test_the_dp_all_reduce_term_is_the_ring_formula() -> None:
    """Megatron-Core's gradient all-reduce over dp 4 ranks of a node: fp32 gradients (4 bytes a parameter) and
    2 (n - 1) / n of them at the NVLink tier's bandwidth, plus 2 (n - 1) hops and the call's overhead."""
    params = 1.0e9
    kw = dict(tp=np.array([[1]]), pp=1, dp=np.array([[4]]), zero_stage=0, params_here=np.array([[params]]))
    kw.update(num_microbatches=np.array([[1]]), pipeline_end=True)
    engine = get_engine("megatron-core")
    (c,) = step.engine_dp_collectives(LLAMA, dtype="bfloat16", engine=engine, **kw)
    assert (c.kind, int(np.asarray(c.group).item()), c.count) == ("all_reduce", 4, 1)
    assert float(np.asarray(c.message_bytes).item()) == 4.0 * params
    reduce_s, gather_s = step.dp_collective_times(H100, COEFFS, LLAMA, run=Resolved(engine=engine), **kw)
    assert float(np.asarray(reduce_s).item()) == pytest.approx(_ring_s(2.0, 4, 4.0 * params), rel=1e-12)
    assert float(np.asarray(gather_s).item()) == 0.0


def test_the_tp_collectives_are_the_ring_formula() -> None:
    """The TP group of 2 inside a node: an all-reduce of one micro-batch's activations (b s h, 2 bytes each)
    takes two ring passes, an all-gather or a reduce-scatter one."""
    x, _, _ = _inputs(_plan())
    message = 1 * LLAMA.seq_len * LLAMA.hidden * 2.0
    assert float(x.ar[0, 0]) == pytest.approx(_ring_s(2.0, 2, message), rel=1e-12)
    assert float(x.ag[0, 0]) == pytest.approx(_ring_s(1.0, 2, message), rel=1e-12)
    assert float(x.rs[0, 0]) == pytest.approx(_ring_s(1.0, 2, message), rel=1e-12)


def test_the_tp_term_counts_two_collectives_a_layer_and_the_ends() -> None:
    """Without sequence parallelism or overlap: each layer all-reduces twice in the forward and twice in the
    backward; the first stage adds the vocab-parallel embedding's all-reduce to its forward, the last the head's
    input-gradient all-reduce to its backward; nothing is hidden."""
    plan = _plan()
    assert not plan.sequence_parallel and plan.recompute == "none"
    x, w, _ = _inputs(plan)
    ar = float(x.ar[0, 0])
    per_stage = np.array(plan.layers_per_stage(), dtype=float)
    tp = stage.tp_term(x, w)
    first, last = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    np.testing.assert_allclose(tp.fwd[0], (2 * per_stage + first) * ar, rtol=1e-12)
    np.testing.assert_allclose(tp.bwd[0], (2 * per_stage + last) * ar, rtol=1e-12)
    np.testing.assert_allclose(tp.hidden, 0.0, atol=1e-15)  # (f + b) - f - b: rounding only


def test_the_p2p_term_is_one_send_of_a_ranks_activations() -> None:
    """One boundary transfer: the call's overhead, one hop, b s h at 2 bytes over the NVLink tier (the pipeline
    neighbours are tp dp = 4 ranks apart, inside the node)."""
    x, _, _ = _inputs(_plan())
    message = 1 * LLAMA.seq_len * LLAMA.hidden * 2.0
    want = COEFFS.collective_overhead_s + NVLINK.latency_s + message / (NVLINK.bytes_per_s * COEFFS.link_eff)
    assert float(stage.p2p_s(x)[0]) == pytest.approx(want, rel=1e-12)


def test_the_compute_term_of_a_dense_stage() -> None:
    """No recomputation: the weight-gradient pass is the forward's dense GEMMs; the backward is the layers'
    backward less it, with two thirds of the framework's per-layer time (the forward a third) and half the
    per-op pipeline overhead each; the embedding on the first stage, the head on the last."""
    x, w, _ = _inputs(_plan())
    c = stage.compute_term(x, w)
    fw = compute.framework_layer_s(x.dev, x.tp, x.dp, x.zero)
    op = x.dev.params.pp_microbatch_overhead_s / 2
    L = x.L
    np.testing.assert_allclose(c.wgrad, w.dense + 0.0 * L, rtol=1e-12)
    ends_f = np.array([1.0, 0.0]) * w.emb_f + np.array([0.0, 1.0]) * w.head_f
    ends_b = np.array([1.0, 0.0]) * w.emb_b + np.array([0.0, 1.0]) * w.head_b
    np.testing.assert_allclose(c.fwd, w.fwd + L * fw / 3 + op + ends_f, rtol=1e-12)
    np.testing.assert_allclose(c.bwd, w.bwd - w.dense + 2 * L * fw / 3 + op + ends_b, rtol=1e-12)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"model": get_model("mixtral-8x7b"), "gpus": 16, "ep": 4, "tp": 2, "pp": 2, "sequence_parallel": True},
        {"cp": 2, "gpus": 16, "sequence_parallel": True, "recompute": "full", "recompute_layers": 3},
    ],
    ids=["dense", "moe", "cp"],
)
def test_stage_times_is_the_sum_of_its_terms(kw) -> None:
    """Every field of ``stage_times`` is its terms': compute, TP, and the expert all-to-all plus the cp exchange
    (the all-to-all's seconds non-zero exactly where the layout has ep, the exchange's zero without cp)."""
    plan = _plan(**kw)
    x, w, args = _inputs(plan)
    model, cluster, coeffs, dev, lay, run, split, rules = args
    st = stage.stage_times(model, cluster, coeffs, dev, lay, run=run, stage_layers=split, rules=rules)
    c, tp, ep, cp = stage.compute_term(x, w), stage.tp_term(x, w), stage.ep_term(x, w), stage.cp_term(x, w)
    for got, want in ((st.fwd, c.fwd), (st.bwd, c.bwd), (st.wgrad, c.wgrad), (st.tp_fwd, tp.fwd)):
        np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))
    np.testing.assert_array_equal(st.tp_bwd, np.broadcast_to(tp.bwd, st.tp_bwd.shape))
    np.testing.assert_array_equal(st.ext_fwd, np.broadcast_to(ep.fwd + cp.fwd, st.ext_fwd.shape))
    np.testing.assert_array_equal(st.ext_bwd, np.broadcast_to(ep.bwd + cp.bwd, st.ext_bwd.shape))
    np.testing.assert_array_equal(st.ep_share, np.broadcast_to(ep.fwd + ep.bwd, st.ep_share.shape))
    assert bool(np.all(np.asarray(ep.exposed) > 0)) == (plan.ep > 1)
    if plan.cp == 1:  # (on one node the exchange hides behind the attention core: cost.context)
        np.testing.assert_array_equal(cp.exposed, 0.0)


@pytest.mark.parametrize(
    "kw",
    [{}, {"zero": 1, "gpus": 16, "pp": 4, "tp": 1}, {"cp": 2, "gpus": 16, "sequence_parallel": True}],
    ids=["1f1b", "zero1-pp4", "cp"],
)
def test_the_step_is_the_composition_of_its_terms(kw) -> None:
    """The step is the pipeline's makespan plus the exposed DP collectives, the optimizer, the offload, the fixed
    overhead and the straggler's lag; the makespan is the busiest rank's compute and communication, its bubble and
    the exposed pipeline transfers."""
    tb, pt = step_time(_plan(**kw), H100, COEFFS)
    pipe = float(pt.step_s[0])
    assert tb.dp_comm > 0 and tb.optimizer > 0 and tb.other > 0 and tb.bubble > 0
    parts = pipe + tb.dp_comm + tb.optimizer + tb.offload + tb.other + tb.straggler
    assert tb.step == pytest.approx(parts, rel=1e-12)
    inside = tb.compute + tb.tp_comm + tb.ep_comm + tb.cp_comm + tb.bubble + tb.pp_comm
    assert pipe == pytest.approx(inside, rel=1e-12)


def test_one_rerun_share_for_a_partial_full_recomputation() -> None:
    """The first N layers of each stage (N per layout; 0: all), or one in ``every`` of a rank's layers
    (``settings.full_rerun_layers``), as layers, shares and per-rank sums."""
    split = [3, 5, 4, 4]  # pp 2, interleave 2: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3
    first = np.array([0, 2, 9])
    np.testing.assert_array_equal(rerun_layers(split, 2, first), [[3, 5, 4, 4], [2, 2, 2, 2], [3, 5, 4, 4]])
    np.testing.assert_allclose(rerun_share(split, 2, first), [[1, 1, 1, 1], [2 / 3, 2 / 5, 1 / 2, 1 / 2], [1] * 4])
    looped = np.arange(4)
    np.testing.assert_array_equal(rerun_on_rank(split, 2, looped, first, n=3), [[7, 9], [4, 4], [7, 9]])
    every = full_rerun_layers(split, 2, every=3)
    assert every == (1, 1, 1, 2)  # rank 0: layers 1-3 and 4-7 hold its 3rd and 6th; rank 1: 1-5, 6-9
    np.testing.assert_array_equal(rerun_layers(split, 2, every=3), [every])
    np.testing.assert_allclose(rerun_share(split, 2, every=3), [[1 / 3, 1 / 5, 1 / 4, 2 / 4]])
    assert rerun_layers(split, 2, 0) is None and rerun_share(split, 2, 0) == 1.0
    # the step time reads the same share: a full recomputation of the first 3 of each stage's 16 layers
    x, _, _ = _inputs(_plan(recompute="full", recompute_layers=3))
    np.testing.assert_allclose(x.full, [[3 / 16, 3 / 16]])


def test_loss_scaling_is_float16s_only() -> None:
    """The found-inf all-reduce: one fp32 flag over every rank under float16, nothing otherwise."""
    gpus = np.array([8])
    assert float(step.loss_scaling_s(H100, COEFFS, "bfloat16", gpus)[0]) == 0.0
    flag = float(step.loss_scaling_s(H100, COEFFS, "float16", gpus)[0])
    assert flag == pytest.approx(_ring_s(2.0, 8, step.FOUND_INF_BYTES), rel=1e-12)
