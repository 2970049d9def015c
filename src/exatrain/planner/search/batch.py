"""Evaluate every candidate of a Space at once: worst-stage memory and predicted step time.

The formulas are the ones ``planner.estimate`` uses for one plan (accounting.memory.rank_memory,
cost.compute, cost.network), fed numpy arrays instead of numbers. Two simplifications keep it
vectorised, and ``tests/planner/test_search.py`` bounds their effect against ``estimate_plan``:
  * the pipeline time comes from ``schedule.step_time_fast`` (closed form) instead of the event
    simulation, with the middle stages taken as the slowest middle stage;
  * memory is evaluated for pipeline ranks 0, 1 and pp-1 only: with the balanced split (spare
    layers to the middle stages first) and in-flight counts that fall with the rank, the worst
    stage is always one of them.
Candidates are grouped by their categorical choices (ZeRO stage, recompute, SP, schedule) so each
group is one pass of array arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.plan import RECOMPUTE, balanced_split
from exatrain.accounting.flops import model_flops_per_step
from exatrain.accounting.memory import COMPUTE_BYTES, inflight, rank_memory
from exatrain.accounting.trainer_memory import trainer_rank_memory
from exatrain.accounting.params import (embedding_params, final_norm_params, head_params,
                                                 layer_params, position_params)
from exatrain.planner.cost import compute, network, schedule
from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.cost.step import dp_collective_times, tp_collective_time_s
from exatrain.planner.search.space import Space

MEMORY_FIELDS = ("weights", "gradients", "optimizer", "activations", "other")
TIME_FIELDS = ("step", "compute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer", "other")


@dataclass
class BatchResult:
    """Per candidate (aligned with the Space arrays)."""

    memory: dict[str, np.ndarray]  # worst stage's breakdown, bytes
    memory_total: np.ndarray
    fits: np.ndarray
    time: dict[str, np.ndarray]  # seconds
    tokens_per_s: np.ndarray
    model_tflops_per_gpu: np.ndarray


def _layer_layout(L: int, pp: int, v: int) -> tuple[int, int, int, int, int, int]:
    """(layers on rank 0, rank 1, rank pp-1, first virtual stage, last virtual stage, most on a rank)."""
    split = balanced_split(L, pp * v)
    on = [sum(split[k] for k in range(r, pp * v, pp)) for r in range(pp)]
    return on[0], on[min(1, pp - 1)], on[pp - 1], split[0], split[-1], max(on)


def evaluate(space: Space, model: ModelSpec, cluster: ClusterSpec, global_batch: int, cp: CostParams,
             dtype: str = "bfloat16", flash: bool = True, runtime: str = "megatron") -> BatchResult:
    """``runtime``: whose memory the candidates are judged by — "megatron" (accounting.memory, the lean
    reference) or "exatrain" (accounting.trainer_memory, the project's trainer as it runs today)."""
    n = len(space)
    mem = {k: np.zeros(n) for k in MEMORY_FIELDS}
    mem_total = np.zeros(n)
    times = {k: np.zeros(n) for k in TIME_FIELDS}
    variants = space.options.schedules
    keys = np.stack([space.zero, space.recompute, space.sp.astype(int), space.variant])
    groups, inverse = np.unique(keys, axis=1, return_inverse=True)
    inverse = np.ravel(inverse)
    gpus_total = int(space.tp[0] * space.pp[0] * space.dp[0]) if len(space) else 1
    dev = compute.device_for(cluster, dtype, cp, gpus_total)
    for gi, (zero, rec_i, sp_i, var_i) in enumerate(groups.T):
        idx = np.nonzero(inverse == gi)[0]
        sched, v = variants[var_i]
        opts = dict(zero_stage=int(zero), recompute=RECOMPUTE[rec_i], sequence_parallel=bool(sp_i),
                    schedule=sched, interleave=v)
        mparts, mtot, tparts = _evaluate_group(space, idx, model, cluster, dev, cp, dtype, flash, runtime, **opts)
        for k in MEMORY_FIELDS:
            mem[k][idx] = mparts[k]
        mem_total[idx] = mtot
        for k in TIME_FIELDS:
            times[k][idx] = tparts[k]
    gpus = space.tp * space.pp * space.dp
    tokens = global_batch * model.seq_len
    return BatchResult(memory=mem, memory_total=mem_total, fits=mem_total <= cluster.device.hbm_bytes,
                       time=times, tokens_per_s=tokens / times["step"],
                       model_tflops_per_gpu=model_flops_per_step(model, global_batch) / times["step"] / gpus / 1e12)


def _evaluate_group(space: Space, idx: np.ndarray, model: ModelSpec, cluster: ClusterSpec, dev, cp: CostParams,
                    dtype: str, flash: bool, runtime: str, *, zero_stage: int, recompute: str, sequence_parallel: bool,
                    schedule: str, interleave: int):
    tp, pp, dp = space.tp[idx], space.pp[idx], space.dp[idx]
    mb, m = space.micro_batch[idx], space.num_microbatches[idx]
    v = np.where(pp > 1, interleave, 1)
    e = COMPUTE_BYTES[dtype]
    L = model.layers

    # ---- layers per rank / stage (one Python call per distinct (pp, v)) ----
    lay = np.zeros((idx.size, 6))
    pairs, inv = np.unique(np.stack([pp, v]), axis=1, return_inverse=True)
    table = np.array([_layer_layout(L, int(a), int(b)) for a, b in pairs.T], dtype=float)
    lay[:] = table[np.ravel(inv)]
    l0, l1, llast, s_first, s_last, rank_max = lay.T
    s_mid = L / (pp * v)  # the mean stage; the busiest rank's excess is added below

    # ---- parameters held by ranks 0, 1 and pp-1 ----
    lp = layer_params(model)
    per_layer = lp.sharded / tp + lp.replicated
    first_extra = embedding_params(model) / tp + position_params(model)
    last_extra = final_norm_params(model) + np.where(
        model.tied_embeddings, np.where(pp > 1, embedding_params(model) / tp, 0.0), head_params(model) / tp)
    ranks = {  # rank, its parameters, is_last, is_first
        "r0": (0, l0 * per_layer + first_extra + np.where(pp == 1, last_extra, 0.0), pp == 1,
               np.ones_like(pp, bool)),
        "r1": (np.minimum(1, pp - 1), l1 * per_layer + np.where(pp == 2, last_extra, 0.0)
               + np.where(pp == 1, first_extra + last_extra, 0.0), pp <= 2, pp == 1),
        "rl": (pp - 1, llast * per_layer + last_extra + np.where(pp == 1, first_extra, 0.0),
               np.ones_like(pp, bool), pp == 1),
    }
    layers_of = {"r0": l0, "r1": l1, "rl": llast}
    worst_total = np.full(idx.size, -1.0)
    worst_parts = {k: np.zeros(idx.size) for k in MEMORY_FIELDS}
    params_by_rank = {}
    for key, (rank, params_here, is_last, is_first) in ranks.items():
        params_by_rank[key] = params_here
        fl = inflight(schedule, pp, m, v, rank)
        common = dict(dtype=dtype, zero_stage=zero_stage, recompute=recompute, sequence_parallel=sequence_parallel,
                      flash=flash, tp=tp, dp=dp, micro_batch=mb, pp=pp, interleave=v, params_here=params_here,
                      layers_here=layers_of[key], inflight_mb=fl, is_last=is_last)
        if runtime == "exatrain":
            parts = trainer_rank_memory(model, is_first=is_first, num_microbatches=m,
                                        on_cpu=cluster.device.name == "cpu", **common)
        else:
            parts = rank_memory(model, **common)
        total = sum(parts)
        better = total > worst_total
        worst_total = np.where(better, total, worst_total)
        for k, part in zip(MEMORY_FIELDS, parts):
            worst_parts[k] = np.where(better, part, worst_parts[k])

    # ---- time ----
    kw = dict(sequence_parallel=sequence_parallel, dtype=dtype, dev=dev)
    lt = compute.layer_times(model, mb, tp, flash=flash, recompute=recompute, **kw)
    dense = sum(compute.gemm_time_s(g, dev) for g in compute.layer_gemms(model, mb, tp)
                if not g.name.startswith("attn_"))
    emb_f, emb_b = compute.embedding_times(model, mb, tp, **kw)
    head_f, head_b = compute.head_times(model, mb, tp, **kw)
    msg = mb * model.seq_len * model.hidden * e
    tp_one = tp_collective_time_s(cluster, cp, tp, msg, sequence_parallel)
    tp_lf = 2 * tp_one
    tp_lb = (2 + (2 if recompute == "full" else 0)) * tp_one

    fw = compute.framework_layer_s(dev, tp, dp, zero_stage)
    pp_op = np.where(pp > 1, dev.params.pp_microbatch_overhead_s / 2, 0.0)

    def stage(layers, first: bool, last: bool):
        f = layers * (lt.fwd + tp_lf + fw / 3) + pp_op
        w = layers * dense
        b = layers * (lt.bwd + lt.recompute + tp_lb + 2 * fw / 3) - w + pp_op
        if first:
            f = f + emb_f + tp_one
            b = b + emb_b
        if last:
            f = f + head_f
            b = b + head_b + tp_one
        return f, b, w

    Fm, Bm, Wm = stage(s_mid, False, False)
    F0, B0, W0 = stage(s_first, True, False)
    FL, BL, WL = stage(s_last, False, True)
    split = schedule == "zero_bubble"
    if not split:
        Bm, B0, BL = Bm + Wm, B0 + W0, BL + WL
        Wm = W0 = WL = np.zeros_like(Wm)
    p2p_msg = msg / (tp if sequence_parallel else 1)
    bw, lat = network.tier_arrays(cluster, network.pp_span(tp, dp))
    p2p = np.where(pp > 1, network.collective_time_s("send_recv", 2, p2p_msg, bw, lat, cp), 0.0)
    single = pp * v == 1
    F0 = np.where(single, F0 + FL - Fm, F0)  # one stage is both first and last
    B0 = np.where(single, B0 + BL - Bm, B0)
    fast = dict(pp=pp, num_microbatches=m, schedule=schedule, interleave=v, weight_s=Wm,
                first_forward_s=F0, first_backward_s=B0, first_weight_s=W0,
                last_forward_s=np.where(single, Fm, FL), last_backward_s=np.where(single, Bm, BL),
                last_weight_s=np.where(single, Wm, WL))
    with_p2p = schedule_fast(Fm, Bm, p2p, fast)
    no_p2p = schedule_fast(Fm, Bm, 0.0, fast)
    # Uneven splits: the rank with the most layers paces the steady state (m - 1 micro-batches) when
    # its excess over the mean outweighs what the first/last stages already add.
    per_layer_s = (Fm + Bm + Wm) / s_mid
    d_mid = (rank_max - L / pp) * per_layer_s
    d_ends = np.maximum(np.maximum(F0 + B0 + W0 - (Fm + Bm + Wm), FL + BL + WL - (Fm + Bm + Wm)), 0.0)
    excess = np.where(pp > 1, (m - 1) * np.maximum(d_mid - d_ends, 0.0), 0.0)
    # busiest rank's split into compute and TP communication, per micro-batch
    tp_share_mid = s_mid * (tp_lf + tp_lb)
    tp_share = np.maximum.reduce([tp_share_mid * v, s_first * (tp_lf + tp_lb) + tp_one, s_last * (tp_lf + tp_lb) + tp_one])
    tp_total = m * tp_share
    busy = no_p2p.compute_s + np.where(pp > 1, m * np.maximum(d_mid - d_ends, 0.0), 0.0)
    compute_s = busy - tp_total

    # ---- DP exposure (ranks 0 and pp-1) and optimizer ----
    t_dp0 = dp_collective_times(cluster, cp, model, tp=tp, pp=pp, dp=dp, zero_stage=zero_stage,
                                params_here=params_by_rank["r0"], num_microbatches=m, dtype=dtype,
                                pipeline_end=True)
    t_dpl = dp_collective_times(cluster, cp, model, tp=tp, pp=pp, dp=dp, zero_stage=zero_stage,
                                params_here=params_by_rank["rl"], num_microbatches=m, dtype=dtype,
                                pipeline_end=True)
    if zero_stage == 3:
        win0 = cp.dp_overlap * m * (F0 + B0 + W0 + (v - 1) * (Fm + Bm + Wm))
        winl = cp.dp_overlap * m * (FL + BL + WL + (v - 1) * (Fm + Bm + Wm))
    else:
        win0 = cp.dp_overlap * (B0 + W0 + (v - 1) * (Bm + Wm))
        winl = cp.dp_overlap * (BL + WL + (v - 1) * (Bm + Wm))
    slack_last = np.where(pp > 1, (pp - 1) * (Bm + Wm), 0.0)  # the drain after the last stage finishes
    dp_exp = np.maximum(np.maximum(t_dp0 - win0, 0.0), np.maximum(t_dpl - winl - slack_last, 0.0))
    shard = np.where(zero_stage >= 1, dp, 1)
    opt = compute.optimizer_time_s(np.maximum(params_by_rank["r0"], params_by_rank["rl"]) / shard, dev)
    fixed = dev.params.step_overhead_s + np.where(dp > 1, dev.params.dp_step_overhead_s, 0.0)
    step = with_p2p.step_s + excess + dp_exp + opt + fixed
    times = {"step": step, "compute": compute_s, "bubble": np.maximum(no_p2p.step_s + excess - busy, 0.0),
             "tp_comm": tp_total, "pp_comm": with_p2p.step_s - no_p2p.step_s, "dp_comm": dp_exp,
             "optimizer": opt, "other": fixed * np.ones(idx.size)}
    return worst_parts, worst_total, times


def schedule_fast(F, B, p2p, kw):
    return schedule.step_time_fast(F, B, p2p_s=p2p, **kw)

