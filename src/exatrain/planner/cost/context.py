"""Context parallelism's exchange of attention's operands in the step time (``cp_exposed_s``): what each engine's
way of sending K,V (a ring, an all-gather, an all-to-all; ``accounting.context.CpExchange``) leaves exposed.

The context-parallel ring: cp-1 K,V blocks per layer forward and cp-1 (K,V + dK,dV) backward
(``accounting.context``), each sent while the previous block's attention runs (Megatron-Core / TE
``AttnFuncWithCPAndKVP2P`` overlap them this way): a step exposes only what its send takes beyond 1/cp of the
layer's attention compute.
"""

from __future__ import annotations

import numpy as np

from exatrain.accounting.context import CpExchange, a2a_tensor_bytes, kv_block_bytes
from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.planner.cost import network
from exatrain.planner.cost.coefficients import CostParams


def cp_exposed_s(
    m: ModelSpec,
    cluster: ClusterSpec,
    params: CostParams,
    micro_batch,
    tp,
    *,
    cp: int,
    dtype: str,
    attn_fwd,
    attn_bwd,
    exchange: CpExchange | None = None,
):
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


__all__ = ["cp_exposed_s"]
