"""The optimizer step in the step time: Adam over a rank's optimizer shard in the engine's kernel and the
engine's passes around it (``optimizer_seconds``), and float16's found-inf all-reduce (``loss_scaling_s``)."""

from __future__ import annotations

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.planner.cost import compute, network
from exatrain.planner.cost.coefficients import CostParams


FOUND_INF_BYTES = 4.0  # the overflow flag (an fp32 scalar) each rank all-reduces under float16 training


def loss_scaling_s(cluster: ClusterSpec, coeffs: CostParams, dtype: str, gpus):
    """(N,) seconds a step of float16 training spends on its dynamic loss scaling beyond the unscale pass (which is
    an optimizer-step pass, ``EngineProfile.step_pass_bytes``): the found-inf all-reduce before the update, one
    fp32 flag over the ``gpus`` ranks of the job (every rank holding other gradients takes part; a MAX all-reduce,
    latency-bound: ``network.collective_s``). 0 for other dtypes."""
    gpus = np.asarray(gpus)
    if dtype != "float16":
        return 0.0 * gpus
    return network.collective_s("all_reduce", cluster, gpus, gpus, FOUND_INF_BYTES, coeffs)


def optimizer_seconds(
    engine,
    dtype: str,
    params_by_rank,
    expert_params,
    *,
    shard,
    xshard,
    zero,
    tp,
    ep: int,
    on_host: bool,
    dev: compute.Device,
    offloaded: bool = False,
) -> np.ndarray:
    """(N,) seconds of the optimizer step on its slowest pipeline rank: Adam over the rank's optimizer shard
    (``params_by_rank`` / ``shard`` and ``expert_params`` / ``xshard``, each (N, pp)) in the engine's kernel
    (engines.ADAM_BYTES; exatrain's fused one only where its parameters are plain GPU tensors: tp 1, ep 1, no FSDP,
    no ZeroRedundancyOptimizer), and the engine's passes around it (``EngineProfile.step_passes``) over the whole
    stage, over the gradients as held (sharded at ZeRO-2/3) and over the optimizer shard. Element-wise bandwidth:
    every pass is memory-bound. ``offloaded``: Adam runs on the host's CPUs (``cost.offload``), not here."""
    from exatrain.accounting.engines import ADAM_BYTES

    whole_b, held_b, shard_b = engine.step_passes(dtype)
    zero = np.asarray(zero).reshape(-1, 1)
    whole = params_by_rank + expert_params
    sharded = params_by_rank / shard + expert_params / xshard
    held = np.where(zero >= 2, sharded, whole)
    kernel = engine.adam_kernel(tp=np.asarray(tp).reshape(-1, 1), ep=ep, zero=zero, shard=shard, on_host=on_host)
    adam = np.vectorize(ADAM_BYTES.__getitem__, otypes=[float])(kernel) * (not offloaded)
    moved = whole_b * whole + held_b * held + (shard_b + adam) * sharded
    return compute.elementwise_time_s(moved, dev).max(axis=1)


__all__ = ["FOUND_INF_BYTES", "loss_scaling_s", "optimizer_seconds"]
