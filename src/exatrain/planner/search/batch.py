"""Evaluate every candidate of a Space at once: worst-stage memory and predicted step time.

The Space's arrays become ``Layouts`` and go through ``planner.evaluate``, the path
``estimate_plan`` takes with a single plan, so a candidate's numbers here are its estimate's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.plan import SCHEDULES
from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.cost.experts import moe_load
from exatrain.planner.cost.step import TIME_FIELDS
from exatrain.planner.evaluate import MEMORY_FIELDS
from exatrain.planner.evaluate import evaluate as evaluate_layouts
from exatrain.planner.layouts import Layouts
from exatrain.planner.search.space import Space

__all__ = ["BatchResult", "MEMORY_FIELDS", "TIME_FIELDS", "evaluate", "layouts_of"]


@dataclass
class BatchResult:
    """Per candidate (aligned with the Space arrays)."""

    memory: dict[str, np.ndarray]  # worst stage's breakdown, bytes
    memory_total: np.ndarray
    fits: np.ndarray
    time: dict[str, np.ndarray]  # seconds
    tokens_per_s: np.ndarray
    model_tflops_per_gpu: np.ndarray


def layouts_of(space: Space) -> Layouts:
    """The Space's candidates as Layouts (a candidate with pp = 1 runs no schedule: 1f1b, v 1)."""
    names = np.array([SCHEDULES.index(s) for s, _ in space.options.schedules], dtype=np.int64)
    vs = np.array([v for _, v in space.options.schedules], dtype=np.int64)
    one = space.pp == 1
    return Layouts.of(tp=space.tp, pp=space.pp, dp=space.dp, micro_batch=space.micro_batch,
                      num_microbatches=space.num_microbatches, zero_stage=space.zero, recompute=space.recompute,
                      sequence_parallel=space.sp,
                      schedule=np.where(one, SCHEDULES.index("1f1b"), names[space.variant] if len(space) else 0),
                      interleave=np.where(one, 1, vs[space.variant] if len(space) else 1), ep=space.ep, cp=space.cp,
                      fp8=space.options.fp8)


def evaluate(space: Space, model: ModelSpec, cluster: ClusterSpec, global_batch: int, cp: CostParams,
             dtype: str = "bfloat16", flash: bool = True, runtime: str = "exatrain",
             time_if_fits: bool = False, overlap: str = "all") -> BatchResult:
    """``runtime``: the engine that runs the candidates (``accounting.engines.ENGINE_NAMES``): its
    memory judges them and its overlaps time them (``planner.evaluate``). ``time_if_fits``: time only
    the candidates that fit (NaN for the others)."""
    ev = evaluate_layouts(layouts_of(space), model, cluster, cp, global_batch=global_batch, dtype=dtype,
                          flash=flash, memory=(runtime,), time_if_fits=time_if_fits, runtime=runtime,
                          overlap=overlap, moe_dispatcher=space.options.moe_dispatcher,
                          attention_kernel=space.options.attention_kernel,
                          elementwise=space.options.elementwise,
                          moe_load=moe_load(space.options.moe_capacity_factor, space.options.moe_force_balance),
                          fp8_param_gather=space.options.fp8_param_gather,
                          cross_entropy=space.options.cross_entropy, grad_accum=space.options.grad_accum,
                grad_accum_fusion=space.options.grad_accum_fusion, adam_kernel=space.options.adam_kernel,
                cp_comm=space.options.cp_comm, recompute_modules=space.options.recompute_modules,
                recompute_layers=space.options.recompute_layers, recompute_every=space.options.recompute_every)
    return BatchResult(memory=ev.memory[runtime], memory_total=ev.memory_total[runtime], fits=ev.fits,
                       time=ev.time, tokens_per_s=ev.tokens_per_s, model_tflops_per_gpu=ev.model_tflops_per_gpu)
