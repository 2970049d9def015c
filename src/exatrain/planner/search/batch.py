"""Evaluate every candidate of a Space at once: worst-stage memory and predicted step time.

The Space's arrays become ``Layouts`` and go through ``planner.evaluate``, the path
``estimate_plan`` takes with a single plan, so a candidate's numbers here are its estimate's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from exatrain.accounting.engines import resolve_settings
from exatrain.accounting.offload import host_fits
from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.settings import RECOMPUTE, SCHEDULES
from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.cost.step import TIME_FIELDS
from exatrain.planner.evaluate import MEMORY_FIELDS, layer_split
from exatrain.planner.evaluate import evaluate as evaluate_layouts
from exatrain.planner.layouts import Layouts
from exatrain.planner.search.space import RECOMPUTE_LAYERS_AUTO, Space

__all__ = ["BatchResult", "MEMORY_FIELDS", "TIME_FIELDS", "evaluate_space", "fit_recompute_layers", "layouts_of"]


@dataclass
class BatchResult:
    """Per candidate (aligned with the Space arrays)."""

    memory: dict[str, np.ndarray]  # worst stage's breakdown, bytes
    memory_total: np.ndarray
    fits: np.ndarray
    time: dict[str, np.ndarray]  # seconds
    tokens_per_s: np.ndarray
    model_tflops_per_gpu: np.ndarray
    recompute_layers: np.ndarray | None = None  # each candidate's (Layouts.recompute_layers)
    host_fits: np.ndarray | None = None  # where states are offloaded: whether a node's host memory holds them


def layouts_of(space: Space) -> Layouts:
    """The Space's candidates as Layouts (a candidate with pp = 1 runs no schedule: 1f1b, v 1)."""
    names = np.array([SCHEDULES.index(s) for s, _ in space.options.schedules], dtype=np.int64)
    vs = np.array([v for _, v in space.options.schedules], dtype=np.int64)
    one = space.pp == 1
    return Layouts.of(
        tp=space.tp,
        pp=space.pp,
        dp=space.dp,
        micro_batch=space.micro_batch,
        num_microbatches=space.num_microbatches,
        zero_stage=space.zero,
        recompute=space.recompute,
        sequence_parallel=space.sp,
        schedule=np.where(one, SCHEDULES.index("1f1b"), names[space.variant] if len(space) else 0),
        interleave=np.where(one, 1, vs[space.variant] if len(space) else 1),
        ep=space.ep,
        cp=space.cp,
        recompute_layers=max(space.options.recompute_layers, 0),
    )


def evaluate_space(
    space: Space,
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch: int,
    coeffs: CostParams,
    dtype: str = "bfloat16",
    flash: bool = True,
    runtime: str = "exatrain",
    time_if_fits: bool = False,
    overlap: str | None = None,
    fit_bytes: float | None = None,
    recompute_limit_bytes: float | None = None,
) -> BatchResult:
    """``runtime``: the engine that runs the candidates (``settings.RUNTIMES``), with the space's run
    settings (``SpaceOptions.settings``): its memory judges them and its overlaps time them (``planner.evaluate``).
    ``time_if_fits``: time only the candidates whose worst stage is at most ``fit_bytes`` (None: the capacity; NaN
    for the others). With ``space.options.recompute_layers`` RECOMPUTE_LAYERS_AUTO each full-recomputation candidate
    recomputes the fewest layers of each stage it needs to come under ``recompute_limit_bytes`` (None: the capacity;
    ``fit_recompute_layers``)."""
    o = space.options
    run = resolve_settings(o.settings.replace(runtime=runtime), model, dtype=dtype, flash=flash)
    kw = dict(global_batch=global_batch, memory=(runtime,), run=run, overlap=overlap)
    layouts = layouts_of(space)
    if o.recompute_layers == RECOMPUTE_LAYERS_AUTO:
        layouts = dataclasses.replace(
            layouts,
            recompute_layers=fit_recompute_layers(
                layouts, model, cluster, coeffs, limit_bytes=recompute_limit_bytes, **kw
            ),
        )
    ev = evaluate_layouts(layouts, model, cluster, coeffs, time_if_fits=time_if_fits, fit_bytes=fit_bytes, **kw)
    return BatchResult(
        memory=ev.memory[runtime],
        memory_total=ev.memory_total[runtime],
        fits=ev.fits,
        time=ev.time,
        tokens_per_s=ev.tokens_per_s,
        model_tflops_per_gpu=ev.model_tflops_per_gpu,
        recompute_layers=layouts.recompute_layers,
        host_fits=None if o.offload == "none" else host_fits(ev.host_bytes, cluster, layouts.gpus),
    )


def fit_recompute_layers(
    layouts: Layouts,
    model: ModelSpec,
    cluster: ClusterSpec,
    coeffs: CostParams,
    *,
    memory: tuple[str, ...],
    limit_bytes: float | None = None,
    **kw,
) -> np.ndarray:
    """Per layout, the fewest layers of each (virtual) stage a full recomputation must cover, the first ones
    (Megatron-Core's block method, ``Plan.recompute_layers``), for every rank to fit the device in ``memory[0]``'s
    count; 0 (every layer) where no fewer fit, or for a layout that does not recompute in full. A rank's memory is
    linear in the layers it reruns (``accounting.memory.rank_memory``: a rerun layer keeps its input, a kept one
    everything), so two counts — every layer, and one a stage — give each rank's line, and the smallest N whose
    line fits on every rank is read off it. ``limit_bytes``: what "fits" means (None: the device's capacity)."""
    out = np.zeros(len(layouts), dtype=np.int64)
    full = np.nonzero(layouts.recompute == RECOMPUTE.index("full"))[0]
    if not full.size:
        return out
    sub = layouts.take(full)
    totals = []
    for n in (0, 1):
        ev = evaluate_layouts(
            dataclasses.replace(sub, recompute_layers=np.full(len(sub), n)),
            model,
            cluster,
            coeffs,
            memory=memory,
            by_rank=True,
            time=False,
            **kw,
        )
        totals.append(sum(ev.by_rank[memory[0]][f] for f in MEMORY_FIELDS))
    every, one = totals
    capacity = cluster.device.hbm_bytes if limit_bytes is None else limit_bytes
    v_eff = np.where(sub.pp > 1, sub.interleave, 1)
    for pp, v in {(int(a), int(b)) for a, b in zip(sub.pp, v_eff)}:
        rows = np.nonzero((sub.pp == pp) & (v_eff == v))[0]
        split = layer_split(model, pp, v, sub.stage_layers)
        held = split.reshape(v, pp).sum(axis=0)  # each rank's layers
        ns = np.arange(1, int(split.max()) + 1)
        rerun = np.minimum(split[None, :], ns[:, None]).reshape(len(ns), v, pp).sum(axis=1)  # (N values, pp)
        per_layer = (one[rows, :pp] - every[rows, :pp]) / np.maximum(held - rerun[0], 1)  # bytes a rerun layer saves
        fits = ((every[rows, None, :pp] + (held - rerun)[None] * per_layer[:, None, :]) <= capacity).all(axis=2)
        first = ns[np.argmax(fits, axis=1)]
        out[full[rows]] = np.where(fits.any(axis=1) & (first < split.max()), first, 0)
    return out
