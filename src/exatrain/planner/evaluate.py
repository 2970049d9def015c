"""Memory of every pipeline stage and the step time of many layouts at once.

The one evaluation path of the planner: the search feeds it every candidate of a space, and
``estimate_plan`` feeds it a single plan (a batch of one), so the two agree by construction.
Memory comes from the accounting, per runtime (the engine that runs the plan):
``accounting.memory.rank_memory`` (with the engine's profile) for megatron-core, megatron-deepspeed and torchtitan,
``accounting.trainer_memory.trainer_rank_memory`` for exatrain's own trainer, evaluated for every
pipeline rank, so the worst stage is the plan's true worst stage; time from ``cost.step``, with the
runtime's overlaps and collectives (``cost.overlap``). The plan's dtype, flash attention and run settings arrive
resolved once (``accounting.engines.Resolved``: what the runtime runs for them).

Layouts are grouped by what fixes array shapes: GPU count (the device's share of a CPU), pp and
interleave (the layer split and the number of stages), and by ep and cp (scalars to the accounting
and to ``cost.moe`` and ``cost.context``); within a group memory is evaluated once per (ZeRO stage, recompute,
sequence parallel), the accounting's scalar choices.

Mixture-of-experts models, context parallelism and FP8 GEMMs are priced by the lean reference
(``accounting.memory.rank_memory`` with ep, cp, the expert split of ``cost.moe`` and its
routing load ``moe_load``, and the FP8 recipe) and by ``cost.layer``, ``cost.moe`` and ``cost.context`` for time.
An ep wider than dp (folded over tp*cp*dp, ``plan.ParallelDims``) takes the same per-rank counts (experts/ep local
experts, states sharded over edp = tp*cp*dp/ep); only the ranks its groups span differ (``cost.moe.ep_span``,
``edp_span``). exatrain's own trainer memory (``accounting.trainer_memory``) counts its dense and MoE
layers with ep and cp (routed tokens at a balanced load, as the trainer's dropless routing averages);
for latent attention, QK-norm, a separate head width and FP8 the runtime ``exatrain`` is counted by
``accounting.memory`` with the exatrain profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from exatrain.layout_arrays import among
from exatrain.accounting.engines import Resolved
from exatrain.accounting.flops import model_flops_per_step
from exatrain.accounting.memory import RankCounts, inflight, rank_memory, unsharded_grad_share
from exatrain.accounting.moe import expert_dp
from exatrain.accounting.offload import host_fits, offloaded
from exatrain.accounting.params import rank_params
from exatrain.accounting.trainer_memory import trainer_rank_memory
from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.plan import balanced_split
from exatrain.settings import RECOMPUTE, RUNTIMES, SCHEDULES, V_SCHEDULES
from exatrain.planner.cost import compute
from exatrain.planner.cost.overlap import overlap_for
from exatrain.planner.cost.rerun import rerun_on_rank
from exatrain.planner.cost.moe import rank_params_split
from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.cost.step import TIME_FIELDS, step_times
from exatrain.planner.layouts import Layouts

MEMORY_FIELDS = ("weights", "gradients", "optimizer", "activations", "other")


@dataclass(frozen=True, eq=False)
class Evaluation:
    """Per layout (aligned with the Layouts). Memory of the worst pipeline rank under each memory
    model asked for; ``fits`` judges the first. ``by_rank`` (when asked for): every rank's
    breakdown, arrays (N, max pp) with NaN beyond a layout's pp."""

    memory: dict[str, dict[str, np.ndarray]]  # model -> field -> (N,) bytes, the worst rank
    memory_total: dict[str, np.ndarray]  # model -> (N,)
    worst_rank: dict[str, np.ndarray]
    fits: np.ndarray
    time: dict[str, np.ndarray]  # TIME_FIELDS -> (N,) seconds
    pipeline_s: np.ndarray  # (N,) the pipeline's makespan (cost.pipeline), part of time["step"]
    tokens_per_s: np.ndarray
    model_tflops_per_gpu: np.ndarray
    rank_end_s: np.ndarray  # (N, max pp): when each pipeline rank finishes (cost.pipeline)
    busy_s: np.ndarray  # (N, max pp)
    by_rank: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    hidden: dict[str, np.ndarray] = field(default_factory=dict)  # tp/pp/dp -> (N,) seconds overlap hid
    # (N,) bytes of model states the busiest rank keeps in host memory (Plan.offload; accounting.offload); zeros
    # without offload. ``fits`` also asks that a node's ranks' fit its host memory (offload.host_fits).
    host_bytes: np.ndarray | None = None
    # by_rank evaluations of an offloading run: cost.offload's parts, each (N,) seconds (adam, h2d, d2h, exposed)
    offload_parts: dict[str, np.ndarray] = field(default_factory=dict)


def _groups(keys: np.ndarray):
    """(indices, key column) of each distinct column of ``keys`` (rows: one key per layout)."""
    if keys.shape[1] == 0:
        return []
    if keys.shape[1] == 1 or (keys == keys[:, :1]).all():
        return [(np.arange(keys.shape[1]), keys[:, 0])]
    uniq, inverse = np.unique(keys, axis=1, return_inverse=True)
    inverse = np.ravel(inverse)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=uniq.shape[1]))[:-1]
    return list(zip(np.split(order, bounds), uniq.T))


def layer_split(model: ModelSpec, pp: int, interleave: int, stage_layers: tuple[int, ...]) -> np.ndarray:
    return np.array(stage_layers or balanced_split(model.layers, pp * interleave), dtype=np.int64)


def not_modelled(model: ModelSpec) -> None:
    """Refuse, in one line, a model this step-time and memory path does not price. Every model the
    catalog can describe is priced now — mixture-of-experts, latent-attention and separate-head-width
    layers by their own GEMM shapes and memory (``cost.layer``, ``accounting.memory``) — so this
    refuses nothing; it stays as the one place such a refusal belongs."""
    return None


def trainer_models_it(model: ModelSpec, ep: int, cp: int, fp8: str) -> bool:
    """Whether ``accounting.trainer_memory`` counts this layout: the trainer's dense and MoE layers
    with standard (grouped-query) attention, with or without ep and cp; not latent attention, QK-norm,
    a separate head width, sliding windows, nor FP8 GEMMs."""
    return not (model.mla or model.qk_norm or model.kv_channels or model.sliding_window or fp8)


def evaluate(
    layouts: Layouts,
    model: ModelSpec,
    cluster: ClusterSpec,
    coeffs: CostParams,
    *,
    global_batch,
    run: Resolved,
    memory: tuple[str, ...] | None = None,
    by_rank: bool = False,
    time_if_fits: bool = False,
    overlap: str | None = None,
    time: bool = True,
    fit_bytes: float | None = None,
) -> Evaluation:
    """Evaluate every layout (see the module doc) as ``run`` says its runtime runs them (``accounting.engines.
    Resolved``: the plan's dtype, flash attention and run settings, resolved once). ``memory``: which runtimes'
    memory models to evaluate, the first deciding ``fits`` (None: the runtime's; (): time only, fits all true);
    another runtime than the plan's counts its own run of the same FP8 GEMMs and MoE routing
    (``Resolved.other``, resolved once, before any layout is counted). ``time_if_fits``: time only the layouts that
    fit (the others' times are NaN), as a search that ranks only those needs. ``overlap``: which of the runtime's
    overlaps are on (``cost.overlap.overlap_rules``). A full recomputation covers each layout's
    ``Layouts.recompute_layers`` of each virtual stage (``Plan.recompute_layers``; 0: all), or one layer in
    ``run.recompute_every`` of a rank (``cost.rerun``). ``by_rank`` also fills ``hidden``; ``time`` False: memory
    only (the times NaN). ``fit_bytes``: the worst stage's bytes ``time_if_fits`` times up to (None: the device's
    capacity; a search keeping layouts whose capacity lies inside their memory band passes capacity over the band's
    lowest low end, planner/memory_band.py). A run with synchronous launches (``launch_blocking``) adds the host's
    time to every kernel and overlaps nothing (``compute.with_launch_blocking``)."""
    ctx = _context(model, cluster, coeffs, run, memory, overlap, by_rank)
    out = _Results.empty(len(layouts), int(layouts.pp.max()) if len(layouts) else 1, ctx.memory, by_rank)
    v_eff = np.where(layouts.pp > 1, layouts.interleave, 1)
    is_v = among(layouts.schedule, [SCHEDULES.index(s) for s in V_SCHEDULES]) & (layouts.pp > 1)
    for idx, (gpus, pp, v, ep, cpd, vee) in _groups(
        np.stack([layouts.gpus, layouts.pp, v_eff, layouts.ep, layouts.cp, is_v.astype(np.int64)])
    ):
        lay = layouts.take(idx)
        g = _group_counts(ctx, lay, layouts.stage_layers, int(pp), int(v), int(ep), int(cpd), bool(vee))
        cats = np.stack([lay.zero_stage, lay.recompute, lay.sequence_parallel.astype(np.int64)])
        if run.settings.offload != "none":
            _host_bytes(ctx, lay, g, cats, idx, out)
        for j, (zero, rec, sp) in _groups(cats) if ctx.memory else ():
            _memory_of(ctx, lay, g, j, (int(zero), int(rec), bool(sp)), idx, out)
        if time:
            fit = capacity_of(cluster, fit_bytes)
            _time_of(ctx, lay, g, idx, int(gpus), out, fit if time_if_fits and ctx.memory else None)
    return _evaluation(ctx, layouts, global_batch, out)


def capacity_of(cluster: ClusterSpec, fit_bytes: float | None) -> float:
    """The worst stage's bytes a layout is timed up to under ``time_if_fits``: ``fit_bytes``, else the device's."""
    return cluster.device.hbm_bytes if fit_bytes is None else fit_bytes


@dataclass(frozen=True, eq=False)
class _Context:
    """What every group of layouts shares: the model, the cluster, the coefficients with the run's attention
    kernel and launch mode applied, the overlaps that are on, the memory models asked for and each one's resolved
    run (``runs``, the plan's own and ``Resolved.other``'s, resolved once)."""

    model: ModelSpec
    cluster: ClusterSpec
    coeffs: CostParams
    run: Resolved
    runs: dict
    memory: tuple[str, ...]
    overlap: str | None
    by_rank: bool


def _context(model, cluster, coeffs, run: Resolved, memory, overlap, by_rank: bool) -> _Context:
    """The ``_Context`` of an evaluation; a ValueError names an unknown memory model."""
    runtime = run.runtime
    # the kernel (the plan's, else the runtime's) sets the attention rate
    coeffs = compute.with_attention_kernel(coeffs, run.attention_kernel)
    if run.settings.launch_blocking:  # each launch waits for its kernel: the host's time joins every kernel's
        coeffs = compute.with_launch_blocking(coeffs)
    overlap = overlap_for(overlap, run.settings.launch_blocking)
    memory = (runtime,) if memory is None else tuple(memory)
    bad = sorted(set(memory) - set(RUNTIMES))
    if bad:
        raise ValueError(f"unknown memory model(s) {bad}; choose among {RUNTIMES}")
    runs = {k: run if k == runtime else run.other(k, model) for k in memory}
    not_modelled(model)
    return _Context(model, cluster, coeffs, run, runs, memory, overlap, by_rank)


@dataclass(eq=False)
class _Results:
    """The evaluation's arrays, filled group by group (``Evaluation``'s fields before ``fits``)."""

    mem: dict
    total: dict
    worst: dict
    ranks: dict
    times: dict
    pipe: np.ndarray
    rank_end: np.ndarray
    busy: np.ndarray
    hidden: dict
    host: np.ndarray
    offload_parts: dict

    @classmethod
    def empty(cls, N: int, pmax: int, memory: tuple[str, ...], by_rank: bool) -> _Results:
        return cls(
            mem={k: {f: np.zeros(N) for f in MEMORY_FIELDS} for k in memory},
            total={k: np.zeros(N) for k in memory},
            worst={k: np.zeros(N, dtype=np.int64) for k in memory},
            ranks={k: {f: np.full((N, pmax), np.nan) for f in MEMORY_FIELDS} for k in memory} if by_rank else {},
            times={k: np.full(N, np.nan) for k in TIME_FIELDS},
            pipe=np.full(N, np.nan),
            rank_end=np.full((N, pmax), np.nan),
            busy=np.full((N, pmax), np.nan),
            hidden={k: np.full(N, np.nan) for k in ("tp", "pp", "dp")} if by_rank else {},
            host=np.zeros(N),
            offload_parts={},
        )


@dataclass(frozen=True, eq=False)
class _GroupCounts:
    """One group's (shared gpus, pp, interleave, ep, cp, placement) layer split and per-rank counts: layers held
    and rerun by a full recomputation where it does not rerun all (``rerun_on_rank``, (N, pp) or None), parameters
    outside and inside the routed experts (N, pp), in-flight micro-batches and unsharded-gradient share."""

    p: int
    v: int
    ep: int
    cpd: int
    split: np.ndarray
    last_rank: int
    on_rank: np.ndarray
    rerun_on_rank: np.ndarray | None
    params: np.ndarray
    xparams: np.ndarray | None
    moe_here: object
    held: np.ndarray | None  # None where no memory model is counted (a time-only evaluation)
    grad_share: np.ndarray | None


def _group_counts(ctx: _Context, lay: Layouts, stage_layers, p: int, v: int, ep: int, cpd: int, vee: bool):
    """``_GroupCounts`` of the layouts ``lay`` of one group."""
    model = ctx.model
    split = layer_split(model, p, v, stage_layers)
    rank = np.arange(p)
    # stage (chunk, rank) in looped order: rank r holds stages r, r + pp, ...; under a V, r and 2 pp - 1 - r
    looped = np.concatenate([rank, 2 * p - 1 - rank]) if vee else np.arange(p * v)
    last_rank = 0 if vee else p - 1  # the rank of the last stage (the head)
    on_rank = split[looped].reshape(v, p).sum(axis=0)  # layers held by each pipeline rank
    rerun = (
        rerun_on_rank(split, p, looped, lay.recompute_layers, ctx.run.recompute_every, n=len(lay))
        if ctx.memory
        else None
    )
    if model.is_moe:
        params, xparams, moe_here = (
            x.astype(float) for x in rank_params_split(model, lay.tp[:, None], p, v, split, ep, v_shape=vee)
        )
    else:
        params = rank_params(model, lay.tp[:, None], p, on_rank[None, :], rank[None, :], last_rank=last_rank)
        params, xparams, moe_here = params.astype(float), None, 0
    held = grad_share = None
    if ctx.memory:  # the schedule's in-flight counts serve the memory counts only
        m = lay.num_microbatches[:, None]
        held = inflight(lay.schedule[:, None], p, m, v, rank[None, :])
        grad_share = unsharded_grad_share(lay.schedule[:, None], p, m, v)
    return _GroupCounts(p, v, ep, cpd, split, last_rank, on_rank, rerun, params, xparams, moe_here, held, grad_share)


def _host_bytes(ctx: _Context, lay: Layouts, g: _GroupCounts, cats, idx, out: _Results) -> None:
    """Bytes of model states the busiest rank of each layout keeps in host memory (``accounting.offload``)."""
    run, dtype, offload = ctx.run, ctx.run.dtype, ctx.run.settings.offload
    for j, (zero, _, _) in _groups(cats):
        rule = run.engine.state_rule(dtype, int(zero))
        per = offloaded(offload, rule, dtype, lay.dp[j, None] * g.cpd).host
        on_host = g.params[j] * per + (
            0.0
            if g.xparams is None
            else g.xparams[j]
            * offloaded(offload, rule, dtype, expert_dp(lay.tp[j, None], lay.dp[j, None], g.ep, 1, g.cpd)).host
        )
        out.host[idx[j]] = np.max(on_host, axis=1)


def _memory_of(ctx: _Context, lay: Layouts, g: _GroupCounts, j, cat: tuple, idx, out: _Results) -> None:
    """Every memory model's count of the layouts ``j`` of a group sharing (ZeRO stage, recompute, sequence
    parallel) ``cat``, every pipeline rank, the worst one kept."""
    zero, rec, sp = cat
    p, model, rank = g.p, ctx.model, np.arange(g.p)
    common = dict(
        zero_stage=zero,
        recompute=RECOMPUTE[rec],
        sequence_parallel=sp,
        tp=lay.tp[j, None],
        dp=lay.dp[j, None],
        micro_batch=lay.micro_batch[j, None],
        pp=p,
        interleave=g.v,
        cp=g.cpd,
        ep=g.ep,
    )
    counts = dict(
        params_here=g.params[j],
        layers_here=g.on_rank[None, :],
        inflight_mb=g.held[j],
        is_last=rank[None, :] == g.last_rank,
        is_first=rank[None, :] == 0,
        expert_params_here=0 if g.xparams is None else g.xparams[j],
        moe_layers_here=g.moe_here,
    )
    for k in ctx.memory:
        if k == "exatrain" and trainer_models_it(model, g.ep, g.cpd, ctx.run.fp8):
            rank_j = RankCounts(**counts)
            m = lay.num_microbatches[j, None]
            on_cpu = ctx.cluster.device.name == "cpu"
            parts = trainer_rank_memory(model, ctx.runs[k], rank=rank_j, num_microbatches=m, on_cpu=on_cpu, **common)
        else:
            partial = k == ctx.run.runtime and g.rerun_on_rank is not None and RECOMPUTE[rec] == "full"
            recomputed_here = g.rerun_on_rank[j] if partial else None
            rank_j = RankCounts(**counts, pp_grad_share=g.grad_share[j], recomputed_here=recomputed_here)
            parts = rank_memory(model, ctx.runs[k], rank=rank_j, **common)
        _keep_worst(out, k, [np.broadcast_to(x, (j.size, p)) for x in parts], idx[j], p, ctx.by_rank)


def _keep_worst(out: _Results, k: str, parts: list, rows, p: int, by_rank: bool) -> None:
    """Record memory model ``k``'s worst rank of each layout (``rows``) and, ``by_rank``, every rank's parts."""
    tot = sum(parts)
    # the first of equal stages, as max() over stages picks
    w = np.argmax(np.nan_to_num(tot, nan=-1.0), axis=1)
    out.worst[k][rows] = w
    out.total[k][rows] = np.take_along_axis(tot, w[:, None], axis=1)[:, 0]
    for f, x in zip(MEMORY_FIELDS, parts):
        out.mem[k][f][rows] = np.take_along_axis(x, w[:, None], axis=1)[:, 0]
        if by_rank:
            out.ranks[k][f][rows, :p] = x


def _time_of(ctx: _Context, lay: Layouts, g: _GroupCounts, idx, gpus: int, out: _Results, fit) -> None:
    """The step time of a group's layouts (``cost.step.step_times``), scaled by the calibration's ``step_scale``;
    with ``fit`` (bytes) only those whose worst stage fits it."""
    keep = np.arange(idx.size)
    params, xparams = g.params, g.xparams
    if fit is not None:
        keep = np.nonzero(out.total[ctx.memory[0]][idx] <= fit)[0]
        if not keep.size:
            return
        lay, params = lay.take(keep), params[keep]
        xparams = None if xparams is None else xparams[keep]
    coeffs = ctx.coeffs
    dev = compute.device_for(ctx.cluster, ctx.run.dtype, coeffs, gpus)
    hid: dict | None = {} if ctx.by_rank else None
    t, _, pt = step_times(
        ctx.model,
        ctx.cluster,
        coeffs,
        dev,
        lay,
        run=ctx.run,
        stage_layers=g.split,
        params_by_rank=params,
        expert_params_by_rank=xparams,
        overlap=ctx.overlap,
        hidden=hid,
    )
    rows, p, N = idx[keep], g.p, len(out.pipe)
    scale = coeffs.step_scale  # a calibration's cluster x engine factor (CostParams): every second alike
    for k in hid or ():
        if k == "offload":  # cost.offload's parts (adam, h2d, d2h, exposed, total)
            for part, x in hid[k].items():
                out.offload_parts.setdefault(part, np.full(N, np.nan))[rows] = x
            continue
        out.hidden[k][rows] = hid[k] * scale
    for k in TIME_FIELDS:
        out.times[k][rows] = t[k] * scale
    out.pipe[rows] = pt.step_s * scale
    out.rank_end[rows, :p] = pt.rank_end_s * scale
    out.busy[rows, :p] = pt.busy_s * scale


def _evaluation(ctx: _Context, layouts: Layouts, global_batch, out: _Results) -> Evaluation:
    """The ``Evaluation`` of the filled results: ``fits`` by the first memory model (and, offloading, the host's
    memory), the throughputs from the step."""
    model, cluster, memory = ctx.model, ctx.cluster, ctx.memory
    capacity = cluster.device.hbm_bytes
    fits = out.total[memory[0]] <= capacity if memory else np.ones(len(layouts), dtype=bool)
    if ctx.run.settings.offload != "none":
        fits = fits & host_fits(out.host, cluster, layouts.gpus)
    step = out.times["step"]
    return Evaluation(
        memory=out.mem,
        memory_total=out.total,
        worst_rank=out.worst,
        fits=fits,
        time=out.times,
        pipeline_s=out.pipe,
        tokens_per_s=np.asarray(global_batch) * model.seq_len / step,
        model_tflops_per_gpu=model_flops_per_step(model, global_batch) / step / layouts.gpus / 1e12,
        rank_end_s=out.rank_end,
        busy_s=out.busy,
        by_rank=out.ranks,
        hidden=out.hidden,
        host_bytes=out.host,
        offload_parts=out.offload_parts,
    )


__all__ = ["Evaluation", "MEMORY_FIELDS", "evaluate", "layer_split"]
