"""The closed form the accumulation-pass tests price against: a plan's parameters per pipeline rank, and the
seconds a pass of so many bytes a parameter takes over them at the element-wise kernels' bandwidth."""

from __future__ import annotations

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.planner.cost import compute
from exatrain.planner.cost import moe as cost_moe
from exatrain.planner.cost.coefficients import default_params


def rank_params(plan) -> np.ndarray:
    """(1, pp) parameters one rank of each pipeline rank holds, routed experts included."""
    dense, routed, _ = cost_moe.rank_params_split(
        plan.model, np.array([[plan.tp]]), plan.pp, plan.interleave, plan.layers_per_stage(), plan.ep
    )
    return (dense + routed).astype(float)


def pass_seconds(plan, cluster: ClusterSpec, bytes_per_param) -> np.ndarray:
    """(1, pp) seconds of one pass moving ``bytes_per_param`` (a number or (1, pp)) over each rank's parameters,
    on ``cluster``'s device with its shipped prior."""
    dev = compute.device_for(cluster, plan.dtype, default_params(cluster.device.name), plan.gpus)
    return compute.elementwise_time_s(np.asarray(bytes_per_param, dtype=float) * rank_params(plan), dev)
