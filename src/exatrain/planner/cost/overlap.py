"""What the runtime (the engine that runs a plan) hides behind compute, and what it sends.

The planner predicts a plan as run by one engine (``Plan.runtime``, a profile of
``accounting.engines``). Two things of the step time depend on it:

* which communications overlap compute. A profile lists the overlaps the engine offers
  (``EngineProfile.overlaps``); ``--overlap all`` assumes every one of them is switched on, ``default``
  (and ``--overlap`` left unset, ``None``: the estimate then says so and its band reaches down to the
  every-overlap-on case, ``planner.estimate``) takes the engine's defaults, ``none`` none (the notes of an
  estimate name the switches), and each communication is hidden only behind the compute it can run beside,
  exposing the rest: ``exposed = max(0, comm - overlappable compute)``, so a step never gets
  shorter than its compute. What each overlap runs beside:

  - ``tp``: the GEMMs of the same layer (Megatron-Core --tp-comm-overlap, Transformer Engine
    userbuffers; torchtitan async TP: both split the sequence-parallel all-gather /
    reduce-scatter into chunks pipelined with the GEMM that consumes / produces them, so they need
    sequence parallelism: megatron/training/arguments.py refuses --tp-comm-overlap without
    --sequence-parallel; torch/distributed/_symmetric_memory fused_all_gather_matmul). Each
    collective runs beside the GEMM it feeds or drains only (the attention input's all-gather
    beside the input projections, the reduce-scatter beside the output projection, the MLP's beside
    fc1 / fc2), cut into tp chunks, so one chunk of the GEMM has nothing to hide
    (``cost.step.tp_overlap_exposed``): a small projection leaves part of its collective exposed
    even where the layer's GEMMs together outlast its communication;
  - ``dp_grad_reduce``: the backward of the remaining layers of the last micro-batch (bucketed
    reduction launched as buckets fill: Megatron-Core distributed_data_parallel_config.py
    overlap_grad_reduce, DeepSpeed zero overlap_comm, torch DDP/FSDP2);
  - ``dp_param_gather``: the forward (Megatron-Core overlap_param_gather: the distributed
    optimizer's all-gather of updated parameters runs under the next step's first forward;
    ZeRO-3/FSDP prefetch: each micro-batch's gathers run under its forward and backward; the
    backward's gathers and the gradient reduction travel over the same links, so together they hide
    behind the backward at most once: ``cost.step.step_times``);
  - ``pp_p2p``: with the interleaved schedule only (Megatron-Core overlap_p2p_comm,
    megatron/core/pipeline_parallel/schedules.py), a stage's send/receive under its next forward.
  - ``ep_a2a``: a MoE layer's dispatch and combine all-to-alls (forward and backward) under the
    compute of the MoE layers of another micro-batch, forward and backward (Megatron-Core
    --overlap-moe-expert-parallel-comm: the schedule runs one micro-batch's forward beside another's
    backward, layer by layer, and issues each one's all-to-all while the other computes;
    megatron/core/pipeline_parallel/combined_1f1b.py). Counted per stage as
    ``max(0, all-to-all - MoE layers' forward + backward)``; it needs a second micro-batch in flight,
    which every step with gradient accumulation or a pipeline has.

* what the data-parallel collectives carry. ``accounting.comms.dp_collectives_for`` counts
  exatrain's trainer (fp32 gradients all-reduced, ZeroRedundancyOptimizer broadcasting its fp32
  shard); the other engines reduce gradients in their gradient-accumulation dtype
  (``EngineProfile.grad_accum_dtype``: Megatron-Core fp32 unless --grad-reduce-in-bf16,
  DeepSpeed the model dtype, torchtitan mixed_precision_reduce fp32) and gather parameters in the
  compute dtype; their ZeRO-1 is a reduce-scatter of gradients and an all-gather of the updated
  16-bit parameters (Megatron-Core docs, 'Distributed Optimizer'; DeepSpeed stage_1_and_2.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from exatrain.accounting.comms import GRAD_BYTES, Collective
from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.accounting.engines import COMMS, EngineProfile, get_engine
from exatrain.errors import UserError


OVERLAP_CHOICES = ("all", "default", "none")  # or a comma-separated list of COMMS; None: not stated (its default)


def overlap_priced(on: str | None) -> str:
    """The ``--overlap`` value a run is priced with: what it states, or its engine's defaults where it states
    nothing (``None``): a setting left unstated is never assumed at its best case."""
    return "default" if on is None else on


@dataclass(frozen=True)
class OverlapRules:
    """Which communications a runtime hides, as booleans, and the switches that turn them on."""

    runtime: str
    tp: bool  # with sequence parallelism only
    dp_grad_reduce: bool
    dp_param_gather: bool
    pp_p2p: bool  # with the interleaved schedule only
    grad_reduce_needs_no_pipeline: bool  # exatrain: DDP's overlap runs only without a pipeline schedule
    ep_a2a: bool = False  # the expert all-to-alls under another micro-batch's MoE-layer compute
    tp_backward: bool = True  # the TP overlap also hides the backward's collectives (Overlap.passes)
    switches: tuple[str, ...] = ()  # the engine's switches of the overlaps that are on


def overlap_rules(engine: EngineProfile | str, on: str | None = None) -> OverlapRules:
    """The overlaps of ``engine`` (a profile or its name) that are on: ``all`` it offers (its
    switches assumed on), its ``default`` (``Overlap.default_on``; also ``None``, not stated), ``none``, or a
    comma-separated list of communications (``accounting.engines.COMMS``); one it cannot overlap is a UserError."""
    e = get_engine(engine) if isinstance(engine, str) else engine
    on = overlap_priced(on)
    offered = {o.comm: o for o in e.overlaps}
    if on == "all":
        chosen = set(offered)
    elif on == "default":
        chosen = {c for c, o in offered.items() if o.default_on}
    elif on == "none":
        chosen = set()
    else:
        chosen = {c.strip() for c in str(on).split(",") if c.strip()}
        bad = sorted(chosen - set(COMMS))
        if bad or not chosen:
            raise UserError(
                f"--overlap must be all, default, none or a comma-separated list of {', '.join(COMMS)}; got {on!r}"
            )
        missing = sorted(chosen - set(offered))
        if missing:
            raise UserError(
                f"runtime {e.name} cannot overlap {', '.join(missing)} (it overlaps {', '.join(offered) or 'nothing'})"
            )
    return OverlapRules(
        runtime=e.name,
        tp="tp" in chosen,
        dp_grad_reduce="dp_grad_reduce" in chosen,
        dp_param_gather="dp_param_gather" in chosen,
        pp_p2p="pp_p2p" in chosen,
        ep_a2a="ep_a2a" in chosen,
        tp_backward="tp" in offered and offered["tp"].passes == "both",
        # the exatrain profile's own words: "(ZeRO-0/1 without pipeline)"
        grad_reduce_needs_no_pipeline=e.name == "exatrain",
        switches=tuple(o.switch for c, o in offered.items() if c in chosen),
    )


def overlap_for(on: str | None, launch_blocking: bool) -> str | None:
    """The overlaps a run has on: ``on`` (``overlap_rules``' argument), or none where its kernel launches are
    synchronous (settings: launch_blocking), since each launch then waits for its kernel and no kernel runs beside
    another. ``planner.evaluate`` prices with it and ``planner.estimate`` notes it."""
    return "none" if launch_blocking else on


def exposed(comm_s, window_s):
    """The part of a communication its overlap window does not hide (never negative)."""
    return np.maximum(np.asarray(comm_s) - np.asarray(window_s), 0.0)


def is_gather(c: Collective) -> bool:
    """A parameter gather (ZeRO's broadcast / all-gather of weights) rather than a gradient reduction."""
    return c.kind in ("all_gather", "broadcast")


def engine_collectives(collectives, engine: EngineProfile, *, dtype: str) -> tuple[Collective, ...]:
    """``dp_collectives_for``'s collectives (exatrain's trainer) as ``engine`` sends them: gradients in
    its gradient-accumulation dtype, ZeRO-1 as reduce-scatter + all-gather of 16-bit parameters (see
    the module doc). The exatrain profile's are returned unchanged."""
    if engine.name == "exatrain":
        return tuple(collectives)
    accum = engine.accum_dtype(dtype)
    g = COMPUTE_BYTES[accum] / GRAD_BYTES
    out = []
    # ZeRO-1 reduce-scatters its gradients, unless the engine all-reduces them under this dtype
    # (EngineProfile.allreduce_grads_accum: DeepSpeed's BF16_Optimizer)
    zero1 = any(c.kind == "broadcast" for c in collectives) and accum not in engine.allreduce_grads_accum
    for c in collectives:
        if c.kind == "broadcast":  # ZeroRedundancyOptimizer's fp32 shard -> the updated compute-dtype weights
            out.append(replace(c, kind="all_gather", message_bytes=c.message_bytes * COMPUTE_BYTES[dtype] / 4))
        elif c.kind in ("all_reduce", "reduce_scatter"):
            kind = "reduce_scatter" if (zero1 and c.axis != "pp-ends" and c.kind == "all_reduce") else c.kind
            out.append(replace(c, kind=kind, message_bytes=c.message_bytes * g))
        else:
            out.append(c)
    return tuple(out)


def p2p_exposed(p2p_s, stage_fwd_s, *, rules: OverlapRules, interleaved):
    """One pipeline boundary transfer as the schedule sees it: under interleaving with P2P overlap,
    what the shortest virtual stage's forward does not hide; otherwise all of it."""
    p2p_s = np.asarray(p2p_s, dtype=float)
    if not rules.pp_p2p:
        return p2p_s
    return np.where(np.asarray(interleaved), exposed(p2p_s, np.min(stage_fwd_s, axis=1)), p2p_s)


__all__ = [
    "OVERLAP_CHOICES",
    "OverlapRules",
    "engine_collectives",
    "exposed",
    "is_gather",
    "overlap_for",
    "overlap_priced",
    "overlap_rules",
    "p2p_exposed",
]
