"""A single plan's cost-model figures beyond its estimate: its step time and per-stage seconds (``step_time``,
``plan_stage_times``), its pipeline simulated op by op (``simulate_plan``), and the bytes its busiest rank sends
(``comm_bytes``). Plan-level helpers over the array-level cost model (``cost.step``, ``cost.moe``)."""

from __future__ import annotations

import numpy as np

from exatrain.accounting import comms
from exatrain.accounting.engines import plan_run
from exatrain.accounting.params import stage_layer_kinds, stage_params_split
from exatrain.catalog.hardware import ClusterSpec
from exatrain.plan import Plan, TimeBreakdown
from exatrain.planner.cost import compute, step
from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.cost.moe import dedup_copies, rank_params_split
from exatrain.planner.cost.overlap import overlap_rules, p2p_exposed
from exatrain.planner.cost.pipeline import PipelineTimes
from exatrain.planner.cost.step import TIME_FIELDS, StageTimes, stage_times, with_parameter_passes
from exatrain.planner.evaluate import evaluate
from exatrain.planner.layouts import Layouts
from exatrain.settings import RECOMPUTE


def step_time(
    plan: Plan, cluster: ClusterSpec, coeffs: CostParams, overlap: str | None = None
) -> tuple[TimeBreakdown, PipelineTimes]:
    """Predicted seconds per optimizer step of one plan, broken down (a batch of one through
    ``planner.evaluate``), and its pipeline's times."""
    ev = evaluate(
        Layouts.from_plan(plan),
        plan.model,
        cluster,
        coeffs,
        global_batch=plan.global_batch,
        run=plan_run(plan),
        memory=(),
        overlap=overlap,
    )
    return (
        TimeBreakdown(**{k: float(ev.time[k][0]) for k in TIME_FIELDS}),
        PipelineTimes(step_s=ev.pipeline_s, rank_end_s=ev.rank_end_s, busy_s=ev.busy_s),
    )


def plan_stage_times(plan: Plan, cluster: ClusterSpec, coeffs: CostParams, overlap: str | None = None) -> StageTimes:
    """The per-stage seconds of one plan (row 0 of each array), as the step time uses them: what
    the schedule simulator replays for a timeline picture."""
    run = plan_run(plan)
    coeffs = compute.with_attention_kernel(coeffs, run.attention_kernel)
    dev = compute.device_for(cluster, plan.dtype, coeffs, plan.gpus)
    st = stage_times(
        plan.model,
        cluster,
        coeffs,
        dev,
        Layouts.from_plan(plan),
        run=run,
        stage_layers=np.array(plan.layers_per_stage()),
        rules=overlap_rules(run.engine, overlap),
    )
    dense, routed, _ = rank_params_split(
        plan.model,
        np.array([[plan.tp]]),
        plan.pp,
        plan.interleave,
        plan.layers_per_stage(),
        plan.ep,
        v_shape=plan.v_shape,
    )
    return with_parameter_passes(
        st,
        run.engine,
        plan.dtype,
        plan.model,
        [plan.tp],
        (dense + routed).astype(float),
        plan.interleave,
        [plan.num_microbatches],
        [plan.zero_stage],
        [RECOMPUTE.index(plan.recompute)],
        dev,
        shard=[plan.dp * plan.cp],
        side_streams=not cluster.device.is_host,
        v_shape=plan.v_shape,
    )


def simulate_plan(plan: Plan, cluster: ClusterSpec, coeffs: CostParams, overlap: str | None = None):
    """The plan's pipeline simulated op by op (``schedule.simulate``) on its own per-stage seconds:
    the timeline picture, and the oracle the closed-form pipeline term is tested against."""
    from exatrain.planner.cost.schedule import simulate

    st = plan_stage_times(plan, cluster, coeffs, overlap)
    p2p = p2p_exposed(
        st.p2p,
        st.fwd,
        rules=overlap_rules(plan.runtime, overlap),
        interleaved=plan.schedule == "interleaved" and plan.interleave > 1,
    )
    return simulate(
        st.forward_s[0],
        st.backward_s[0],
        weight_s=st.wgrad[0],
        p2p_s=float(p2p[0]),
        pp=plan.pp,
        num_microbatches=plan.num_microbatches,
        schedule=plan.schedule,
        interleave=plan.interleave,
    )


def comm_bytes(plan) -> dict[str, float]:
    """Bytes the busiest rank sends per step, per kind (``accounting.comms.comm_bytes_per_rank``),
    with ep, cp and the expert split: tp and pp messages of s/cp tokens, dp over the dp*cp group plus
    the experts' reduction over the expert-data-parallel group, the expert all-to-alls ("ep": a
    deduplicating dispatcher sends each routed token once per destination rank, ``dedup_copies``, where
    the all-to-all sends its top_k copies) and the K,V ring ("cp"). The dp bytes are those the plan's
    runtime sends (``cost.step.engine_dp_collectives``: its gradient dtype, its ZeRO-1 collectives, FP8
    weight gathers under ``Plan.fp8_param_gather``), the ones its dp time is priced from."""
    run = plan_run(plan)
    engine = None if plan.runtime == "exatrain" else run.engine
    out = comms.comm_bytes_per_rank(plan, engine)
    m = plan.model
    if not (m.is_moe or plan.cp > 1 or plan.runtime != "exatrain"):
        return out
    stage_layers = np.asarray(plan.layers_per_stage())
    kinds = stage_layer_kinds(
        m, pp=plan.pp, interleave=plan.interleave, layers_per_stage=tuple(stage_layers), v_shape=plan.v_shape
    )
    dp = _dp_bytes_by_rank(plan, engine, stage_layers)
    ep, cpb = [], []
    for r in range(plan.pp):
        # the share of the rank's layers whose forward runs again: a full recomputation's (the first
        # recompute_layers of each stage), the "moe" module's for the all-to-alls
        full = plan.recomputed_layers_of_rank(r) / max(sum(kinds[r]), 1)
        if m.is_moe:
            ep.append(_ep_bytes(plan, run, kinds[r][1], full))
        if plan.cp > 1:
            cpb.append(_cp_bytes(plan, run, sum(kinds[r]), full))
    out["dp"] = max(dp)
    for k in ("tp", "pp"):  # their messages are a rank's tokens wide: s/cp of each sequence
        out[k] = out[k] / plan.cp
    if ep:
        out["ep"] = max(ep)
        if plan.moe_dispatcher != "alltoall" and plan.ep > 1:
            ranks, _ = dedup_copies(m, plan.ep, 1)
            out["ep"] *= float(ranks) / (m.top_k * (plan.ep - 1) / plan.ep)
    if cpb:
        out["cp"] = max(cpb)
    return out


def _dp_bytes_by_rank(plan, engine, stage_layers) -> list[float]:
    """Bytes each pipeline rank sends per step in its data-parallel collectives, as the plan's runtime sends
    them (``cost.step.engine_dp_collectives``; the FP8-gathered weights at one byte each)."""
    m, split = plan.model, stage_params_split_for(plan)
    fp8_gathered = (
        step.fp8_gathered_params(m, np.asarray([plan.tp]), stage_layers, plan.pp, plan.ep)
        if plan.fp8 and plan.fp8_param_gather
        else None
    )
    out = []
    for r in range(plan.pp):
        dense, experts = split[r]
        cs = step.engine_dp_collectives(
            m,
            tp=plan.tp,
            pp=plan.pp,
            dp=plan.dp,
            zero_stage=plan.zero_stage,
            params_here=dense,
            num_microbatches=plan.num_microbatches,
            dtype=plan.dtype,
            pipeline_end=r in (0, plan.pp - 1),
            engine=engine,
            cp_size=plan.cp,
            ep=plan.ep,
            expert_params_here=experts,
            fp8_gathered=None if fp8_gathered is None else tuple(float(g[0, r]) for g in fp8_gathered),
        )
        out.append(sum(float(c.bytes_per_rank) for c in cs))
    return out


def _ep_bytes(plan, run, moe_layers: int, full: float) -> float:
    """Bytes a rank with ``moe_layers`` MoE layers sends per step in its expert all-to-alls, the forward's again
    in the share ``full`` of its layers a full recomputation reruns (all of them where the "moe" module is)."""
    moe_again = 1.0 if plan.recompute == "selective" and "moe" in plan.recompute_modules else full
    cs = comms.moe_collectives_for(
        plan.model,
        micro_batch=plan.micro_batch,
        tp=plan.tp,
        ep=plan.ep,
        cp=plan.cp,
        sequence_parallel=plan.sequence_parallel,
        dtype=plan.dtype,
        moe_layers=moe_layers,
        num_microbatches=plan.num_microbatches,
        capacity_factor=run.moe_load,
        rerun=moe_again,
    )
    return sum(float(c.bytes_per_rank) for c in cs)


def _cp_bytes(plan, run, layers: int, full: float) -> float:
    """Bytes a rank with ``layers`` layers sends per step in its context-parallel exchange (``run.cp_comm``), the
    forward's again in the share ``full`` a full recomputation reruns."""
    cs = comms.cp_collectives_for(
        plan.model,
        micro_batch=plan.micro_batch,
        tp=plan.tp,
        cp=plan.cp,
        dtype=plan.dtype,
        layers=layers,
        num_microbatches=plan.num_microbatches,
        comm=run.cp_comm,
        rerun=full,
    )
    return sum(float(c.bytes_per_rank) for c in cs)


def stage_params_split_for(plan):
    """``params.stage_params_split`` of the plan, with its ep."""
    return stage_params_split(
        plan.model,
        tp=plan.tp,
        pp=plan.pp,
        interleave=plan.interleave,
        layers_per_stage=plan.layers_per_stage(),
        v_shape=plan.v_shape,
        ep=plan.ep,
    )


__all__ = ["comm_bytes", "plan_stage_times", "simulate_plan", "stage_params_split_for", "step_time"]
