"""Time of collectives on the link tier a group actually spans (alpha-beta model).

Ring algorithms (Patarasuk & Yuan 2009; Thakur et al. 2005): over n ranks an all-reduce takes
2(n-1) steps of latency alpha and sends 2(n-1)/n of the buffer per rank; all-gather, reduce-scatter
and broadcast (pipelined) half of that; a send/recv one step and the whole buffer. Every call adds a
fixed ``CostParams.collective_overhead_s`` (the library's own base latency, as NCCL's cost model
counts it), so many small collectives cost more than their bytes.

Ranks are ordered tp fastest, then dp, then pp, so a tp group is ``tp`` consecutive ranks, a dp group
strides by tp (spanning tp*(dp-1)+1 ranks) and pipeline neighbours are tp*dp apart. A group inside a
node is carried by the narrowest tier that spans it (``ClusterSpec.tier_for``): on Frontier tp=2 talks
over the 200 GB/s GCD pair, tp=4 or 8 over 50 GB/s Infinity Fabric.

A group that spans nodes (``collective_s``) is priced as NCCL runs it (src/graph/tuning.cc,
ncclTopoTuneModel): its rings and trees stripe over one channel per NIC, so a group with k members on
each node crosses between nodes on k ranks' share of the node's NICs at once (the catalog's network
tier is one rank's share), capped by the node's own links that the ring also crosses; a ring's
latency is one network hop per node boundary and one in-node hop per other step, and an all-reduce
takes NCCL's tree (2 log2(nodes) network hops) where that is faster. NVLink-SHARP and in-network
(SHARP) reduction are not priced: on clusters that have them NCCL can be faster than this.
Functions accept numpy arrays for sizes and group sizes (the search evaluates many plans at once).
"""

from __future__ import annotations

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.planner.cost.coefficients import CostParams

_STEPS = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "broadcast": 1.0}


def tier_arrays(cluster: ClusterSpec, span, params: CostParams | None = None):
    """Per-rank bandwidth (bytes/s) and latency (s) of the tier carrying a group of ``span`` ranks.
    With ``params`` (a ring collective's or a send's caller), the network tier's bandwidth is scaled by
    net_eff / link_eff, so that ``collective_time_s``'s link_eff leaves it at net_eff of line rate
    (``CostParams.net_eff``); all-to-all and the context-parallel ring pass none."""
    span = np.asarray(span)
    net = cluster.network.bytes_per_s
    if params is not None and params.net_eff is not None and params.link_eff > 0:
        net = net * params.net_eff / params.link_eff
    bw = np.full(span.shape, net, dtype=float)
    lat = np.full(span.shape, cluster.network.latency_s, dtype=float)
    # Walk tiers widest-first so the narrowest covering tier wins.
    for tier in reversed(cluster.tiers[:-1]):
        inside = span <= tier.span
        bw = np.where(inside, tier.bytes_per_s, bw)
        lat = np.where(inside, tier.latency_s, lat)
    return bw, lat


def collective_time_s(kind: str, group, message_bytes, bw, lat, params: CostParams):
    """Seconds for one collective of ``message_bytes`` over ``group`` ranks on links (bw, lat)."""
    n = np.asarray(group, dtype=float)
    eff_bw = np.asarray(bw, dtype=float) * params.link_eff
    base = params.collective_overhead_s  # fixed per call (CostParams: NCCL/RCCL tuning.cc baseLat)
    if kind == "send_recv":
        return base + lat + message_bytes / eff_bw
    steps = _STEPS[kind]
    frac = steps * (n - 1) / np.maximum(n, 1)
    t = base + steps * (n - 1) * lat + frac * message_bytes / eff_bw
    return np.where(n > 1, t, 0.0)


def tp_span(tp):
    return np.asarray(tp)


def dp_span(tp, dp):
    return np.asarray(tp) * (np.asarray(dp) - 1) + 1


def pp_span(tp, dp):
    return np.asarray(tp) * np.asarray(dp) + 1


# NCCL's ring all-reduce across nodes, at sizes where bandwidth rules, takes this times its summed
# per-step latency (src/graph/tuning.cc ncclTopoGetAlgoTime: "plateau effect of ring", 1.4 from sm80).
RING_PLATEAU = 1.4
# NCCL's tree all-reduce: bus bandwidth 0.92 of the channels' (tuning.cc: busBw * .92), algorithm
# bandwidth half the bus bandwidth (ratio .5); latency 2 x ((k-1) in-node + log2(nodes) network hops).
TREE_BW = 0.92


def ranks_per_node(cluster: ClusterSpec, group, span):
    """Members of a group of ``group`` ranks spread evenly over ``span`` consecutive ranks that share
    one node of ``cluster.gpus_per_node`` (1 where the members stride a node or more apart)."""
    n = np.maximum(np.asarray(group, dtype=float), 1.0)
    stride = np.where(n > 1, (np.asarray(span, dtype=float) - 1) / np.maximum(n - 1, 1), 1.0)
    k = np.floor(cluster.gpus_per_node / np.maximum(stride, 1.0))
    return np.clip(k, 1.0, n)


def spans_nodes(cluster: ClusterSpec, group, span):
    """Where a group crosses the network tier between nodes (the cluster has links inside a node and
    the group reaches beyond them onto a second node)."""
    if len(cluster.tiers) < 2:
        return np.zeros(np.broadcast(np.asarray(group), np.asarray(span)).shape, dtype=bool)
    widest = max(t.span for t in cluster.tiers[:-1])
    n = np.asarray(group, dtype=float)
    return (np.asarray(span) > widest) & (np.ceil(n / ranks_per_node(cluster, group, span)) > 1)


def node_bus_bandwidth(cluster: ClusterSpec, group, span, params: CostParams):
    """(bus bandwidth, network-hop latency, in-node-hop latency, nodes, members a node) of a group that
    spans nodes: NCCL stripes its channels over the NICs, one channel per NIC (tuning.cc: busBw =
    nChannels x per-channel speed), so its k members on a node send over k ranks' share of the node's
    NICs (the network tier's per-rank rate x k, at ``net_eff`` of line rate), and its ring's in-node hops
    over the links joining those k members (at ``link_eff``); the slower of the two is the bus rate."""
    n = np.maximum(np.asarray(group, dtype=float), 1.0)
    k = ranks_per_node(cluster, group, span)
    nodes = np.ceil(n / k)
    stride = np.where(n > 1, (np.asarray(span, dtype=float) - 1) / np.maximum(n - 1, 1), 1.0)
    inner_span = np.minimum((k - 1) * stride + 1, cluster.gpus_per_node)
    inner_bw, inner_lat = tier_arrays(cluster, np.maximum(np.rint(inner_span), 1))
    eff = params.net_eff if params.net_eff is not None else params.link_eff
    nic = k * cluster.network.bytes_per_s * eff
    bus = np.where(k > 1, np.minimum(nic, inner_bw * params.link_eff), nic)
    return bus, cluster.network.latency_s + 0.0 * bus, inner_lat + 0.0 * bus, nodes, k


def collective_s(kind: str, cluster: ClusterSpec, group, span, message_bytes, params: CostParams):
    """Seconds of one collective of ``message_bytes`` over ``group`` ranks spread over ``span``
    consecutive ranks: inside a node on the tier spanning it (``collective_time_s``); across nodes as
    NCCL prices it (module doc, ``node_bus_bandwidth``): a ring of (n-1) steps per pass, (nodes-1) of
    them network hops, at the node's bus rate; an all-reduce the faster of that ring (its latency x
    ``RING_PLATEAU``) and NCCL's tree. Sends (``send_recv``) take one rank's NIC as before."""
    bw, lat = tier_arrays(cluster, span, params)
    inside = collective_time_s(kind, group, message_bytes, bw, lat, params)
    if kind == "send_recv":
        return inside
    cross = spans_nodes(cluster, group, span)
    if not np.any(cross):
        return inside
    n = np.maximum(np.asarray(group, dtype=float), 1.0)
    bus, lat_net, lat_in, nodes, k = node_bus_bandwidth(cluster, group, span, params)
    steps = _STEPS[kind]
    base = params.collective_overhead_s
    hops = steps * ((nodes - 1) * lat_net + (n - nodes) * lat_in)
    ring = base + hops * (RING_PLATEAU if kind == "all_reduce" else 1.0) + steps * (n - 1) / n * message_bytes / bus
    if kind == "all_reduce":
        tree = (
            base
            + 2 * ((k - 1) * lat_in + np.ceil(np.log2(np.maximum(nodes, 1))) * lat_net)
            + 2 * message_bytes / (TREE_BW * bus)
        )
        ring = np.minimum(ring, tree)
    return np.where(cross, ring, inside)
