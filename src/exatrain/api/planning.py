"""The planner's calls: ``estimate`` (one layout), ``search`` (every legal layout, ranked) and
``scaling`` (the best layout over GPU counts). Torch-free, except ``estimate(trace=True)``.

Keyword arguments have the names and defaults of the CLI's flags (``--micro-batch`` is
``micro_batch``); a model is a preset name, a ModelSpec or ``model_file``, a cluster a catalog
name, a ClusterSpec or ``cluster_file`` (neither: ``DEFAULT_CLUSTER``, the Frontier study's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from exatrain.api.plans import (
    calibrated,
    layout_values,
    make_plan,
    resolve_cluster,
    resolve_model,
    space_options,
    with_launch,
)
from exatrain.api.requests import (
    Budget,
    ClusterQuery,
    Engine,
    Layout,
    ModelQuery,
    PlanOptions,
    PlanRequest,
    SettingsArg,
    plan_request,
)
from exatrain.catalog import ClusterSpec, ModelSpec
from exatrain.errors import UserError
from exatrain.paths import check_output_file
from exatrain.plan import Plan
from exatrain.settings import RUNTIMES, check_settings, default_runtime, default_runtime_note
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


ESTIMATE_OPTIONS = ("out", "trace", "from_file", "progress")
SEARCH_OPTIONS = ("top", "rank_by", "strict_memory", "out", "from_file")
SCALING_OPTIONS = ("mode", "strict_memory")


def estimate(
    model: ModelQuery | str | ModelSpec | None = None,
    cluster: ClusterQuery | str | ClusterSpec | None = None,
    *,
    layout: Layout | None = None,
    settings: SettingsArg = None,
    engine: Engine | None = None,
    budget: Budget | None = None,
    options: PlanOptions | None = None,
    **pins: Any,
) -> Plan:
    """Memory of every pipeline stage and the step time of one layout as ``engine.runtime`` runs it (megatron-core,
    megatron-deepspeed, torchtitan, exatrain; None: exatrain, or megatron-core for a model exatrain's trainer does
    not build, ``settings.default_runtime``, said in the notes): the validated Plan (its ``runtime`` set) with its
    StepEstimate (``plan.estimate``). The requests (``api.requests``) say what is asked; each of their fields may
    also be given flat by name (``estimate("llama3-70b", "dgx-h100", gpus=64, tp=8, fp8="current")``).
    ``settings``: the run settings (a RunSettings, or a mapping by name; not given: the runtime's own).
    ``options.trace``: also trace the trainer's own model per stage (torch, nothing allocated): True or "fast" one
    rank per distinct stage shape, replayed over every stage's order; "full" every stage over the whole step.
    ``options.out``: also write the plan with its estimate as JSON. ``options.from_file``: a Megatron-LM /
    Megatron-DeepSpeed launch or torchtitan job TOML whose model, world size, layout and settings fill every value
    left at its default (``plans.with_launch``). ``budget``: the estimate also carries ``time_to_train`` (steps,
    days, GPU-hours, energy, cost; each with the band: ``planner.time_to_train``) and its ``goodput``
    (``planner.goodput``)."""
    given = dict(model=model, cluster=cluster, layout=layout, settings=settings, engine=engine, budget=budget)
    return estimate_request(plan_request("estimate", ESTIMATE_OPTIONS, pins, **given, options=options))


def estimate_request(r: PlanRequest) -> Plan:
    """``estimate`` of a whole request."""
    if r.options.from_file is not None:
        return estimate_request(with_launch(r, "estimate"))
    run = _budget(r.budget)
    opts, lay, eng = r.options, r.layout, r.engine
    if opts.trace:
        from exatrain.bench.traced import trace_mode

        trace_mode(opts.trace)  # bad input is refused before anything is planned
    if eng.runtime is not None:
        check_runtime(eng.runtime, eng.overlap)
    if opts.out is not None:
        check_output_file(opts.out, "--out")
    c = resolve_cluster(r.cluster.cluster, r.cluster.cluster_file, default=DEFAULT_CLUSTER)
    m = resolve_model(r.model.model, r.model.model_file, **r.model.shape())
    runtime, chosen = _runtime_for(eng.runtime, m, eng.overlap)
    c, params = calibrated(c, eng.calibration, runtime)
    stage_layers = tuple(lay.stage_layers) if lay.stage_layers is not None else None
    values = {**layout_values({**lay.values(), "settings": r.settings}), "stage_layers": stage_layers}
    plan = make_plan(m, c, gpus=r.cluster.gpus, **values, runtime=runtime)
    plan = plan.replace(runtime=runtime).validate(c)
    from exatrain.planner.estimate import estimate_plan

    est = estimate_plan(plan, c, params, eng.overlap)
    if chosen and (note := default_runtime_note(m)):
        est = dataclasses.replace(est, notes=(note, *est.notes))
    plan = plan.with_estimate(est)
    if opts.trace:
        from exatrain.bench.traced import trace_mode, traced_estimate

        mode = trace_mode(opts.trace) or "fast"
        plan = plan.with_estimate(traced_estimate(plan, c, opts.progress, mode=mode))
    plan = with_time_to_train(plan, c, run)
    if opts.out is not None:
        plan.save(opts.out)
    return plan


def _budget(b: Budget, rank_by: str = "throughput"):
    """The run's options of a budget (``planner.time_to_train.run_options``), checked."""
    return run_options(
        b.tokens,
        b.gpu_hour_price,
        b.power_overhead,
        rank_by,
        node_mtbf_hours=b.node_mtbf_hours,
        checkpoint_bandwidth=b.checkpoint_bandwidth,
        restart_minutes=b.restart_minutes,
    )


def search(
    model: ModelQuery | str | ModelSpec | None = None,
    cluster: ClusterQuery | str | ClusterSpec | None = None,
    *,
    layout: Layout | None = None,
    settings: SettingsArg = None,
    engine: Engine | None = None,
    budget: Budget | None = None,
    options: PlanOptions | None = None,
    **pins: Any,
):
    """Every legal layout of the model on ``cluster.gpus`` devices at ``layout.global_batch``, those that fit ranked
    by predicted throughput (a SearchResult; ``ranked[0]`` is the best, with its estimate). Layout values pin a
    dimension. ``engine.runtime``: the engine that will run it — its memory decides what fits, its overlaps
    (``engine.overlap``, as for ``estimate``) and collectives the step time, its ZeRO stages are the candidates
    (None: as for ``estimate``, said in ``SearchResult.notes``). ``options``: ``top`` plans kept, ``out`` writes the
    best plan as JSON, ``from_file`` a launch (as for ``estimate``) whose values pin what it states, ``rank_by``:
    throughput, or days, gpu_hours or cost to train, with failures (``planner.time_to_train.rank``: on one GPU
    count and batch the same order, said in ``SearchResult.notes``), ``strict_memory`` drops the "tight" layouts
    (device capacity inside the band of measured peak memory), which are otherwise kept and marked (their
    estimate's ``memory_verdict``; ``SearchResult.tight`` counts them; planner/memory_band.py). ``budget``: each
    ranked plan carries ``time_to_train`` with its ``goodput`` (as for ``estimate``). No feasible layout is a
    UserError naming the constraint that removed the most. Every field may be given flat, as for ``estimate``."""
    given = dict(model=model, cluster=cluster, layout=layout, settings=settings, engine=engine, budget=budget)
    return search_request(plan_request("search", SEARCH_OPTIONS, pins, **given, options=options))


def search_request(r: PlanRequest):
    """``search`` of a whole request."""
    if r.options.from_file is not None:
        return search_request(with_launch(r, "search"))
    opts, lay, eng, gpus = r.options, r.layout, r.engine, r.cluster.gpus
    run = _budget(r.budget, opts.rank_by)
    if gpus is None or lay.global_batch is None:
        raise UserError("search needs --gpus and --global-batch")
    if opts.top < 1:
        raise UserError("--top must be at least 1")
    if eng.runtime is not None:  # fail before resolving anything (_runtime_for checks it all again for the model)
        check_runtime(eng.runtime, eng.overlap)
    if opts.out is not None:
        check_output_file(opts.out, "--out")
    options = space_options(**layout_values({**lay.values(), "settings": r.settings}))
    c = resolve_cluster(r.cluster.cluster, r.cluster.cluster_file, default=DEFAULT_CLUSTER)
    m = resolve_model(r.model.model, r.model.model_file, **r.model.shape())
    runtime, chosen = _runtime_for(eng.runtime, m, eng.overlap, r.settings, lay.dtype)
    c, params = calibrated(c, eng.calibration, runtime)
    from exatrain.planner.scaling import no_feasible_layout
    from exatrain.planner.search.search import search as run_search

    result = run_search(
        m,
        c,
        gpus,
        lay.global_batch,
        top=opts.top,
        options=options,
        params=params,
        dtype=lay.dtype or "bfloat16",
        runtime=runtime,
        overlap=eng.overlap,
        flash=True if lay.flash_attention is None else lay.flash_attention,
        strict_memory=bool(opts.strict_memory),
    )
    if not result.ranked:
        raise no_feasible_layout(result, gpus, c)
    if chosen and (note := default_runtime_note(m)):
        result.notes = (note, *result.notes)
    result.ranked, order = rank([with_time_to_train(p, c, run) for p in result.ranked], opts.rank_by)
    result.notes = (*result.notes, *((order,) if order else ()))
    if opts.out is not None:
        result.ranked[0].save(opts.out)
    return result


def scaling(
    model: ModelQuery | str | ModelSpec | None = None,
    cluster: ClusterQuery | str | ClusterSpec | None = None,
    *,
    layout: Layout | None = None,
    settings: SettingsArg = None,
    engine: Engine | None = None,
    budget: Budget | None = None,
    options: PlanOptions | None = None,
    **pins: Any,
):
    """Predicted weak (global batch grows with the GPU count) or strong (fixed global batch) scaling over
    ``cluster.gpus`` (increasing counts) as ``engine.runtime`` runs it: the best layout at each count (or the
    pinned one), its throughput and efficiency, and what a published study measured for this model and cluster (a
    ScalingResult). ``engine.runtime`` None: as for ``estimate`` (the title names it). ``options.mode``: weak or
    strong; ``options.strict_memory``: each count's search drops tight layouts too (as ``search``). ``budget``:
    each point's plan carries ``time_to_train`` (as for ``estimate``): where the GPU counts differ, so do days and
    GPU-hours. Every field may be given flat, as for ``estimate``."""
    given = dict(model=model, cluster=cluster, layout=layout, settings=settings, engine=engine, budget=budget)
    return scaling_request(plan_request("scaling", SCALING_OPTIONS, pins, **given, options=options))


def scaling_request(r: PlanRequest):
    """``scaling`` of a whole request."""
    lay, eng = r.layout, r.engine
    run = _budget(r.budget)
    if eng.runtime is not None:  # fail before resolving anything (_runtime_for checks it all again for the model)
        check_runtime(eng.runtime, eng.overlap)
    if lay.global_batch is None:
        raise UserError("scaling needs --global-batch (the batch at the first GPU count)")
    options = space_options(**layout_values({**lay.values(), "settings": r.settings}))
    c = resolve_cluster(r.cluster.cluster, r.cluster.cluster_file, default=DEFAULT_CLUSTER)
    m = resolve_model(r.model.model, r.model.model_file, **r.model.shape())
    runtime, _ = _runtime_for(eng.runtime, m, eng.overlap, r.settings, lay.dtype)
    c, params = calibrated(c, eng.calibration, runtime)
    from exatrain.planner.scaling import scaling as run_scaling

    result = run_scaling(
        m,
        c,
        list(r.cluster.gpus or ()),
        lay.global_batch,
        mode=r.options.mode,
        options=options,
        params=params,
        dtype=lay.dtype or "bfloat16",
        flash=True if lay.flash_attention is None else lay.flash_attention,
        runtime=runtime,
        overlap=eng.overlap,
        strict_memory=bool(r.options.strict_memory),
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
    "estimate_request",
    "scaling",
    "scaling_request",
    "search",
    "search_request",
]
