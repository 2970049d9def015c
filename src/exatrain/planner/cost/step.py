"""Step time of many layouts at once: the cost model's one definition of a step (a single plan is
a batch of one, ``step_time``).

Assembly (one data-parallel replica; all replicas run the same), every term over numpy arrays of
layouts that share pp and interleave (``planner.evaluate`` groups them):
  1. per virtual stage k and micro-batch: forward F[k] and backward B[k] (+ weight pass W[k], a
     separate op only under the split-backward schedules) = its layers' compute (cost.compute) + their exposed TP
     collectives (Megatron's TP all-reduces sit on the critical path; cost.network), plus the
     embedding on the first stage and norm/logits/loss on the last, with the stages' real layer
     split; recomputation is part of B;
  2. point-to-point transfers between stages on different ranks (cost.network, pipeline tier);
  3. the pipeline's makespan (cost.pipeline) with and without the transfers: their difference is
     the exposed pipeline communication;
  4. DP gradient reduction / ZeRO gathers of every pipeline rank: what one micro-batch's backward
     cannot hide (dp_overlap), less the time the rank waits for the pipeline to drain, is exposed;
     ZeRO-3's backward gathers and its reduction share the links, so the backward hides their sum
     at most once;
  5. the optimizer update of the rank with the most (sharded) parameters and a fixed per-step
     overhead; under float16 also the loss scaler's unscale pass over the gradients and its
     found-inf all-reduce (``loss_scaling_s``).
What is hidden depends on the runtime (``cost.overlap``): TP collectives behind the layer's GEMMs,
gradient reduction behind the last micro-batch's backward, parameter gathers behind forward,
interleaved P2P behind the next forward, each only where the runtime's profile overlaps it; the
leftover, ``max(0, comm - overlappable compute)``, is what the terms above count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from exatrain.accounting import comms
from exatrain.accounting import fp8 as fp8_acc
from exatrain.accounting.engines import Resolved
from exatrain.accounting.memory import COMPUTE_BYTES
from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.settings import HALF_DTYPES, RECOMPUTE, SCHEDULES, V_SCHEDULES, full_rerun_layers
from exatrain.planner.cost import compute, network
from exatrain.planner.cost.context import cp_exposed_s
from exatrain.planner.cost.fp8 import fp8_speedup
from exatrain.planner.cost.layer import layer_times
from exatrain.planner.cost.moe import a2a_time_s, edp_span, stage_kinds
from exatrain.planner.cost.recompute import module_rerun_s
from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.cost.overlap import (
    OverlapRules,
    engine_collectives,
    exposed,
    is_gather,
    overlap_rules,
    p2p_exposed,
)
from exatrain.planner.cost.offload import offload_seconds
from exatrain.planner.cost.pipeline import PipelineTimes, pipeline_times
from exatrain.planner.cost.variability import straggler_s
from exatrain.planner.layouts import Layouts

TIME_FIELDS = (
    "step",
    "compute",
    "bubble",
    "tp_comm",
    "pp_comm",
    "dp_comm",
    "optimizer",
    "other",
    "ep_comm",
    "cp_comm",
    "straggler",
    "offload",
)
_FULL, _SELECTIVE = RECOMPUTE.index("full"), RECOMPUTE.index("selective")
_INTERLEAVED = SCHEDULES.index("interleaved")
_V_CODES = [SCHEDULES.index(s) for s in V_SCHEDULES]


@dataclass(frozen=True, eq=False)
class StageTimes:
    """Per layout and virtual stage, per micro-batch (seconds, arrays (N, S)): compute and TP
    communication apart; ``p2p`` (N,) is one boundary transfer between ranks."""

    fwd: np.ndarray
    bwd: np.ndarray  # input-gradient pass incl. recomputation (whole backward minus ``wgrad``)
    wgrad: np.ndarray  # weight-gradient GEMMs (a separate op only under the split-backward schedules)
    tp_fwd: np.ndarray
    tp_bwd: np.ndarray
    p2p: np.ndarray
    tp_hidden: np.ndarray | None = None  # (N, S) TP seconds per micro-batch the runtime's overlap hides
    # exposed expert all-to-all and context-parallel ring (cost.moe, cost.context), (N, S); 0 without ep / cp
    ext_fwd: np.ndarray | float = 0.0
    ext_bwd: np.ndarray | float = 0.0
    ep_share: np.ndarray | float = 0.0  # the all-to-all's part of ext_fwd + ext_bwd

    @property
    def forward_s(self) -> np.ndarray:
        return self.fwd + self.tp_fwd + self.ext_fwd

    @property
    def backward_s(self) -> np.ndarray:
        return self.bwd + self.tp_bwd + self.ext_bwd


def tp_collectives_s(
    cluster: ClusterSpec, coeffs: CostParams, tp, message_bytes, kinds=("all_gather", "reduce_scatter")
):
    """Seconds of each of ``kinds`` of TP collective on b*s*h over the tp group's tier (0 where tp is
    1); arrays allowed."""
    on = np.asarray(tp) > 1
    return tuple(
        np.where(on, network.collective_s(kind, cluster, tp, network.tp_span(tp), message_bytes, coeffs), 0.0)
        for kind in kinds
    )


def tp_collective_time_s(cluster: ClusterSpec, coeffs: CostParams, tp, message_bytes, sequence_parallel):
    """One forward-or-backward TP collective on b*s*h (an all-reduce, or with sequence parallelism
    an all-gather + reduce-scatter pair) over the tp group's tier; arrays allowed."""
    ag, rs, ar = tp_collectives_s(cluster, coeffs, tp, message_bytes, ("all_gather", "reduce_scatter", "all_reduce"))
    return np.where(sequence_parallel, ag + rs, ar)


def tp_overlap_exposed(ag, rs, tp, gemms_fwd, *, mlp: bool, ag_fwd=None):
    """(forward, backward) TP seconds a layer leaves exposed when its runtime decomposes each
    sequence-parallel collective into tp chunks pipelined with the GEMMs next to it (``cost.overlap``
    ``tp``; ``compute.TP_PAIRS``: ``gemms_fwd`` are their forward seconds). Chunk i of the GEMM waits
    for chunk i of the collective (or the other way round), so of the collective's ``c`` seconds and
    the GEMM's ``g`` the pipeline hides all but ``max(0, c - g (tp-1)/tp)``: one chunk of the GEMM
    has no transfer beside it. The forward pairs the attention input's all-gather with the input
    projections, the reduce-scatter with ``proj``, and the MLP's with ``fc1`` / ``fc2``; the backward
    runs each one's transpose (a reduce-scatter of the input gradient, an all-gather of the output
    gradient) beside the same GEMMs' input- and weight-gradient passes, twice the forward's time.
    ``mlp``: the layer has the MLP pair (dense layers, MoE layers with shared experts); ``ag_fwd``: the
    forward's all-gathers where they carry FP8 inputs (None: ``ag``)."""
    share = (np.asarray(tp, dtype=float) - 1) / np.maximum(np.asarray(tp, dtype=float), 1)
    g_in, g_proj, g_fc1, g_fc2 = gemms_fwd
    agf = ag if ag_fwd is None else ag_fwd
    fwd = exposed(agf, share * g_in) + exposed(rs, share * g_proj)
    bwd = exposed(rs, 2 * share * g_in) + exposed(ag, 2 * share * g_proj)
    if mlp:
        fwd = fwd + exposed(agf, share * g_fc1) + exposed(rs, share * g_fc2)
        bwd = bwd + exposed(rs, 2 * share * g_fc1) + exposed(ag, 2 * share * g_fc2)
    return fwd, bwd


def _pick(sequence_parallel, fn):
    """fn(sp) evaluated without and, where some layout uses it, with sequence parallelism."""
    off = fn(False)
    if not np.any(sequence_parallel):
        return off
    on = fn(True)
    return tuple(np.where(sequence_parallel, a, b) for a, b in zip(on, off))


def recomputed(rec, fwd, attn, dense, *, per_op: bool = False, per_op_gemms=None):
    """Seconds the backward spends rerunning forward work, from the layers' forward ``fwd``, its
    attention core ``attn`` and dense GEMMs ``dense`` (same shapes): full recomputation reruns the
    whole forward; selective the attention core (Korthikanti et al. 2022, Sec. 5), or, under
    torchtitan's per-op policy (``per_op``: it saves the outputs of the attention kernel, the
    reduce-scatters and every second matmul, counted across calls: torchtitan/distributed/
    activation_checkpoint.py), the matmuls it does not save (``per_op_gemms``: ``compute.per_op_rerun_s``;
    None: half of the dense GEMMs) and all element-wise work (norms, rotary, activation, products,
    residual adds: ``fwd - attn - dense``), and not the attention."""
    if per_op:
        selective = (0.5 * dense if per_op_gemms is None else per_op_gemms) + (fwd - attn - dense)
    else:
        selective = attn
    return np.where(rec == _FULL, fwd, np.where(rec == _SELECTIVE, selective, 0.0))


def stage_times(
    model: ModelSpec,
    cluster: ClusterSpec,
    coeffs: CostParams,
    dev: compute.Device,
    lay: Layouts,
    *,
    run: Resolved,
    stage_layers: np.ndarray,
    rules: OverlapRules | None = None,
) -> StageTimes:
    """Per-stage seconds of the layouts ``lay``, which share pp, the layer split ``stage_layers`` (S,), ep and cp
    (MoE layers, context parallelism and FP8 GEMMs: ``cost.layer``), as ``run`` says their runtime runs them
    (``accounting.engines.Resolved``); ``rules``: the runtime's overlaps (None: exatrain's, which hides no TP
    communication). From ``run``: what its selective recomputation reruns (``selective``, see ``recomputed``); how
    MoE tokens reach their experts (``moe_dispatcher``, ``cost.moe.a2a_time_s``) and the busiest expert rank's
    load (``moe_load``); how the element-wise ops and the loss run (``elementwise``, ``compute.unfused_extra``;
    ``cross_entropy``, ``compute.head_times``); under FP8 (``fp8``) whether the forward's sequence-parallel
    all-gathers carry the GEMM inputs already cast to FP8, one byte an element (``fp8_tp_gather``), the backward's
    collectives staying 16-bit; how the engine launches its local experts' GEMMs (``expert_gemms``,
    ``cost.layer.layer_times``); how it runs context parallelism (``cp_exchange``, ``accounting.context.CpExchange``:
    its kernel calls and what its exchange exposes, ``cost.context.cp_exposed_s``; None: Transformer Engine's p2p
    ring); what selective recomputation reruns by Megatron-Core module (``recompute_modules``; (): ``selective``):
    their forward seconds (``cost.recompute.module_rerun_s``), the TP collectives inside them
    (``accounting.comms.module_rerun_tp_pairs``) and, for "moe", the layer's all-to-alls, again in the backward. A
    full recomputation covers the first ``lay.recompute_layers`` layers of each stage (Plan.recompute_layers; 0: all),
    or one in ``run.recompute_every`` of a rank's (settings.full_rerun_layers): the rerun forward, its TP
    collectives, all-to-alls and cp exchange in that share of the stage's layers."""
    pp, ep, cp_size = int(lay.pp[0]), int(lay.ep[0]), int(lay.cp[0])
    dtype, fp8, selective, moe_load = run.dtype, run.fp8, run.selective, run.moe_load
    elementwise, cross_entropy, cp_exchange = run.elementwise, run.cross_entropy, run.cp_exchange
    recompute_modules, recompute_every, recompute_layers = (
        run.recompute_modules,
        run.recompute_every,
        lay.recompute_layers,
    )
    tp, dp, b = (np.asarray(x)[:, None] for x in (lay.tp, lay.dp, lay.micro_batch))
    cp_calls = None if cp_exchange is None else cp_exchange.kernel_calls(cp_size)
    sp = np.asarray(lay.sequence_parallel, dtype=bool)[:, None]
    rec = np.asarray(lay.recompute)[:, None]
    zero = np.asarray(lay.zero_stage)[:, None]

    n_dense, n_moe = (x[None, :] for x in stage_kinds(model, stage_layers))
    kinds = ((False, n_dense), (True, n_moe)) if model.is_moe else ((False, n_dense),)
    speedup = fp8_speedup(cluster, dtype, coeffs) if fp8 else 1.0
    bl = b / cp_size if cp_size > 1 else b  # a rank's share of each sequence, as micro-batch: s/cp tokens

    message = bl * model.seq_len * model.hidden * COMPUTE_BYTES[dtype]
    ag, rs, ar = tp_collectives_s(cluster, coeffs, tp, message, ("all_gather", "reduce_scatter", "all_reduce"))
    ag_f = (
        tp_collectives_s(cluster, coeffs, tp, message / COMPUTE_BYTES[dtype], ("all_gather",))[0]
        if fp8 and run.fp8_tp_gather
        else ag
    )
    tp_overlap = rules is not None and rules.tp

    def layer(s: bool):
        # per stage: forward, backward, attention core, forward weight GEMMs, MoE layers' f+b, and the
        # TP seconds forward and backward a decomposing overlap leaves exposed (tp_overlap_exposed;
        # only where the runtime overlaps TP)
        sums = [0.0] * 9
        for moe, n in kinds:
            lt = layer_times(
                model,
                b,
                tp,
                moe=moe,
                ep=ep,
                cp=cp_size,
                sequence_parallel=s,
                dev=dev,
                run=run,
                speedup=speedup,
                cp_calls=cp_calls,
            )
            left = (
                tp_overlap_exposed(ag, rs, tp, lt.tp_gemms_fwd, mlp=not moe or bool(model.shared_experts), ag_fwd=ag_f)
                if tp_overlap and s
                else (0.0, 0.0)
            )
            rerun = (
                module_rerun_s(
                    model,
                    b,
                    tp,
                    moe=moe,
                    ep=ep,
                    cp=cp_size,
                    sequence_parallel=s,
                    dev=dev,
                    run=run,
                    attention_core_fwd=lt.attention_core_fwd,
                    speedup=speedup,
                )
                if recompute_modules
                else 0.0
            )
            sums = [
                a + n * x
                for a, x in zip(
                    sums,
                    (
                        lt.fwd,
                        lt.bwd,
                        lt.attention_core_fwd,
                        lt.dense_gemm_fwd,
                        (lt.fwd + lt.bwd) if moe else 0.0,
                        lt.per_op_gemm_fwd,
                        *left,
                        rerun,
                    ),
                )
            ]
        return (
            *sums,
            *compute.embedding_times(model, bl, tp, sequence_parallel=s, dtype=dtype, dev=dev),
            *compute.head_times(
                model,
                bl,
                tp,
                sequence_parallel=s,
                dtype=dtype,
                dev=dev,
                elementwise=elementwise,
                cross_entropy=cross_entropy,
            ),
        )

    # dense: the layers' weight GEMMs, whose weight-gradient pass (W) takes as long as the forward's
    fwd_l, bwd_l, attn_l, dense, moe_fb, per_op_l, tp_left_f, tp_left_b, modules_l, emb_f, emb_b, head_f, head_b = (
        _pick(sp, layer)
    )
    L = np.asarray(stage_layers, dtype=float)[None, :]
    # the share of each stage's layers a full recomputation reruns (the first recompute_layers of each)
    n = np.asarray(recompute_layers, dtype=float).reshape(-1, 1)  # one per layout, or one for all
    if recompute_every:
        share = np.asarray(full_rerun_layers(stage_layers, pp, every=recompute_every), dtype=float)[None, :] / L
    elif np.any(n > 0):
        share = np.where(n > 0, np.minimum(n, L) / np.maximum(L, 1.0), 1.0)
    else:
        share = 1.0
    full = np.where(rec == _FULL, share, 0.0)
    again = recomputed(
        rec, fwd_l, attn_l, dense, per_op=selective == "per_op" and not model.is_moe, per_op_gemms=per_op_l
    )
    again = np.where(rec == _FULL, share * again, again)
    if recompute_modules:
        again = np.where(rec == _SELECTIVE, modules_l, again)
    tp_one = np.where(sp, ag + rs, ar)  # tp_collective_time_s, from the collectives already priced
    tp_one_f = np.where(sp, ag_f + rs, ar)  # the forward's (and a rerun forward's): FP8 all-gathers where sent so
    # TP collectives per layer: 2 in forward, 2 in backward, 2 more when full recompute reruns forward;
    # a MoE layer under sequence parallelism: the attention's and the shared experts' only (comms).
    moe_f = (1 + (1 if model.shared_experts else 0)) if model.is_moe else 2
    n_tp_f = 2 * n_dense + np.where(sp, moe_f, 2) * n_moe
    fw = compute.framework_layer_s(dev, tp, dp, zero)
    pp_op = dev.params.pp_microbatch_overhead_s / 2 if pp > 1 else 0.0  # per F and per B op
    S = L.shape[1]
    fwd = fwd_l + L * fw / 3 + pp_op
    wgrad = dense + 0.0 * L
    bwd = bwd_l + again + L * 2 * fw / 3 - wgrad + pp_op
    tp_f, tp_b = n_tp_f * tp_one_f, n_tp_f * (tp_one + full * tp_one_f)
    # torchtitan's per-op selective recomputation saves the reduce-scatters' outputs but not the
    # all-gathers' (nor, without SP, the all-reduces'): its rerun forward gathers each GEMM input again
    # (torchtitan/distributed/activation_checkpoint.py _save_list), in the backward.
    per_op_rerun = (selective == "per_op" and not model.is_moe) * (rec == _SELECTIVE)
    tp_again = n_tp_f * np.where(sp, ag_f, ar) * per_op_rerun
    pairs = 0.0  # TP collective pairs inside the modules a selective recomputation reruns, again in the backward
    if recompute_modules:
        pairs_dense, pairs_moe = comms.module_rerun_tp_pairs(model, recompute_modules, sp)
        pairs = (pairs_dense * n_dense + pairs_moe * n_moe) * (rec == _SELECTIVE)
    tp_b = tp_b + tp_again + pairs * tp_one_f
    # Expert all-to-alls (dispatch + combine, forward and backward, the forward's again under full
    # recompute) and the context-parallel ring's exposed part (cost.moe, cost.context).
    a2a = (
        2
        * n_moe
        * _pick(
            sp,
            lambda s: (
                a2a_time_s(
                    model,
                    cluster,
                    coeffs,
                    b,
                    tp,
                    ep=ep,
                    cp=cp_size,
                    sequence_parallel=s,
                    dtype=dtype,
                    dp=dp,
                    dispatcher=run.moe_dispatcher,
                    load=moe_load,
                ),
            ),
        )[0]
        if model.is_moe
        else 0.0 * L
    )
    cp_f, cp_b = cp_exposed_s(
        model,
        cluster,
        coeffs,
        b,
        tp,
        cp=cp_size,
        dtype=dtype,
        attn_fwd=attn_l / np.maximum(L, 1),
        attn_bwd=2.5 * attn_l / np.maximum(L, 1),
        exchange=cp_exchange,
    )
    moe_rerun = full + ((rec == _SELECTIVE) & ("moe" in recompute_modules))  # the share rerunning the all-to-alls
    a2a_f, a2a_b = a2a, a2a * (1 + moe_rerun)
    if rules is not None and rules.ep_a2a:
        # EP all-to-all overlap (cost.overlap): hidden behind another micro-batch's MoE-layer compute;
        # what stays exposed is split between forward and backward in proportion.
        whole = a2a_f + a2a_b
        left = exposed(whole, moe_fb) / np.where(whole > 0, whole, 1.0)
        a2a_f, a2a_b = a2a_f * left, a2a_b * left
    ext_f = a2a_f + L * cp_f
    ext_b = a2a_b + L * (cp_b + full * cp_f)
    first, last = np.arange(S) == 0, np.arange(S) == S - 1
    fwd = fwd + first * emb_f + last * head_f
    bwd = bwd + first * emb_b + last * head_b
    tp_f = tp_f + first * tp_one  # vocab-parallel embedding all-reduce
    tp_b = tp_b + last * tp_one  # head input-gradient all-reduce
    tp_all = tp_f + tp_b
    if tp_overlap:
        # TP comm overlap (sequence parallel only, cost.overlap): each layer collective decomposed beside
        # the GEMMs next to it (tp_overlap_exposed), the recomputed forward's again under full
        # recomputation; the embedding's and the head's collectives stay exposed. A runtime whose
        # overlap covers the forward only (OverlapRules.tp_backward) leaves the backward's own exposed and
        # hides the rerun forward's as the forward's (torchtitan's async TP: the compiled backward graph
        # holds the rerun forward, and inductor's micro-pipeline pass runs on it as on the forward graph).
        tp_f = np.where(sp, tp_left_f + first * tp_one, tp_f)
        # a rerun module's pairs decomposed as the forward's are: their share of what the forward leaves exposed
        tp_again = tp_again + pairs * tp_left_f / np.maximum(n_tp_f, 1)
        if rules.tp_backward:
            tp_b = np.where(sp, tp_left_b + full * tp_left_f + last * tp_one + tp_again, tp_b)
        else:
            tp_b = np.where(sp, n_tp_f * tp_one + full * tp_left_f + last * tp_one + tp_again, tp_b)
    if pp > 1:
        msg = bl[:, 0] * model.seq_len * model.hidden * COMPUTE_BYTES[dtype] / np.where(sp[:, 0], tp[:, 0], 1)
        bw, lat = network.tier_arrays(cluster, network.pp_span(tp[:, 0] * cp_size, dp[:, 0]), coeffs)
        p2p = network.collective_time_s("send_recv", 2, msg, bw, lat, coeffs)
    else:
        p2p = np.zeros(len(b))
    shape = (len(b), S)
    ext = (ext_f, ext_b, a2a_f + a2a_b)
    return StageTimes(
        *(np.broadcast_to(x, shape) + 0.0 for x in (fwd, bwd, wgrad, tp_f, tp_b)),
        p2p=p2p,
        tp_hidden=np.broadcast_to(tp_all - tp_f - tp_b, shape) + 0.0,
        **dict(zip(("ext_fwd", "ext_bwd", "ep_share"), (np.broadcast_to(x, shape) + 0.0 for x in ext))),
    )


def fp8_gathered_params(m: ModelSpec, tp, stage_layers, pp: int, ep: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(data-parallel, expert-data-parallel) GEMM weights each pipeline rank holds (N, pp), of N layouts
    of tensor-parallel degree ``tp`` (N,) sharing the layer split (S,): what ``Plan.fp8_param_gather``
    gathers in FP8 (accounting.fp8.gemm_weights; the routed experts' part on the edp group)."""
    n_dense, n_moe = stage_kinds(m, stage_layers)
    S = len(n_dense)
    dense_r, moe_r = (x.reshape(S // pp, pp).sum(axis=0)[None, :] for x in (n_dense, n_moe))
    t = np.asarray(tp, dtype=float)[:, None]
    routed = fp8_acc.routed_gemm_weights(m, ep)
    moe_w = fp8_acc.gemm_weights(m, True, t, ep) - routed if m.is_moe else 0.0
    return dense_r * fp8_acc.gemm_weights(m, False, t) + moe_r * moe_w, moe_r * routed + 0.0 * t


def engine_dp_collectives(
    model,
    *,
    tp,
    pp,
    dp,
    zero_stage: int,
    params_here,
    num_microbatches,
    dtype: str,
    pipeline_end: bool,
    engine=None,
    cp_size: int = 1,
    ep: int = 1,
    expert_params_here=0,
    fp8_gathered=None,
) -> tuple:
    """One rank's data-parallel collectives per step as ``engine`` sends them (``accounting.comms``'
    ``dp_collectives_for``, the exatrain trainer's, through ``cost.overlap.engine_collectives``; None:
    the trainer's own): the gradient reduce-scatter once a micro-batch where the engine reduces each
    (``EngineProfile.reduce_each_microbatch``, ZeRO-2/3 without a pipeline), the FP8-gathered GEMM weights
    (``fp8_gathered``: (dp, edp) weights, or None) at one byte each: what ``dp_collective_times`` prices and
    ``experts.comm_bytes`` counts."""
    cs = comms.dp_collectives_for(
        model,
        tp=tp,
        pp=pp,
        dp=dp,
        zero_stage=zero_stage,
        num_microbatches=num_microbatches,
        dtype=dtype,
        params_here=params_here,
        pipeline_end=pipeline_end,
        cp=cp_size,
        ep=ep,
        expert_params_here=expert_params_here,
    )
    if engine is not None:
        cs = engine_collectives(cs, engine, dtype=dtype)
        if engine.reduce_each_microbatch and zero_stage >= 2:
            # a reduce-scatter after every micro-batch's backward, unless a pipeline schedule defers it
            each = np.where(np.asarray(pp) == 1, np.asarray(num_microbatches, dtype=float), 1.0)
            cs = tuple(
                replace(c, count=c.count * each) if c.kind == "reduce_scatter" and c.axis in ("dp", "edp") else c
                for c in cs
            )
    if fp8_gathered is not None:
        saved = dict(zip(("dp", "edp"), fp8_gathered))
        cs = tuple(
            replace(c, message_bytes=c.message_bytes - saved[c.axis] * (COMPUTE_BYTES[dtype] - 1.0))
            if is_gather(c) and c.axis in saved
            else c
            for c in cs
        )
    return tuple(cs)


def dp_collective_times(
    cluster: ClusterSpec,
    coeffs: CostParams,
    model,
    *,
    tp,
    pp,
    dp,
    zero_stage: int,
    params_here,
    num_microbatches,
    run: Resolved,
    pipeline_end: bool,
    cp_size: int = 1,
    ep: int = 1,
    expert_params_here=0,
    fp8_gathered=None,
):
    """(gradient reductions, parameter gathers): seconds of one rank's DP collectives per step, with the
    tied-embedding gradient reduction between the pipeline's two ends, which crosses the pipeline tier; arrays
    allowed. ``run``: the dtype and the runtime's profile (what it sends, ``cost.overlap.engine_collectives``;
    ``run.engine`` None: exatrain's trainer). With context
    parallelism the group is dp*cp (strided by tp); a MoE model's routed-expert gradients reduce over
    the expert-data-parallel group (``cost.moe.edp_span``). ``fp8_gathered``: (dp, edp) GEMM weights
    of the rank gathered in FP8 (``Plan.fp8_param_gather``): their gathers send one byte each instead
    of the compute dtype's; None: none."""
    # the span each axis's group covers (a group across nodes is priced on the node's NICs: network.collective_s)
    dp_span = network.dp_span(tp, np.asarray(dp) * cp_size)
    spans = {"dp": dp_span, "edp": edp_span(tp, dp, cp_size, ep) if model.is_moe else dp_span}
    ends = (np.asarray(pp) - 1) * np.asarray(tp) * cp_size * np.asarray(dp) + 1
    reduce_s, gather_s = 0.0, 0.0
    cs = engine_dp_collectives(
        model,
        tp=tp,
        pp=pp,
        dp=dp,
        zero_stage=zero_stage,
        params_here=params_here,
        num_microbatches=num_microbatches,
        dtype=run.dtype,
        pipeline_end=pipeline_end,
        engine=run.engine,
        cp_size=cp_size,
        ep=ep,
        expert_params_here=expert_params_here,
        fp8_gathered=fp8_gathered,
    )
    for c in cs:
        t = c.count * network.collective_s(c.kind, cluster, c.group, spans.get(c.axis, ends), c.message_bytes, coeffs)
        if is_gather(c):
            gather_s = gather_s + t
        else:
            reduce_s = reduce_s + t
    return reduce_s, gather_s


def with_accumulation(st: StageTimes, engine, dtype: str, params_by_rank, v: int, dev: compute.Device) -> StageTimes:
    """``st`` with each micro-batch's backward ending in the pass an engine makes over its virtual stage's
    gradients to accumulate them outside the GEMMs (``EngineProfile.accum_pass``, bytes a parameter; a rank's
    parameters ``params_by_rank`` (N, pp) split evenly over its ``v`` virtual stages), at the element-wise
    kernels' bandwidth; unchanged where the engine makes none."""
    accum = engine.accum_pass(dtype)
    if not accum:
        return st
    return replace(st, bwd=st.bwd + compute.elementwise_time_s(accum * _per_stage(params_by_rank, v), dev))


def _per_stage(params_by_rank, v: int) -> np.ndarray:
    """(N, pp) parameters of a rank -> (N, pp * v) of each of its virtual stages, split evenly."""
    return np.tile(np.asarray(params_by_rank, dtype=float) / v, (1, v))


# Bytes an element of the parameter passes moves (EngineProfile.autocast_casts, autograd_accum, fsdp_pass_zero): a
# weight cast fp32 -> bf16 (read 4, write 2), its gradient cast back (read 2, write 4), an fp32 add into .grad
# (read 4 + 4, write 4), a bf16 gradient added into an fp32 one (read 2 + 4, write 4), a 16-bit copy (read 2, write
# 2), an fp32 copy (read 4, write 4)
CAST_BYTES_FP32_BF16 = 6.0
GRAD_ADD_BYTES_FP32 = 12.0
GRAD_ADD_BYTES_BF16_INTO_FP32 = 10.0
COPY_BYTES_BF16 = 4.0
COPY_BYTES_FP32 = 8.0


def cast_params(model: ModelSpec, tp, pp: int, params_by_rank) -> tuple[np.ndarray, np.ndarray]:
    """(the parameters of each rank (N, pp) a GEMM reads as weights, those of them in its transformer blocks):
    ``params_by_rank`` without the input embedding table and the learned positions (looked up, never a GEMM's
    weight; a tied table on a single stage is the head's weight too), and, for the blocks, without the head
    and the final norm either. The norms' parameters inside the blocks stay counted (autocast leaves them fp32;
    they are 2h to 4h of a layer's ~12h^2)."""
    from exatrain.accounting.params import embedding_params, final_norm_params, head_params, position_params

    tp = np.asarray(tp, dtype=np.int64).reshape(-1, 1)
    rank = np.arange(pp)[None, :]
    params = np.asarray(params_by_rank, dtype=float)
    table = 0 if (model.tied_embeddings and pp == 1) else embedding_params(model)
    looked_up = np.where(rank == 0, table // tp + position_params(model), 0)
    gemm = params - looked_up
    head = embedding_params(model) // tp if model.tied_embeddings else head_params(model) // tp
    blocks = gemm - np.where(rank == pp - 1, head + final_norm_params(model), 0)
    return gemm, blocks


def _v_looped(st: StageTimes, p: int) -> StageTimes:
    """A V placement's stage times reordered as the looped placement lays them out (chunk c of rank r at c pp + r:
    rank r's stages r and 2 pp - 1 - r), so that per-rank sums and spreads apply; its own inverse."""
    perm = np.concatenate([np.arange(p), np.arange(2 * p - 1, p - 1, -1)])
    return replace(
        st,
        **{
            f: getattr(st, f)[:, perm]
            for f in ("fwd", "bwd", "wgrad", "tp_fwd", "tp_bwd", "tp_hidden", "ext_fwd", "ext_bwd", "ep_share")
            if np.ndim(getattr(st, f)) == 2 and np.shape(getattr(st, f))[1] == 2 * p
        },
    )


def with_parameter_passes(
    st: StageTimes,
    engine,
    dtype: str,
    model: ModelSpec,
    tp,
    params_by_rank,
    v: int,
    m,
    zero,
    recompute,
    dev: compute.Device,
    shard=1,
    side_streams: bool = True,
    v_shape: bool = False,
) -> StageTimes:
    """``st`` with the passes an engine makes over its parameters every micro-batch (rank parameters
    ``params_by_rank`` (N, pp), tp (N,), ``m`` micro-batches, ``zero`` stages, ``recompute`` indices, FSDP's
    ``shard`` size (N,)), spread evenly over a step's micro-batches: its accumulation outside the GEMMs
    (``with_accumulation``); autograd's adds into a kept 16-bit .grad after the first micro-batch
    (``EngineProfile.later_accum``, DeepSpeed at ZeRO-0/1); at the ZeRO stages that keep fp32 parameters whole
    (``EngineProfile.param_pass_zero``, DDP) autocast's weight casts (bfloat16 training: the forward, a full
    recomputation's rerun of the blocks, the gradients back in the backward) and autograd's fp32 adds into .grad after
    the first micro-batch; at those FSDP2 shards (``fsdp_pass_zero``, bfloat16 training) each gather's copies into and
    out of its buffer (the shard cast to bf16, the gathered weights copied out; ZeRO-3 gathers again in the backward),
    the unsharded gradients kept in fp32 between micro-batches (the first cast, each later one added) and the last
    backward's copies into and out of the reduce-scatter. With ``side_streams`` (a GPU) FSDP2 runs two of those beside
    the compute, on its own streams (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): each gather's copy-in of
    the shard (all_gather_copy_in_stream) and the reduce-scatter output's copy into the shard's .grad (the
    reduce-scatter stream); they lengthen the collectives they feed, not the compute, and are left out here. The
    gathered weights' copy-out and the reduce-scatter's copy-in run on the compute stream. Without streams (the
    CPU) every copy is in line. An FSDP1 engine (``EngineProfile.flat_param_grad_copy``) copies every backward's
    gradients into its units' flat gradients on the compute stream (``flat_grad_copy_bytes``). ``v_shape``: the
    stages are placed in a V (rank r: r and 2 pp - 1 - r), each rank's passes spread over its own two."""
    if v_shape:
        p = np.shape(params_by_rank)[-1]
        return _v_looped(
            with_parameter_passes(
                _v_looped(st, p),
                engine,
                dtype,
                model,
                tp,
                params_by_rank,
                v,
                m,
                zero,
                recompute,
                dev,
                shard=shard,
                side_streams=side_streams,
            ),
            p,
        )
    st = with_accumulation(st, engine, dtype, params_by_rank, v, dev)
    flat = engine.flat_grad_copy_bytes(dtype)
    if flat:  # FSDP1: autograd builds each unit's flat gradient from its views, every backward, on the compute stream
        st = replace(st, bwd=st.bwd + compute.elementwise_time_s(flat * _per_stage(params_by_rank, v), dev))
    later = engine.later_accum(dtype, np.asarray(zero).reshape(-1, 1))
    if np.any(later):  # autograd's adds into a kept 16-bit .grad from the second micro-batch on
        m_ = np.asarray(m, dtype=float).reshape(-1, 1)
        adds = later * (m_ - 1) / m_ * np.asarray(params_by_rank, dtype=float)
        st = replace(st, bwd=st.bwd + compute.elementwise_time_s(_per_stage(adds, v), dev))
    if not (engine.autocast_casts or engine.autograd_accum or engine.fsdp_pass_zero):
        return st
    z = np.asarray(zero).reshape(-1)
    ddp, fsdp = (np.isin(z, stages)[:, None] for stages in (engine.param_pass_zero, engine.fsdp_pass_zero))
    m = np.asarray(m, dtype=float).reshape(-1, 1)
    params = np.asarray(params_by_rank, dtype=float)
    gemm, blocks = cast_params(model, tp, params.shape[1], params)
    fwd = np.zeros_like(gemm)
    bwd = GRAD_ADD_BYTES_FP32 * (m - 1) / m * params if engine.autograd_accum else 0.0 * gemm
    if engine.autocast_casts and dtype in HALF_DTYPES:
        full = (np.asarray(recompute).reshape(-1) == RECOMPUTE.index("full"))[:, None]
        fwd = CAST_BYTES_FP32_BF16 * gemm
        bwd = bwd + CAST_BYTES_FP32_BF16 * (gemm + np.where(full, blocks, 0.0))
    fwd, bwd = np.where(ddp, fwd, 0.0), np.where(ddp, bwd, 0.0)
    if dtype in HALF_DTYPES and engine.fsdp_pass_zero:
        s = np.asarray(shard, dtype=float).reshape(-1, 1)
        inline = 0.0 if side_streams else 1.0  # the shard-sized copies FSDP2 runs on its own streams on a GPU
        gather = inline * CAST_BYTES_FP32_BF16 / s + COPY_BYTES_BF16
        kept = np.where(m > 1, CAST_BYTES_FP32_BF16 + GRAD_ADD_BYTES_BF16_INTO_FP32 * (m - 1), 0.0)
        reduce = np.where(m > 1, COPY_BYTES_FP32, CAST_BYTES_FP32_BF16) + inline * COPY_BYTES_FP32 / s
        fwd = np.where(fsdp, gather * params, fwd)
        bwd = np.where(fsdp, (np.where((z == 3)[:, None], gather, 0.0) + (kept + reduce) / m) * params, bwd)
    fwd_s = compute.elementwise_time_s(_per_stage(fwd, v), dev)
    bwd_s = compute.elementwise_time_s(_per_stage(bwd, v), dev)
    return replace(st, fwd=st.fwd + fwd_s, bwd=st.bwd + bwd_s)


FOUND_INF_BYTES = 4.0  # the overflow flag (an fp32 scalar) each rank all-reduces under float16 training


def loss_scaling_s(cluster: ClusterSpec, coeffs: CostParams, dtype: str, gpus):
    """(N,) seconds a step of float16 training spends on its dynamic loss scaling beyond the unscale pass (which is
    an optimizer-step pass, ``EngineProfile.step_pass_bytes``): the found-inf all-reduce before the update, one
    fp32 flag over the ``gpus`` ranks of the job (every rank holding other gradients takes part; a MAX all-reduce,
    latency-bound: ``network.collective_s``). 0 for other dtypes."""
    gpus = np.asarray(gpus)
    if dtype != "float16":
        return 0.0 * gpus
    return network.collective_s("all_reduce", cluster, gpus, gpus, FOUND_INF_BYTES, coeffs)


def optimizer_seconds(
    engine,
    dtype: str,
    params_by_rank,
    expert_params,
    *,
    shard,
    xshard,
    zero,
    tp,
    ep: int,
    on_host: bool,
    dev: compute.Device,
    offloaded: bool = False,
) -> np.ndarray:
    """(N,) seconds of the optimizer step on its slowest pipeline rank: Adam over the rank's optimizer shard
    (``params_by_rank`` / ``shard`` and ``expert_params`` / ``xshard``, each (N, pp)) in the engine's kernel
    (engines.ADAM_BYTES; exatrain's fused one only where its parameters are plain GPU tensors: tp 1, ep 1, no FSDP,
    no ZeroRedundancyOptimizer), and the engine's passes around it (``EngineProfile.step_passes``) over the whole
    stage, over the gradients as held (sharded at ZeRO-2/3) and over the optimizer shard. Element-wise bandwidth:
    every pass is memory-bound. ``offloaded``: Adam runs on the host's CPUs (``cost.offload``), not here."""
    from exatrain.accounting.engines import ADAM_BYTES

    whole_b, held_b, shard_b = engine.step_passes(dtype)
    zero = np.asarray(zero).reshape(-1, 1)
    whole = params_by_rank + expert_params
    sharded = params_by_rank / shard + expert_params / xshard
    held = np.where(zero >= 2, sharded, whole)
    kernel = engine.adam_kernel(tp=np.asarray(tp).reshape(-1, 1), ep=ep, zero=zero, shard=shard, on_host=on_host)
    adam = np.vectorize(ADAM_BYTES.__getitem__, otypes=[float])(kernel) * (not offloaded)
    moved = whole_b * whole + held_b * held + (shard_b + adam) * sharded
    return compute.elementwise_time_s(moved, dev).max(axis=1)


def step_times(
    model: ModelSpec,
    cluster: ClusterSpec,
    coeffs: CostParams,
    dev: compute.Device,
    lay: Layouts,
    *,
    run: Resolved,
    stage_layers: np.ndarray,
    params_by_rank: np.ndarray,
    expert_params_by_rank=None,
    overlap: str | None = None,
    hidden: dict | None = None,
) -> tuple[dict[str, np.ndarray], StageTimes, PipelineTimes]:
    """TIME_FIELDS (arrays of N) for the N layouts ``lay``, which share pp, interleave, the layer split, ep and
    cp, as ``run`` says their runtime runs them (``accounting.engines.Resolved``: the engine whose overlaps and
    collectives count, ``cost.overlap``, with the plan's gradient accumulation, its fusion and Adam kernel; the
    rest as ``stage_times`` reads it); ``params_by_rank`` (N, pp) are the parameters one rank of each pipeline rank
    holds (of a MoE model: those outside the routed experts, which are ``expert_params_by_rank``). ``overlap``:
    which of the runtime's overlaps are on (``cost.overlap.overlap_rules``). ``hidden``: when given, gets the
    seconds per step the overlaps hid (tp, pp, dp; arrays of N). Under ``run.fp8_param_gather`` the GEMM weights'
    gathers carry one byte a weight (``fp8_gathered_params``); the gradient collectives carry the dtype gradients
    accumulate in, and an engine's pass over the stage's gradients to accumulate them outside the GEMMs
    (``EngineProfile.accum_pass``) joins every backward; the optimizer step runs the engine's Adam kernel
    (``optimizer_seconds``). The data-parallel collectives hidden behind compute slow it by
    ``CostParams.comm_contention`` of their seconds (counted in ``dp_comm``); an FSDP1 engine's pass before each
    reduce-scatter (``EngineProfile.reduce_prep_bytes``) lengthens the reduction."""
    engine, dtype, fp8 = run.engine, run.dtype, run.fp8
    p, ep, cp_size = int(lay.pp[0]), int(lay.ep[0]), int(lay.cp[0])
    v = int(lay.interleave[0]) if p > 1 else 1
    schedule = lay.schedule
    rules = overlap_rules(engine, overlap)
    tp, dp, m, zero = (np.asarray(x) for x in (lay.tp, lay.dp, lay.num_microbatches, lay.zero_stage))
    N = tp.size
    xp = 0.0 * params_by_rank if expert_params_by_rank is None else expert_params_by_rank
    st = stage_times(model, cluster, coeffs, dev, lay, run=run, stage_layers=stage_layers, rules=rules)
    is_v = np.isin(np.asarray(schedule), _V_CODES) & (v == 2) & (p > 1)
    if is_v.any() and not is_v.all():
        raise ValueError("step_times needs layouts of one placement: V schedules apart (planner.evaluate groups them)")
    st = with_parameter_passes(
        st,
        engine,
        dtype,
        model,
        tp,
        params_by_rank + xp,
        v,
        m,
        zero,
        lay.recompute,
        dev,
        shard=dp * cp_size,
        side_streams=not cluster.device.is_host,
        v_shape=bool(is_v.all()),
    )
    F, B, W = st.forward_s, st.backward_s, st.wgrad
    p2p = p2p_exposed(st.p2p, st.fwd, rules=rules, interleaved=(np.asarray(schedule) == _INTERLEAVED) & (v > 1))
    # The pipeline with and without the transfers, in one call.
    two = pipeline_times(
        np.concatenate([F, F]),
        np.concatenate([B, B]),
        np.concatenate([W, W]),
        pp=p,
        interleave=v,
        num_microbatches=np.concatenate([m, m]),
        schedule=np.concatenate([schedule, schedule]),
        p2p_s=np.concatenate([p2p, 0 * p2p]),
    )
    pipe, no_p2p = two.step_s[:N], two.step_s[N:]
    pt = PipelineTimes(step_s=pipe, rank_end_s=two.rank_end_s[:N], busy_s=two.busy_s[:N])

    v_looped = np.concatenate([np.arange(p), np.arange(2 * p - 1, p - 1, -1)])  # rank r: stages r, 2 pp - 1 - r

    def per_rank(x: np.ndarray) -> np.ndarray:  # (N, S) per micro-batch -> (N, pp) per step
        if is_v.any():
            x = np.where(is_v[:, None], x[:, v_looped], x)
        return x.reshape(N, v, p).sum(axis=1) * m[:, None]

    # The busiest rank: its compute and TP communication.
    busiest = np.argmax(pt.busy_s, axis=1)[:, None]
    compute_s = np.take_along_axis(per_rank(st.fwd + st.bwd + st.wgrad), busiest, axis=1)[:, 0]
    tp_s = np.take_along_axis(per_rank(st.tp_fwd + st.tp_bwd), busiest, axis=1)[:, 0]
    ext_s = np.take_along_axis(per_rank(st.ext_fwd + st.ext_bwd), busiest, axis=1)[:, 0]
    ep_s = np.take_along_axis(per_rank(st.ep_share), busiest, axis=1)[:, 0]
    # DP: rank r's gradient reduction starts after its last backward; where the runtime overlaps it,
    # one micro-batch's backward hides dp_overlap of it, and the time until the pipeline drains hides
    # the rest. Parameter gathers: ZeRO-3 prefetches each micro-batch's under its forward and
    # backward; ZeRO-1/2's all-gather of updated weights runs under the next step's first forward
    # (overlap_param_gather), in each case where the runtime overlaps them.
    rank = np.arange(p)[None, :]
    gathered = fp8_gathered_params(model, tp, stage_layers, p, ep) if (fp8 and run.fp8_param_gather) else None
    t_red, t_gat = np.zeros((N, p)), np.zeros((N, p))
    for z in np.unique(zero):
        kw = dict(
            tp=tp[:, None],
            pp=p,
            dp=dp[:, None],
            zero_stage=int(z),
            params_here=params_by_rank,
            num_microbatches=m[:, None],
            run=run,
            cp_size=cp_size,
            ep=ep,
            expert_params_here=xp,
            fp8_gathered=gathered,
        )
        r_, g_ = dp_collective_times(cluster, coeffs, model, pipeline_end=True, **kw)
        prep = engine.reduce_prep_bytes(dtype) if z >= 2 else 0.0
        if prep:  # FSDP1's cast and pre-divide before each reduce-scatter, on the stream that then runs it
            reductions = np.where(engine.reduce_each_microbatch & (p == 1), m, 1)[:, None]
            r_ = r_ + np.where(
                dp[:, None] > 1, reductions * compute.elementwise_time_s(prep * (params_by_rank + xp), dev), 0.0
            )
        if model.tied_embeddings and p > 2:  # the ends' embedding all-reduce: ranks 0 and pp-1 only
            mid_r, mid_g = dp_collective_times(cluster, coeffs, model, pipeline_end=False, **kw)
            ends = (rank == 0) | (rank == p - 1)
            r_, g_ = np.where(ends, r_, mid_r), np.where(ends, g_, mid_g)
        t_red = np.where((zero == z)[:, None], r_, t_red)
        t_gat = np.where((zero == z)[:, None], g_, t_gat)
    z3 = (zero == 3)[:, None]
    red_on = rules.dp_grad_reduce & ((p == 1) | (zero >= 2) | (not rules.grad_reduce_needs_no_pipeline))
    # the reduction hides behind the last micro-batch's backward, or behind every one where each reduces its own
    each = engine.reduce_each_microbatch & (zero >= 2) & (p == 1)
    red_window = np.where(red_on[:, None], coeffs.dp_overlap * per_rank(B + W) / np.where(each, 1, m)[:, None], 0.0)
    gat_window = (
        coeffs.dp_overlap * np.where(z3, per_rank(F + B), per_rank(F) / m[:, None])
        if rules.dp_param_gather
        else np.zeros((N, p))
    )
    slack = pipe[:, None] - pt.rank_end_s
    red_exposed = exposed(t_red, red_window + slack)
    gat_exposed = exposed(t_gat, gat_window)
    # ZeRO-3 sends in both passes over the same links: half its gathers (each micro-batch's forward
    # ones) beside the forward, the other half and the gradient reduction beside the backward. Those
    # two share the backward's window, so together they can hide no more than it (plus the drain),
    # however each would fare alone.
    gather = coeffs.dp_overlap if rules.dp_param_gather else 0.0
    gat_b = exposed(t_gat / 2, gather * per_rank(B + W))
    both_b = exposed(t_gat / 2 + t_red, np.where(red_on[:, None], coeffs.dp_overlap, gather) * per_rank(B + W) + slack)
    z3_exposed = exposed(t_gat / 2, gather * per_rank(F)) + np.maximum(gat_b + red_exposed, both_b)
    dp_exposed = np.where(z3, z3_exposed, red_exposed + gat_exposed).max(axis=1)
    # the collectives hidden behind compute (not behind the pipeline's drain, where the rank waits) slow the compute
    # they overlap by comm_contention of their time
    overlapped = np.maximum((t_red + t_gat).max(axis=1) - dp_exposed - slack.max(axis=1), 0.0)
    contention = coeffs.comm_contention * overlapped
    dp_exposed = dp_exposed + contention
    if hidden is not None:
        hidden["tp"] = np.take_along_axis(per_rank(st.tp_hidden), np.argmax(pt.busy_s, axis=1)[:, None], axis=1)[:, 0]
        raw = pipeline_times(F, B, W, pp=p, interleave=v, num_microbatches=m, schedule=schedule, p2p_s=st.p2p)
        hidden["pp"] = raw.step_s - pipe
        # DP seconds not exposed, whether the overlap or the wait for the pipeline to drain hid them
        hidden["dp"] = (t_red + t_gat).max(axis=1) - (dp_exposed - contention)
    shard = np.where(zero >= 1, dp * cp_size, 1)[:, None]
    xshard = np.where(zero >= 1, tp * cp_size * dp / ep, 1)[:, None]  # the expert-data-parallel group
    offload = run.settings.offload
    opt = optimizer_seconds(
        engine,
        dtype,
        params_by_rank,
        xp,
        shard=shard,
        xshard=xshard,
        zero=zero,
        tp=tp,
        ep=ep,
        on_host=cluster.device.is_host,
        dev=dev,
        offloaded=offload != "none",
    ) + loss_scaling_s(cluster, coeffs, dtype, lay.gpus)
    each_mb = np.where(engine.reduce_each_microbatch & (p == 1), m, 1)  # FSDP's reductions a step
    parts = offload_seconds(
        offload,
        run,
        cluster,
        partition=(params_by_rank / shard + xp / xshard).max(axis=1),
        gathers=m * np.where(zero == 3, 2, 1),
        reductions=each_mb,
        compute_s=compute_s,
        gpus=lay.gpus,
    )
    off = parts["total"]
    if hidden is not None and offload != "none":  # the offload's parts, for the estimate's note
        hidden["offload"] = parts
    fixed = dev.params.step_overhead_s + np.where(dp > 1, dev.params.dp_step_overhead_s, 0.0)
    # the step waits for its slowest GPU, whose pipeline and optimizer run speed_spread x E[max] slower
    lag = straggler_s(pipe + opt, lay.gpus, coeffs.speed_spread, on_host=cluster.device.is_host)
    times = {
        "step": pipe + dp_exposed + opt + off + fixed + lag,
        "compute": compute_s,
        "offload": off,
        "bubble": np.maximum(no_p2p - compute_s - tp_s - ext_s, 0.0),
        "tp_comm": tp_s,
        "pp_comm": pipe - no_p2p,
        "dp_comm": dp_exposed,
        "optimizer": opt,
        "other": fixed + 0.0 * pipe,
        "ep_comm": ep_s,
        "cp_comm": ext_s - ep_s,
        "straggler": lag,
    }
    return times, st, pt


__all__ = [
    "StageTimes",
    "TIME_FIELDS",
    "dp_collective_times",
    "loss_scaling_s",
    "recomputed",
    "stage_times",
    "step_times",
    "tp_collective_time_s",
]
