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
Each part is a named function returning a small typed value (``cost.terms``): 1 is ``cost.stage``'s
``compute_term``, ``tp_term``, ``ep_term`` and ``cp_term`` with the engine's parameter passes (``cost.passes``),
2-3 ``pipeline_term``, 4 ``dp_rank_seconds`` and ``dp_term`` (``cost.dp``), 5 ``optimizer_term``
(``cost.optimizer``) and ``offload_term``; ``compose_step`` sums them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.layout_arrays import among
from exatrain.accounting.engines import Resolved
from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.planner.cost import compute
from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.cost.dp import dp_collective_times, engine_dp_collectives, fp8_gathered_params
from exatrain.planner.cost.offload import offload_seconds
from exatrain.planner.cost.optimizer import FOUND_INF_BYTES, loss_scaling_s, optimizer_seconds
from exatrain.planner.cost.overlap import OverlapRules, exposed, overlap_rules, p2p_exposed
from exatrain.planner.cost.passes import (
    CAST_BYTES_FP32_BF16,
    COPY_BYTES_BF16,
    COPY_BYTES_FP32,
    GRAD_ADD_BYTES_BF16_INTO_FP32,
    GRAD_ADD_BYTES_FP32,
    cast_params,
    with_accumulation,
    with_parameter_passes,
)
from exatrain.planner.cost.pipeline import PipelineTimes, pipeline_times
from exatrain.planner.cost.stage import StageTimes, recomputed, stage_times
from exatrain.planner.cost.terms import DpTerm, RankShare
from exatrain.planner.cost.tp import tp_collective_time_s, tp_collectives_s, tp_overlap_exposed
from exatrain.planner.cost.variability import straggler_s
from exatrain.planner.layouts import Layouts
from exatrain.settings import SCHEDULES, V_SCHEDULES

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
_INTERLEAVED = SCHEDULES.index("interleaved")
_V_CODES = [SCHEDULES.index(s) for s in V_SCHEDULES]


@dataclass(frozen=True, eq=False)
class StepShape:
    """What fixes a step's arrays, for N layouts sharing pp (``p``), interleave (``v``), ep and cp: their degrees
    and micro-batches (N,) and whether their stages lie in a V (``is_v``)."""

    p: int
    v: int
    ep: int
    cp: int
    tp: np.ndarray
    dp: np.ndarray
    m: np.ndarray
    zero: np.ndarray
    is_v: np.ndarray

    @property
    def n(self) -> int:
        return self.tp.size

    @classmethod
    def of(cls, lay: Layouts) -> StepShape:
        p = int(lay.pp[0])
        v = int(lay.interleave[0]) if p > 1 else 1
        tp, dp, m, zero = (np.asarray(x) for x in (lay.tp, lay.dp, lay.num_microbatches, lay.zero_stage))
        is_v = among(lay.schedule, _V_CODES) & (v == 2) & (p > 1)
        if is_v.any() and not is_v.all():
            raise ValueError(
                "step_times needs layouts of one placement: V schedules apart (planner.evaluate groups them)"
            )
        return cls(p, v, int(lay.ep[0]), int(lay.cp[0]), tp, dp, m, zero, is_v)

    def per_rank(self, x: np.ndarray) -> np.ndarray:
        """(N, S) seconds per micro-batch -> (N, pp) per step of each pipeline rank (rank r: stages r, r + pp, ...;
        under a V r and 2 pp - 1 - r)."""
        p = self.p
        if self.is_v.any():
            v_looped = np.concatenate([np.arange(p), np.arange(2 * p - 1, p - 1, -1)])
            x = np.where(self.is_v[:, None], x[:, v_looped], x)
        return x.reshape(self.n, self.v, p).sum(axis=1) * self.m[:, None]


def pipeline_term(st: StageTimes, rules: OverlapRules, g: StepShape, schedule) -> tuple[PipelineTimes, np.ndarray]:
    """(the pipeline's times with its exposed point-to-point transfers, its makespan (N,) without them), in one
    ``pipeline_times`` call: their difference is the exposed pipeline communication (``p2p_exposed``: interleaved
    transfers behind the next forward where the runtime overlaps them)."""
    F, B, W, m, N = st.forward_s, st.backward_s, st.wgrad, g.m, g.n
    interleaved = (np.asarray(schedule) == _INTERLEAVED) & (g.v > 1)
    p2p = p2p_exposed(st.p2p, st.fwd, rules=rules, interleaved=interleaved)
    two = pipeline_times(
        np.concatenate([F, F]),
        np.concatenate([B, B]),
        np.concatenate([W, W]),
        pp=g.p,
        interleave=g.v,
        num_microbatches=np.concatenate([m, m]),
        schedule=np.concatenate([schedule, schedule]),
        p2p_s=np.concatenate([p2p, 0 * p2p]),
    )
    pt = PipelineTimes(step_s=two.step_s[:N], rank_end_s=two.rank_end_s[:N], busy_s=two.busy_s[:N])
    return pt, two.step_s[N:]


def busiest_rank(st: StageTimes, pt: PipelineTimes, g: StepShape) -> RankShare:
    """The busiest pipeline rank's compute, TP communication and exposed all-to-all and cp exchange a step."""
    busiest = np.argmax(pt.busy_s, axis=1)[:, None]

    def on_it(x):
        return np.take_along_axis(g.per_rank(x), busiest, axis=1)[:, 0]

    return RankShare(
        compute=on_it(st.fwd + st.bwd + st.wgrad),
        tp=on_it(st.tp_fwd + st.tp_bwd),
        ext=on_it(st.ext_fwd + st.ext_bwd),
        ep=on_it(st.ep_share),
    )


def dp_rank_seconds(model, cluster, coeffs, dev, g: StepShape, run: Resolved, params, xp, stage_layers):
    """(gradient reductions, parameter gathers) of each pipeline rank a step, (N, pp) seconds
    (``dp_collective_times``, with the FP8-gathered weights under ``run.fp8_param_gather`` and an FSDP1 engine's
    pass before each reduce-scatter, ``EngineProfile.reduce_prep_bytes``, on the stream that then runs it); under
    tied embeddings only the pipeline's two ends reduce the embedding."""
    p, engine = g.p, run.engine
    rank = np.arange(p)[None, :]
    gathered = fp8_gathered_params(model, g.tp, stage_layers, p, g.ep) if (run.fp8 and run.fp8_param_gather) else None
    t_red, t_gat = np.zeros((g.n, p)), np.zeros((g.n, p))
    for z in np.unique(g.zero):
        kw = dict(
            tp=g.tp[:, None],
            pp=p,
            dp=g.dp[:, None],
            zero_stage=int(z),
            params_here=params,
            num_microbatches=g.m[:, None],
            run=run,
            cp_size=g.cp,
            ep=g.ep,
            expert_params_here=xp,
            fp8_gathered=gathered,
        )
        r_, g_ = dp_collective_times(cluster, coeffs, model, pipeline_end=True, **kw)
        prep = engine.reduce_prep_bytes(run.dtype) if z >= 2 else 0.0
        if prep:
            reductions = np.where(engine.reduce_each_microbatch & (p == 1), g.m, 1)[:, None]
            prep_s = reductions * compute.elementwise_time_s(prep * (params + xp), dev)
            r_ = r_ + np.where(g.dp[:, None] > 1, prep_s, 0.0)
        if model.tied_embeddings and p > 2:  # the ends' embedding all-reduce: ranks 0 and pp-1 only
            mid_r, mid_g = dp_collective_times(cluster, coeffs, model, pipeline_end=False, **kw)
            ends = (rank == 0) | (rank == p - 1)
            r_, g_ = np.where(ends, r_, mid_r), np.where(ends, g_, mid_g)
        t_red = np.where((g.zero == z)[:, None], r_, t_red)
        t_gat = np.where((g.zero == z)[:, None], g_, t_gat)
    return t_red, t_gat


def dp_term(coeffs: CostParams, rules: OverlapRules, engine, g: StepShape, st: StageTimes, pt, t_red, t_gat) -> DpTerm:
    """What a step leaves exposed of each rank's DP collectives (``t_red``, ``t_gat`` (N, pp)), the worst rank's.
    Rank r's gradient reduction starts after its last backward; where the runtime overlaps it, one micro-batch's
    backward (each one's, where each reduces its own) hides dp_overlap of it, and the time until the pipeline
    drains hides the rest. Parameter gathers: ZeRO-3 prefetches each micro-batch's under its forward and backward;
    ZeRO-1/2's all-gather of updated weights runs under the next step's first forward (overlap_param_gather), in
    each case where the runtime overlaps them. ZeRO-3 sends half its gathers beside the forward, the other half and
    the reduction beside the backward, whose window hides no more than once their sum (plus the drain). The
    collectives hidden behind compute (not the drain) slow it by ``comm_contention`` of their seconds."""
    F, B, W, m, zero, per_rank, ov = st.forward_s, st.backward_s, st.wgrad, g.m, g.zero, g.per_rank, coeffs.dp_overlap
    z3 = (zero == 3)[:, None]
    red_on = rules.dp_grad_reduce & ((g.p == 1) | (zero >= 2) | (not rules.grad_reduce_needs_no_pipeline))
    each = engine.reduce_each_microbatch & (zero >= 2) & (g.p == 1)
    red_window = np.where(red_on[:, None], ov * per_rank(B + W) / np.where(each, 1, m)[:, None], 0.0)
    gat_window = (
        ov * np.where(z3, per_rank(F + B), per_rank(F) / m[:, None]) if rules.dp_param_gather else np.zeros((g.n, g.p))
    )
    slack = pt.step_s[:, None] - pt.rank_end_s
    red_exposed = exposed(t_red, red_window + slack)
    gat_exposed = exposed(t_gat, gat_window)
    gather = ov if rules.dp_param_gather else 0.0
    gat_b = exposed(t_gat / 2, gather * per_rank(B + W))
    both_b = exposed(t_gat / 2 + t_red, np.where(red_on[:, None], ov, gather) * per_rank(B + W) + slack)
    z3_exposed = exposed(t_gat / 2, gather * per_rank(F)) + np.maximum(gat_b + red_exposed, both_b)
    dp_exposed = np.where(z3, z3_exposed, red_exposed + gat_exposed).max(axis=1)
    overlapped = np.maximum((t_red + t_gat).max(axis=1) - dp_exposed - slack.max(axis=1), 0.0)
    contention = coeffs.comm_contention * overlapped
    dp_exposed = dp_exposed + contention
    # not exposed, hidden behind the overlap or the pipeline's drain (the contention taken back off as it was added)
    hidden = (t_red + t_gat).max(axis=1) - (dp_exposed - contention)
    return DpTerm(exposed=dp_exposed, contention=contention, hidden=hidden, reduce=t_red, gather=t_gat)


def optimizer_shards(g: StepShape) -> tuple[np.ndarray, np.ndarray]:
    """(N, 1) ranks a parameter's optimizer state is sharded over, outside the routed experts (dp*cp from ZeRO-1
    on) and inside them (the expert-data-parallel group)."""
    shard = np.where(g.zero >= 1, g.dp * g.cp, 1)[:, None]
    xshard = np.where(g.zero >= 1, g.tp * g.cp * g.dp / g.ep, 1)[:, None]
    return shard, xshard


def optimizer_term(cluster, coeffs, dev, g: StepShape, run: Resolved, params, xp, gpus) -> np.ndarray:
    """(N,) seconds of the optimizer step on its slowest rank (``optimizer_seconds``) and of float16's loss scaling
    (``loss_scaling_s``)."""
    shard, xshard = optimizer_shards(g)
    opt = optimizer_seconds(
        run.engine,
        run.dtype,
        params,
        xp,
        shard=shard,
        xshard=xshard,
        zero=g.zero,
        tp=g.tp,
        ep=g.ep,
        on_host=cluster.device.is_host,
        dev=dev,
        offloaded=run.settings.offload != "none",
    )
    return opt + loss_scaling_s(cluster, coeffs, run.dtype, gpus)


def offload_term(cluster, g: StepShape, run: Resolved, params, xp, compute_s, gpus) -> dict:
    """``cost.offload.offload_seconds``' parts of the step (the optimizer shard's transfers and host Adam)."""
    shard, xshard = optimizer_shards(g)
    each_mb = np.where(run.engine.reduce_each_microbatch & (g.p == 1), g.m, 1)  # FSDP's reductions a step
    return offload_seconds(
        run.settings.offload,
        run,
        cluster,
        partition=(params / shard + xp / xshard).max(axis=1),
        gathers=g.m * np.where(g.zero == 3, 2, 1),
        reductions=each_mb,
        compute_s=compute_s,
        gpus=gpus,
    )


def compose_step(pt: PipelineTimes, no_p2p, ranks: RankShare, dp: DpTerm, opt, off, fixed, lag) -> dict:
    """TIME_FIELDS from the step's terms: the step is the pipeline's makespan with its exposed transfers, the
    exposed DP collectives, the optimizer, the offload, the fixed overhead and the straggler's lag; the bubble is
    what of the pipeline without transfers is neither the busiest rank's compute nor its communication."""
    pipe = pt.step_s
    return {
        "step": pipe + dp.exposed + opt + off + fixed + lag,
        "compute": ranks.compute,
        "offload": off,
        "bubble": np.maximum(no_p2p - ranks.compute - ranks.tp - ranks.ext, 0.0),
        "tp_comm": ranks.tp,
        "pp_comm": pipe - no_p2p,
        "dp_comm": dp.exposed,
        "optimizer": opt,
        "other": fixed + 0.0 * pipe,
        "ep_comm": ranks.ep,
        "cp_comm": ranks.ext - ranks.ep,
        "straggler": lag,
    }


def _record_hidden(hidden: dict, st: StageTimes, pt: PipelineTimes, g: StepShape, dp: DpTerm, schedule) -> None:
    """Fill ``hidden`` with the seconds per step the overlaps hid: the busiest rank's TP, the pipeline's exposed
    transfers' difference to its raw ones, the DP collectives'."""
    hidden["tp"] = np.take_along_axis(g.per_rank(st.tp_hidden), np.argmax(pt.busy_s, axis=1)[:, None], axis=1)[:, 0]
    F, B, W = st.forward_s, st.backward_s, st.wgrad
    raw = pipeline_times(F, B, W, pp=g.p, interleave=g.v, num_microbatches=g.m, schedule=schedule, p2p_s=st.p2p)
    hidden["pp"] = raw.step_s - pt.step_s
    hidden["dp"] = dp.hidden


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
    seconds per step the overlaps hid (tp, pp, dp; arrays of N) and an offloading run's parts. The composition of
    the stage terms (``cost.stage``), the engine's parameter passes (``cost.passes``), the pipeline
    (``pipeline_term``), the DP collectives (``dp_rank_seconds``, ``dp_term``), the optimizer (``optimizer_term``),
    the offload (``offload_term``), a fixed overhead and the straggler's lag (``compose_step``)."""
    engine = run.engine
    rules = overlap_rules(engine, overlap)
    g = StepShape.of(lay)
    xp = 0.0 * params_by_rank if expert_params_by_rank is None else expert_params_by_rank
    st = stage_times(model, cluster, coeffs, dev, lay, run=run, stage_layers=stage_layers, rules=rules)
    st = with_parameter_passes(
        st,
        engine,
        run.dtype,
        model,
        g.tp,
        params_by_rank + xp,
        g.v,
        g.m,
        g.zero,
        lay.recompute,
        dev,
        shard=g.dp * g.cp,
        side_streams=not cluster.device.is_host,
        v_shape=bool(g.is_v.all()),
    )
    pt, no_p2p = pipeline_term(st, rules, g, lay.schedule)
    ranks = busiest_rank(st, pt, g)
    t_red, t_gat = dp_rank_seconds(model, cluster, coeffs, dev, g, run, params_by_rank, xp, stage_layers)
    dp = dp_term(coeffs, rules, engine, g, st, pt, t_red, t_gat)
    opt = optimizer_term(cluster, coeffs, dev, g, run, params_by_rank, xp, lay.gpus)
    parts = offload_term(cluster, g, run, params_by_rank, xp, ranks.compute, lay.gpus)
    if hidden is not None:
        _record_hidden(hidden, st, pt, g, dp, lay.schedule)
        if run.settings.offload != "none":  # the offload's parts, for the estimate's note
            hidden["offload"] = parts
    fixed = dev.params.step_overhead_s + np.where(g.dp > 1, dev.params.dp_step_overhead_s, 0.0)
    # the step waits for its slowest GPU, whose pipeline and optimizer run speed_spread x E[max] slower
    lag = straggler_s(pt.step_s + opt, lay.gpus, coeffs.speed_spread, on_host=cluster.device.is_host)
    return compose_step(pt, no_p2p, ranks, dp, opt, parts["total"], fixed, lag), st, pt


__all__ = [
    "CAST_BYTES_FP32_BF16",
    "COPY_BYTES_BF16",
    "COPY_BYTES_FP32",
    "FOUND_INF_BYTES",
    "GRAD_ADD_BYTES_BF16_INTO_FP32",
    "GRAD_ADD_BYTES_FP32",
    "StageTimes",
    "StepShape",
    "TIME_FIELDS",
    "busiest_rank",
    "cast_params",
    "compose_step",
    "dp_collective_times",
    "dp_rank_seconds",
    "dp_term",
    "engine_dp_collectives",
    "fp8_gathered_params",
    "loss_scaling_s",
    "offload_term",
    "optimizer_seconds",
    "optimizer_term",
    "pipeline_term",
    "recomputed",
    "stage_times",
    "step_times",
    "tp_collective_time_s",
    "tp_collectives_s",
    "tp_overlap_exposed",
    "with_accumulation",
    "with_parameter_passes",
]
