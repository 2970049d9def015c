"""Collectives of a group that spans nodes, priced as NCCL runs them (cost.network.collective_s): its
channels stripe over all of a node's NICs, so the bus bandwidth is the node's NICs together (capped by
the node's own links), not one NIC; checked against published nccl-tests bus bandwidths
(benchmarks/data/nccl_tests_busbw.csv).

Broken on purpose and seen to fail here: the NIC share not multiplied by the group's members on a node
(``nic = cluster.network.bytes_per_s * eff`` in ``network.node_bus_bandwidth``: one NIC per group, the
old pricing) fails ``test_two_node_tp_group_uses_every_nic`` and the nccl-tests comparison (every
multi-node row 4-8x under) and the dp-share tests; dropping the in-node cap (``bus = nic``) fails
``test_the_node_links_cap_the_nics`` and the tp 1 dp-share case; the tree left out of ``collective_s``
fails ``test_tree_takes_small_all_reduces_at_scale``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from exatrain.catalog import get_cluster
from exatrain.catalog.hardware import ClusterSpec, LinkTier
from exatrain.planner.cost import network
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.cost.step import tp_collective_time_s

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "nccl_tests_busbw.csv"
TOLERANCE = 0.15  # |predicted / published - 1| for rows that met their owners' expectation


def _rows() -> list[dict]:
    return list(csv.DictReader(DATA.open(encoding="utf-8")))


def _cluster_of(row: dict) -> ClusterSpec:
    """The row's node: the catalog DGX of its GPU for the in-node links, the row's NICs for the network
    (the network tier is one rank's share of the node's NICs, as in the catalog)."""
    base = get_cluster("dgx-h100" if "H100" in row["hardware"] else "dgx-a100")
    gpn = int(row["gpus_per_node"])
    share = int(row["nics_per_node"]) * float(row["nic_gbps"]) / 8 * 1e9 / gpn
    return ClusterSpec(
        name="nccl-tests",
        device=base.device,
        gpus_per_node=gpn,
        tiers=(base.tiers[0], LinkTier("nics", 0, share, base.network.latency_s)),
    )


def _busbw(cluster: ClusterSpec, nodes: int, size: float) -> float:
    """nccl-tests' bus bandwidth of an all-reduce over every GPU of ``nodes`` nodes (2(n-1)/n S / t)."""
    n = nodes * cluster.gpus_per_node
    t = float(
        network.collective_s(
            "all_reduce", cluster, np.array([n]), np.array([n]), size, default_params(cluster.device.name)
        )[0]
    )
    return 2 * (n - 1) / n * size / t / 1e9


def test_published_nccl_tests_bus_bandwidths() -> None:
    """Large all-reduces on 1-5 nodes with 2-8 NICs a node: within 15% of what was published; where the
    NCCL maintainers called a figure low, the model is above it; on two nodes NCCL's tree can beat the
    network's limit (not priced), so that row may sit above the model by up to 25%."""
    rows = _rows()
    assert len(rows) >= 10 and len({r["url"] for r in rows}) >= 8
    checked = 0
    for r in rows:
        c = _cluster_of(r)
        size = float(r["size_bytes"] or 1 << 33)
        published = float(r["busbw_gbs"])
        for nodes in [int(r["nodes"])] if r["nodes"] else [2, 8, 64]:
            got = _busbw(c, nodes, size)
            if "below expectation" in r["kind"]:
                assert got > published, r["source"]
            elif r["algorithm"] == "tree" and nodes == 2:
                assert 0.75 * published < got < published, r["source"]
            else:
                assert abs(got / published - 1) < TOLERANCE, (r["source"], nodes, got, published)
            checked += 1
    assert checked >= 12


def test_two_node_tp_group_uses_every_nic() -> None:
    """tp 16 over two DGX A100 nodes: its all-reduce runs at the node's eight NICs together, not at one
    NIC's 25 GB/s — several times faster than one-NIC pricing, and no slower than 1.3x tp 8 in a node."""
    c = get_cluster("dgx-a100")
    p = default_params(c.device.name)
    msg = float(1 << 28)
    t16 = float(tp_collective_time_s(c, p, np.array([16]), msg, np.array([False]))[0])
    t8 = float(tp_collective_time_s(c, p, np.array([8]), msg, np.array([False]))[0])
    one_nic = 2 * 15 / 16 * msg / (c.network.bytes_per_s * p.net_eff)
    assert t16 < one_nic / 5
    assert t16 < 1.3 * t8
    bus = float(network.node_bus_bandwidth(c, 16, 16, p)[0])
    assert bus == pytest.approx(min(8 * c.network.bytes_per_s * p.net_eff, c.tiers[0].bytes_per_s * p.link_eff))


@pytest.mark.parametrize("tp, members", [(1, 8), (2, 4), (4, 2), (8, 1)])
def test_a_dp_group_gets_its_members_share_of_the_nics(tp: int, members: int) -> None:
    """dp 16 strided by tp: tp groups' worth of dp groups reduce at once, each on its members' NICs."""
    c = get_cluster("dgx-h100")
    p = default_params(c.device.name)
    span = network.dp_span(tp, 16)
    assert float(network.ranks_per_node(c, 16, span)) == members
    bus = float(network.node_bus_bandwidth(c, 16, span, p)[0])
    nics = members * c.network.bytes_per_s * p.net_eff
    assert bus == pytest.approx(min(nics, c.tiers[0].bytes_per_s * p.link_eff) if members > 1 else nics)


def test_the_node_links_cap_the_nics() -> None:
    """Eight 400 Gb/s NICs carry more than the node's NVLink ring: the ring is held to NVLink's rate."""
    c = get_cluster("dgx-h100")
    p = default_params(c.device.name)
    bus = float(network.node_bus_bandwidth(c, 32, 32, p)[0])
    assert bus == pytest.approx(c.tiers[0].bytes_per_s * p.link_eff)
    assert 8 * c.network.bytes_per_s * p.net_eff > bus


def test_tree_takes_small_all_reduces_at_scale() -> None:
    """On 512 nodes a ring's 2 x 511 network hops dominate a small all-reduce; NCCL's tree (2 log2 nodes
    hops) is priced instead, while a large one on 16 nodes stays on the ring (2(n-1)/n of the bytes, not
    2/0.92)."""
    c = get_cluster("dgx-h100")
    p = default_params(c.device.name)
    n = 512 * 8
    small = float(network.collective_s("all_reduce", c, np.array([n]), np.array([n]), 1 << 20, p)[0])
    ring_hops = 2 * (511 * c.network.latency_s + (n - 512) * c.tiers[0].latency_s) * network.RING_PLATEAU
    assert small < ring_hops / 5
    big, n = 8.0 * (1 << 30), 16 * 8
    bus = float(network.node_bus_bandwidth(c, n, n, p)[0])
    t = float(network.collective_s("all_reduce", c, np.array([n]), np.array([n]), big, p)[0])
    assert t < 2 * big / (network.TREE_BW * bus)
    assert t == pytest.approx(2 * (n - 1) / n * big / bus, rel=0.05)


def test_groups_inside_a_node_and_without_node_links_are_unchanged() -> None:
    """A group inside one node, and every group on a cluster with no in-node tier (the local CPU's
    loopback), are priced on their tier as before."""
    p = default_params("h100-sxm")
    c = get_cluster("dgx-h100")
    bw, lat = network.tier_arrays(c, np.array([8]), p)
    inside = network.collective_time_s("all_gather", 8, 1e8, bw, lat, p)
    assert float(network.collective_s("all_gather", c, 8, np.array([8]), 1e8, p)[0]) == float(inside[0])
    cpu = get_cluster("local-cpu")
    q = default_params("cpu")
    bw, lat = network.tier_arrays(cpu, np.array([16]), q)
    assert float(network.collective_s("all_reduce", cpu, 16, np.array([16]), 1e6, q)[0]) == pytest.approx(
        float(network.collective_time_s("all_reduce", 16, 1e6, bw, lat, q)[0])
    )
