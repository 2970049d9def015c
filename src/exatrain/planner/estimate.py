"""One evaluation of one plan: memory per stage, FLOPs, communication bytes and (cost model) time.

This is the planner's single entry point for a plan; `exatrain estimate`, the trainer's CLI
(to attach a prediction to each run) and reports call it. Memory and time come from
``planner.evaluate`` with the plan as a batch of one: the very code the search runs on every
candidate, so a searched plan's estimate is what the search ranked it by.
"""

from __future__ import annotations

from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.studies import best_mfu_for
from exatrain.plan import MemoryBreakdown, Plan, StepEstimate, TimeBreakdown
from exatrain.accounting.engines import plan_run
from exatrain.accounting.flops import hardware_flops_per_step, model_flops_per_step
from exatrain.accounting.memory import logits_bytes_per_element
from exatrain.accounting.offload import host_fits
from exatrain.errors import UserError
from exatrain.accounting.params import stage_params, total_params
from exatrain.planner.cost.coefficients import CostParams, default_params
from exatrain.planner.cost.overlap import overlap_for, overlap_priced, overlap_rules
from exatrain.planner.cost.step import TIME_FIELDS
from exatrain.planner.band import with_band
from exatrain.planner.memory_band import with_memory_band
from exatrain.planner.memory_advice import memory_advice
from exatrain.planner.cost.fp8 import CAST_BYTES, fp8_speedup
from exatrain.planner.plan_cost import comm_bytes
from exatrain.planner.evaluate import MEMORY_FIELDS, evaluate, trainer_models_it
from exatrain.planner.layouts import Layouts
from exatrain.planner.estimate_notes import NoteFacts, estimate_notes


def estimate_plan(
    plan: Plan, cluster: ClusterSpec, params: CostParams | None = None, overlap: str | None = None
) -> StepEstimate:
    """Memory of every stage, the counts of one optimizer step, and the predicted step time of
    ``plan`` on ``cluster`` as its runtime (``plan.runtime``) runs it. ``params`` are the cost
    model's efficiencies (default: the device's prior, or what a calibration file measured);
    ``overlap``: which of the runtime's overlaps are on (``cost.overlap.overlap_rules``); None (not stated): the
    runtime's defaults, said in the notes, with the band reaching down to every overlap on (``_best_case``)."""
    coeffs = params or default_params(cluster.device.name)
    rt, run = plan.runtime, plan_run(plan)
    if plan.offload != "none" and cluster.host_memory_bytes is None:
        raise UserError(
            f"--offload {plan.offload}: cluster {cluster.name} states no host memory per node; describe "
            "it in a --cluster-file with host_memory_bytes and host_link_bytes_per_s"
        )
    memory = (rt,) if rt == "exatrain" else (rt, "exatrain")
    layouts = Layouts.from_plan(plan)
    kw = dict(global_batch=plan.global_batch, run=run, memory=memory, by_rank=True, overlap=overlap)
    ev = evaluate(layouts, plan.model, cluster, coeffs, **kw)
    by_stage, trainer_by_stage = _stages(ev, rt, plan.pp), _stages(ev, "exatrain", plan.pp)
    worst_rank = int(ev.worst_rank[rt][0])
    worst = by_stage[worst_rank]
    own = trainer_models_it(plan.model, plan.ep, plan.cp, plan.fp8)
    time_s = TimeBreakdown(**{k: float(ev.time[k][0]) for k in TIME_FIELDS})
    best_s = _best_case(plan, cluster, coeffs, run, overlap, float(ev.time["step"][0]))
    facts = _note_facts(plan, run, cluster, coeffs, ev, overlap, best_s, own, time_s)
    host_ok = facts.host is None or facts.host[2]
    host_memory = _host_memory(facts.host, cluster)
    est = StepEstimate(
        params=total_params(plan.model),
        params_by_stage=stage_params(plan),
        memory_bytes=worst,
        memory_by_stage=by_stage,
        trainer_memory_bytes=trainer_by_stage[int(ev.worst_rank["exatrain"][0])] if own else None,
        trainer_memory_by_stage=trainer_by_stage if own else (),
        capacity_bytes=cluster.device.hbm_bytes,
        fits=worst.total <= cluster.device.hbm_bytes,
        comm_bytes=comm_bytes(plan),
        time_s=time_s,
        tokens_per_s=plan.tokens_per_step / time_s.step,
        notes=estimate_notes(facts),
        memory_advice=memory_advice(plan, cluster, coeffs, worst=(worst_rank, worst)),
        **_throughput(plan, cluster, time_s),
    )
    banded = with_memory_band(with_band(est, plan, cluster, coeffs, best_s=best_s), plan, cluster)
    refused = {} if host_ok else {"fits": False, "memory_verdict": "does not fit"}
    return banded.replace(host_memory=host_memory, **refused)


def _host_memory(host, cluster: ClusterSpec) -> dict | None:
    """An offloaded plan's host memory per node against its capacity (StepEstimate.host_memory); else None."""
    if host is None:
        return None
    return {"bytes_per_node": host[0], "capacity_bytes": cluster.host_memory_bytes, "fits": host[2]}


def _stages(ev, memory: str, pp: int) -> tuple[MemoryBreakdown, ...]:
    """Each pipeline rank's memory under ``memory``'s model (a runtime, or "exatrain" for the trainer's)."""
    parts = ev.by_rank[memory]
    return tuple(MemoryBreakdown(*(float(parts[f][0, r]) for f in MEMORY_FIELDS)) for r in range(pp))


def _note_facts(plan, run, cluster, coeffs, ev, stated, best_s, own, time_s) -> NoteFacts:
    """What the estimate's notes read (``estimate_notes.NoteFacts``)."""
    overlap = overlap_priced(overlap_for(stated, plan.launch_blocking))  # as evaluate priced it
    host = None
    if plan.offload != "none":
        per_node = float(ev.host_bytes[0]) * min(plan.gpus, cluster.gpus_per_node)
        fits = bool(host_fits(float(ev.host_bytes[0]), cluster, plan.gpus))
        host = (per_node, {k: float(v[0]) for k, v in ev.offload_parts.items()}, fits)
    return NoteFacts(
        plan=plan,
        run=run,
        cluster=cluster,
        coeffs=coeffs,
        overlap=overlap,
        stated=stated,
        rules=overlap_rules(run.engine, overlap),
        hidden={k: float(v[0]) for k, v in ev.hidden.items()},
        best_s=best_s,
        own=own,
        logits_bytes=logits_bytes_per_element(run.cross_entropy, plan.dtype, plan.tp),
        fp8_speedup=fp8_speedup(cluster, plan.dtype, coeffs) if plan.fp8 else None,
        cast_bytes=CAST_BYTES[plan.fp8] if plan.fp8 else 0.0,
        time_s=time_s,
        host=host,
    )


def _throughput(plan: Plan, cluster: ClusterSpec, time_s: TimeBreakdown) -> dict:
    """The FLOPs of a step and the rates and utilisations they make in ``time_s`` (StepEstimate's fields)."""
    model_flops = model_flops_per_step(plan.model, plan.global_batch)
    rerun_share = sum(plan.recomputed_layers_of_rank(r) for r in range(plan.pp)) / plan.model.layers
    hw_flops = hardware_flops_per_step(
        plan.model,
        plan.global_batch,
        plan.recompute,
        plan.recompute_modules,
        rerun_share=rerun_share if plan.recompute == "full" else 1.0,
    )
    model_tf = model_flops / time_s.step / plan.gpus / 1e12
    hw_tf = hw_flops / time_s.step / plan.gpus / 1e12
    peak = cluster.device.peak_flops(plan.dtype)
    mfu = None if peak is None else model_tf * 1e12 / peak
    return dict(
        model_flops_per_step=model_flops,
        hardware_flops_per_step=hw_flops,
        model_tflops_per_gpu=model_tf,
        mfu=mfu,
        hardware_tflops_per_gpu=hw_tf,
        hfu=None if peak is None else hw_tf * 1e12 / peak,
        mfu_above_published=mfu_above_published(
            cluster.device.name, bool(plan.fp8), model_tf * 1e12 / peak if peak else None
        ),
    )


def mfu_above_published(device: str, fp8: bool, mfu: float | None) -> dict | None:
    """The best published MFU of the device's class and precision (``catalog.studies.best_mfu_for``) where ``mfu``
    is above it, as a dict (mfu, run, source, text); else None: a prediction above every run ever published on such
    a device is more likely optimistic than a record."""
    best = best_mfu_for(device, fp8) if mfu is not None else None
    if best is None or mfu <= best.mfu:
        return None
    text = (
        f"predicted MFU {mfu:.1%} is above the highest published for {device} in "
        f"{best.precision} training, {best.mfu:.1%} ({best.run}; {best.source})"
    )
    return {"mfu": best.mfu, "precision": best.precision, "run": best.run, "source": best.source, "text": text}


def _best_case(
    plan: Plan, cluster: ClusterSpec, coeffs: CostParams, run, stated: str | None, step_s: float
) -> float | None:
    """The step time with every overlap the runtime offers on, where the run states none (``stated`` None) and that
    is faster than its defaults; else None. A setting left unstated is priced at its engine's default and the band
    carries the spread to the best case, rather than the best case taken silently."""
    if stated is not None or plan.launch_blocking:
        return None
    if overlap_rules(run.engine, "all").switches == overlap_rules(run.engine, "default").switches:
        return None  # its defaults are every overlap it offers
    ev = evaluate(
        Layouts.from_plan(plan),
        plan.model,
        cluster,
        coeffs,
        global_batch=plan.global_batch,
        run=run,
        memory=(),
        overlap="all",
    )
    best = float(ev.time["step"][0])
    return best if best <= step_s * (1 - 1e-9) else None
