"""Tensor-parallel collectives in the step time: the seconds of one forward-or-backward collective on a rank's
activations over the tp group's tier (``cost.network``), and what a runtime that decomposes each collective beside
its GEMMs leaves exposed (``tp_overlap_exposed``). ``cost.stage.tp_term`` counts them per stage."""

from __future__ import annotations

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.planner.cost import network
from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.cost.overlap import exposed


def tp_collectives_s(
    cluster: ClusterSpec, coeffs: CostParams, tp, message_bytes, kinds=("all_gather", "reduce_scatter")
):
    """Seconds of each of ``kinds`` of TP collective on b*s*h over the tp group's tier (0 where tp is
    1); arrays allowed."""
    on = np.asarray(tp) > 1
    return tuple(
        np.where(on, network.collective_s(kind, cluster, tp, network.tp_span(tp), message_bytes, coeffs), 0.0)
        for kind in kinds
    )


def tp_collective_time_s(cluster: ClusterSpec, coeffs: CostParams, tp, message_bytes, sequence_parallel):
    """One forward-or-backward TP collective on b*s*h (an all-reduce, or with sequence parallelism
    an all-gather + reduce-scatter pair) over the tp group's tier; arrays allowed."""
    ag, rs, ar = tp_collectives_s(cluster, coeffs, tp, message_bytes, ("all_gather", "reduce_scatter", "all_reduce"))
    return np.where(sequence_parallel, ag + rs, ar)


def tp_overlap_exposed(ag, rs, tp, gemms_fwd, *, mlp: bool, ag_fwd=None):
    """(forward, backward) TP seconds a layer leaves exposed when its runtime decomposes each
    sequence-parallel collective into tp chunks pipelined with the GEMMs next to it (``cost.overlap``
    ``tp``; ``compute.TP_PAIRS``: ``gemms_fwd`` are their forward seconds). Chunk i of the GEMM waits
    for chunk i of the collective (or the other way round), so of the collective's ``c`` seconds and
    the GEMM's ``g`` the pipeline hides all but ``max(0, c - g (tp-1)/tp)``: one chunk of the GEMM
    has no transfer beside it. The forward pairs the attention input's all-gather with the input
    projections, the reduce-scatter with ``proj``, and the MLP's with ``fc1`` / ``fc2``; the backward
    runs each one's transpose (a reduce-scatter of the input gradient, an all-gather of the output
    gradient) beside the same GEMMs' input- and weight-gradient passes, twice the forward's time.
    ``mlp``: the layer has the MLP pair (dense layers, MoE layers with shared experts); ``ag_fwd``: the
    forward's all-gathers where they carry FP8 inputs (None: ``ag``)."""
    share = (np.asarray(tp, dtype=float) - 1) / np.maximum(np.asarray(tp, dtype=float), 1)
    g_in, g_proj, g_fc1, g_fc2 = gemms_fwd
    agf = ag if ag_fwd is None else ag_fwd
    fwd = exposed(agf, share * g_in) + exposed(rs, share * g_proj)
    bwd = exposed(rs, 2 * share * g_in) + exposed(ag, 2 * share * g_proj)
    if mlp:
        fwd = fwd + exposed(agf, share * g_fc1) + exposed(rs, share * g_fc2)
        bwd = bwd + exposed(rs, 2 * share * g_fc1) + exposed(ag, 2 * share * g_fc2)
    return fwd, bwd


__all__ = ["tp_collective_time_s", "tp_collectives_s", "tp_overlap_exposed"]
