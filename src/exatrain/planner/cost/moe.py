"""Cost terms of mixture-of-experts layers under expert parallelism (ep): the expert all-to-all, where the ep and
expert-data-parallel groups lie, and the split of a rank's parameters into routed experts and the rest.

Expert all-to-all (``a2a_time_s``; exposed, seconds per layer and micro-batch on one rank): Megatron-Core's
all-to-all dispatcher (megatron/core/transformer/moe/token_dispatcher.py) sends T*top_k token copies out and back
— dispatch and combine — in forward and again in backward; not overlapped with compute (Megatron-Core overlaps it
only with ``--overlap-moe-expert-parallel-comm``). The ep group is ep consecutive dp ranks, strided by tp*cp, or,
wider than dp (folded over tp*cp*dp: Megatron-Core's MoE parallel folding), ep consecutive ranks
(``plan.ParallelDims``, ``ep_span``): a rank sends 1/ep of its buffer to each of its ep-1 peers (pairwise exchange;
Thakur et al. 2005, Sec. 4.5), over the node's links to the peers on its node and over the network to the others,
both at once (NCCL's all-to-all posts every peer's send together), so the slower of the two sets the time, plus
(ep-1) latency steps of the tier spanning the group.

The load of the busiest expert rank over the mean of the routed token copies (``accounting.moe.moe_load``, from
the plan's routing settings) scales the expert GEMMs, the all-to-all buffers and the dispatch buffers and expert
activations in memory.
"""

from __future__ import annotations

import math

import numpy as np

from exatrain.accounting import moe as moe_acc
from exatrain.accounting.moe import LOAD_IMBALANCE
from exatrain.accounting.params import (
    embedding_params,
    final_norm_params,
    head_params,
    layer_params,
    position_params,
    stage_layer_kinds,
)
from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.planner.cost import network
from exatrain.planner.cost.coefficients import CostParams


def stage_kinds(m: ModelSpec, stage_layers) -> tuple[np.ndarray, np.ndarray]:
    """(dense layers, MoE layers) of each virtual stage (S,), layers in model order."""
    split = np.asarray(stage_layers, dtype=np.int64)
    kinds = np.array([m.layer_is_moe(i) for i in range(m.layers)], dtype=float)
    ends = np.cumsum(split)
    moe = np.array([kinds[e - n : e].sum() for n, e in zip(split, ends)])
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


def a2a_time_s(
    m: ModelSpec,
    cluster: ClusterSpec,
    params: CostParams,
    micro_batch,
    tp,
    *,
    ep: int,
    cp: int,
    sequence_parallel: bool,
    dtype: str,
    dp=None,
    dispatcher: str = "alltoall",
    load: float = LOAD_IMBALANCE,
):
    """One all-to-all (a dispatch or a combine) of one MoE layer and micro-batch on one rank (module
    doc). ``dp``: where ep does not divide it the group is folded (ep consecutive ranks); None: inside dp.
    ``dispatcher`` (``settings.MOE_DISPATCHERS``): "alltoall" sends every routed copy pairwise; "deepep" and
    "hybridep" send each token once per destination rank and node (``dedup_copies``). ``load``: the busiest
    expert rank's routed copies over the mean (``moe_load``)."""
    msg = moe_acc.a2a_message_bytes(
        m, micro_batch, tp, sequence_parallel=sequence_parallel, dtype=dtype, cp=cp, capacity_factor=load
    )
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
    return (ep - 1) * lat + np.maximum(
        near * per_peer / (nbw * params.link_eff), far * per_peer / (bw * params.link_eff)
    )


def rank_params_split(m: ModelSpec, tp, pp: int, interleave: int, split, ep: int, v_shape: bool = False):
    """(non-routed-expert, routed-expert) parameters one rank of each pipeline rank holds, arrays
    (N, pp) for tp (N, 1): ``params.stage_params_split`` on arrays, with ``ep`` (``v_shape``: a V placement)."""
    tp = np.asarray(tp, dtype=np.int64)
    kinds = stage_layer_kinds(
        m, pp=pp, interleave=interleave, layers_per_stage=tuple(int(x) for x in split), v_shape=v_shape
    )
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
    head = np.where(pp > 1, embedding_params(m) // tp, 0) if m.tied_embeddings else head_params(m) // tp
    dense = dense + np.where(rank == (0 if v_shape else pp - 1), final_norm_params(m) + head, 0)
    return dense, experts, n_moe


__all__ = ["a2a_time_s", "dedup_copies", "edp_span", "ep_span", "folded", "rank_params_split", "stage_kinds"]
