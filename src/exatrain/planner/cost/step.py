"""Step time of one plan: per-stage compute and communication through the pipeline schedule.

Assembly (one data-parallel replica; all replicas run the same):
  1. per virtual stage k and micro-batch: forward F[k] and backward B[k] (+ weight pass W[k] split
     out for zero_bubble) = its layers' compute (cost.compute) + their exposed TP collectives
     (Megatron's TP all-reduces sit on the critical path; cost.network), plus the embedding on the
     first stage and norm/logits/loss on the last; recomputation is part of B;
  2. point-to-point transfers between stages on different ranks (cost.network, pipeline tier);
  3. the schedule simulation (cost.schedule) gives the makespan and the bubble;
  4. DP gradient reduction / ZeRO gathers: what one micro-batch's backward cannot hide (dp_overlap),
     less the slack a stage has before the pipeline drains, is exposed;
  5. the optimizer update of the rank's (sharded) parameters and a fixed per-step overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.plan import Plan, TimeBreakdown
from exatrain.accounting import comms
from exatrain.accounting.memory import COMPUTE_BYTES
from exatrain.accounting.params import stage_params
from exatrain.planner.cost import compute, network, schedule
from exatrain.planner.cost.coefficients import CostParams


@dataclass(frozen=True)
class StageTimes:
    """Per virtual stage, per micro-batch (seconds): compute and TP communication separately."""

    fwd: np.ndarray
    bwd: np.ndarray  # input-gradient pass incl. recomputation (whole backward minus ``wgrad``)
    wgrad: np.ndarray  # weight-gradient GEMMs (a separate op only under zero_bubble)
    tp_fwd: np.ndarray
    tp_bwd: np.ndarray
    p2p: float  # one boundary transfer between ranks


def tp_collective_time_s(cluster: ClusterSpec, cp: CostParams, tp, message_bytes, sequence_parallel: bool):
    """One forward-or-backward TP collective on b*s*h (an all-reduce, or with sequence parallelism
    an all-gather + reduce-scatter pair) over the tp group's tier; arrays allowed."""
    bw, lat = network.tier_arrays(cluster, network.tp_span(tp))
    if sequence_parallel:
        one = (network.collective_time_s("all_gather", tp, message_bytes, bw, lat, cp)
               + network.collective_time_s("reduce_scatter", tp, message_bytes, bw, lat, cp))
    else:
        one = network.collective_time_s("all_reduce", tp, message_bytes, bw, lat, cp)
    return np.where(np.asarray(tp) > 1, one, 0.0)


def _tp_time(plan: Plan, cluster: ClusterSpec, cp: CostParams, n_collectives: float) -> float:
    m = plan.model
    msg = plan.micro_batch * m.seq_len * m.hidden * COMPUTE_BYTES[plan.dtype]
    return float(n_collectives * tp_collective_time_s(cluster, cp, plan.tp, msg, plan.sequence_parallel))


def stage_times(plan: Plan, cluster: ClusterSpec, cp: CostParams) -> StageTimes:
    m, b, tp = plan.model, plan.micro_batch, plan.tp
    dev = compute.device_for(cluster, plan.dtype, cp, plan.gpus)
    kw = dict(sequence_parallel=plan.sequence_parallel, dtype=plan.dtype, dev=dev)
    lt = compute.layer_times(m, b, tp, flash=plan.flash_attention, recompute=plan.recompute, **kw)
    dense_gemm_fwd = sum(compute.gemm_time_s(g, dev) for g in compute.layer_gemms(m, b, tp)
                         if not g.name.startswith("attn_"))
    emb_f, emb_b = compute.embedding_times(m, b, tp, **kw)
    head_f, head_b = compute.head_times(m, b, tp, **kw)
    # TP collectives per layer: 2 in forward, 2 in backward, 2 more when full recompute reruns forward.
    tp_layer_f = _tp_time(plan, cluster, cp, 2)
    tp_layer_b = _tp_time(plan, cluster, cp, 2 + (2 if plan.recompute == "full" else 0))
    layers = np.asarray(plan.layers_per_stage(), dtype=float)
    S = len(layers)
    fw = float(compute.framework_layer_s(dev, tp, plan.dp, plan.zero_stage))
    pp_op = dev.params.pp_microbatch_overhead_s / 2 if plan.pp > 1 else 0.0  # per F and per B op
    fwd = layers * (float(lt.fwd) + fw / 3) + pp_op
    wgrad = layers * float(dense_gemm_fwd)
    bwd = layers * (float(lt.bwd + lt.recompute) + 2 * fw / 3) - wgrad + pp_op
    tp_f, tp_b = layers * tp_layer_f, layers * tp_layer_b
    fwd[0] += float(emb_f)
    bwd[0] += float(emb_b)
    tp_f[0] += _tp_time(plan, cluster, cp, 1)  # vocab-parallel embedding all-reduce
    fwd[S - 1] += float(head_f)
    bwd[S - 1] += float(head_b)
    tp_b[S - 1] += _tp_time(plan, cluster, cp, 1)  # head input-gradient all-reduce
    p2p = 0.0
    if plan.pp > 1:
        msg = b * m.seq_len * m.hidden * COMPUTE_BYTES[plan.dtype] / (tp if plan.sequence_parallel else 1)
        bw, lat = network.tier_arrays(cluster, network.pp_span(tp, plan.dp))
        p2p = float(network.collective_time_s("send_recv", 2, msg, bw, lat, cp))
    return StageTimes(fwd=fwd, bwd=bwd, wgrad=wgrad, tp_fwd=tp_f, tp_bwd=tp_b, p2p=p2p)


def dp_collective_times(cluster: ClusterSpec, cp: CostParams, model, *, tp, pp, dp, zero_stage: int,
                        params_here, num_microbatches, dtype: str, pipeline_end: bool):
    """Seconds of one rank's DP collectives per step, plus the tied-embedding gradient reduction
    between the pipeline's two ends, which crosses the pipeline tier; arrays allowed."""
    bw, lat = network.tier_arrays(cluster, network.dp_span(tp, dp))
    ebw, elat = network.tier_arrays(cluster, (np.asarray(pp) - 1) * np.asarray(tp) * np.asarray(dp) + 1)
    total = 0.0
    for c in comms.dp_collectives_for(model, tp=tp, pp=pp, dp=dp, zero_stage=zero_stage,
                                      num_microbatches=num_microbatches, dtype=dtype,
                                      params_here=params_here, pipeline_end=pipeline_end):
        b_, l_ = (bw, lat) if c.axis == "dp" else (ebw, elat)
        total = total + c.count * network.collective_time_s(c.kind, c.group, c.message_bytes, b_, l_, cp)
    return total


def dp_time_s(plan: Plan, cluster: ClusterSpec, cp: CostParams, pp_rank: int) -> float:
    return float(dp_collective_times(cluster, cp, plan.model, tp=plan.tp, pp=plan.pp, dp=plan.dp,
                                     zero_stage=plan.zero_stage, params_here=stage_params(plan)[pp_rank],
                                     num_microbatches=plan.num_microbatches, dtype=plan.dtype,
                                     pipeline_end=pp_rank in (0, plan.pp - 1)))


def step_time(plan: Plan, cluster: ClusterSpec, cp: CostParams) -> tuple[TimeBreakdown, schedule.ScheduleResult]:
    """Predicted seconds per optimizer step, broken down, and the simulated schedule behind it."""
    st = stage_times(plan, cluster, cp)
    F = st.fwd + st.tp_fwd
    B = st.bwd + st.tp_bwd
    kw = dict(pp=plan.pp, num_microbatches=plan.num_microbatches, schedule=plan.schedule,
              interleave=plan.interleave, weight_s=st.wgrad)
    sim = schedule.simulate(F, B, p2p_s=st.p2p, **kw)
    pipe = sim.step_s
    # The part of the step the transfers add: a second simulation without them (uneven stages
    # leave slack that hides some transfers, so no closed form attributes this exactly).
    no_p2p = schedule.simulate(F, B, p2p_s=0.0, **kw).step_s if plan.pp > 1 and st.p2p > 0 else pipe
    m = plan.num_microbatches
    # The busiest rank: its compute and TP communication.
    busiest = int(np.argmax(sim.busy_s))
    mine = list(plan.stages_of_rank(busiest))
    compute_s = m * float(np.sum(st.fwd[mine] + st.bwd[mine] + st.wgrad[mine]))
    tp_s = m * float(np.sum(st.tp_fwd[mine] + st.tp_bwd[mine]))
    # DP: stage r's reduction starts after its last backward; one micro-batch's backward hides
    # dp_overlap of it, and the time until the pipeline drains hides the rest.
    ends = np.zeros(plan.pp)
    tl = sim.timeline
    np.maximum.at(ends, tl.rank, tl.end_s)
    dp_exposed = 0.0
    opt_s = 0.0
    dev = compute.device_for(cluster, plan.dtype, cp, plan.gpus)
    params = stage_params(plan)
    for r in range(plan.pp):
        ks = list(plan.stages_of_rank(r))
        # ZeRO-3 prefetches each micro-batch's gathers under compute; otherwise only the last
        # micro-batch's backward runs alongside the reduction.
        busy = float(np.sum(F[ks] + B[ks] + st.wgrad[ks])) * m if plan.zero_stage == 3 else float(np.sum(B[ks] + st.wgrad[ks]))
        window = cp.dp_overlap * busy
        t_dp = dp_time_s(plan, cluster, cp, r)
        slack = float(ends.max() - ends[r])
        dp_exposed = max(dp_exposed, max(0.0, t_dp - window - slack))
        shard = params[r] / (plan.dp if plan.zero_stage >= 1 else 1)
        opt_s = max(opt_s, float(compute.optimizer_time_s(shard, dev)))
    fixed = dev.params.step_overhead_s + (dev.params.dp_step_overhead_s if plan.dp > 1 else 0.0)
    total = pipe + dp_exposed + opt_s + fixed
    bd = TimeBreakdown(step=total, compute=compute_s, bubble=max(0.0, no_p2p - compute_s - tp_s),
                       tp_comm=tp_s, pp_comm=pipe - no_p2p, dp_comm=dp_exposed, optimizer=opt_s,
                       other=fixed)
    return bd, sim
