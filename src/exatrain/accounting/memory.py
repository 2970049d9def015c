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

Mixture of experts, context parallelism and fp8 (``accounting.moe``, ``accounting.context``,
``accounting.fp8``) enter through keyword arguments of ``layer_activation_bytes`` and
``rank_memory`` (``ep``, ``etp``, ``cp``, ``capacity_factor``, ``fp8`` ...); at their defaults a dense
model's numbers are the ones above, bit for bit.

A plan that keeps model states in host memory (``run.settings.offload``) holds on the GPU what is left once
``accounting.offload`` has moved them (with an engine profile; the host's share is ``planner.evaluate``'s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.plan import MemoryBreakdown, Plan
from exatrain.settings import HALF_DTYPES, SCHEDULES
from exatrain.accounting.inflight import group_sizes, peak_in_flight_fast, schedule_codes
from exatrain.accounting.params import layer_params, stage_layer_kinds, stage_params, stage_params_split, total_params
from exatrain.accounting.engines import EngineProfile, Resolved
from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.accounting.fp8 import Fp8Recipe, gemms_per_layer
from exatrain.accounting.fp8 import gemm_weights as fp8_gemm_weights
from exatrain.accounting import moe as moe_acc
from exatrain.accounting.context import cp_buffer_bytes, kv_width
from exatrain.accounting.moe import dispatch_buffer_bytes, expert_dp
from exatrain.accounting.offload import offloaded

# Engines whose embedding applies dropout outside every activation checkpoint, keeping its 1-byte mask per element
# of the embedding's output for each micro-batch in flight on the first stage (``rank_memory``): Megatron's
# embedding_dropout (hidden_dropout) in megatron/core/models/common/embeddings/language_model_embedding.py (after
# the scatter to the sequence-parallel region) and Megatron-DeepSpeed's Embedding (megatron/model/language_model.py),
# which DeepSpeed's PipelineModule leaves out of its checkpoints (``_is_checkpointable``: transformer layers only).
EMBEDDING_DROPOUT_ENGINES = ("megatron-core", "megatron-deepspeed")

# Fraction of the rest added as "other": allocator fragmentation and caching slack (a stated
# allowance, not a measurement: PyTorch's caching allocator typically reserves 5-10% above the peak).
FRAGMENTATION_ALLOWANCE = 0.05


@dataclass(frozen=True)
class EngineSaves:
    """How an engine's layer saves two of its tensors for backward (``layer_activation_bytes``): the attention's and
    the MLP's inputs all-gathered over tp under sequence parallelism (``gathered_inputs``), and a SwiGLU's input
    alone, its output recomputed (``glu_saves_input``)."""

    gathered_inputs: bool = False
    glu_saves_input: bool = False


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
    copy16 = 2.0 if dtype in HALF_DTYPES else 0.0
    if zero_stage == 0:
        return StateBytesPerParam(4.0 + copy16, 4.0, 8.0)
    if zero_stage == 1:
        return StateBytesPerParam(4.0 + copy16, 4.0, 8.0 / dp)
    if zero_stage == 2:
        # FSDP2 with reshard_after_forward=False keeps the unsharded compute copy from forward to
        # backward: a 16-bit copy in mixed precision, a separate fp32 buffer in float32 training.
        return StateBytesPerParam(4.0 / dp + (copy16 or 4.0), 4.0 / dp, 8.0 / dp)
    return StateBytesPerParam(4.0 / dp, 4.0 / dp, 8.0 / dp)


def logits_bytes_per_element(cross_entropy: str, dtype: str, tp=1):
    """Bytes the loss holds per logit element of a rank (its vocabulary shard) at its peak
    (settings.CROSS_ENTROPY), the rest of the step's activations still held beside it:
      "upcast", torch's cross_entropy(logits.float()): the forward holds the e-byte logits, their fp32 copy
        and its fp32 log-softmax (saved for backward); the backward holds the saved log-softmax, the
        incoming fp32 gradient and the outgoing one, 12 bytes, the larger (for e <= 4). On logits
        sharded over the vocabulary (tp > 1: torch's ``loss_parallel``, which torchtitan and the trainer
        run) the backward is written out in eager ops (torch/distributed/tensor/parallel/loss.py
        ``_nll_loss_and_log_softmax_backward``: (zeros + exp(log-softmax)) x grad): the saved
        log-softmax, the zeros, the exponential and their sum, 16 bytes (traced by
        tests/helpers/loss_peak_trace.py: 16.1 a logit of a shard, 12.0 of whole logits);
      "inplace", Megatron's vocab-parallel loss: the logits and one fp32 copy, which becomes the softmax and
        then the gradient in place (no copy where the logits are fp32 already): e + 4, or 4;
      "fused", one compiled kernel: the e-byte logits (and a log-sum-exp per token) and their e-byte
        gradient, 2e.
    ``tp`` may be a numpy array (the search's batch path); the result is then one too."""
    e = COMPUTE_BYTES[dtype]
    if cross_entropy == "fused":
        return 2.0 * e
    if cross_entropy == "inplace":
        return e + 4.0 if e < 4 else 4.0
    if cross_entropy == "upcast":
        held = np.where(np.asarray(tp) > 1, 16.0, max(e + 4.0 + 4.0, 12.0))
        return float(held) if held.ndim == 0 else held
    raise ValueError(f"unknown cross-entropy {cross_entropy!r}")


def korthikanti_layer_activation_bytes(
    s: int, b: int, h: int, a: int, t: int = 1, *, sequence_parallel: bool = False, recompute: str = "none"
) -> float:
    """Activation bytes of one transformer layer, 16-bit, exactly Korthikanti et al. 2022 Table 2."""
    if recompute == "full":
        return 2.0 * s * b * h / (t if sequence_parallel else 1)
    scores = 0.0 if recompute == "selective" else 5.0 * a * s / h
    if sequence_parallel:
        return s * b * h * (34.0 + scores) / t
    return s * b * h * (10.0 + 24.0 / t + scores / t)


def layer_activation_bytes(
    m: ModelSpec,
    micro_batch,
    tp,
    *,
    sequence_parallel: bool,
    recompute: str,
    flash: bool,
    dtype: str = "bfloat16",
    dropout: bool | None = None,
    cp=1,
    moe: bool | None = None,
    etp=1,
    capacity_factor=1.0,
    fp8: Fp8Recipe | None = None,
    recompute_modules: tuple[str, ...] = (),
    saves: EngineSaves | None = None,
) -> float:
    """Activation bytes one layer keeps for backward, per micro-batch, on one tp rank.

    Tensor by tensor as Korthikanti Table 2 counts them, with e = bytes per activation element:
      replicated over tp (sharded with SP): two norm inputs, QKV input, MLP input (4h elements)
        + two dropout masks (1 byte each, only with dropout);
      sharded over tp: Q (h), K and V (kv_hidden each), projection input (h), MLP interior
        (GELU: fc1 output and fc2 input, 2f; SwiGLU: gate, silu(gate), up and their product, 4f);
      attention scores, per head and key (a*s per token, sharded): 2e + 1 bytes with dropout
        (Korthikanti's 5), e without; a flash kernel stores none, only fp32 softmax statistics.
    With dropout, GELU, MHA, no flash and e = 2 this is Table 2 exactly (tested).

    Extensions (their defaults change nothing):
      ``cp``: a rank holds s/cp tokens of every tensor (the score matrix still spans all s keys);
      head width / QK-norm (Q is heads*head_dim wide; QK-norm keeps Q and K before their norms too);
        latent attention keeps Q and K (heads*(head_dim + rope_head_dim)), V and the attention
        output (heads*head_dim) sharded, and its latents (q_lora + kv_lora, and their pre-norm
        copies with the rotary key part) replicated like the layer's input — an approximation of
        Megatron-Core's MLA, which keeps a few more small tensors;
      ``moe`` (None: the model's MoE layer when it has one): the MLP interior is the shared experts'
        (sharded over tp) plus the routed experts' and the router's (``accounting.moe``, with
        ``etp`` and ``capacity_factor``);
      ``fp8``: the GEMM inputs kept for the weight gradients (attention input, MLA latents,
        projection input, MLP input and fc2 input; the routed experts' fc1/fc2 inputs) are saved
        in fp8 (``Fp8Recipe.saved_input_bytes``). A MoE layer's MLP input stays in the compute dtype
        for the router's backward;
      ``saves`` (``EngineSaves``; None: neither), how the engine saves two tensors:
      ``glu_saves_input``: a dense layer's SwiGLU runs as one fused function that saves only its input, the
        fc1 output (gate and up, 2f), and recomputes silu(gate) in its backward, so the MLP interior is 3f (with
        fc2's input) instead of 4f (Megatron-Core's bias_swiglu_impl, on unless --no-bias-swiglu-fusion:
        megatron/core/fusions/fused_bias_swiglu.py SwiGLUFunction.forward saves ``input`` alone;
        ``ActivationRules.glu``);
      ``gathered_inputs``: under sequence parallelism the attention's and the MLP's inputs are kept
        all-gathered over tp (whole sequence) rather than as this rank's shard (DTensor's
        PrepareModuleInput to Replicate: torchtitan, ``EngineProfile.sp_gathered_layer_inputs``; Megatron
        saves the shard and gathers it again in backward);
      ``recompute_modules`` (with ``recompute`` "selective"; settings.RECOMPUTE_MODULES, Megatron-Core's): what the
        layer no longer keeps is the nothing-recomputed count less, per token, "core_attn" the attention scores
        (the selective count), "layernorm" the outputs of the norms that stand alone (a MoE layer's MLP input, in
        the compute dtype; latent attention's input, a GEMM input), "mla_up_proj" Q, K and V (the up-projections'
        and rotary's outputs, which the attention kernel saved: output-discarding checkpointing frees them),
        "mlp" a dense layer's MLP input and interior (its checkpoint keeps the residual stream, counted as the
        norm's input), "shared_experts" the shared experts' interior, "moe_act" each routed copy's activation
        beyond its input (``moe.expert_activation_bytes``), "moe" everything the MoE layer keeps past its input
        (router, routed copies, shared experts).
    """
    s, b, h = m.seq_len, micro_batch, m.hidden
    s_local = s / cp
    gathered_inputs, glu_saves_input = (saves.gathered_inputs, saves.glu_saves_input) if saves else (False, False)
    e = COMPUTE_BYTES[dtype]
    if dropout is None:
        dropout = m.dropout > 0
    moe = m.is_moe if moe is None else (moe and m.is_moe)
    sp_div = tp if sequence_parallel else 1
    if recompute == "full":
        return e * s_local * b * h / sp_div  # only the layer input is kept
    modules = recompute_modules if recompute == "selective" else ()
    if recompute == "selective" and (not modules or "core_attn" in modules):
        scores = 0.0
    elif flash:
        scores = 4.0 * m.heads / tp  # fp32 log-sum-exp per head and query
    else:
        scores = (2 * e + 1 if dropout else e) * m.heads * s / tp
    g = e if fp8 is None else fp8.saved_input_bytes
    in_div = 1 if gathered_inputs else sp_div  # the attention's and the MLP's inputs (whole sequence if gathered)
    if not (m.kv_channels or m.qk_norm or m.mla or moe):
        replicated = (2 * h * e + (2 * h if dropout else 0)) / sp_div + 2 * h * e / in_div
        mlp_interior = ((3 if glu_saves_input else 4) if m.gated_mlp else 2) * m.ffn_hidden
        sharded = (2 * h + 2 * m.kv_hidden + mlp_interior) * e / tp
        kept = s_local * b * (replicated + sharded + scores)
        if "mlp" in modules:  # the MLP's input and interior (fc2's input in fp8 under FP8 GEMMs, below)
            kept = kept - s_local * b * (h * e / in_div + mlp_interior * e / tp)
        if fp8 is None:
            return kept
        # attention and MLP inputs (replicated), projection and fc2 inputs (sharded) go to fp8
        held = 0 if "mlp" in modules else h / in_div + m.ffn_hidden / tp
        return kept - s_local * b * (e - g) * (h / in_div + h / tp + held)
    latents = 2 * (m.q_lora_rank + m.kv_lora_rank) + m.rope_head_dim if m.mla else 0
    fp8_replicated = h + (m.q_lora_rank + m.kv_lora_rank) + (0 if moe else h)  # GEMM inputs among those
    replicated = ((4 * h + latents) * e - fp8_replicated * (e - g) + (2 * h if dropout else 0)) / sp_div
    if gathered_inputs:  # the attention's input (and a dense MLP's) kept whole: h (and h) more than its shard
        inputs = h * g + (0 if moe else h * g)
        replicated = replicated + inputs * (1 - 1 / sp_div)
    attn = m.q_width + kv_width(m) + m.attn_out_width + (m.q_width + m.kv_hidden if m.qk_norm else 0)
    if moe:
        interior, fc2_in = moe_acc.shared_expert_interior_elements(m), m.shared_experts * m.expert_width
    else:
        interior, fc2_in = ((3 if glu_saves_input else 4) if m.gated_mlp else 2) * m.ffn_hidden, m.ffn_hidden
    sharded = ((attn + interior) * e - (m.attn_out_width + fc2_in) * (e - g)) / tp
    kept = s_local * b * (replicated + sharded + scores)
    if modules:
        drop = 0.0
        if "layernorm" in modules:  # the stand-alone norms' outputs (module doc)
            drop = drop + (h * e / sp_div if moe else 0.0) + (h * g / in_div if m.mla else 0.0)
        if "mla_up_proj" in modules and m.mla:
            drop = drop + (m.q_width + kv_width(m)) * e / tp
        if "mlp" in modules and not moe:
            drop = drop + h * g / in_div + (interior * e - fc2_in * (e - g)) / tp
        if moe and ("shared_experts" in modules or "moe" in modules):
            drop = drop + (interior * e - fc2_in * (e - g)) / tp
        kept = kept - s_local * b * drop
    if moe and "moe" not in modules:
        kept = kept + moe_acc.router_activation_bytes(m, b, tp, sequence_parallel=sequence_parallel, cp=cp)
        kept = kept + moe_acc.expert_activation_bytes(
            m,
            b,
            tp,
            sequence_parallel=sequence_parallel,
            dtype=dtype,
            cp=cp,
            etp=etp,
            capacity_factor=capacity_factor,
            gemm_input_bytes=g,
            act_recompute="moe_act" in modules,
        )
    return kept


def per_op_checkpoint_layer_bytes(
    m: ModelSpec, micro_batch, tp, *, sequence_parallel: bool, flash: bool, dtype: str = "bfloat16"
):
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


def engine_layer_activation_bytes(
    engine: EngineProfile,
    m: ModelSpec,
    micro_batch,
    tp,
    *,
    sequence_parallel: bool,
    recompute: str,
    flash: bool,
    dtype: str = "bfloat16",
    **extensions,
):
    """``layer_activation_bytes`` under ``engine``'s rules: dropout masks only where the engine keeps
    them (and the model has dropout); its own selective recomputation where it differs.
    ``extensions`` (cp, moe, etp, capacity_factor, fp8) go to ``layer_activation_bytes``; torchtitan's
    per-op selective policy is modelled for dense layers (with cp and FP8 GEMMs too); for a MoE layer
    selective recomputation falls back to the Korthikanti count."""
    rules = engine.activations
    dense = not (m.is_moe and extensions.get("moe", True) is not False)
    if recompute == "selective" and rules.selective == "per_op" and dense:
        # FP8 GEMMs leave the saved matmul outputs in the compute dtype (torchao float8 linear returns
        # them in it), so the per-op count holds; context parallelism gives each rank s/cp tokens.
        cp = np.asarray(extensions.get("cp", 1), dtype=float)
        return (
            per_op_checkpoint_layer_bytes(
                m, micro_batch, tp, sequence_parallel=sequence_parallel, flash=flash, dtype=dtype
            )
            / cp
        )
    return layer_activation_bytes(
        m,
        micro_batch,
        tp,
        sequence_parallel=sequence_parallel,
        recompute=recompute,
        flash=flash,
        dtype=dtype,
        dropout=rules.dropout_masks and m.dropout > 0,
        saves=EngineSaves(engine.sp_gathered_layer_inputs, rules.glu == "fused"),
        **extensions,
    )


@dataclass(frozen=True)
class RankCounts:
    """What one rank of a pipeline stage holds (numbers, or numpy arrays, one entry per layout): its parameters
    outside the routed experts and its routed experts' (``params.stage_params_split`` with ep), its layers and
    the MoE layers among them, the micro-batches whose activations it holds at its peak (``inflight``), whether
    it is the last (the head and the loss) and the first (the embedding; None: when pp == 1) stage; the part of
    its stage's unsharded gradient alive at once (``unsharded_grad_share``); and under full recomputation the
    layers of it that recomputation covers (Plan.recompute_layers, recompute_every: ``settings.full_rerun_layers``;
    None: all of them)."""

    params_here: Any
    layers_here: Any
    inflight_mb: Any
    is_last: Any
    expert_params_here: Any = 0
    moe_layers_here: Any = 0
    is_first: Any = None
    pp_grad_share: Any = 1.0
    recomputed_here: Any = None


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
    held = peak_in_flight_fast(
        pp=pp, num_microbatches=num_microbatches, schedule=schedule, interleave=interleave, rank=pp_rank
    )
    return np.where(np.asarray(pp) == 1, 1.0, held / np.asarray(interleave, dtype=float))


def stage_memory(plan: Plan, pp_rank: int, engine: EngineProfile | None = None) -> MemoryBreakdown:
    """Peak bytes of one rank of pipeline stage ``pp_rank`` (see the module doc for conventions;
    ``engine``: another engine's, see ``accounting.engines``). A MoE model is counted with its
    experts whole on every rank (ep is counted by ``rank_memory``, the path estimates take)."""
    layers_here = sum(plan.layers_per_stage()[v] for v in plan.stages_of_rank(pp_rank))
    moe = {}
    if plan.model.is_moe:
        split = stage_params_split(
            plan.model,
            tp=plan.tp,
            pp=plan.pp,
            interleave=plan.interleave,
            layers_per_stage=plan.layers_per_stage(),
            v_shape=plan.v_shape,
        )
        kinds = stage_layer_kinds(
            plan.model,
            pp=plan.pp,
            interleave=plan.interleave,
            layers_per_stage=plan.layers_per_stage(),
            v_shape=plan.v_shape,
        )
        params_here = split[pp_rank][0]
        moe = dict(expert_params_here=split[pp_rank][1], moe_layers_here=kinds[pp_rank][1])
    else:
        params_here = stage_params(plan)[pp_rank]
    # the convention's (or the engine's) count of the plan's loss and selective recomputation; no cp, ep, FP8
    loss = engine.cross_entropy(plan.cross_entropy, plan.elementwise) if engine is not None else plan.cross_entropy
    run = Resolved(
        dtype=plan.dtype,
        flash=plan.flash_attention,
        engine=engine,
        cross_entropy=loss or "upcast",
        recompute_modules=plan.recompute_modules,
        moe_load=1.0,
    )
    rank = RankCounts(
        params_here=params_here,
        layers_here=layers_here,
        inflight_mb=inflight_microbatches(plan, pp_rank),
        is_last=pp_rank == plan.rank_of_stage(plan.virtual_stages - 1),
        is_first=pp_rank == plan.rank_of_stage(0),
        recomputed_here=(
            plan.recomputed_layers_of_rank(pp_rank) if plan.recompute_layers or plan.recompute_every else None
        ),
        pp_grad_share=float(unsharded_grad_share(plan.schedule, plan.pp, plan.num_microbatches, plan.interleave)),
        **moe,
    )
    parts = rank_memory(
        plan.model,
        run,
        zero_stage=plan.zero_stage,
        recompute=plan.recompute,
        sequence_parallel=plan.sequence_parallel,
        tp=plan.tp,
        dp=plan.dp,
        micro_batch=plan.micro_batch,
        pp=plan.pp,
        interleave=plan.interleave,
        rank=rank,
    )
    return MemoryBreakdown(*(float(x) for x in parts))


def rank_memory(
    m: ModelSpec,
    run: Resolved,
    *,
    zero_stage: int,
    recompute: str,
    sequence_parallel: bool,
    tp,
    dp,
    micro_batch,
    pp,
    interleave,
    rank: RankCounts,
    cp=1,
    ep=1,
    etp=1,
):
    """(weights, gradients, optimizer, activations, other) bytes of one rank. Categorical options
    are scalars; every size may be a numpy array (one entry per candidate plan).

    ``run``: the run as its runtime runs it (``accounting.engines.Resolved``): its dtype, flash attention, and
    ``run.engine``, whose count it is (that engine's model states by ZeRO stage, its ZeRO-3 working set, bucket
    buffers, allocator allowance and activation rules; None: this module's own convention, equal to the
    ``exatrain`` profile's). ``rank``: what the rank holds (``RankCounts``).

    Extensions (defaults: none, and then the result is the dense count exactly):
      ``cp``: context parallelism — activations, logits and pipeline buffers per rank divided by cp,
        the attention's K,V working set (``accounting.context.cp_buffer_bytes``, ``run.cp_comm``) in
        "other", and the model states sharded over dp*cp (the gradients of ranks holding the same
        weights are reduced over the data-parallel group with context parallelism:
        Megatron-Core parallel_state, ``get_data_parallel_group(with_context_parallel=True)``);
      MoE (``accounting.moe``): ``params_here`` is the rank's non-routed-expert parameters and
        ``expert_params_here`` its routed-expert ones (``params.stage_params_split``), whose states
        are sharded over the expert-data-parallel group ``expert_dp(tp, dp, ep, etp, cp)``;
        ``moe_layers_here`` of the ``layers_here`` layers are MoE layers (their activations with
        ``etp`` and the routing load ``run.moe_load``), and one all-to-all's buffers join "other";
      ``run.fp8_recipe``: the cached fp8 weights (``Fp8Recipe.weight_bytes_per_param`` per GEMM weight here;
        under ZeRO-3 only the gathered layers') join the weights, GEMM inputs are saved in fp8, and delayed scaling's
        amax histories join "other". The two transient working sets (CP's and the all-to-all's) belong to different
        parts of a layer, so the larger of them is counted.
    ``run.cross_entropy``: how the last stage's loss holds its logits (``logits_bytes_per_element``);
    ``rank.pp_grad_share``: the part of a stage's unsharded gradient (EngineProfile.pp_unsharded_grad_bytes) alive
    at once (``unsharded_grad_share``); ``run.recompute_modules``: what selective recomputation reruns
    (Plan.recompute_modules, ``layer_activation_bytes``); ``rank.recomputed_here``: under full recomputation, the
    layers of the rank it covers, the others keeping everything (None: all its layers); MoE layers among them in
    the rank's proportion.
    """
    dtype, flash, engine, fp8 = run.dtype, run.flash, run.engine, run.fp8_recipe
    capacity_factor, cp_comm, cross_entropy = run.moe_load, run.cp_comm, run.cross_entropy
    params_here, layers_here, inflight_mb = rank.params_here, rank.layers_here, rank.inflight_mb
    expert_params_here, moe_layers_here = rank.expert_params_here, rank.moe_layers_here
    pp_grad_share, recomputed_here = rank.pp_grad_share, rank.recomputed_here
    tp, dp, b, pp, v = (np.asarray(x, dtype=float) for x in (tp, dp, micro_batch, pp, interleave))
    is_last = np.asarray(rank.is_last, dtype=float)
    e = COMPUTE_BYTES[dtype]
    shard_dp = dp * cp
    ext = dict(cp=cp, etp=etp, capacity_factor=capacity_factor, fp8=fp8, recompute_modules=tuple(run.recompute_modules))
    if engine is None:
        per = state_bytes_per_param(dtype, zero_stage, shard_dp)
        per_weights, per_grads, per_optim = per.weights, per.gradients, per.optimizer
        gathered_layers, prefetch_elements, unsharded_grad_bytes = 2, 0.0, 4.0
        buffers, allowance = 0.0, FRAGMENTATION_ALLOWANCE

        def state_bytes(degree):
            st = state_bytes_per_param(dtype, zero_stage, degree)
            return st.weights, st.gradients, st.optimizer

        def layer_bytes(mode: str, moe: bool = False):
            return layer_activation_bytes(
                m, b, tp, recompute=mode, sequence_parallel=sequence_parallel, flash=flash, dtype=dtype, moe=moe, **ext
            )
    else:
        per_weights, per_grads, per_optim = engine.state_bytes(dtype, zero_stage, shard_dp)
        gathered_layers = engine.zero3_gathered_layers
        prefetch_elements, unsharded_grad_bytes = engine.zero3_prefetch_elements, engine.zero3_unsharded_grad_bytes
        buffers, allowance = engine.buffer_bytes(dtype, zero_stage), engine.allocator_allowance

        def state_bytes(degree):
            return engine.state_bytes(dtype, zero_stage, degree)

        def layer_bytes(mode: str, moe: bool = False):
            return engine_layer_activation_bytes(
                engine,
                m,
                b,
                tp,
                recompute=mode,
                sequence_parallel=sequence_parallel,
                flash=flash,
                dtype=dtype,
                moe=moe,
                **ext,
            )

    weights, grads, optim = params_here * per_weights, params_here * per_grads, params_here * per_optim
    if m.is_moe:
        ew, eg, eo = state_bytes(expert_dp(tp, dp, ep, etp, cp))
        weights, grads, optim = (
            weights + expert_params_here * ew,
            grads + expert_params_here * eg,
            optim + expert_params_here * eo,
        )
    offload = run.settings.offload
    if engine is not None and offload != "none":  # what leaves the GPU for host memory (accounting.offload)
        rule = engine.state_rule(dtype, zero_stage)
        for n, degree in (
            (params_here, shard_dp),
            *(((expert_params_here, expert_dp(tp, dp, ep, etp, cp)),) if m.is_moe else ()),
        ):
            moved = offloaded(offload, rule, dtype, degree)
            weights, grads, optim = (
                weights - n * moved.weights,
                grads - n * moved.gradients,
                optim - n * moved.optimizer,
            )
    # Under a pipeline schedule an engine may hold the stage's whole gradient unsharded until the last
    # micro-batch's backward (EngineProfile.pp_unsharded_grad_bytes: torchtitan's FSDP2 stages).
    pp_grad = (engine.pp_unsharded_grad_bytes if engine is not None and zero_stage >= 2 else 0.0) * (pp > 1)
    if zero_stage == 3:
        # FSDP2 gathers one layer while prefetching the next, and holds one layer's unsharded
        # gradient until its reduce-scatter (DeepSpeed's ZeRO-3: one layer and a prefetch bucket).
        lp = layer_params(m)
        layer_rank_params = lp.sharded / tp + lp.replicated
        if m.is_moe:
            layer_rank_params = layer_rank_params + lp.experts / (np.asarray(ep, dtype=float) * etp)
        weights = weights + gathered_layers * layer_rank_params * e
        if prefetch_elements:
            weights = weights + prefetch_elements * e
        # (a stage holding its whole unsharded gradient holds this layer's within it)
        grads = grads + np.where(pp_grad > 0, 0.0, layer_rank_params * unsharded_grad_bytes)
    if zero_stage >= 2:
        grads = grads + pp_grad * pp_grad_share * (params_here + (expert_params_here if m.is_moe else 0.0))
    partial = recompute == "full" and recomputed_here is not None
    if partial:  # the rerun layers keep their input, the others everything (the rank's mix of MoE layers in each)
        share = np.asarray(recomputed_here, dtype=float) / np.maximum(np.asarray(layers_here, dtype=float), 1.0)
    if m.is_moe:
        moe_here = np.asarray(moe_layers_here, dtype=float)
        per_dense, per_moe = layer_bytes(recompute), layer_bytes(recompute, True)
        if partial:
            per_dense = share * per_dense + (1 - share) * layer_bytes("none")
            per_moe = share * per_moe + (1 - share) * layer_bytes("none", True)
        acts = (per_dense * (layers_here - moe_here) + per_moe * moe_here) * inflight_mb
        if recompute != "none":
            # the recomputed layer's working set: the larger kind present on this rank
            full_layer = np.where(moe_here > 0, layer_bytes("none", True), layer_bytes("none"))
            kept = np.where(moe_here > 0, per_moe, per_dense)
            acts = acts + full_layer - (kept if recompute == "selective" else 0.0)
    else:
        per_layer = layer_bytes(recompute)
        if partial:
            per_layer = share * per_layer + (1 - share) * layer_bytes("none")
        acts = per_layer * layers_here * inflight_mb
        if recompute != "none":
            # Backward recomputes one layer at a time, holding what that layer would have kept
            # without recomputation for one micro-batch (minus what selective already keeps).
            full_layer = layer_bytes("none")
            acts = acts + full_layer - (per_layer if recompute == "selective" else 0.0)
    tokens = b * m.seq_len / cp
    sp_div = tp if sequence_parallel else 1.0
    # Last stage: final-norm and head inputs per in-flight micro-batch (the head's whole sequence where the
    # engine keeps it all-gathered under sequence parallelism, EngineProfile.sp_gathered_head_input, as the
    # trainer's DTensor head does); the logits of one micro-batch as the loss holds them at its peak
    # (logits_bytes_per_element).
    head_div = 1.0 if engine is None or engine.sp_gathered_head_input else sp_div
    acts = acts + is_last * (
        (e * tokens * m.hidden / sp_div + e * tokens * m.hidden / head_div) * inflight_mb
        + tokens * m.vocab / tp * logits_bytes_per_element(cross_entropy, dtype, tp)
    )
    if engine is not None and engine.name in EMBEDDING_DROPOUT_ENGINES and m.dropout > 0:
        # the first stage's embedding-dropout masks, 1 byte an element, one per micro-batch in flight
        first = (pp == 1).astype(float) if rank.is_first is None else np.asarray(rank.is_first, dtype=float)
        acts = acts + first * tokens * m.hidden / sp_div * inflight_mb
    # Pipeline receive buffers: one activation and one gradient per virtual stage boundary.
    p2p = np.where(pp > 1, 2 * e * tokens * m.hidden / sp_div * v, 0.0)
    if buffers:  # communication-bucket buffers the engine keeps for the whole run
        p2p = p2p + buffers
    working = _working_set_bytes(
        m,
        b,
        tp,
        dtype=dtype,
        sequence_parallel=sequence_parallel,
        cp=cp,
        etp=etp,
        capacity_factor=capacity_factor,
        cp_comm=cp_comm,
        moe_layers_here=moe_layers_here,
    )
    if working is not None:
        p2p = p2p + working
    if fp8 is not None:
        dense_here = layers_here - (moe_layers_here if m.is_moe else 0)
        gemm_w = dense_here * fp8_gemm_weights(m, False, tp)
        n_gemms = dense_here * gemms_per_layer(m, False)
        if m.is_moe:
            ep_ = np.asarray(ep, dtype=float)
            gemm_w = gemm_w + moe_layers_here * fp8_gemm_weights(m, True, tp, ep_, etp)
            n_gemms = n_gemms + moe_layers_here * gemms_per_layer(m, True, ep_)
        if zero_stage == 3:
            # Sharded weights (FSDP / ZeRO-3) are cast to fp8 as each layer is gathered (torchtitan's
            # float8 all-gather, torchao float8/fsdp_utils.py); no whole-stage fp8 copy is cached, only
            # the gathered layers' (the ZeRO-3 working set).
            gemm_w = gemm_w * np.minimum(1.0, gathered_layers / np.maximum(layers_here, 1))
        weights = weights + gemm_w * fp8.weight_bytes_per_param(dtype)
        p2p = p2p + fp8.meta_bytes(n_gemms)
    other = p2p + allowance * (weights + grads + optim + acts + p2p)
    return weights, grads, optim, acts, other


def _working_set_bytes(
    m: ModelSpec, b, tp, *, dtype, sequence_parallel, cp, etp, capacity_factor, cp_comm, moe_layers_here
):
    """The larger of CP's attention working set and one all-to-all's buffers (None when neither)."""
    parts = []
    if np.any(np.asarray(cp) != 1):
        parts.append(cp_buffer_bytes(m, b, tp, cp, dtype=dtype, comm=cp_comm))
    if m.is_moe:
        a2a = dispatch_buffer_bytes(
            m, b, tp, sequence_parallel=sequence_parallel, dtype=dtype, cp=cp, etp=etp, capacity_factor=capacity_factor
        )
        parts.append(np.where(np.asarray(moe_layers_here) > 0, a2a, 0.0))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else np.maximum(parts[0], parts[1])


def unsharded_grad_share(schedule, pp, num_microbatches, interleave):
    """The part of a rank's stage gradient held unsharded at once where an engine accumulates it so over a
    pipeline schedule (EngineProfile.pp_unsharded_grad_bytes) and reduce-scatters each virtual stage's after
    that stage's last backward: one virtual stage's, 1/v, under the interleaved schedule when its micro-batches
    make one interleaving group (``inflight.group_size``: m <= pp, or no divisor of m between pp and m;
    every backward of virtual stage v-1, then all of v-2, ...: ``cost.schedule.rank_order``), else all of
    it (the groups alternate the virtual stages). Arrays allowed."""
    v = np.asarray(interleave, dtype=float)
    m, p = np.asarray(num_microbatches), np.asarray(pp)
    code = schedule_codes(schedule, np.broadcast_shapes(v.shape, m.shape, p.shape, np.shape(schedule)))
    one_round = (code == SCHEDULES.index("interleaved")) & (v > 1) & (group_sizes(p, m) >= m)
    return np.where(one_round, 1.0 / np.maximum(v, 1.0), 1.0)


def memory_by_stage(plan: Plan, engine: EngineProfile | None = None) -> tuple[MemoryBreakdown, ...]:
    return tuple(stage_memory(plan, r, engine) for r in range(plan.pp))


def model_state_bytes(plan: Plan) -> float:
    """Weights + optimizer states of the whole job (all ranks), the "model states" of the study."""
    per = state_bytes_per_param(plan.dtype, 0, 1)
    return total_params(plan.model) * (per.weights + per.optimizer)
