"""Selective recomputation by module in the step time (``module_rerun_s``): the forward seconds Megatron-Core's
--recompute-modules reruns in the backward (settings.RECOMPUTE_MODULES), priced as ``cost.layer.layer_times``
prices the forward. What a full recomputation of some layers reruns is ``cost.rerun.rerun_share`` of the stage's
layers."""

from __future__ import annotations

import numpy as np

from exatrain.accounting import moe as moe_acc
from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.accounting.engines import Resolved
from exatrain.accounting.flops import layer_gemms
from exatrain.catalog.models import ModelSpec
from exatrain.planner.cost import compute
from exatrain.planner.cost.fp8 import CAST_BYTES, NOT_FP8
from exatrain.planner.cost.layer import _gemm_pricer


def module_rerun_s(
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
    attention_core_fwd=0.0,
    speedup: float = 1.0,
):
    """Forward seconds Megatron-Core's selective recomputation of ``run.recompute_modules``
    (settings.RECOMPUTE_MODULES) reruns in one layer (a MoE layer if ``moe``), one micro-batch, one rank, as ``run``
    runs it (its dtype, FP8 recipe, routing load and expert GEMMs), priced as ``layer_times`` prices the forward:
    "core_attn" the attention core (``attention_core_fwd``, the layer's own); "layernorm" a stand-alone norm (read
    and write h per token: a MoE layer's pre-MLP norm, latent attention's input norm; Transformer Engine fuses the
    others into their GEMM, plan.py); "mla_up_proj" the q and kv up-projections and rotary; "mlp" a dense layer's
    fc1 and fc2, its activation and its fused norm; "shared_experts" the shared experts' GEMMs and activation;
    "moe_act" the routed copies' activation; "moe" the router, the experts, the shared experts and every
    element-wise pass of the MoE layer (permutes, activation, router softmax). FP8 GEMMs cast their inputs again.
    The collectives a rerun repeats (TP around the MLP, the all-to-alls) are ``cost.step.stage_times``'."""
    mods = set(run.recompute_modules)
    moe = bool(moe and m.is_moe)
    e = COMPUTE_BYTES[run.dtype]
    tp_a = np.asarray(tp, dtype=float)
    tokens = np.asarray(micro_batch, dtype=float) * m.seq_len / cp
    gemms = layer_gemms(
        m,
        micro_batch,
        tp,
        moe=moe,
        ep=ep,
        cp=cp,
        sequence_parallel=sequence_parallel,
        capacity_factor=run.moe_load if moe else 1.0,
    )
    pr = _RerunPricer(gemms, dev, run, speedup)
    act = 3.0 if m.gated_mlp else 2.0  # as layer_times: SwiGLU reads gate, up, writes product; GELU reads, writes
    norm = pr.elem(tokens * e * 2.0 * m.hidden / (tp_a if sequence_parallel else 1.0), 1)
    total = 0.0 * tokens
    if "core_attn" in mods:
        total = total + attention_core_fwd
    if "layernorm" in mods:
        total = total + norm * ((1 if moe else 0) + (1 if m.mla else 0))
    if "mla_up_proj" in mods and m.mla:
        rotary = 0.0 if m.learned_positions else 2.0 * (m.q_width + 2 * m.kv_hidden)
        total = total + pr.gemms_s(("q_up", "kv_up")) + pr.elem(tokens * e * rotary / tp_a, 2)
    if "mlp" in mods and not moe:
        total = total + pr.gemms_s(("fc1", "fc2")) + pr.elem(tokens * e * act * m.ffn_hidden / tp_a, 1) + norm
    if moe:
        total = _moe_rerun_s(m, micro_batch, tp, pr, mods, total, sequence_parallel=sequence_parallel, cp=cp)
    return total


class _RerunPricer:
    """Prices rerun work as ``layer_times`` prices the forward: a set of the layer's GEMMs by name (with their
    FP8 input casts) and an element-wise pass of some bytes and kernel launches."""

    def __init__(self, gemms, dev: compute.Device, run: Resolved, speedup: float):
        self.gemms, self.dev, self.fp8 = gemms, dev, run.fp8
        self.priced = _gemm_pricer(dev, run.dtype, run.fp8, speedup, run.expert_gemms)
        self.per = CAST_BYTES.get(run.fp8, 0.0)
        self.e = COMPUTE_BYTES[run.dtype]
        self.load = run.moe_load

    def gemms_s(self, names):
        chosen = [g for g in self.gemms if g.name in names]
        casts = sum((g.m * g.k * g.count for g in chosen if self.fp8 and g.name not in NOT_FP8), 0.0)
        return sum((self.priced(g) for g in chosen), 0.0) + compute.elementwise_time_s(self.per * casts, self.dev)

    def elem(self, n_bytes, ops: int):
        return compute.elementwise_time_s(n_bytes, self.dev) + ops * self.dev.params.op_overhead_s


def _moe_rerun_s(m: ModelSpec, micro_batch, tp, pr: _RerunPricer, mods: set, total, *, sequence_parallel, cp):
    """``total`` with a MoE layer's rerun modules: "moe" the router, the experts, the shared experts and every
    element-wise pass; else "shared_experts" the shared experts' GEMMs and activation, "moe_act" the routed
    copies' activation."""
    e, load = pr.e, pr.load
    b = np.asarray(micro_batch, dtype=float)
    tp_a = np.asarray(tp, dtype=float)
    tokens = b * m.seq_len / cp
    act = 3.0 if m.gated_mlp else 2.0
    shared = (
        (
            pr.gemms_s(("shared_fc1", "shared_fc2"))
            + pr.elem(tokens * e * act * m.shared_experts * m.expert_width / tp_a, 1)
        )
        if m.shared_experts
        else 0.0
    )
    routed = moe_acc.routed_tokens_per_rank(m, b, tp_a, sequence_parallel=sequence_parallel, cp=cp)
    copies = routed * m.top_k * load
    if "moe" in mods:
        return (
            total
            + pr.gemms_s(("router", "expert_fc1", "expert_fc2"))
            + shared
            + pr.elem(
                copies * e * (act * m.expert_width + 4.0 * m.hidden)
                + routed * m.experts * 3.0 * moe_acc.ROUTER_SCORE_BYTES,
                4,
            )
        )
    if "shared_experts" in mods:
        total = total + shared
    if "moe_act" in mods:
        total = total + pr.elem(copies * e * act * m.expert_width, 1)
    return total


__all__ = ["module_rerun_s"]
