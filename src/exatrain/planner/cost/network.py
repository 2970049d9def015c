"""Time of collectives on the link tier a group actually spans (alpha-beta model).

Ring algorithms (Patarasuk & Yuan 2009; Thakur et al. 2005): over n ranks an all-reduce takes
2(n-1) steps of latency alpha and sends 2(n-1)/n of the buffer per rank; all-gather, reduce-scatter
and broadcast (pipelined) half of that; a send/recv one step and the whole buffer. Every call adds a
fixed ``CostParams.collective_overhead_s`` (the library's own base latency, as NCCL's cost model
counts it), so many small collectives cost more than their bytes.

Ranks are ordered tp fastest, then dp, then pp, so a tp group is ``tp`` consecutive ranks, a dp group
strides by tp (spanning tp*(dp-1)+1 ranks) and pipeline neighbours are tp*dp apart. A group is
carried by the narrowest tier that spans it (``ClusterSpec.tier_for``): on Frontier tp=2 talks over
the 200 GB/s GCD pair, tp=4 or 8 over 50 GB/s Infinity Fabric, anything wider over Slingshot.
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
