"""Compute time of one layer, the embedding and the head, per micro-batch on one rank.

* GEMMs (the layer's shapes from accounting.flops.layer_gemms): time = max(FLOPs / (peak * gemm_eff *
  prod_d d/(d + gemm_dim_half)), bytes moved / (bandwidth * mem_eff)) + gemm_overhead_s per call —
  large GEMMs run near a device's practical peak, thin ones (a small head_dim, a small tp shard) and
  short ones fall off it, and none runs faster than it can read its operands and write its output.
  Backward runs two GEMMs of the forward's size (input and weight gradient).
* Fused (flash) attention (``flash_attention_s``): attn_eff of peak, falling off at short key lengths
  (attn_seq_half), plus a fixed time per call; its backward costs 2.5x its forward (FlashAttention-2,
  Dao 2023, Sec. 3.2: five matmuls against two, minus the causal skip both share). Which kernel runs
  (cuDNN's, FlashAttention-2's) is the runtime's (``with_attention_kernel``).
* Element-wise kernels (norms, activation, residual adds, softmax without flash, rotary, loss) are
  memory-bound: bytes / (memory bandwidth * mem_eff); backward moves about twice the forward's bytes.
  Byte counts assume Megatron-style fused kernels (bias-GELU, bias-dropout-add, scale-mask-softmax);
  a run whose element-wise ops run eager, a kernel per PyTorch op, moves more (``unfused_extra``).

All size arguments may be numpy arrays (the search evaluates many layouts at once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.errors import UserError
from exatrain.settings import ATTENTION_KERNELS, ELEMENTWISE
from exatrain.accounting.flops import Gemm, layer_gemms, logits_gemm
from exatrain.accounting.memory import COMPUTE_BYTES
from exatrain.planner.cost.coefficients import A100_FA2_CURVE, A100_TRITON_CURVE, CostParams


# Host-side terms: on a CPU whose cores the ranks share, each stretches like the arithmetic does.
HOST_TERMS = (
    "gemm_overhead_s",
    "op_overhead_s",
    "step_overhead_s",
    "tp_layer_overhead_s",
    "fsdp_layer_overhead_s",
    "pp_microbatch_overhead_s",
    "dp_step_overhead_s",
)


@dataclass(frozen=True)
class Device:
    """Peak speed and bandwidth the cost model uses for one rank (catalog, or a calibration)."""

    peak_flops: float
    mem_bytes_per_s: float
    params: CostParams


def device_for(cluster: ClusterSpec, dtype: str, params: CostParams, ranks: int = 1) -> Device:
    """The speed one rank sees when ``ranks`` ranks of the job run (a node holds up to
    gpus_per_node of them). Where ranks share CPU cores (``cores_per_node``), each gets its share:
    every compute and host-side term slows by ranks_on_node / cores."""
    share = 1.0
    if params.cores_per_node > 0:
        share = max(1.0, min(ranks, cluster.gpus_per_node) / params.cores_per_node)
        if share > 1.0:
            params = params.replace(**{k: getattr(params, k) * share for k in HOST_TERMS})
    peak = params.peak_flops or cluster.device.peak_flops(dtype)
    if peak is None and dtype != "float32":
        peak = cluster.device.peak_flops("float32")
    if peak is None:
        raise UserError(
            f"device {cluster.device.name!r} has no {dtype} peak in the catalog; "
            "measure it with `exatrain bench --out calib.json` and pass --calibration calib.json"
        )
    bw = params.mem_bytes_per_s or cluster.device.hbm_bytes_per_s
    return Device(
        peak_flops=float(peak) * params.clock_factor / share, mem_bytes_per_s=float(bw) / share, params=params
    )


def gemm_time_s(g: Gemm, dev: Device, calls: int = 1, in_bytes: float = 2.0, out_bytes: float = 2.0):
    """Seconds for ``calls`` GEMMs of shape ``g`` (batched ``g.count`` times per call): the slower of
    its arithmetic (FLOPs at gemm_eff of peak, thin dimensions falling off by d/(d + gemm_dim_half))
    and its memory traffic (both operands read at ``in_bytes`` per element, the output written at
    ``out_bytes``, at the element-wise kernels' mem_eff of the bandwidth: the roofline), plus
    gemm_overhead_s per call. The traffic bound is what prices a batched GEMM of a small inner
    dimension, such as a math attention's scores (k = head_dim) against its s x s output, or a
    tensor-parallel shard of an FP8 GEMM (1-byte operands at twice the bf16 rate)."""
    p = dev.params
    half = p.gemm_dim_half
    shape = 1.0
    for d in (g.m, g.n, g.k):
        d = np.asarray(d, dtype=float)
        shape = shape * d / (d + half)
    arithmetic = g.flops / (dev.peak_flops * p.gemm_eff * shape)
    m, n, k = (np.asarray(d, dtype=float) for d in (g.m, g.n, g.k))
    traffic = elementwise_time_s(g.count * ((m * k + k * n) * in_bytes + m * n * out_bytes), dev)
    return calls * (np.maximum(arithmetic, traffic) + p.gemm_overhead_s)


def flash_attention_s(core: list[Gemm], dev: Device, calls: int = 1, seq_len: float | None = None):
    """(forward, backward) seconds of a fused (flash) attention kernel over the layer's two attention
    GEMMs (``attn_scores``, ``attn_values``: queries x keys x head_dim, ``count`` = batch x heads on this
    rank). FLOPs are the full count (4 b s^2 heads d forward, causal skip not taken); the kernel runs at

        attn_eff * n / (n + attn_seq_half)

    of peak, n the key length of each GEMM (each query row's softmax and rescaling work is amortised over
    n keys; a sliding-window layer's share of the heads reads fewer),
    plus ``attn_call_overhead_s`` per forward + backward pair (the kernels' fixed work beyond the
    tiles: the backward's preprocessing and gradient conversion, launches), split as the FLOPs are.
    The backward costs 2.5x the forward's FLOPs at the same rate (FlashAttention-2, Dao 2023,
    Sec. 3.2: five matmuls against two). With attn_seq_half and the overhead 0 (the generic prior)
    the rate is attn_eff at every shape. ``calls``: the work split into that many kernel calls over
    1/calls of the keys each (a context-parallel ring runs one per K,V block: cp calls of s/cp keys),
    each paying the call time. ``seq_len`` (the sequence the calls split): a call covers at most seq_len/calls
    keys of a query, and a sliding-window share, whose queries read fewer keys than that, keeps its own key
    length in each call (without it every share's is divided by calls)."""
    if not core:
        return 0.0, 0.0
    p = dev.params
    arithmetic = 0.0
    for g in core:  # each at the rate of its own key length (a sliding-window layer's share reads fewer keys)
        keys = np.asarray(g.k if g.name == "attn_values" else g.n, dtype=float)
        n = keys / calls if seq_len is None else np.minimum(keys, seq_len / calls)
        arithmetic = arithmetic + g.flops / (dev.peak_flops * p.attn_eff * n / (n + p.attn_seq_half))
    fwd = arithmetic + calls * p.attn_call_overhead_s / 3.5
    return fwd, 2.5 * fwd


def _triton_from_fa2(params: CostParams) -> CostParams:
    """The Triton kernel on a device whose FlashAttention-2 rate ``params`` describes (``fa2_attn_ratio`` already
    applied): its long-key rate the A100's Triton / FA2 ratio of FA2's, its half-point and call time FA2's plus what
    the Triton kernel adds on the A100 (A100_TRITON_CURVE - A100_FA2_CURVE: per-query work in key-equivalents, and
    the kernel's fixed time per call)."""
    (fa_eff, fa_half, fa_call), (tr_eff, tr_half, tr_call) = A100_FA2_CURVE, A100_TRITON_CURVE
    return params.replace(
        attn_eff=params.attn_eff * tr_eff / fa_eff,
        attn_seq_half=params.attn_seq_half + tr_half - fa_half,
        attn_call_overhead_s=params.attn_call_overhead_s + tr_call - fa_call,
    )


def with_launch_blocking(params: CostParams) -> CostParams:
    """The parameters for a run whose kernel launches are synchronous (CUDA_LAUNCH_BLOCKING=1, settings:
    launch_blocking): the host's dispatch of each kernel (``blocking_launch_s``) no longer hides behind the
    kernels before it, so it joins the fixed time of every GEMM call, element-wise kernel and collective call.
    That nothing overlaps is the caller's (``planner.evaluate`` prices such a run with ``--overlap none``)."""
    x = params.blocking_launch_s
    return params.replace(
        gemm_overhead_s=params.gemm_overhead_s + x,
        op_overhead_s=params.op_overhead_s + x,
        collective_overhead_s=params.collective_overhead_s + x,
    )


def with_attention_kernel(params: CostParams, kernel: str) -> CostParams:
    """The parameters for a run whose flash attention is ``kernel`` (``settings.ATTENTION_KERNELS``; an engine's
    ``ActivationRules.flash_kernel``). The prior's attention rate describes the device's fastest fused
    kernel; "fa2" scales it by ``fa2_attn_ratio`` (and sets the ratio to 1, so applying it twice changes
    nothing), as "fa2-varlen" (the same kernel; its gathers around it are priced by ``cost.layer.unpad_term``);
    "triton" (a FlashAttention-1 class kernel) runs FA2's curve as the A100's measured Triton kernel departs
    from it (``_triton_from_fa2``); "fused" and "sdpa" (torch's SDPA, which picks cuDNN's kernel on Hopper from torch
    2.11 and FlashAttention-2 elsewhere, where the prior is FA2's) keep it."""
    if kernel not in ATTENTION_KERNELS:
        raise UserError(f"unknown attention kernel {kernel!r}; choose among {', '.join(ATTENTION_KERNELS)}")
    if kernel == "triton":
        return _triton_from_fa2(params.replace(attn_eff=params.attn_eff * params.fa2_attn_ratio, fa2_attn_ratio=1.0))
    if kernel not in ("fa2", "fa2-varlen") or params.fa2_attn_ratio == 1.0:
        return params
    return params.replace(attn_eff=params.attn_eff * params.fa2_attn_ratio, fa2_attn_ratio=1.0)


def elementwise_time_s(n_bytes, dev: Device):
    return n_bytes / (dev.mem_bytes_per_s * dev.params.mem_eff)


# Bytes per element an eager (unfused) op chain moves beyond its fused kernel's read + write, bfloat16
# activations (``e`` bytes) as the chain runs them in PyTorch:
#   rotary on q and k, as torchtitan's apply_rotary_emb runs it: an fp32 copy (read e, write 4), the
#     complex product (read 4, write 4) and the cast back (read 4, write e) against one read + write
#     (2e): 16 bytes more, two more kernels per tensor;
#   RMSNorm as its composite ops run (``eager-composite``): x.float() (read e, write 4), pow (4, 4),
#     mean (read 4), x * rsqrt (4, 4), type_as (4, e), * weight (e, e) = 4e + 28 against 2e: 2e + 28
#     more, five more kernels per norm;
#   SwiGLU as silu(gate) * up: silu writes its output (e) and the product reads it again (e): 2e more,
#     one more kernel.
EAGER_ROTARY_EXTRA = 16.0


def eager_norm_extra(e: float) -> float:
    """Bytes per element a composite RMSNorm moves beyond a fused one (module comment above)."""
    return 2.0 * e + 28.0


def composite_norms(m: ModelSpec, mode: str) -> bool:
    """Whether ``mode`` runs the model's norms as composite ops: RMSNorm (llama family) under
    "eager-composite"; LayerNorm is one kernel in every mode."""
    return mode == "eager-composite" and m.arch == "llama"


def unfused_extra(m: ModelSpec, tokens, tp, *, sequence_parallel: bool, e: float, mode: str, act_elems=0.0):
    """(bytes, kernels) one layer's forward moves and launches beyond the fused counts when its
    element-wise ops run ``mode`` (settings.ELEMENTWISE): "fused" adds nothing; "eager" the rotary chain
    and the gated activation's product (``act_elems``: the elements the SwiGLU products write on this
    rank); "eager-composite" also each RMSNorm as composite ops (llama-family norms, the per-head q/k
    norms, MLA's latent norms). The backward moves twice these bytes, as it does the fused ones."""
    if mode not in ELEMENTWISE:
        raise UserError(f"unknown element-wise mode {mode!r}; choose among {', '.join(ELEMENTWISE)}")
    if mode == "fused":
        return 0.0, 0
    tp_a = np.asarray(tp, dtype=float)
    extra, ops = 0.0, 0
    if m.gated_mlp:
        extra = extra + 2.0 * e * np.asarray(act_elems, dtype=float)
        ops += 1
    if not m.learned_positions:
        extra = extra + EAGER_ROTARY_EXTRA * tokens * (m.q_width + m.kv_hidden) / tp_a
        ops += 4
    if composite_norms(m, mode):
        norm = 2.0 * m.hidden / (tp_a if sequence_parallel else 1.0)
        if m.qk_norm:
            norm = norm + (m.q_width + m.kv_hidden) / tp_a
        if m.mla:
            norm = norm + (m.q_lora_rank + m.kv_lora_rank) / (tp_a if sequence_parallel else 1.0)
        extra = extra + eager_norm_extra(e) * tokens * norm
        ops += 10
    return extra, ops


@dataclass(frozen=True)
class LayerTimes:
    """One transformer layer, one micro-batch, one rank, communication excluded (seconds)."""

    fwd: object  # float or array
    bwd: object
    recompute: object  # extra forward work done inside backward
    attention_core_fwd: object  # the part selective recomputation repeats
    dense_gemm_fwd: object = 0.0  # the dense (weight) GEMMs of the forward; backward's weight gradient equals it
    # forward seconds of the GEMMs next to each sequence-parallel TP collective (``tp_paired_s``)
    tp_gemms_fwd: tuple = (0.0, 0.0, 0.0, 0.0)
    # forward seconds of the matmuls torchtitan's per-op selective recomputation reruns (``per_op_rerun_s``)
    per_op_gemm_fwd: object = 0.0


# The GEMMs a sequence-parallel layer's four TP collectives feed or drain, in the layer's order:
# the attention input's all-gather feeds the projections that read the layer input (qkv; MLA's q
# and kv down-projections, or q), the output projection's reduce-scatter drains ``proj``, the MLP
# input's all-gather feeds ``fc1`` and the MLP output's reduce-scatter drains ``fc2`` (a MoE layer:
# its shared experts'). A decomposed (overlapped) collective runs beside these GEMMs only.
TP_PAIRS = (("qkv", "q", "q_down", "kv_down"), ("proj",), ("fc1", "shared_fc1"), ("fc2", "shared_fc2"))


def tp_paired_s(gemms, seconds) -> tuple:
    """Forward seconds of the GEMMs paired with each of the four TP collectives (``TP_PAIRS``);
    ``seconds``: each of ``gemms``' seconds at the rate it runs (FP8 or not), already priced."""
    return tuple(sum((t for g, t in zip(gemms, seconds) if g.name in names), 0.0) for names in TP_PAIRS)


def per_op_rerun_s(m: ModelSpec, gemms, seconds):
    """Forward seconds of the matmuls torchtitan's per-op policy recomputes: it saves every other
    matmul output, counting the block's matmuls in call order (torchtitan/distributed/
    activation_checkpoint.py: the ``mm`` count, saved when odd), so wq, wv, w1, w2 are kept and the
    2nd, 4th and 6th — wk, wo and w3 (gated; fc2 otherwise) — rerun. exatrain's GEMMs fuse q, k, v
    (``qkv``) and gate + up (``fc1``): their shares are taken by width. Latent attention's projections
    are not in that order: half of its dense GEMMs."""
    t = {g.name: x for g, x in zip(gemms, seconds)}
    if "qkv" not in t:
        return 0.5 * sum(seconds, 0.0)
    k_share = m.kv_hidden / (m.q_width + 2.0 * m.kv_hidden)
    mlp = 0.5 * t.get("fc1", 0.0) if m.gated_mlp else t.get("fc2", 0.0)
    return k_share * t["qkv"] + t.get("proj", 0.0) + mlp


def dense_layer_times(
    m: ModelSpec,
    micro_batch,
    tp,
    *,
    flash: bool,
    recompute: str,
    sequence_parallel: bool,
    dtype: str,
    dev: Device,
    elementwise: str = "fused",
) -> LayerTimes:
    e = COMPUTE_BYTES[dtype]
    tokens = np.asarray(micro_batch) * m.seq_len
    gemms = layer_gemms(m, micro_batch, tp)
    dense = [g for g in gemms if not g.name.startswith("attn_")]
    dense_s = [gemm_time_s(g, dev, in_bytes=e, out_bytes=e) for g in dense]
    gemm_fwd = sum(dense_s)
    h, f, kvh = m.hidden, m.ffn_hidden, m.kv_hidden
    tp_a = np.asarray(tp, dtype=float)
    rep_div = tp_a if sequence_parallel else 1.0
    # elements read + written per token, forward
    replicated = 10.0 * h  # two norms (r h, w h) + two fused bias-dropout-add (r 2h, w h)
    if m.dropout > 0:
        replicated += 2.0 * h / e  # the two residual-branch dropout masks, one byte each
    sharded = 3.0 * f if m.gated_mlp else 2.0 * f  # SwiGLU reads gate, up, writes product; GELU r/w
    if not m.learned_positions:
        sharded += 2.0 * (h + 2 * kvh)  # rotary on q and k (read + write)
    # two norms, two residual adds, the activation (+ rotary on q, k) — each a kernel launch
    n_ops = 5 + (2 if not m.learned_positions else 0) + (2 if m.dropout > 0 else 0)
    extra, extra_ops = unfused_extra(
        m, tokens, tp, sequence_parallel=sequence_parallel, e=e, mode=elementwise, act_elems=tokens * f / tp_a
    )
    elem_fwd = (
        elementwise_time_s(tokens * e * (replicated / rep_div + sharded / tp_a) + extra, dev)
        + (n_ops + extra_ops) * dev.params.op_overhead_s
    )
    if flash:
        attn_fwd, attn_bwd = flash_attention_s([g for g in gemms if g.name.startswith("attn_")], dev)
    else:
        scores = [g for g in gemms if g.name.startswith("attn_")]
        # fused scale-mask-softmax reads and writes the scores; attention dropout reads them again,
        # writes its output and a one-byte mask (Megatron runs it as a separate kernel).
        per_score = 2.0 * e + ((2.0 * e + 1.0) if m.dropout > 0 else 0.0)
        softmax = (
            elementwise_time_s(tokens * per_score * m.heads * m.seq_len / tp_a, dev)
            + (2 if m.dropout > 0 else 1) * dev.params.op_overhead_s
        )
        attn_fwd = sum(gemm_time_s(g, dev, in_bytes=e, out_bytes=e) for g in scores) + softmax
        attn_bwd = sum(gemm_time_s(g, dev, calls=2, in_bytes=e, out_bytes=e) for g in scores) + 2 * softmax
    fwd = gemm_fwd + attn_fwd + elem_fwd
    bwd = 2 * gemm_fwd + attn_bwd + 2 * elem_fwd
    if recompute == "full":
        extra = fwd
    elif recompute == "selective":
        extra = attn_fwd
    else:
        extra = 0.0 * fwd
    return LayerTimes(
        fwd=fwd,
        bwd=bwd,
        recompute=extra,
        attention_core_fwd=attn_fwd,
        dense_gemm_fwd=gemm_fwd,
        tp_gemms_fwd=tp_paired_s(dense, dense_s),
        per_op_gemm_fwd=per_op_rerun_s(m, dense, dense_s),
    )


def framework_layer_s(dev: Device, tp, dp, zero_stage: int):
    """Per layer and micro-batch (forward + backward): what DTensor (tp > 1) and FSDP (ZeRO-2/3 over
    dp > 1) add on the host. The forward takes a third, the backward the rest."""
    p = dev.params
    tp_a, dp_a = np.asarray(tp), np.asarray(dp)
    return np.where(tp_a > 1, p.tp_layer_overhead_s, 0.0) + np.where(
        (dp_a > 1) & (zero_stage >= 2), p.fsdp_layer_overhead_s, 0.0
    )


def embedding_times(m: ModelSpec, micro_batch, tp, *, sequence_parallel: bool, dtype: str, dev: Device):
    """(forward, backward) seconds of the token (+ position) embedding on the first stage."""
    e = COMPUTE_BYTES[dtype]
    tokens = np.asarray(micro_batch) * m.seq_len
    div = np.asarray(tp, dtype=float) if sequence_parallel else 1.0
    n = (3.0 if m.learned_positions else 1.0) * tokens * m.hidden * e / div
    fwd = elementwise_time_s(n, dev)
    return fwd, 2 * fwd


def head_times(
    m: ModelSpec,
    micro_batch,
    tp,
    *,
    sequence_parallel: bool,
    dtype: str,
    dev: Device,
    elementwise: str = "fused",
    cross_entropy: str = "upcast",
):
    """(forward, backward) seconds of final norm, logits GEMM and cross-entropy on the last stage; the
    norm as composite ops under "eager-composite" (``unfused_extra``); the cross-entropy as
    ``cross_entropy`` runs it (settings.CROSS_ENTROPY)."""
    e = COMPUTE_BYTES[dtype]
    tokens = np.asarray(micro_batch) * m.seq_len
    tp_a = np.asarray(tp, dtype=float)
    g = logits_gemm(m, micro_batch, tp)
    per = 2.0 * e + (eager_norm_extra(e) if composite_norms(m, elementwise) else 0.0)
    norm = elementwise_time_s(per * tokens * m.hidden / (tp_a if sequence_parallel else 1.0), dev)
    # cross-entropy over vocab-parallel logits, "upcast" and "inplace": read the logits, write and read
    # their fp32 copy, each way; "fused": the forward reads the 16-bit logits once (a log-sum-exp per
    # token), the backward reads them and writes their 16-bit gradient.
    logits = tokens * (m.vocab / tp_a)
    ce_f, ce_b = (e, 2.0 * e) if cross_entropy == "fused" else (e + 4 + 4, e + 4 + 4)
    fwd = gemm_time_s(g, dev, in_bytes=e, out_bytes=e) + norm + elementwise_time_s(logits * ce_f, dev)
    bwd = gemm_time_s(g, dev, calls=2, in_bytes=e, out_bytes=e) + 2 * norm + elementwise_time_s(logits * ce_b, dev)
    return fwd, bwd
