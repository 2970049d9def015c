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

Other engines keep other copies (``accounting.engines``): pass ``engine=`` to ``rank_memory``,
``stage_memory`` or ``memory_by_stage`` for Megatron-Core's, Megatron-DeepSpeed's or torchtitan's
model states, bucket buffers, dropout masks and selective recomputation. Without it (the default)
the numbers are the convention above, which is the ``exatrain`` profile's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.plan import MemoryBreakdown, Plan
from exatrain.accounting.inflight import peak_in_flight_fast
from exatrain.accounting.params import layer_params, stage_params, total_params
from exatrain.accounting.engines import EngineProfile

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


def per_op_checkpoint_layer_bytes(m: ModelSpec, micro_batch, tp, *, sequence_parallel: bool, flash: bool,
                                  dtype: str = "bfloat16"):
    """Activation bytes one layer keeps under torchtitan's per-op selective checkpointing, per
    micro-batch, on one tp rank (torchtitan/distributed/activation_checkpoint.py, op policy).

    The policy saves the outputs of matmuls, attention kernels and reduce-scatters and recomputes
    everything else (norms, activation functions, products), except that every second matmul is
    recomputed too, counted across calls: with an odd number of matmuls per layer the saved half
    alternates between steps, so the larger half is the peak. Kept per token, e bytes per element:
      the layer input (the checkpoint's input; 1/tp of it under sequence parallelism);
      the attention output (h/tp) and, for a flash kernel, fp32 log-sum-exp per head, or the s x s
        probabilities of the math kernel;
      the saved matmul outputs, in forward order q, k, v, o, then gate, up, down (SwiGLU) or fc1,
        fc2: column-parallel outputs are 1/tp wide, row-parallel ones (o, down/fc2) are the full-width
        partial sums before their reduction;
      under sequence parallelism, the two reduce-scatter outputs (h/tp each).
    Dropout has no place here: torchtitan's models have none."""
    s, h = m.seq_len, m.hidden
    b = np.asarray(micro_batch, dtype=float)
    t = np.asarray(tp, dtype=float)
    e = COMPUTE_BYTES[dtype]
    sp_div = t if sequence_parallel else 1.0
    f, kv = m.ffn_hidden, m.kv_hidden
    mlp = [f / t, f / t, h + 0 * t] if m.gated_mlp else [f / t, h + 0 * t]
    widths = [h / t, kv / t, kv / t, h + 0 * t] + mlp
    first, second = sum(widths[0::2]), sum(widths[1::2])
    saved = first if len(widths) % 2 == 0 else np.maximum(first, second)
    attention = e * h / t + (4.0 * m.heads / t if flash else e * m.heads * s / t)
    reduce_scatter = 2 * e * h / t if sequence_parallel else 0.0
    return s * b * (e * h / sp_div + attention + e * saved + reduce_scatter)


def engine_layer_activation_bytes(engine: EngineProfile, m: ModelSpec, micro_batch, tp, *, sequence_parallel: bool,
                                  recompute: str, flash: bool, dtype: str = "bfloat16"):
    """``layer_activation_bytes`` under ``engine``'s rules: dropout masks only where the engine keeps
    them (and the model has dropout); its own selective recomputation where it differs."""
    rules = engine.activations
    if recompute == "selective" and rules.selective == "per_op":
        return per_op_checkpoint_layer_bytes(m, micro_batch, tp, sequence_parallel=sequence_parallel, flash=flash,
                                             dtype=dtype)
    return layer_activation_bytes(m, micro_batch, tp, sequence_parallel=sequence_parallel, recompute=recompute,
                                  flash=flash, dtype=dtype, dropout=rules.dropout_masks and m.dropout > 0)


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


def stage_memory(plan: Plan, pp_rank: int, engine: EngineProfile | None = None) -> MemoryBreakdown:
    """Peak bytes of one rank of pipeline stage ``pp_rank`` (see the module doc for conventions;
    ``engine``: another engine's, see ``accounting.engines``)."""
    layers_here = sum(plan.layers_per_stage()[v] for v in plan.stages_of_rank(pp_rank))
    parts = rank_memory(plan.model, dtype=plan.dtype, zero_stage=plan.zero_stage, recompute=plan.recompute,
                        sequence_parallel=plan.sequence_parallel, flash=plan.flash_attention,
                        tp=plan.tp, dp=plan.dp, micro_batch=plan.micro_batch, pp=plan.pp,
                        interleave=plan.interleave, params_here=stage_params(plan)[pp_rank],
                        layers_here=layers_here,
                        inflight_mb=inflight_microbatches(plan, pp_rank),
                        is_last=pp_rank == plan.pp - 1, engine=engine)
    return MemoryBreakdown(*(float(x) for x in parts))


def rank_memory(m: ModelSpec, *, dtype: str, zero_stage: int, recompute: str, sequence_parallel: bool,
                flash: bool, tp, dp, micro_batch, pp, interleave, params_here, layers_here, inflight_mb,
                is_last, engine: EngineProfile | None = None):
    """(weights, gradients, optimizer, activations, other) bytes of one rank. Categorical options
    are scalars; every size may be a numpy array (one entry per candidate plan).

    ``engine``: count what that engine keeps (its model states by ZeRO stage, its ZeRO-3 working
    set, bucket buffers, allocator allowance and activation rules); None is this module's own
    convention (equal to the ``exatrain`` profile's)."""
    tp, dp, b, pp, v = (np.asarray(x, dtype=float) for x in (tp, dp, micro_batch, pp, interleave))
    is_last = np.asarray(is_last, dtype=float)
    e = COMPUTE_BYTES[dtype]
    if engine is None:
        per = state_bytes_per_param(dtype, zero_stage, dp)
        per_weights, per_grads, per_optim = per.weights, per.gradients, per.optimizer
        gathered_layers, prefetch_elements, unsharded_grad_bytes = 2, 0.0, 4.0
        buffers, allowance = 0.0, FRAGMENTATION_ALLOWANCE

        def layer_bytes(mode: str):
            return layer_activation_bytes(m, b, tp, recompute=mode, sequence_parallel=sequence_parallel, flash=flash,
                                          dtype=dtype)
    else:
        per_weights, per_grads, per_optim = engine.state_bytes(dtype, zero_stage, dp)
        gathered_layers = engine.zero3_gathered_layers
        prefetch_elements, unsharded_grad_bytes = engine.zero3_prefetch_elements, engine.zero3_unsharded_grad_bytes
        buffers, allowance = engine.buffer_bytes(dtype, zero_stage), engine.allocator_allowance

        def layer_bytes(mode: str):
            return engine_layer_activation_bytes(engine, m, b, tp, recompute=mode, sequence_parallel=sequence_parallel,
                                                 flash=flash, dtype=dtype)
    weights, grads, optim = params_here * per_weights, params_here * per_grads, params_here * per_optim
    if zero_stage == 3:
        # FSDP2 gathers one layer while prefetching the next, and holds one layer's unsharded
        # gradient until its reduce-scatter (DeepSpeed's ZeRO-3: one layer and a prefetch bucket).
        lp = layer_params(m)
        layer_rank_params = lp.sharded / tp + lp.replicated
        weights = weights + gathered_layers * layer_rank_params * e
        if prefetch_elements:
            weights = weights + prefetch_elements * e
        grads = grads + layer_rank_params * unsharded_grad_bytes
    per_layer = layer_bytes(recompute)
    acts = per_layer * layers_here * inflight_mb
    if recompute != "none":
        # Backward recomputes one layer at a time, holding what that layer would have kept
        # without recomputation for one micro-batch (minus what selective already keeps).
        full_layer = layer_bytes("none")
        acts = acts + full_layer - (per_layer if recompute == "selective" else 0.0)
    tokens = b * m.seq_len
    sp_div = tp if sequence_parallel else 1.0
    # Last stage: final-norm and head inputs per in-flight micro-batch; the logits of one
    # micro-batch in the compute dtype, their fp32 copy for the loss, and its fp32 gradient.
    acts = acts + is_last * (2 * e * tokens * m.hidden / sp_div * inflight_mb
                             + tokens * m.vocab / tp * (e + 4 + 4))
    # Pipeline receive buffers: one activation and one gradient per virtual stage boundary.
    p2p = np.where(pp > 1, 2 * e * tokens * m.hidden / sp_div * v, 0.0)
    if buffers:  # communication-bucket buffers the engine keeps for the whole run
        p2p = p2p + buffers
    other = p2p + allowance * (weights + grads + optim + acts + p2p)
    return weights, grads, optim, acts, other


def memory_by_stage(plan: Plan, engine: EngineProfile | None = None) -> tuple[MemoryBreakdown, ...]:
    return tuple(stage_memory(plan, r, engine) for r in range(plan.pp))


def model_state_bytes(plan: Plan) -> float:
    """Weights + optimizer states of the whole job (all ranks), the "model states" of the study."""
    per = state_bytes_per_param(plan.dtype, 0, 1)
    return total_params(plan.model) * (per.weights + per.optimizer)
