"""Cost terms of mixture-of-experts layers (ep), context parallelism (cp) and FP8 GEMMs.

``cost.step`` and ``planner.evaluate`` call these for every group of layouts that share ep and cp
(scalars here; tp, micro-batch and the rest are arrays); a dense model with cp 1 and no FP8 takes
``cost.compute.layer_times`` unchanged.

Compute of one layer (``layer_times``): the layer's forward GEMMs as ``accounting.flops.layer_gemms``
shapes them — a MoE layer's router, tensor-parallel shared experts and one grouped GEMM per local
expert (experts/ep of them) whose tokens are the rank's routed tokens x top_k x the load (``moe_load``, below)
spread over them (the busiest expert rank sets the pace); a dense-first layer of a MoE model is a
dense layer — each at the cost model's GEMM efficiency; the attention core of s/cp queries against
all s keys (the causal mask load-balanced over 2*cp chunks, so every cp rank does 1/cp of it; TE
``get_seq_chunk_ids_for_reordering``), run as the ring runs it: cp kernel calls, one per K,V block of
s/cp keys (``compute.flash_attention_s(calls=cp)``); element-wise kernels over the rank's s/cp tokens, plus a MoE
layer's token permutation and un-permutation (read and write h per routed copy, each) and its
activation over the routed copies. Under FP8 (``accounting.fp8``) every linear-layer GEMM runs at the
device's FP8 peak times the same efficiency (the router, the attention core and the output head stay
16-bit, as Transformer Engine and DeepSeek-V3's recipe keep them; arXiv 2412.19437 Sec. 3.3.1), and
each FP8 GEMM first casts its input (forward) or output gradient (backward) to FP8: read 2, write 1
byte per element and its transposed copy 1 more, plus a read for the amax under current scaling
(``CAST_BYTES``).

Communication (exposed; all in seconds per layer and micro-batch on one rank):

* expert all-to-all (``a2a_time_s``): Megatron-Core's all-to-all dispatcher (megatron/core/transformer/
  moe/token_dispatcher.py) sends T*top_k token copies out and back — dispatch and combine — in forward
  and again in backward; not overlapped with compute (Megatron-Core overlaps it only with
  ``--overlap-moe-expert-parallel-comm``). The ep group is ep consecutive dp ranks, strided by tp*cp,
  or, wider than dp (folded over tp*cp*dp: Megatron-Core's MoE parallel folding), ep consecutive
  ranks (``plan.ParallelDims``, ``ep_span``): a rank sends 1/ep of its buffer to each of its ep-1
  peers (pairwise exchange; Thakur et al. 2005, Sec. 4.5), over the node's links to the peers on its node and over
  the network to the others, both at once (NCCL's all-to-all posts every peer's send together), so
  the slower of the two sets the time, plus (ep-1) latency steps of the tier spanning the group.
* context-parallel ring (``cp_exposed_s``): cp-1 K,V blocks per layer forward and cp-1 (K,V + dK,dV)
  backward (``accounting.context``), each sent while the previous block's attention runs
  (Megatron-Core / TE ``AttnFuncWithCPAndKVP2P`` overlap them this way): a step exposes only what its
  send takes beyond 1/cp of the layer's attention compute.

The load of the busiest expert rank over the mean of the routed token copies (``moe_load``) scales the
expert GEMMs, the all-to-all buffers and the dispatch buffers and expert activations in memory. It follows
the plan's routing (plan.py): under dropless routing, the default, it is ``LOAD_IMBALANCE``, a named
assumption, not a measurement: 1.25x, the capacity factor Switch Transformer trains with (Fedus et al.
2022, JMLR, Sec. 2.2 and Table 1: 1.0-1.25 keep quality at the least padding). With a token-drop capacity
factor C and padding (``Plan.moe_capacity_factor``; Megatron-Core's alltoall dispatcher with
--moe-expert-capacity-factor C --moe-pad-expert-input-to-capacity: every local expert's input is cut or
padded to C times the mean, moe_utils.py) it is exactly C. With the routing forced even
(``Plan.moe_force_balance``; Megatron-Core --moe-router-force-load-balancing, which replaces the router's
scores with random ones, a benchmarking switch) it is 1: the busiest rank's excess over the mean is then a
random fluctuation, about sqrt(2 ln(ep) / n) for n routed copies a rank (2% for the 16,384 a rank of
Qwen3-235B at tp 2, ep 32 receives per micro-batch).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from exatrain.accounting import moe as moe_acc
from exatrain.accounting.context import CpExchange, a2a_tensor_bytes, kv_block_bytes
from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.accounting.flops import layer_gemms
from exatrain.accounting.fp8 import Fp8Recipe
from exatrain.accounting.params import (embedding_params, final_norm_params, head_params, layer_params,
                                       position_params, stage_layer_kinds)
from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.errors import UserError
from exatrain.plan import cp_comm_for
from exatrain.planner.cost import compute, network
from exatrain.planner.cost.coefficients import CostParams

LOAD_IMBALANCE = 1.25  # busiest expert rank's routed copies over the mean, dropless: an assumption (module doc)


def moe_load(capacity_factor: float = 0.0, force_balance: bool = False) -> float:
    """The busiest expert rank's routed token copies over the mean (module doc): the padded capacity
    factor where one is set, 1 under forced balance, else ``LOAD_IMBALANCE`` (dropless)."""
    if capacity_factor:
        return float(capacity_factor)
    return 1.0 if force_balance else LOAD_IMBALANCE


def plan_moe_load(plan) -> float:
    """``moe_load`` of a plan's routing settings."""
    return moe_load(plan.moe_capacity_factor, plan.moe_force_balance)


_NOT_FP8 = ("attn_scores", "attn_values", "router")  # GEMMs that stay 16-bit under FP8
# Bytes moved per element of a tensor cast to FP8 for a GEMM, by recipe. Every recipe reads the 16-bit
# tensor (2) and writes it twice in FP8 (1 + 1): Hopper's FP8 GEMM takes only the "TN" layout, so the
# cast also writes the transposed copy the other GEMMs of the pair read (Transformer Engine's fused
# cast-transpose; accounting.fp8 keeps that copy for weights). Current scaling ("current") first reads
# the tensor once more for its amax (2); delayed scaling uses the previous amax and updates it inside the
# cast; block and MXFP8 scale each block inside the cast.
CAST_BYTES = {"delayed": 4.0, "current": 6.0, "block": 4.0, "mxfp8": 4.0}


def extended(m: ModelSpec, cp: int, fp8: str) -> bool:
    """Whether the layout needs this module's layer time (else ``compute.layer_times`` is exact)."""
    return bool(m.is_moe or m.mla or m.qk_norm or m.kv_channels or m.sliding_window or cp > 1 or fp8)


def fp8_recipe(fp8: str, param_gather: bool = False) -> Fp8Recipe | None:
    """The accounting's FP8 configuration of a plan: its scaling and, with ``param_gather``
    (``Plan.fp8_param_gather``), FP8 weights in place of the GEMMs' 16-bit compute copy."""
    return Fp8Recipe(scaling=fp8, fp8_params=param_gather) if fp8 else None


def fp8_speedup(cluster: ClusterSpec, dtype: str, params: CostParams | None = None) -> float:
    """How much faster an FP8 GEMM runs than a ``dtype`` one: ``params.fp8_speedup`` (what ``exatrain
    bench`` measured, or the device prior's fitted ratio: Hopper's, coefficients.DEFAULTS), else the
    device's FP8 peak over its ``dtype`` peak (catalog data-sheet figures, the same fraction of each)."""
    if params is not None and params.fp8_speedup is not None:
        return float(params.fp8_speedup)
    fast, base = cluster.device.peak_flops("float8"), cluster.device.peak_flops(dtype)
    if not fast or not base:
        raise UserError(f"device {cluster.device.name!r} has no FP8 peak in the catalog: --fp8 needs one "
                        "(e.g. H100, H200, B200, MI300X)")
    return float(fast) / float(base)


def layer_times(m: ModelSpec, micro_batch, tp, *, moe: bool, ep: int, cp: int, flash: bool,
                sequence_parallel: bool, dtype: str, dev: compute.Device, fp8: str = "",
                speedup: float = 1.0, elementwise: str = "fused",
                load: float = LOAD_IMBALANCE, expert_gemms: str = "grouped",
                cp_calls: int | None = None) -> compute.LayerTimes:
    """One layer (a MoE layer if ``moe``), one micro-batch, one rank (module doc); ``elementwise``: how
    its element-wise ops run (plan.ELEMENTWISE, ``compute.unfused_extra``); ``load``: the busiest expert
    rank's routed copies over the mean (``moe_load``); ``expert_gemms``: "per_expert" where the engine
    launches one GEMM per local expert (``EngineProfile.expert_gemms``: each pays the per-call time),
    "grouped" where one kernel runs them all. ``cp_calls``: the attention kernel calls a layer's core takes under
    cp (``CpExchange.kernel_calls``; None: cp, one per K,V block of the ring)."""
    if not extended(m, cp, fp8):
        return compute.layer_times(m, micro_batch, tp, flash=flash, recompute="none",
                                   sequence_parallel=sequence_parallel, dtype=dtype, dev=dev,
                                   elementwise=elementwise)
    moe = bool(moe and m.is_moe)
    e = COMPUTE_BYTES[dtype]
    b = np.asarray(micro_batch, dtype=float)
    tp_a = np.asarray(tp, dtype=float)
    tokens = b * m.seq_len / cp
    gemms = layer_gemms(m, micro_batch, tp, moe=moe, ep=ep, cp=cp, sequence_parallel=sequence_parallel,
                        capacity_factor=load if moe else 1.0)
    dense = [g for g in gemms if not g.name.startswith("attn_")]
    priced = _gemm_pricer(dev, dtype, fp8, speedup, expert_gemms)
    dense_s = [priced(g) for g in dense]
    gemm_fwd = sum(dense_s)
    core = [g for g in gemms if g.name.startswith("attn_")]
    h, kvh = m.hidden, m.kv_hidden
    rep_div = tp_a if sequence_parallel else 1.0
    replicated = 10.0 * h + (2.0 * h / e if m.dropout > 0 else 0.0)  # as compute.layer_times counts it
    sharded = 0.0
    if not m.learned_positions:
        sharded += 2.0 * (m.q_width + 2 * kvh)  # rotary on q and k (read + write), as compute.layer_times
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
    extra, extra_ops = compute.unfused_extra(m, tokens, tp, sequence_parallel=sequence_parallel, e=e,
                                             mode=elementwise, act_elems=act_elems)
    elem_bytes = elem_bytes + extra
    n_ops += extra_ops
    if fp8:
        # cast each FP8 GEMM's input (forward) and its output gradient (backward): CAST_BYTES[fp8]
        cast_elems = sum(g.m * g.k * g.count for g in dense if g.name not in _NOT_FP8)
        cast_bwd = sum(g.m * g.n * g.count for g in dense if g.name not in _NOT_FP8)
    else:
        cast_elems = cast_bwd = 0.0
    per = CAST_BYTES.get(fp8, 0.0)
    elem_fwd = compute.elementwise_time_s(elem_bytes + per * cast_elems, dev) + n_ops * dev.params.op_overhead_s
    elem_bwd = 2 * compute.elementwise_time_s(elem_bytes, dev) + compute.elementwise_time_s(per * cast_bwd, dev) \
        + 2 * n_ops * dev.params.op_overhead_s
    if flash:
        # a cp ring runs the kernel once per K,V block: cp calls over s/cp keys each (cp_calls: as the
        # engine's exchange runs it, e.g. one call over all s keys after an all-to-all)
        attn_fwd, attn_bwd = compute.flash_attention_s(core, dev, calls=cp if cp_calls is None else cp_calls,
                                                       seq_len=m.seq_len)
    else:
        per_score = 2.0 * e + ((2.0 * e + 1.0) if m.dropout > 0 else 0.0)
        softmax = compute.elementwise_time_s(tokens * per_score * m.heads * m.seq_len / tp_a, dev) \
            + (2 if m.dropout > 0 else 1) * dev.params.op_overhead_s
        attn_fwd = sum(compute.gemm_time_s(g, dev, in_bytes=e, out_bytes=e) for g in core) + softmax
        attn_bwd = sum(compute.gemm_time_s(g, dev, calls=2, in_bytes=e, out_bytes=e) for g in core) + 2 * softmax
    fwd = gemm_fwd + attn_fwd + elem_fwd
    bwd = 2 * gemm_fwd + attn_bwd + elem_bwd
    return compute.LayerTimes(fwd=fwd, bwd=bwd, recompute=0.0 * fwd, attention_core_fwd=attn_fwd,
                              dense_gemm_fwd=gemm_fwd, tp_gemms_fwd=compute.tp_paired_s(dense, dense_s),
                              per_op_gemm_fwd=compute.per_op_rerun_s(m, dense, dense_s))


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
        if fp8 and g.name not in _NOT_FP8:
            return compute.gemm_time_s(g, fast, calls=calls, in_bytes=1.0, out_bytes=e)
        return compute.gemm_time_s(g, dev, calls=calls, in_bytes=e, out_bytes=e)

    return priced


def module_rerun_s(m: ModelSpec, micro_batch, tp, *, moe: bool, ep: int, cp: int, sequence_parallel: bool,
                   dtype: str, dev: compute.Device, modules: tuple[str, ...], attention_core_fwd=0.0, fp8: str = "",
                   speedup: float = 1.0, load: float = LOAD_IMBALANCE, expert_gemms: str = "grouped"):
    """Forward seconds Megatron-Core's selective recomputation of ``modules`` (plan.RECOMPUTE_MODULES) reruns in
    one layer (a MoE layer if ``moe``), one micro-batch, one rank, priced as ``layer_times`` prices the forward:
    "core_attn" the attention core (``attention_core_fwd``, the layer's own); "layernorm" a stand-alone norm (read
    and write h per token: a MoE layer's pre-MLP norm, latent attention's input norm; Transformer Engine fuses the
    others into their GEMM, plan.py); "mla_up_proj" the q and kv up-projections and rotary; "mlp" a dense layer's
    fc1 and fc2, its activation and its fused norm; "shared_experts" the shared experts' GEMMs and activation;
    "moe_act" the routed copies' activation; "moe" the router, the experts, the shared experts and every
    element-wise pass of the MoE layer (permutes, activation, router softmax). FP8 GEMMs cast their inputs again.
    The collectives a rerun repeats (TP around the MLP, the all-to-alls) are ``cost.step.stage_times``'."""
    moe = bool(moe and m.is_moe)
    mods = set(modules)
    e = COMPUTE_BYTES[dtype]
    b = np.asarray(micro_batch, dtype=float)
    tp_a = np.asarray(tp, dtype=float)
    tokens = b * m.seq_len / cp
    rep_div = tp_a if sequence_parallel else 1.0
    gemms = layer_gemms(m, micro_batch, tp, moe=moe, ep=ep, cp=cp, sequence_parallel=sequence_parallel,
                        capacity_factor=load if moe else 1.0)
    priced = _gemm_pricer(dev, dtype, fp8, speedup, expert_gemms)
    per = CAST_BYTES.get(fp8, 0.0)

    def gemms_s(names):
        chosen = [g for g in gemms if g.name in names]
        casts = sum((g.m * g.k * g.count for g in chosen if fp8 and g.name not in _NOT_FP8), 0.0)
        return sum((priced(g) for g in chosen), 0.0) + compute.elementwise_time_s(per * casts, dev)

    def elem(n_bytes, ops: int):
        return compute.elementwise_time_s(n_bytes, dev) + ops * dev.params.op_overhead_s

    act = 3.0 if m.gated_mlp else 2.0  # as layer_times: SwiGLU reads gate, up, writes product; GELU reads, writes
    norm = elem(tokens * e * 2.0 * m.hidden / rep_div, 1)
    total = 0.0 * tokens
    if "core_attn" in mods:
        total = total + attention_core_fwd
    if "layernorm" in mods:
        total = total + norm * ((1 if moe else 0) + (1 if m.mla else 0))
    if "mla_up_proj" in mods and m.mla:
        rotary = 0.0 if m.learned_positions else 2.0 * (m.q_width + 2 * m.kv_hidden)
        total = total + gemms_s(("q_up", "kv_up")) + elem(tokens * e * rotary / tp_a, 2)
    if "mlp" in mods and not moe:
        total = total + gemms_s(("fc1", "fc2")) + elem(tokens * e * act * m.ffn_hidden / tp_a, 1) + norm
    if moe:
        shared = (gemms_s(("shared_fc1", "shared_fc2"))
                  + elem(tokens * e * act * m.shared_experts * m.expert_width / tp_a, 1)) if m.shared_experts else 0.0
        routed = moe_acc.routed_tokens_per_rank(m, b, tp_a, sequence_parallel=sequence_parallel, cp=cp)
        copies = routed * m.top_k * load
        if "moe" in mods:
            total = total + gemms_s(("router", "expert_fc1", "expert_fc2")) + shared + elem(
                copies * e * (act * m.expert_width + 4.0 * m.hidden)
                + routed * m.experts * 3.0 * moe_acc.ROUTER_SCORE_BYTES, 4)
        else:
            if "shared_experts" in mods:
                total = total + shared
            if "moe_act" in mods:
                total = total + elem(copies * e * act * m.expert_width, 1)
    return total


def stage_kinds(m: ModelSpec, stage_layers) -> tuple[np.ndarray, np.ndarray]:
    """(dense layers, MoE layers) of each virtual stage (S,), layers in model order."""
    split = np.asarray(stage_layers, dtype=np.int64)
    kinds = np.array([m.layer_is_moe(i) for i in range(m.layers)], dtype=float)
    ends = np.cumsum(split)
    moe = np.array([kinds[e - n:e].sum() for n, e in zip(split, ends)])
    return split - moe, moe


def folded(dp, ep: int) -> np.ndarray:
    """Whether the ep group is wider than dp, folded over the tp*cp*dp ranks of a stage (``plan.ParallelDims``)."""
    return np.asarray(dp) % max(int(ep), 1) != 0


def ep_span(tp, cp: int, ep: int, dp=None):
    """Ranks from the first to the last of an ep group (``plan.ParallelDims``): ep dp ranks,
    consecutive, strided by tp*cp; folded over tp*cp*dp (ep does not divide ``dp``; None: it does),
    ep consecutive ranks."""
    inside = (ep - 1) * np.asarray(tp) * cp + 1
    if dp is None:
        return inside
    return np.where(folded(dp, ep), ep + 0 * inside, inside)


def edp_span(tp, dp, cp: int, ep: int):
    """Ranks spanned by an expert-data-parallel group: the tp*cp ranks of each of the dp/ep dp ranks
    holding the same experts, ep*tp*cp apart; folded (ep wider than dp), the tp*cp*dp/ep ranks that
    hold the same experts, ep apart."""
    tp, dp = np.asarray(tp), np.asarray(dp)
    inside = tp * cp * (ep * (dp // ep - 1) + 1)
    edp = np.maximum(tp * cp * dp // ep, 1)
    return np.where(folded(dp, ep), ep * (edp - 1) + 1, inside)


def _none_of(experts: int, top_k: int, held) -> np.ndarray:
    """Probability that a token's top_k distinct experts, drawn uniformly from ``experts``, miss all
    ``held`` of them (hypergeometric: C(experts - held, k) / C(experts, k))."""
    held = np.asarray(held, dtype=float)
    p = np.ones_like(held)
    for i in range(top_k):
        p = p * np.clip(experts - held - i, 0.0, None) / (experts - i)
    return p


def dedup_copies(m: ModelSpec, ep: int, local) -> tuple[np.ndarray, np.ndarray]:
    """(copies over the node's links, copies over the network) per routed token of one rank under a
    deduplicating dispatcher (DeepEP, HybridEP: Megatron-Core's flex dispatcher): a token goes once to
    each other rank of the ep group that holds at least one of its top_k experts (directly, or
    forwarded inside the destination node after the network hop), and once over the network to each
    other node of the group holding one. Routing is uniform (a balanced router, as everywhere here);
    each rank holds experts/ep of them, each node ``local`` ranks of the group."""
    local = np.minimum(np.asarray(local, dtype=float), ep)
    per_rank = m.experts / ep
    ranks = (ep - 1) * (1.0 - _none_of(m.experts, m.top_k, per_rank))
    nodes = np.ceil(ep / local)
    remote = (nodes - 1) * (1.0 - _none_of(m.experts, m.top_k, per_rank * local))
    return ranks, remote


def a2a_time_s(m: ModelSpec, cluster: ClusterSpec, params: CostParams, micro_batch, tp, *, ep: int, cp: int,
               sequence_parallel: bool, dtype: str, dp=None, dispatcher: str = "alltoall",
               load: float = LOAD_IMBALANCE):
    """One all-to-all (a dispatch or a combine) of one MoE layer and micro-batch on one rank (module
    doc). ``dp``: where ep does not divide it the group is folded (ep consecutive ranks); None: inside dp.
    ``dispatcher`` (``plan.MOE_DISPATCHERS``): "alltoall" sends every routed copy pairwise; "deepep" and
    "hybridep" send each token once per destination rank and node (``dedup_copies``). ``load``: the busiest
    expert rank's routed copies over the mean (``moe_load``)."""
    msg = moe_acc.a2a_message_bytes(m, micro_batch, tp, sequence_parallel=sequence_parallel, dtype=dtype, cp=cp,
                                    capacity_factor=load)
    if ep <= 1:
        return 0.0 * msg
    tp = np.asarray(tp)
    gpn = cluster.gpus_per_node
    # members of the group on one node (the group strides by tp*cp), and the peers beyond it
    local = np.clip(gpn // (tp * cp), 1, ep)
    near_span = (local - 1) * tp * cp + 1
    if dp is not None:
        # folded: ep consecutive ranks from a multiple of ep; the fewest of them that share a node is
        # gcd(ep, gpus per node) (blocks of ep and nodes of gpn ranks meet in multiples of the gcd)
        fold = folded(dp, ep)
        local = np.where(fold, math.gcd(int(ep), int(gpn)), local)
        near_span = np.where(fold, local, near_span)
    near, far = local - 1, ep - local
    span = ep_span(tp, cp, ep, dp)
    if dp is not None:  # a folded group with peers off the node reaches them over the network
        span = np.where(fold & (far > 0), np.maximum(span, gpn + 1), span)
    nbw, _ = network.tier_arrays(cluster, near_span)
    bw, lat = network.tier_arrays(cluster, span)
    nbw = np.where(near > 0, nbw, bw)
    if dispatcher != "alltoall":
        token = msg / m.top_k  # one copy of every routed token (times the capacity factor)
        ranks, remote = dedup_copies(m, ep, local)
        on_links = np.where(near > 0, ranks * token / (nbw * params.link_eff), 0.0)
        return (ep - 1) * lat + np.maximum(on_links, remote * token / (bw * params.link_eff))
    per_peer = msg / ep
    return (ep - 1) * lat + np.maximum(near * per_peer / (nbw * params.link_eff),
                                       far * per_peer / (bw * params.link_eff))


def cp_exposed_s(m: ModelSpec, cluster: ClusterSpec, params: CostParams, micro_batch, tp, *, cp: int, dtype: str,
                 attn_fwd, attn_bwd, exchange: CpExchange | None = None):
    """(forward, backward) exposed seconds of one layer's context-parallel exchange per micro-batch, as
    the engine runs it (``exchange``, ``accounting.context.CpExchange``; None: Transformer Engine's p2p
    ring). The cp group is cp consecutive tp groups: it spans (cp-1)*tp + 1 ranks. With a K,V block's
    send ``send`` (one rank's s/cp tokens of K and V) and the layer's attention ``attn_fwd``/``attn_bwd``:

    * p2p, overlapped (the module doc): cp-1 sends each behind 1/cp of the attention, forward; cp-1
      pairs (K,V and dK,dV together) backward.
    * all_gather, exposed (TE's, exatrain's): the all-gather of the whole K,V forward; backward the
      reduce-scatter of dK,dV, after gathering K,V again where the engine does (``regather``).
    * all_gather, overlapped (torch's rotater): the gather behind the local block's attention (1/cp of
      it), forward and again backward; dK,dV round the ring (``dkv_ring``), cp-1 sends each behind a
      block's backward and the last one exposed.
    * a2a: two all-to-alls forward (Q,K,V out, the output back) and two backward (their gradients),
      each sending all but 1/cp of a rank's tensor to its cp-1 peers over the tier spanning the group
      (cp-1 latency steps each), exposed.

    Collectives carry ``collective_overhead_s`` each; the ring's sends, as before, only the tier's latency."""
    if cp <= 1:
        return 0.0 * attn_fwd, 0.0 * attn_bwd
    block = kv_block_bytes(m, micro_batch, tp, cp, dtype)
    span = (cp - 1) * np.asarray(tp) + 1
    bw, lat = network.tier_arrays(cluster, span)
    send = lat + block / (bw * params.link_eff)
    comm = "p2p" if exchange is None else exchange.comm
    if comm == "p2p":
        fwd = (cp - 1) * np.maximum(send - attn_fwd / cp, 0.0)
        bwd = (cp - 1) * np.maximum(2 * send - attn_bwd / cp, 0.0)  # K,V and dK,dV travel together
        return fwd, bwd
    if comm == "a2a":
        qkv, out = a2a_tensor_bytes(m, micro_batch, tp, cp, dtype)
        one = 2 * (params.collective_overhead_s + (cp - 1) * lat) + (cp - 1) / cp * (qkv + out) / (bw * params.link_eff)
        return one + 0.0 * attn_fwd, one + 0.0 * attn_bwd
    nbw, nlat = network.tier_arrays(cluster, span, params)
    gather = network.collective_time_s("all_gather", cp, cp * block, nbw, nlat, params)
    if not exchange.overlapped:
        scatter = network.collective_time_s("reduce_scatter", cp, cp * block, nbw, nlat, params)
        return gather + 0.0 * attn_fwd, (gather if exchange.regather else 0.0) + scatter + 0.0 * attn_bwd
    fwd = np.maximum(gather - attn_fwd / cp, 0.0)
    bwd = np.maximum(gather - attn_bwd / cp, 0.0) if exchange.regather else 0.0 * attn_bwd
    if exchange.dkv_ring:
        bwd = bwd + (cp - 1) * np.maximum(send - attn_bwd / cp, 0.0) + send
    else:
        bwd = bwd + network.collective_time_s("reduce_scatter", cp, cp * block, nbw, nlat, params)
    return fwd, bwd


def rank_params_split(m: ModelSpec, tp, pp: int, interleave: int, split, ep: int):
    """(non-routed-expert, routed-expert) parameters one rank of each pipeline rank holds, arrays
    (N, pp) for tp (N, 1): ``params.stage_params_split`` on arrays, with ``ep``."""
    tp = np.asarray(tp, dtype=np.int64)
    kinds = stage_layer_kinds(m, pp=pp, interleave=interleave, layers_per_stage=tuple(int(x) for x in split))
    n_dense = np.array([k[0] for k in kinds], dtype=np.int64)[None, :]
    n_moe = np.array([k[1] for k in kinds], dtype=np.int64)[None, :]
    dl = layer_params(m, moe=False)
    dense = n_dense * (dl.sharded // tp + dl.replicated)
    experts = np.zeros_like(dense)
    if m.is_moe:
        ml = layer_params(m, moe=True)
        dense = dense + n_moe * (ml.sharded // tp + ml.replicated)
        experts = experts + n_moe * (ml.experts // ep)
    rank = np.arange(pp)[None, :]
    dense = dense + np.where(rank == 0, embedding_params(m) // tp + position_params(m), 0)
    head = (np.where(pp > 1, embedding_params(m) // tp, 0) if m.tied_embeddings else head_params(m) // tp)
    dense = dense + np.where(rank == pp - 1, final_norm_params(m) + head, 0)
    return dense, experts, n_moe


__all__ = ["LOAD_IMBALANCE", "a2a_time_s", "cp_exposed_s", "dedup_copies", "edp_span", "ep_span", "extended",
           "fp8_recipe", "folded", "fp8_speedup", "layer_times", "moe_load", "plan_moe_load", "rank_params_split",
           "stage_kinds"]


def comm_bytes(plan) -> dict[str, float]:
    """Bytes the busiest rank sends per step, per kind (``accounting.comms.comm_bytes_per_rank``),
    with ep, cp and the expert split: tp and pp messages of s/cp tokens, dp over the dp*cp group plus
    the experts' reduction over the expert-data-parallel group, the expert all-to-alls ("ep": a
    deduplicating dispatcher sends each routed token once per destination rank, ``dedup_copies``, where
    the all-to-all sends its top_k copies) and the K,V ring ("cp"). The dp bytes are those the plan's
    runtime sends (``cost.step.engine_dp_collectives``: its gradient dtype, its ZeRO-1 collectives, FP8
    weight gathers under ``Plan.fp8_param_gather``), the ones its dp time is priced from."""
    from exatrain.accounting import comms
    from exatrain.accounting.engines import plan_engine
    from exatrain.planner.cost import step

    engine = None if plan.runtime == "exatrain" else plan_engine(plan)
    out = comms.comm_bytes_per_rank(plan, engine)
    m = plan.model
    if not (m.is_moe or plan.cp > 1 or plan.runtime != "exatrain"):
        return out
    split = stage_params_split_for(plan)
    cp_comm = cp_comm_for(plan.runtime, plan.cp_comm, m)
    stage_layers = np.asarray(plan.layers_per_stage())
    kinds = stage_layer_kinds(m, pp=plan.pp, interleave=plan.interleave, layers_per_stage=tuple(stage_layers))
    fp8_gathered = (step.fp8_gathered_params(m, np.asarray([plan.tp]), stage_layers, plan.pp, plan.ep)
                    if plan.fp8 and plan.fp8_param_gather else None)
    dp, ep, cpb = [], [], []
    for r in range(plan.pp):
        dense, experts = split[r]
        dp.append(sum(float(c.bytes_per_rank) for c in step.engine_dp_collectives(
            m, tp=plan.tp, pp=plan.pp, dp=plan.dp, zero_stage=plan.zero_stage, params_here=dense,
            num_microbatches=plan.num_microbatches, dtype=plan.dtype, pipeline_end=r in (0, plan.pp - 1),
            engine=engine, cp_size=plan.cp, ep=plan.ep, expert_params_here=experts,
            fp8_gathered=None if fp8_gathered is None else tuple(float(g[0, r]) for g in fp8_gathered))))
        # the share of the rank's layers whose forward runs again: a full recomputation's (the first
        # recompute_layers of each stage), the "moe" module's for the all-to-alls
        full = plan.recomputed_layers_of_rank(r) / max(sum(kinds[r]), 1)
        if m.is_moe:
            moe_again = 1.0 if plan.recompute == "selective" and "moe" in plan.recompute_modules else full
            ep.append(sum(float(c.bytes_per_rank) for c in comms.moe_collectives_for(
                m, micro_batch=plan.micro_batch, tp=plan.tp, ep=plan.ep, cp=plan.cp,
                sequence_parallel=plan.sequence_parallel, dtype=plan.dtype, moe_layers=kinds[r][1],
                num_microbatches=plan.num_microbatches, capacity_factor=plan_moe_load(plan), rerun=moe_again)))
        if plan.cp > 1:
            cpb.append(sum(float(c.bytes_per_rank) for c in comms.cp_collectives_for(
                m, micro_batch=plan.micro_batch, tp=plan.tp, cp=plan.cp, dtype=plan.dtype, layers=sum(kinds[r]),
                num_microbatches=plan.num_microbatches, comm=cp_comm, rerun=full)))
    out["dp"] = max(dp)
    for k in ("tp", "pp"):  # their messages are a rank's tokens wide: s/cp of each sequence
        out[k] = out[k] / plan.cp
    if ep:
        out["ep"] = max(ep)
        if plan.moe_dispatcher != "alltoall" and plan.ep > 1:
            ranks, _ = dedup_copies(m, plan.ep, 1)
            out["ep"] *= float(ranks) / (m.top_k * (plan.ep - 1) / plan.ep)
    if cpb:
        out["cp"] = max(cpb)
    return out


def stage_params_split_for(plan):
    """``params.stage_params_split`` of the plan, with its ep."""
    from exatrain.accounting.params import stage_params_split

    return stage_params_split(plan.model, tp=plan.tp, pp=plan.pp, interleave=plan.interleave,
                              layers_per_stage=plan.layers_per_stage(), ep=plan.ep)
