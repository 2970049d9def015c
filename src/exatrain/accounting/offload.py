"""Model states kept in host memory (``Plan.offload``, settings.OFFLOADS): what leaves a GPU and what a node's host
memory then holds.

An engine's states per parameter are ``full + sharded / dp`` of weights, gradients and optimizer states
(``accounting.engines.StateRule``). Offloading moves:

* ``optimizer`` (DeepSpeed ZeRO-Offload, Ren et al. 2021 Sec. 4; Megatron-Core's HybridDeviceOptimizer): the Adam
  states, the fp32 master weights (up to 4 bytes of the sharded weights, 16-bit training) and the sharded gradient
  partition (ZeRO-2/3). The host keeps the master weights, an fp32 gradient partition and the Adam states;
  the GPU keeps its 16-bit weights and what its gradient buffers hold whole.
* ``params`` (DeepSpeed ZeRO-3 offload_param; FSDP2's CPUOffloadPolicy): every sharded part (the sharded weights,
  gradients and optimizer states). The host keeps them as they were; the GPU keeps only what is whole there (the
  unsharded 16-bit copy of ZeRO-2 under FSDP2) and the gathered layers' working set.

Torch-free: the planner's memory counts and its cost model (``planner.cost.offload``) use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.settings import HALF_DTYPES

# Share of a node's host memory the offloaded states may take: the rest is left to the operating system, the page
# cache and the data loaders (a stated allowance, not a measurement).
HOST_USABLE = 0.9
MASTER_BYTES = 4.0  # an fp32 master weight
HOST_GRAD_BYTES = 4.0  # the fp32 gradient partition the host's Adam reads (ZeRO-Offload, Megatron's pinned CPU grads)


@dataclass(frozen=True)
class Offloaded:
    """Bytes per parameter a GPU no longer holds (``weights``, ``gradients``, ``optimizer``) and the bytes per
    parameter the host holds for it (``host``)."""

    weights: object
    gradients: object
    optimizer: object
    host: object


def offloaded(offload: str, rule, dtype: str, dp) -> Offloaded:
    """What ``offload`` moves off a GPU for an engine's ``rule`` (``StateRule``: (full, sharded) of weights, gradients
    and optimizer; ``dp`` the sharding degree, may be an array) training in ``dtype`` (module doc)."""
    dp = np.asarray(dp, dtype=float)
    (_, w_sh), (_, g_sh), (o_full, o_sh) = rule.weights, rule.gradients, rule.optimizer
    optim = o_full + o_sh / dp
    if offload == "params":
        w, g = w_sh / dp, g_sh / dp
        return Offloaded(w, g, optim, w + g + optim)
    if offload == "optimizer":
        master = min(MASTER_BYTES, w_sh) / dp if dtype in HALF_DTYPES else 0.0 * dp
        g = g_sh / dp
        return Offloaded(master, g, optim, MASTER_BYTES / dp + HOST_GRAD_BYTES / dp + optim)
    zero = 0.0 * dp
    return Offloaded(zero, zero, zero, zero)


def host_fits(host_bytes_per_rank, cluster, gpus) -> np.ndarray:
    """Whether a node's ranks' offloaded states (``host_bytes_per_rank`` each; ``gpus`` the job's, a node holding
    min(gpus, gpus_per_node) of them) fit in ``HOST_USABLE`` of its host memory; false where the cluster states
    none."""
    if cluster.host_memory_bytes is None:
        return np.zeros(np.shape(host_bytes_per_rank), dtype=bool)
    per_node = np.asarray(host_bytes_per_rank, dtype=float) * np.minimum(np.asarray(gpus), cluster.gpus_per_node)
    return per_node <= HOST_USABLE * cluster.host_memory_bytes


__all__ = ["HOST_USABLE", "Offloaded", "host_fits", "offloaded"]
