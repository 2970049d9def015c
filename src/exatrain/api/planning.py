"""The planner's calls: ``estimate`` (one layout), ``search`` (every legal layout, ranked) and
``scaling`` (the best layout over GPU counts). Torch-free, except ``estimate(trace=True)``.

Keyword arguments have the names and defaults of the CLI's flags (``--micro-batch`` is
``micro_batch``); a model is a preset name, a ModelSpec or ``model_file``, a cluster a catalog
name, a ClusterSpec or ``cluster_file`` (neither: ``DEFAULT_CLUSTER``, the Frontier study's).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from exatrain.api.plans import (
    calibrated,
    layout_values,
    make_plan,
    resolve_cluster,
    resolve_model,
    shape_of,
    space_options,
    with_launch,
)
from exatrain.catalog import ClusterSpec, ModelSpec
from exatrain.errors import UserError
from exatrain.limits import check_counts
from exatrain.paths import check_output_file
from exatrain.plan import Plan
from exatrain.settings import RUNTIMES, check_settings, default_runtime, default_runtime_note, takes_settings
from exatrain.planner.memory_band import STRICT_MEMORY_HELP
from exatrain.planner.time_to_train import RANK_BY, RANK_BY_HELP, RUN_FLAGS, rank, run_options, with_time_to_train

Progress = Callable[[str], None]
DEFAULT_CLUSTER = "frontier"  # the cluster when neither cluster nor cluster_file is given
# The engine a plan is predicted for when none is named and the model is one exatrain's own trainer builds: the
# trainer, the runtime a Plan defaults to and the one `train` and `tune` run, so a searched plan is one this project
# can run. For a model it does not build (settings.default_runtime) the default is Megatron-Core, and the plan says so.
DEFAULT_RUNTIME = "exatrain"


def check_runtime(runtime: str, overlap: str | None = None) -> str:
    """``runtime`` if it names an engine profile (and ``overlap`` names overlaps it has); otherwise a
    one-line UserError naming the choices."""
    from exatrain.planner.cost.overlap import overlap_rules

    if runtime not in RUNTIMES:
        hint = " (Megatron-LM is megatron-core)" if runtime == "megatron" else ""
        raise UserError(f"--runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}{hint}")
    overlap_rules(runtime, overlap)
    return runtime


def check_grad_accum(
    grad_accum: str | None, dtype: str | None, runtime: str, fusion: str | None = None, adam_kernel: str | None = None
) -> None:
    """A one-line UserError where ``runtime`` cannot take these settings in ``dtype`` training
    (``settings.check_settings``)."""
    values = {"grad_accum": grad_accum, "grad_accum_fusion": fusion, "adam_kernel": adam_kernel}
    check_settings(values, runtime=runtime, dtype=dtype)


def check_cp_comm(cp_comm: str | None, runtime: str, model: ModelSpec) -> None:
    """A one-line UserError where ``runtime`` does not run context parallelism by ``cp_comm`` for ``model``
    (``settings.check_settings``)."""
    check_settings({"cp_comm": cp_comm}, runtime=runtime, model=model)


def _runtime_for(
    runtime: str | None,
    model: ModelSpec,
    overlap: str,
    settings: Mapping[str, Any] | None = None,
    dtype: str | None = None,
) -> tuple[str, bool]:
    """(the runtime to plan for, whether it was chosen here): ``runtime``, else ``settings.default_runtime`` of the
    model; its overlaps and, for a search (``settings`` given: the run settings by name), every setting a search
    checks once before it enumerates anything (``settings.check_settings``), each a one-line UserError."""
    chosen = runtime is None
    runtime = check_runtime(default_runtime(model) if chosen else runtime, overlap)
    if settings is not None:
        check_settings(settings, runtime=runtime, model=model, dtype=dtype)
    return runtime, chosen


@takes_settings
def estimate(
    *,
    model: str | ModelSpec | None = None,
    model_file: str | Path | None = None,
    arch: str | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    ffn_hidden: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    cluster: str | ClusterSpec | None = None,
    cluster_file: str | Path | None = None,
    gpus: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    dp: int | None = None,
    micro_batch: int | None = None,
    global_batch: int | None = None,
    zero: int | None = None,
    recompute: str | None = None,
    sequence_parallel: bool | None = None,
    schedule: str | None = None,
    interleave: int | None = None,
    stage_layers: Sequence[int] | None = None,
    dtype: str | None = None,
    flash_attention: bool | None = None,
    ep: int | None = None,
    cp: int | None = None,
    runtime: str | None = None,
    overlap: str | None = None,
    calibration: str | Path | None = None,
    trace: bool | str = False,
    out: str | Path | None = None,
    progress: Progress | None = None,
    from_file: str | Path | None = None,
    tokens: int | float | str | None = None,
    gpu_hour_price: float | str | None = None,
    power_overhead: float | str | None = None,
    node_mtbf_hours: float | str | None = None,
    checkpoint_bandwidth: float | str | None = None,
    restart_minutes: float | str | None = None,
    **settings: Any,
) -> Plan:
    """Memory of every pipeline stage and the step time of one layout as ``runtime`` (an engine:
    megatron-core, megatron-deepspeed, torchtitan, exatrain; None: exatrain, or megatron-core for a model
    exatrain's trainer does not build, ``settings.default_runtime``, said in the notes) runs it: the validated Plan (its
    ``runtime`` set) with its StepEstimate (``plan.estimate``). ``trace``: also trace the trainer's
    own model per stage (torch, nothing allocated): True or "fast" one rank per distinct stage shape,
    replayed over every stage's order; "full" every stage over the whole step. ``overlap``: which of the
    runtime's overlaps are on — all (its switches assumed on), default (the engine's defaults), none, or a comma list of
    tp, dp_grad_reduce, dp_param_gather, pp_p2p, ep_a2a. ``settings``: the run settings by name (``fp8``,
    ``moe_dispatcher``, ``attention_kernel``, ... ``recompute_every``: ``exatrain.settings.SETTINGS``, whose help
    says what each is; None or not given: the runtime's own). ``out``: also write the plan with its estimate as JSON.
    ``from_file``: a Megatron-LM / Megatron-DeepSpeed launch or torchtitan job TOML whose model, world size, layout
    and settings fill every argument left at its default (``plans.with_launch``). ``tokens``: the run's token budget
    (15T, 300e9, ...): the estimate also carries ``time_to_train`` (steps, days, GPU-hours, energy at TDP times
    ``power_overhead``, and with ``gpu_hour_price`` the cost; each with the band: ``planner.time_to_train``) and its
    ``goodput``: checkpoints, interruptions and restarts priced at ``node_mtbf_hours``, ``checkpoint_bandwidth``
    (GB/s) and ``restart_minutes`` (None: the catalog's, ``planner.goodput``)."""
    if from_file is not None:
        return estimate(**with_launch(locals(), estimate))
    values = dict(locals())
    check_counts(values)
    run = run_options(
        tokens,
        gpu_hour_price,
        power_overhead,
        node_mtbf_hours=node_mtbf_hours,
        checkpoint_bandwidth=checkpoint_bandwidth,
        restart_minutes=restart_minutes,
    )
    if trace:
        from exatrain.bench.traced import trace_mode

        trace_mode(trace)  # bad input is refused before anything is planned
    if runtime is not None:
        check_runtime(runtime, overlap)
    if out is not None:
        check_output_file(out, "--out")
    c = resolve_cluster(cluster, cluster_file, default=DEFAULT_CLUSTER)
    m = resolve_model(model, model_file, **shape_of(values))
    runtime, chosen = _runtime_for(runtime, m, overlap)
    c, params = calibrated(c, calibration, runtime)
    stage_layers = tuple(stage_layers) if stage_layers is not None else None
    plan = make_plan(m, c, gpus=gpus, **{**layout_values(values), "stage_layers": stage_layers}, runtime=runtime)
    plan = plan.replace(runtime=runtime).validate(c)
    from exatrain.planner.estimate import estimate_plan

    est = estimate_plan(plan, c, params, overlap)
    if chosen and (note := default_runtime_note(m)):
        est = dataclasses.replace(est, notes=(note, *est.notes))
    plan = plan.with_estimate(est)
    if trace:
        from exatrain.bench.traced import trace_mode, traced_estimate

        plan = plan.with_estimate(traced_estimate(plan, c, progress, mode=trace_mode(trace) or "fast"))
    plan = with_time_to_train(plan, c, run)
    if out is not None:
        plan.save(out)
    return plan


@takes_settings
def search(
    *,
    model: str | ModelSpec | None = None,
    model_file: str | Path | None = None,
    arch: str | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    ffn_hidden: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    cluster: str | ClusterSpec | None = None,
    cluster_file: str | Path | None = None,
    gpus: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    dp: int | None = None,
    micro_batch: int | None = None,
    global_batch: int | None = None,
    zero: int | None = None,
    recompute: str | None = None,
    sequence_parallel: bool | None = None,
    schedule: str | None = None,
    interleave: int | None = None,
    stage_layers: Sequence[int] | None = None,
    dtype: str | None = None,
    flash_attention: bool | None = None,
    ep: int | None = None,
    cp: int | None = None,
    top: int = 10,
    runtime: str | None = None,
    overlap: str | None = None,
    calibration: str | Path | None = None,
    out: str | Path | None = None,
    from_file: str | Path | None = None,
    tokens: int | float | str | None = None,
    gpu_hour_price: float | str | None = None,
    power_overhead: float | str | None = None,
    node_mtbf_hours: float | str | None = None,
    checkpoint_bandwidth: float | str | None = None,
    restart_minutes: float | str | None = None,
    rank_by: str = "throughput",
    strict_memory: bool = False,
    **settings: Any,
):
    """Every legal layout of ``model`` on ``gpus`` devices at ``global_batch``, those that fit ranked
    by predicted throughput (a SearchResult; ``ranked[0]`` is the best, with its estimate). Layout
    values pin a dimension. ``runtime``: the engine that will run it — its memory decides what
    fits, its overlaps (``overlap``, as for ``estimate``) and collectives the step time, its ZeRO
    stages are the candidates (None: as for ``estimate``, said in ``SearchResult.notes``).
    ``out``: write the best plan as JSON. No feasible layout is a UserError naming the constraint
    that removed the most. ``from_file``: a launch (as for ``estimate``) whose values pin what it states.
    ``tokens``, ``gpu_hour_price``, ``power_overhead`` (and ``node_mtbf_hours``, ``checkpoint_bandwidth``,
    ``restart_minutes``): each ranked plan carries ``time_to_train`` with its ``goodput`` (as for ``estimate``);
    ``rank_by``: throughput, or days, gpu_hours or cost to train, with failures (``planner.time_to_train.rank``:
    on one GPU count and batch the same order, said in ``SearchResult.notes``). A layout whose device capacity lies
    inside its band of measured peak memory is "tight": kept and marked (its estimate's ``memory_verdict``;
    ``SearchResult.tight`` counts them), dropped with ``strict_memory`` (planner/memory_band.py)."""
    if from_file is not None:
        return search(**with_launch(locals(), search))
    values = dict(locals())
    check_counts(values)
    run = run_options(
        tokens, gpu_hour_price, power_overhead, rank_by, node_mtbf_hours, checkpoint_bandwidth, restart_minutes
    )
    if gpus is None or global_batch is None:
        raise UserError("search needs --gpus and --global-batch")
    if top < 1:
        raise UserError("--top must be at least 1")
    if runtime is not None:  # fail before resolving anything (_runtime_for checks it all again for the model)
        check_runtime(runtime, overlap)
    if out is not None:
        check_output_file(out, "--out")
    options = space_options(**layout_values(values))
    c = resolve_cluster(cluster, cluster_file, default=DEFAULT_CLUSTER)
    m = resolve_model(model, model_file, **shape_of(values))
    runtime, chosen = _runtime_for(runtime, m, overlap, settings, dtype)
    c, params = calibrated(c, calibration, runtime)
    from exatrain.planner.scaling import no_feasible_layout
    from exatrain.planner.search.search import search as run_search

    result = run_search(
        m,
        c,
        gpus,
        global_batch,
        top=top,
        options=options,
        params=params,
        dtype=dtype or "bfloat16",
        runtime=runtime,
        overlap=overlap,
        flash=True if flash_attention is None else flash_attention,
        strict_memory=bool(strict_memory),
    )
    if not result.ranked:
        raise no_feasible_layout(result, gpus, c)
    if chosen and (note := default_runtime_note(m)):
        result.notes = (note, *result.notes)
    result.ranked, order = rank([with_time_to_train(p, c, run) for p in result.ranked], rank_by)
    result.notes = (*result.notes, *((order,) if order else ()))
    if out is not None:
        result.ranked[0].save(out)
    return result


@takes_settings
def scaling(
    *,
    model: str | ModelSpec | None = None,
    model_file: str | Path | None = None,
    arch: str | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    ffn_hidden: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    cluster: str | ClusterSpec | None = None,
    cluster_file: str | Path | None = None,
    gpus: Sequence[int] = (),
    tp: int | None = None,
    pp: int | None = None,
    dp: int | None = None,
    micro_batch: int | None = None,
    global_batch: int | None = None,
    zero: int | None = None,
    recompute: str | None = None,
    sequence_parallel: bool | None = None,
    schedule: str | None = None,
    interleave: int | None = None,
    stage_layers: Sequence[int] | None = None,
    dtype: str | None = None,
    flash_attention: bool | None = None,
    ep: int | None = None,
    cp: int | None = None,
    mode: str = "weak",
    runtime: str | None = None,
    overlap: str | None = None,
    calibration: str | Path | None = None,
    tokens: int | float | str | None = None,
    gpu_hour_price: float | str | None = None,
    power_overhead: float | str | None = None,
    node_mtbf_hours: float | str | None = None,
    checkpoint_bandwidth: float | str | None = None,
    restart_minutes: float | str | None = None,
    strict_memory: bool = False,
    **settings: Any,
):
    """Predicted weak (global batch grows with the GPU count) or strong (fixed global batch) scaling
    over ``gpus`` (increasing counts) as ``runtime`` runs it: the best layout at each count (or the
    pinned one), its throughput and efficiency, and what a published study measured for this model
    and cluster (a ScalingResult). ``runtime`` None: as for ``estimate`` (the title names it). ``tokens``,
    ``gpu_hour_price``, ``power_overhead``: each point's plan carries ``time_to_train`` (as for ``estimate``): where
    the GPU counts differ, so do days and GPU-hours. ``strict_memory``: each count's search drops tight layouts too
    (as ``search``)."""
    values = dict(locals())
    check_counts(values)
    run = run_options(
        tokens,
        gpu_hour_price,
        power_overhead,
        node_mtbf_hours=node_mtbf_hours,
        checkpoint_bandwidth=checkpoint_bandwidth,
        restart_minutes=restart_minutes,
    )
    if runtime is not None:  # fail before resolving anything (_runtime_for checks it all again for the model)
        check_runtime(runtime, overlap)
    if global_batch is None:
        raise UserError("scaling needs --global-batch (the batch at the first GPU count)")
    options = space_options(**layout_values(values))
    c = resolve_cluster(cluster, cluster_file, default=DEFAULT_CLUSTER)
    m = resolve_model(model, model_file, **shape_of(values))
    runtime, _ = _runtime_for(runtime, m, overlap, settings, dtype)
    c, params = calibrated(c, calibration, runtime)
    from exatrain.planner.scaling import scaling as run_scaling

    result = run_scaling(
        m,
        c,
        list(gpus),
        global_batch,
        mode=mode,
        options=options,
        params=params,
        dtype=dtype or "bfloat16",
        flash=True if flash_attention is None else flash_attention,
        runtime=runtime,
        overlap=overlap,
        strict_memory=bool(strict_memory),
    )
    points = tuple(dataclasses.replace(pt, plan=with_time_to_train(pt.plan, c, run)) for pt in result.points)
    return dataclasses.replace(result, points=points)


__all__ = [
    "DEFAULT_CLUSTER",
    "DEFAULT_RUNTIME",
    "RANK_BY",
    "RANK_BY_HELP",
    "RUN_FLAGS",
    "STRICT_MEMORY_HELP",
    "check_cp_comm",
    "check_runtime",
    "estimate",
    "scaling",
    "search",
]
