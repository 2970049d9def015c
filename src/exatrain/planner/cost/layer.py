"""One layer's time on one rank with what ``cost.compute.dense_layer_times`` does not price: a mixture-of-experts
layer, latent attention, QK-norm, a head width of its own, sliding windows, context parallelism, FP8 GEMMs.

``cost.step`` calls it for every group of layouts that share ep and cp (scalars here; tp, micro-batch and the
rest are arrays); a dense model with cp 1 and no FP8 takes ``cost.compute.dense_layer_times`` unchanged.

The layer's forward GEMMs as ``accounting.flops.layer_gemms`` shapes them — a MoE layer's router,
tensor-parallel shared experts and one grouped GEMM per local expert (experts/ep of them) whose tokens are the
rank's routed tokens x top_k x the load (``accounting.moe.moe_load``) spread over them (the busiest expert rank
sets the pace); a dense-first layer of a MoE model is a dense layer — each at the cost model's GEMM efficiency;
the attention core of s/cp queries against all s keys (the causal mask load-balanced over 2*cp chunks, so every
cp rank does 1/cp of it; TE ``get_seq_chunk_ids_for_reordering``), run as the ring runs it: cp kernel calls, one
per K,V block of s/cp keys (``compute.flash_attention_s(calls=cp)``); element-wise kernels over the rank's s/cp
tokens, plus a MoE layer's token permutation and un-permutation (read and write h per routed copy, each) and its
activation over the routed copies. FP8 GEMMs (``cost.fp8``) run at the FP8 rate and cast their inputs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from exatrain.accounting import moe as moe_acc
from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.accounting.engines import Resolved
from exatrain.accounting.flops import layer_gemms
from exatrain.catalog.models import ModelSpec
from exatrain.planner.cost import compute
from exatrain.planner.cost.fp8 import CAST_BYTES, NOT_FP8
from exatrain.planner.cost.terms import PassSeconds


def extended(m: ModelSpec, cp: int, fp8: str) -> bool:
    """Whether the layout needs this module's layer time (else ``compute.dense_layer_times`` is exact)."""
    return bool(m.is_moe or m.mla or m.qk_norm or m.kv_channels or m.sliding_window or cp > 1 or fp8)


def layer_times(
    m: ModelSpec,
    micro_batch,
    tp,
    *,
    moe: bool,
    ep: int,
    cp: int,
    sequence_parallel: bool,
    dev: compute.Device,
    run: Resolved,
    speedup: float = 1.0,
    cp_calls: int | None = None,
) -> compute.LayerTimes:
    """One layer (a MoE layer if ``moe``), one micro-batch, one rank (module doc), as ``run`` runs it
    (``accounting.engines.Resolved``): its dtype, flash attention and FP8 recipe (``speedup``: an FP8 GEMM's
    over a 16-bit one, ``fp8_speedup``); how its element-wise ops run (``run.elementwise``,
    ``compute.unfused_extra``); the busiest expert rank's routed copies over the mean (``run.moe_load``);
    ``run.expert_gemms``: "per_expert" where the engine launches one GEMM per local expert (each pays the per-call
    time), "grouped" where one kernel runs them all. ``cp_calls``: the attention kernel calls a layer's core takes
    under cp (``CpExchange.kernel_calls``; None: cp, one per K,V block of the ring). A "fa2-varlen" attention adds
    the gathers around its call (``unpad_term``)."""
    lt = _layer_times(
        m,
        micro_batch,
        tp,
        moe=moe,
        ep=ep,
        cp=cp,
        sequence_parallel=sequence_parallel,
        dev=dev,
        run=run,
        speedup=speedup,
        cp_calls=cp_calls,
    )
    if not (run.flash and run.attention_kernel == "fa2-varlen"):
        return lt
    pad = unpad_term(m, np.asarray(micro_batch, dtype=float) * m.seq_len / cp, np.asarray(tp, dtype=float), run, dev)
    return dataclasses.replace(lt, fwd=lt.fwd + pad.fwd, bwd=lt.bwd + pad.bwd)


# Kernels flash-attn's bert_padding launches around a varlen attention call (flash-attn 2.4, bert_padding.py): each
# unpad_input the mask's sum, nonzero, max, cumsum, pad and the index_first_axis gather, three of them (q, k, v),
# and pad_input's zeros and index_put on the output; backward, the output gradient's gather and each input's zeros
# and scatter. (unpad_input also reads nonzero's size and the max with .item(), two host syncs a call: not priced.)
UNPAD_FWD_OPS, UNPAD_BWD_OPS = 3 * 6 + 2, 1 + 3 * 2


def unpad_term(m: ModelSpec, tokens, tp_a, run: Resolved, dev: compute.Device) -> PassSeconds:
    """Seconds of the copies a "fa2-varlen" attention adds to a layer (llm-foundry's flash_attn_fn to 2024-01:
    bert_padding.unpad_input on q, k and v, pad_input on the output, even with no padding): forward, each of q, k, v
    gathered into an unpadded copy (read + write) and the output scattered into a zeroed buffer (write the zeros,
    read + write); backward, the output gradient gathered (read + write) and each input gradient scattered into
    zeros (write, read + write). Element-wise traffic at ``mem_eff``, and each launch's ``op_overhead_s``."""
    e = COMPUTE_BYTES[run.dtype]
    q, kv = m.q_width / tp_a, m.kv_hidden / tp_a
    fwd = tokens * e * (2.0 * (q + 2.0 * kv) + 3.0 * q)
    bwd = tokens * e * (2.0 * q + 3.0 * (q + 2.0 * kv))
    op = dev.params.op_overhead_s
    return PassSeconds(
        fwd=compute.elementwise_time_s(fwd, dev) + UNPAD_FWD_OPS * op,
        bwd=compute.elementwise_time_s(bwd, dev) + UNPAD_BWD_OPS * op,
    )


def _layer_times(
    m: ModelSpec,
    micro_batch,
    tp,
    *,
    moe: bool,
    ep: int,
    cp: int,
    sequence_parallel: bool,
    dev: compute.Device,
    run: Resolved,
    speedup: float = 1.0,
    cp_calls: int | None = None,
) -> compute.LayerTimes:
    """``layer_times`` without the copies around a varlen attention call (``unpad_term``)."""
    flash, dtype, fp8, elementwise = run.flash, run.dtype, run.fp8, run.elementwise
    load, expert_gemms = run.moe_load, run.expert_gemms
    if not extended(m, cp, fp8):
        return compute.dense_layer_times(
            m,
            micro_batch,
            tp,
            flash=flash,
            recompute="none",
            sequence_parallel=sequence_parallel,
            dtype=dtype,
            dev=dev,
            elementwise=elementwise,
        )
    moe = bool(moe and m.is_moe)
    e = COMPUTE_BYTES[dtype]
    gemms = layer_gemms(
        m,
        micro_batch,
        tp,
        moe=moe,
        ep=ep,
        cp=cp,
        sequence_parallel=sequence_parallel,
        capacity_factor=load if moe else 1.0,
    )
    dense = [g for g in gemms if not g.name.startswith("attn_")]
    priced = _gemm_pricer(dev, dtype, fp8, speedup, expert_gemms)
    dense_s = [priced(g) for g in dense]
    gemm_fwd = sum(dense_s)
    core = [g for g in gemms if g.name.startswith("attn_")]
    elem_bytes, n_ops = elementwise_bytes(
        m, micro_batch, tp, moe=moe, cp=cp, sequence_parallel=sequence_parallel, run=run
    )
    elem = elementwise_term(elem_bytes, n_ops, dense, fp8, dev)
    tokens = np.asarray(micro_batch, dtype=float) * m.seq_len / cp
    attn = attention_core_term(m, core, dev, flash, e, tokens, np.asarray(tp, dtype=float), cp_calls=cp_calls, cp=cp)
    fwd = gemm_fwd + attn.fwd + elem.fwd
    bwd = 2 * gemm_fwd + attn.bwd + elem.bwd
    return compute.LayerTimes(
        fwd=fwd,
        bwd=bwd,
        recompute=0.0 * fwd,
        attention_core_fwd=attn.fwd,
        dense_gemm_fwd=gemm_fwd,
        tp_gemms_fwd=compute.tp_paired_s(dense, dense_s),
        per_op_gemm_fwd=compute.per_op_rerun_s(m, dense, dense_s),
    )


def elementwise_bytes(m: ModelSpec, micro_batch, tp, *, moe: bool, cp: int, sequence_parallel: bool, run: Resolved):
    """(bytes, kernel launches) of one layer's forward element-wise kernels on one rank: the norms, residuals and
    dropout over the rank's s/cp tokens (replicated across tp without sequence parallelism), rotary and QK-norm on
    the tp-sharded heads, the latent norms, the MLP's activation; a MoE layer's shared experts' activation, its
    routed copies' activation and permutes, the router's softmax and top-k; the unfused extras of
    ``run.elementwise`` (``compute.unfused_extra``)."""
    e, load = COMPUTE_BYTES[run.dtype], run.moe_load
    b = np.asarray(micro_batch, dtype=float)
    tp_a = np.asarray(tp, dtype=float)
    tokens = b * m.seq_len / cp
    h, kvh = m.hidden, m.kv_hidden
    rep_div = tp_a if sequence_parallel else 1.0
    replicated = 10.0 * h + (2.0 * h / e if m.dropout > 0 else 0.0)  # as compute.dense_layer_times counts it
    sharded = 0.0
    if not m.learned_positions:
        sharded += 2.0 * (m.q_width + 2 * kvh)  # rotary on q and k (read + write), as compute.dense_layer_times
    if m.qk_norm:
        sharded += 2.0 * (m.q_width + kvh)  # the q and k RMSNorms (read + write)
    if m.mla:
        replicated += 4.0 * (m.q_lora_rank + m.kv_lora_rank)  # the latent RMSNorms (read + write)
    act = 3.0 if m.gated_mlp else 2.0  # SwiGLU reads gate, up, writes product; GELU reads, writes
    elem_bytes = tokens * e * (replicated / rep_div + sharded / tp_a)
    n_ops = 5 + (2 if not m.learned_positions else 0) + (2 if m.dropout > 0 else 0)
    if moe:
        routed = moe_acc.routed_tokens_per_rank(m, b, tp_a, sequence_parallel=sequence_parallel, cp=cp)
        copies = routed * m.top_k * load
        elem_bytes = elem_bytes + tokens * e * act * m.shared_experts * m.expert_width / tp_a
        # routed copies: the activation over the expert width, and permute + un-permute (r/w h each)
        elem_bytes = elem_bytes + copies * e * (act * m.expert_width + 4.0 * h)
        # the router's softmax and top-k over its fp32 scores (read, write, read)
        elem_bytes = elem_bytes + routed * m.experts * 3.0 * moe_acc.ROUTER_SCORE_BYTES
        n_ops += 4  # router softmax/top-k, permute, activation, un-permute
        act_elems = tokens * m.shared_experts * m.expert_width / tp_a + copies * m.expert_width
    else:
        elem_bytes = elem_bytes + tokens * e * act * m.ffn_hidden / tp_a
        act_elems = tokens * m.ffn_hidden / tp_a
    extra, extra_ops = compute.unfused_extra(
        m, tokens, tp, sequence_parallel=sequence_parallel, e=e, mode=run.elementwise, act_elems=act_elems
    )
    return elem_bytes + extra, n_ops + extra_ops


def elementwise_term(elem_bytes, n_ops: int, dense: list, fp8: str, dev: compute.Device) -> PassSeconds:
    """Seconds of a layer's element-wise kernels (``elementwise_bytes``), forward and backward (twice the bytes and
    the launches), with, under FP8, the casts of each FP8 GEMM's input (forward) and output gradient (backward):
    ``CAST_BYTES[fp8]`` an element of the ``dense`` GEMMs' operands."""
    if fp8:
        cast_elems = sum(g.m * g.k * g.count for g in dense if g.name not in NOT_FP8)
        cast_bwd = sum(g.m * g.n * g.count for g in dense if g.name not in NOT_FP8)
    else:
        cast_elems = cast_bwd = 0.0
    per = CAST_BYTES.get(fp8, 0.0)
    elem_fwd = compute.elementwise_time_s(elem_bytes + per * cast_elems, dev) + n_ops * dev.params.op_overhead_s
    elem_bwd = (
        2 * compute.elementwise_time_s(elem_bytes, dev)
        + compute.elementwise_time_s(per * cast_bwd, dev)
        + 2 * n_ops * dev.params.op_overhead_s
    )
    return PassSeconds(fwd=elem_fwd, bwd=elem_bwd)


def attention_core_term(m: ModelSpec, core: list, dev, flash: bool, e: float, tokens, tp_a, *, cp_calls, cp: int):
    """Seconds of a layer's attention core (its ``core`` GEMMs), forward and backward: a flash kernel
    (``compute.flash_attention_s``; a cp ring runs it once per K,V block, cp calls over s/cp keys each, or
    ``cp_calls`` as the engine's exchange runs it, e.g. one call over all s keys after an all-to-all), else the
    score GEMMs with a softmax (and dropout) pass over the scores."""
    if flash:
        return PassSeconds(
            *compute.flash_attention_s(core, dev, calls=cp if cp_calls is None else cp_calls, seq_len=m.seq_len)
        )
    per_score = 2.0 * e + ((2.0 * e + 1.0) if m.dropout > 0 else 0.0)
    softmax = (
        compute.elementwise_time_s(tokens * per_score * m.heads * m.seq_len / tp_a, dev)
        + (2 if m.dropout > 0 else 1) * dev.params.op_overhead_s
    )
    attn_fwd = sum(compute.gemm_time_s(g, dev, in_bytes=e, out_bytes=e) for g in core) + softmax
    attn_bwd = sum(compute.gemm_time_s(g, dev, calls=2, in_bytes=e, out_bytes=e) for g in core) + 2 * softmax
    return PassSeconds(fwd=attn_fwd, bwd=attn_bwd)


def _gemm_pricer(dev: compute.Device, dtype: str, fp8: str, speedup: float, expert_gemms: str):
    """Seconds of one forward GEMM as ``layer_times`` prices it: an FP8 GEMM reads 1-byte operands (its casts
    are priced apart) at the FP8 rate and writes a 16-bit output; a routed expert's GEMM launched once per local
    expert (``expert_gemms`` "per_expert") is ``count`` calls of one expert's shape."""
    e = COMPUTE_BYTES[dtype]
    fast = dataclasses.replace(dev, peak_flops=dev.peak_flops * speedup) if fp8 else dev

    def priced(g):
        calls = 1
        if expert_gemms == "per_expert" and g.name.startswith("expert_"):
            g, calls = dataclasses.replace(g, count=1), g.count
        if fp8 and g.name not in NOT_FP8:
            return compute.gemm_time_s(g, fast, calls=calls, in_bytes=1.0, out_bytes=e)
        return compute.gemm_time_s(g, dev, calls=calls, in_bytes=e, out_bytes=e)

    return priced


__all__ = ["attention_core_term", "elementwise_bytes", "elementwise_term", "extended", "layer_times", "unpad_term"]
