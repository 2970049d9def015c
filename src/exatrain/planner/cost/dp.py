"""Data-parallel collectives in the step time: which collectives a rank's engine sends per step
(``engine_dp_collectives``), their seconds over each group's tier (``dp_collective_times``), and what of them a
step leaves exposed (``cost.step.dp_term``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from exatrain.accounting import comms
from exatrain.accounting import fp8 as fp8_acc
from exatrain.accounting.engines import Resolved
from exatrain.accounting.memory import COMPUTE_BYTES
from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.planner.cost import network
from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.cost.moe import edp_span, stage_kinds
from exatrain.planner.cost.overlap import engine_collectives, is_gather


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


def wrapped_units(model: ModelSpec, pp) -> np.ndarray:
    """FSDP units a pipeline rank of ``model`` holds: its share of the transformer blocks (the largest, ceil(L/pp))
    and the root unit (embeddings, final norm and head, which FSDP wraps apart from the blocks)."""
    return np.ceil(model.layers / np.asarray(pp, dtype=float)) + 1.0


def per_unit(collectives, units) -> tuple:
    """``collectives`` as an engine that sends one per wrapped unit (``EngineProfile.collectives_per_unit``) sends
    them: each data-parallel gather and reduction ``units`` times as many calls of 1/``units`` of the bytes, so
    the bytes a step moves are unchanged and every call pays the library's fixed and ring latency
    (``network.collective_s``), which grows with the group: (n - 1) steps a pass over n ranks."""
    return tuple(
        replace(c, count=c.count * units, message_bytes=c.message_bytes / units) if c.axis in ("dp", "edp") else c
        for c in collectives
    )


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
    ``experts.comm_bytes`` counts. An engine that sends them per wrapped unit (FSDP: ``per_unit``) pays each call's
    latency once a unit."""
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
    if engine is not None and engine.collectives_per_unit and zero_stage >= 2:
        cs = per_unit(cs, wrapped_units(model, pp))
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


__all__ = ["dp_collective_times", "engine_dp_collectives", "fp8_gathered_params", "per_unit", "wrapped_units"]
