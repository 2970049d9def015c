"""Per-rank memory of every pipeline stage: model states, activations, buffers.

Byte convention (the trainer's, PyTorch-native mixed precision; Adam):

==========  =======================================  ================  ================
ZeRO stage  weights (bytes/param)                    gradients         optimizer (m, v)
==========  =======================================  ================  ================
0 (DDP)     4 fp32 + 2 16-bit compute copy           4 fp32            8 fp32
1           4 + 2                                    4                 8 / dp
2 (FSDP2)   4 / dp + 2 (unsharded copy kept fwd→bwd) 4 / dp            8 / dp
3 (FSDP2)   4 / dp + 16-bit copies of 2 layers       4 / dp (+1 layer) 8 / dp
==========  =======================================  ================  ================

The fp32 weights are Adam's master weights, so "model states" (weights + optimizer) come to
14 bytes/param at ZeRO-0 — Rajbhandari et al. 2020's mixed-precision Adam (2 + 4 + 8) — plus 4 bytes
of fp32 gradients. In float32 training there is no 16-bit copy (4 + 4 + 8 = 16 bytes/param).

Activations follow Korthikanti et al. 2022 Table 2, generalised to GQA, SwiGLU, no dropout and
fused (flash) attention; ``korthikanti_layer_activation_bytes`` reproduces the table itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.plan import MemoryBreakdown, Plan
from exatrain.accounting.inflight import peak_in_flight_fast
from exatrain.accounting.params import layer_params, stage_params, total_params

# Fraction of the rest added as "other": allocator fragmentation and caching slack (a stated
# allowance, not a measurement: PyTorch's caching allocator typically reserves 5-10% above the peak).
FRAGMENTATION_ALLOWANCE = 0.05
COMPUTE_BYTES = {"bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class StateBytesPerParam:
    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def state_bytes_per_param(dtype: str, zero_stage: int, dp: int) -> StateBytesPerParam:
    """Bytes per parameter of weights / gradients / optimizer states (table in the module doc).
    ZeRO-3's gathered layers are added by ``stage_memory`` (they depend on layer size)."""
    copy16 = 2.0 if dtype == "bfloat16" else 0.0
    if zero_stage == 0:
        return StateBytesPerParam(4.0 + copy16, 4.0, 8.0)
    if zero_stage == 1:
        return StateBytesPerParam(4.0 + copy16, 4.0, 8.0 / dp)
    if zero_stage == 2:
        # FSDP2 with reshard_after_forward=False keeps the unsharded compute copy from forward to
        # backward: a 16-bit copy in mixed precision, a separate fp32 buffer in float32 training.
        return StateBytesPerParam(4.0 / dp + (copy16 or 4.0), 4.0 / dp, 8.0 / dp)
    return StateBytesPerParam(4.0 / dp, 4.0 / dp, 8.0 / dp)


def korthikanti_layer_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, *,
                                       sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Activation bytes of one transformer layer, 16-bit, exactly Korthikanti et al. 2022 Table 2."""
    if recompute == "full":
        return 2.0 * s * b * h / (t if sequence_parallel else 1)
    scores = 0.0 if recompute == "selective" else 5.0 * a * s / h
    if sequence_parallel:
        return s * b * h * (34.0 + scores) / t
    return s * b * h * (10.0 + 24.0 / t + scores / t)


def layer_activation_bytes(m: ModelSpec, micro_batch: int, tp: int, *, sequence_parallel: bool,
                           recompute: str, flash: bool, dtype: str = "bfloat16",
                           dropout: bool | None = None) -> float:
    """Activation bytes one layer keeps for backward, per micro-batch, on one tp rank.

    Tensor by tensor as Korthikanti Table 2 counts them, with e = bytes per activation element:
      replicated over tp (sharded with SP): two norm inputs, QKV input, MLP input (4h elements)
        + two dropout masks (1 byte each, only with dropout);
      sharded over tp: Q (h), K and V (kv_hidden each), projection input (h), MLP interior
        (GELU: fc1 output and fc2 input, 2f; SwiGLU: gate, silu(gate), up and their product, 4f);
      attention scores, per head and key (a*s per token, sharded): 2e + 1 bytes with dropout
        (Korthikanti's 5), e without; a flash kernel stores none, only fp32 softmax statistics.
    With dropout, GELU, MHA, no flash and e = 2 this is Table 2 exactly (tested).
    """
    s, b, h = m.seq_len, micro_batch, m.hidden
    e = COMPUTE_BYTES[dtype]
    if dropout is None:
        dropout = m.dropout > 0
    sp_div = tp if sequence_parallel else 1
    if recompute == "full":
        return e * s * b * h / sp_div  # only the layer input is kept
    replicated = (4 * h * e + (2 * h if dropout else 0)) / sp_div
    mlp_interior = (4 if m.gated_mlp else 2) * m.ffn_hidden
    sharded = (2 * h + 2 * m.kv_hidden + mlp_interior) * e / tp
    if recompute == "selective":
        scores = 0.0
    elif flash:
        scores = 4.0 * m.heads / tp  # fp32 log-sum-exp per head and query
    else:
        scores = (2 * e + 1 if dropout else e) * m.heads * s / tp
    return s * b * (replicated + sharded + scores)


def inflight_microbatches(plan: Plan, pp_rank: int) -> float:
    """Micro-batches whose activations one rank holds at its peak, in units of that rank's whole
    share of layers (so interleaved schedules can give fractions). See ``inflight``."""
    return float(inflight(plan.schedule, plan.pp, plan.num_microbatches, plan.interleave, pp_rank))


def inflight(schedule: str, pp, num_microbatches, interleave, pp_rank):
    """``inflight_microbatches`` on plain numbers or numpy arrays (the search's batch path).

    The schedule simulator's peak count of (micro-batch, virtual stage) activation sets a rank holds,
    divided by v: GPipe holds all m; 1F1B's rank r min(p - r, m) (Narayanan et al. 2021 Sec. 2.2.1);
    interleaved 1F1B's rank 0 p(1 + (p-1)/(pv)) stage-units (Korthikanti et al. 2022 Sec. 4.2.3);
    zero bubble p, as ZB-H1 is designed to hold (Qi et al. 2023). See cost.schedule.
    """
    held = peak_in_flight_fast(pp=pp, num_microbatches=num_microbatches, schedule=schedule,
                               interleave=interleave, rank=pp_rank)
    return np.where(np.asarray(pp) == 1, 1.0, held / np.asarray(interleave, dtype=float))


def stage_memory(plan: Plan, pp_rank: int) -> MemoryBreakdown:
    """Peak bytes of one rank of pipeline stage ``pp_rank`` (see the module doc for conventions)."""
    layers_here = sum(plan.layers_per_stage()[v] for v in plan.stages_of_rank(pp_rank))
    parts = rank_memory(plan.model, dtype=plan.dtype, zero_stage=plan.zero_stage, recompute=plan.recompute,
                        sequence_parallel=plan.sequence_parallel, flash=plan.flash_attention,
                        tp=plan.tp, dp=plan.dp, micro_batch=plan.micro_batch, pp=plan.pp,
                        interleave=plan.interleave, params_here=stage_params(plan)[pp_rank],
                        layers_here=layers_here,
                        inflight_mb=inflight_microbatches(plan, pp_rank),
                        is_last=pp_rank == plan.pp - 1)
    return MemoryBreakdown(*(float(x) for x in parts))


def rank_memory(m: ModelSpec, *, dtype: str, zero_stage: int, recompute: str, sequence_parallel: bool,
                flash: bool, tp, dp, micro_batch, pp, interleave, params_here, layers_here, inflight_mb,
                is_last):
    """(weights, gradients, optimizer, activations, other) bytes of one rank. Categorical options
    are scalars; every size may be a numpy array (one entry per candidate plan)."""
    tp, dp, b, pp, v = (np.asarray(x, dtype=float) for x in (tp, dp, micro_batch, pp, interleave))
    is_last = np.asarray(is_last, dtype=float)
    e = COMPUTE_BYTES[dtype]
    per = state_bytes_per_param(dtype, zero_stage, dp)
    weights, grads, optim = params_here * per.weights, params_here * per.gradients, params_here * per.optimizer
    if zero_stage == 3:
        # FSDP2 gathers one layer while prefetching the next, and holds one layer's unsharded
        # gradient until its reduce-scatter.
        lp = layer_params(m)
        layer_rank_params = lp.sharded / tp + lp.replicated
        weights = weights + 2 * layer_rank_params * (e if dtype == "bfloat16" else 4)
        grads = grads + layer_rank_params * 4
    kw = dict(sequence_parallel=sequence_parallel, flash=flash, dtype=dtype)
    per_layer = layer_activation_bytes(m, b, tp, recompute=recompute, **kw)
    acts = per_layer * layers_here * inflight_mb
    if recompute != "none":
        # Backward recomputes one layer at a time, holding what that layer would have kept
        # without recomputation for one micro-batch (minus what selective already keeps).
        full_layer = layer_activation_bytes(m, b, tp, recompute="none", **kw)
        acts = acts + full_layer - (per_layer if recompute == "selective" else 0.0)
    tokens = b * m.seq_len
    sp_div = tp if sequence_parallel else 1.0
    # Last stage: final-norm and head inputs per in-flight micro-batch; the logits of one
    # micro-batch in the compute dtype, their fp32 copy for the loss, and its fp32 gradient.
    acts = acts + is_last * (2 * e * tokens * m.hidden / sp_div * inflight_mb
                             + tokens * m.vocab / tp * (e + 4 + 4))
    # Pipeline receive buffers: one activation and one gradient per virtual stage boundary.
    p2p = np.where(pp > 1, 2 * e * tokens * m.hidden / sp_div * v, 0.0)
    other = p2p + FRAGMENTATION_ALLOWANCE * (weights + grads + optim + acts + p2p)
    return weights, grads, optim, acts, other


def memory_by_stage(plan: Plan) -> tuple[MemoryBreakdown, ...]:
    return tuple(stage_memory(plan, r) for r in range(plan.pp))


def model_state_bytes(plan: Plan) -> float:
    """Weights + optimizer states of the whole job (all ranks), the "model states" of the study."""
    per = state_bytes_per_param(plan.dtype, 0, 1)
    return total_params(plan.model) * (per.weights + per.optimizer)
