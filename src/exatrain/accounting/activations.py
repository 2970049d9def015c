"""What one transformer layer keeps for backward, per micro-batch, on one tp rank, and what the loss holds.

``layer_activation_bytes`` counts tensor by tensor as Korthikanti et al. 2022 Table 2 does
(``korthikanti_layer_activation_bytes`` reproduces the table itself), with e = bytes per activation element:
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

``engine_layer_activation_bytes`` applies an engine's rules (``accounting.engines.ActivationRules``) and torchtitan's
per-op selective checkpointing (``per_op_checkpoint_layer_bytes``); ``logits_bytes_per_element`` is the loss's
hold on the logits. ``accounting.memory`` adds these up over a rank's layers and micro-batches in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.accounting.engines import EngineProfile
from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.accounting.fp8 import Fp8Recipe
from exatrain.accounting import moe as moe_acc
from exatrain.accounting.context import kv_width


@dataclass(frozen=True)
class EngineSaves:
    """How an engine's layer saves two of its tensors for backward (``layer_activation_bytes``): the attention's and
    the MLP's inputs all-gathered over tp under sequence parallelism (``gathered_inputs``), and a SwiGLU's input
    alone, its output recomputed (``glu_saves_input``)."""

    gathered_inputs: bool = False
    glu_saves_input: bool = False


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
    """Activation bytes one layer keeps for backward, per micro-batch, on one tp rank: the module doc's count,
    tensor by tensor, with its extensions (their defaults change nothing)."""
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
    k = _PerToken(
        e=e,
        g=e if fp8 is None else fp8.saved_input_bytes,
        tp=tp,
        sp_div=sp_div,
        in_div=1 if gathered_inputs else sp_div,  # the attention's and the MLP's inputs (whole if gathered)
        scores=scores,
        modules=modules,
        glu_saves_input=glu_saves_input,
        gathered_inputs=gathered_inputs,
        dropout=dropout,
        moe=moe,
        fp8=fp8 is not None,
    )
    if not (m.kv_channels or m.qk_norm or m.mla or moe):
        return _plain_layer_bytes(m, k, s_local * b)
    kept = _general_layer_bytes(m, k, s_local * b)
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
            gemm_input_bytes=k.g,
            act_recompute="moe_act" in modules,
        )
    return kept


@dataclass(frozen=True)
class _PerToken:
    """What a layer's per-token count reads (``layer_activation_bytes``): bytes of an activation (e) and of a saved
    GEMM input (g), the divisors of sharded, sequence-parallel and gathered tensors, the scores' bytes, the
    selectively recomputed modules, and the engine's and model's switches."""

    e: float
    g: float
    tp: Any
    sp_div: Any
    in_div: Any
    scores: Any
    modules: tuple[str, ...]
    glu_saves_input: bool
    gathered_inputs: bool
    dropout: bool
    moe: bool
    fp8: bool


def _plain_layer_bytes(m: ModelSpec, k: _PerToken, tokens):
    """A dense layer of Korthikanti's kind (no head width of its own, QK-norm, latent attention or MoE)."""
    h, e, g, tp, sp_div, in_div = m.hidden, k.e, k.g, k.tp, k.sp_div, k.in_div
    replicated = (2 * h * e + (2 * h if k.dropout else 0)) / sp_div + 2 * h * e / in_div
    mlp_interior = ((3 if k.glu_saves_input else 4) if m.gated_mlp else 2) * m.ffn_hidden
    sharded = (2 * h + 2 * m.kv_hidden + mlp_interior) * e / tp
    kept = tokens * (replicated + sharded + k.scores)
    if "mlp" in k.modules:  # the MLP's input and interior (fc2's input in fp8 under FP8 GEMMs, below)
        kept = kept - tokens * (h * e / in_div + mlp_interior * e / tp)
    if not k.fp8:
        return kept
    # attention and MLP inputs (replicated), projection and fc2 inputs (sharded) go to fp8
    held = 0 if "mlp" in k.modules else h / in_div + m.ffn_hidden / tp
    return kept - tokens * (e - g) * (h / in_div + h / tp + held)


def _general_layer_bytes(m: ModelSpec, k: _PerToken, tokens):
    """Any other layer (head width, QK-norm, latent attention, a MoE layer's attention and shared experts), less
    what the selectively recomputed modules drop; the routed experts and router are ``layer_activation_bytes``'."""
    h, e, g, tp, sp_div, in_div, moe, modules = m.hidden, k.e, k.g, k.tp, k.sp_div, k.in_div, k.moe, k.modules
    latents = 2 * (m.q_lora_rank + m.kv_lora_rank) + m.rope_head_dim if m.mla else 0
    fp8_replicated = h + (m.q_lora_rank + m.kv_lora_rank) + (0 if moe else h)  # GEMM inputs among those
    replicated = ((4 * h + latents) * e - fp8_replicated * (e - g) + (2 * h if k.dropout else 0)) / sp_div
    if k.gathered_inputs:  # the attention's input (and a dense MLP's) kept whole: h (and h) more than its shard
        inputs = h * g + (0 if moe else h * g)
        replicated = replicated + inputs * (1 - 1 / sp_div)
    attn = m.q_width + kv_width(m) + m.attn_out_width + (m.q_width + m.kv_hidden if m.qk_norm else 0)
    if moe:
        interior, fc2_in = moe_acc.shared_expert_interior_elements(m), m.shared_experts * m.expert_width
    else:
        interior, fc2_in = ((3 if k.glu_saves_input else 4) if m.gated_mlp else 2) * m.ffn_hidden, m.ffn_hidden
    sharded = ((attn + interior) * e - (m.attn_out_width + fc2_in) * (e - g)) / tp
    kept = tokens * (replicated + sharded + k.scores)
    if not modules:
        return kept
    drop = 0.0
    if "layernorm" in modules:  # the stand-alone norms' outputs (module doc)
        drop = drop + (h * e / sp_div if moe else 0.0) + (h * g / in_div if m.mla else 0.0)
    if "mla_up_proj" in modules and m.mla:
        drop = drop + (m.q_width + kv_width(m)) * e / tp
    if "mlp" in modules and not moe:
        drop = drop + h * g / in_div + (interior * e - fc2_in * (e - g)) / tp
    if moe and ("shared_experts" in modules or "moe" in modules):
        drop = drop + (interior * e - fc2_in * (e - g)) / tp
    return kept - tokens * drop


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
