"""The step's offload term (``Plan.offload``): the host link's copies, the part of them compute does not hide, and
Adam run by the host's CPUs (``accounting.offload`` says what lives where).

* ``optimizer`` (ZeRO-Offload, Ren et al. 2021 Sec. 4-5; Megatron-Core's HybridDeviceOptimizer): each step the
  rank's gradient partition goes device-to-host during the backward (hidden behind the backward's compute, taken
  as two thirds of the step's compute, up to its length), the CPU runs Adam over the partition, and the updated
  weights come host-to-device before the next forward (exposed: the next step needs them).
* ``params`` (FSDP2's CPUOffloadPolicy; DeepSpeed's offload_param): every gather first copies the rank's shard in
  (FSDP2: its fp32 shard, cast on the device; DeepSpeed: its 16-bit partition), and every reduction copies the
  gradient shard out; both run on the gather's and the reduction's streams beside compute, so only what exceeds
  the step's compute is exposed. The optimizer steps on the CPU.

A node's ranks share its CPUs: Adam over the node's partitions runs at one node's rate. The host link is one
device's, each direction on its own (PCIe and Infinity Fabric are full duplex). On a host device (the CPU cluster)
nothing runs beside compute, so every copy is exposed.
"""

from __future__ import annotations

import numpy as np

from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.accounting.offload import HOST_USABLE

# Adam's rate on one node's CPUs, parameters a second. Ren et al. 2021 (ZeRO-Offload, USENIX ATC '21), Table 2: Adam
# over 10B parameters takes 2.57 s with DeepSpeed's vectorised CPU-Adam and 14.76 s with PyTorch's CPU Adam, on a
# DGX-2's two 24-core Xeon Platinum 8168 (the largest size in the table). Newer hosts have more cores: a floor.
CPU_ADAM_PARAMS_PER_S = {"cpu-adam": 10e9 / 2.57, "torch": 10e9 / 14.76}
CPU_ADAM_SOURCE = (
    "Ren et al. 2021 (ZeRO-Offload), Table 2: 10B parameters in 2.57 s (DeepSpeed CPU-Adam) or "
    "14.76 s (PyTorch's CPU Adam) on a DGX-2 node's two 24-core Xeon Platinum 8168"
)
# Which CPU Adam each runtime runs: DeepSpeed's DeepSpeedCPUAdam (deepspeed/ops/adam/cpu_adam.py) under
# offload_optimizer; Megatron-Core's HybridDeviceOptimizer runs torch's only with --use-torch-optimizer-for-cpu-offload
# (priced at CPU-Adam's rate without it); FSDP2 runs the run's torch optimizer over CPU tensors (torchtitan, exatrain).
CPU_ADAM_KERNEL = {
    "megatron-deepspeed": "cpu-adam",
    "megatron-core": "cpu-adam",
    "torchtitan": "torch",
    "exatrain": "torch",
}
BACKWARD_SHARE = 2.0 / 3.0  # the backward's share of a step's compute (twice the forward's FLOPs)
FSDP2_RUNTIMES = ("torchtitan", "exatrain")  # copy their fp32 shards and reduce in fp32


def offload_seconds(
    offload: str, run, cluster, *, partition, gathers, reductions, compute_s, gpus
) -> dict[str, np.ndarray]:
    """(N,) seconds of the step's offload term and its parts: ``adam`` (the CPU's Adam), ``h2d`` and ``d2h`` (the
    copies' seconds), ``exposed`` (the copies compute does not hide) and ``total`` (adam + exposed). ``partition``:
    (N,) parameters of the busiest rank's optimizer partition; ``gathers`` / ``reductions``: (N,) parameter gathers
    and gradient reductions a step (``params``); ``compute_s``: (N,) the step's compute on that rank; ``gpus``: (N,) the
    job's (a node holds the lesser of it and the node's size); ``run``: the resolved run (its runtime, dtype and
    engine); ``cluster``: its host link and node size."""
    partition, compute_s = np.asarray(partition, dtype=float), np.asarray(compute_s, dtype=float)
    if offload == "none":
        zero = 0.0 * partition
        return {"adam": zero, "h2d": zero, "d2h": zero, "exposed": zero, "total": zero}
    rate = CPU_ADAM_PARAMS_PER_S[CPU_ADAM_KERNEL.get(run.runtime, "torch")]
    ranks_per_node = np.minimum(np.asarray(gpus, dtype=float), cluster.gpus_per_node)
    adam = partition * ranks_per_node / rate
    bw = cluster.host_link_bytes_per_s or cluster.device.hbm_bytes_per_s
    e = COMPUTE_BYTES[run.dtype]
    grad_e = COMPUTE_BYTES[run.engine.accum_dtype(run.dtype)] if run.engine is not None else e
    side = 0.0 if cluster.device.is_host else 1.0  # a host device runs nothing beside its compute
    if offload == "optimizer":
        d2h, h2d = partition * grad_e / bw, partition * e / bw
        exposed = np.maximum(d2h - side * BACKWARD_SHARE * compute_s, 0.0) + h2d
    else:
        fsdp2 = run.runtime in FSDP2_RUNTIMES
        h2d = partition * (4.0 if fsdp2 else e) * np.asarray(gathers, dtype=float) / bw
        d2h = partition * (4.0 if fsdp2 else grad_e) * np.asarray(reductions, dtype=float) / bw
        copies = np.maximum(h2d, d2h) if side else h2d + d2h
        exposed = np.maximum(copies - side * compute_s, 0.0)
    return {"adam": adam, "h2d": h2d, "d2h": d2h, "exposed": exposed, "total": adam + exposed}


def offload_note(plan, run, cluster, host_bytes: float, parts: dict[str, float], fits: bool) -> str:
    """The estimate's line on a plan's offload: what its node's host memory holds against what it has, the host
    link's copies and how much of them compute hides, the CPU's Adam (with its source), and the step's offload
    seconds (``parts``: ``offload_seconds``' for the plan)."""
    gib = 2.0**30
    kernel = CPU_ADAM_KERNEL.get(run.runtime, "torch")
    what = (
        "Adam states, fp32 master weights and gradient partition"
        if plan.offload == "optimizer"
        else "sharded parameters, their gradients and the Adam states"
    )
    return (
        f"offload {plan.offload}: the {what} in host memory, {host_bytes / gib:,.1f} GiB per node of "
        f"{cluster.host_memory_bytes / gib:,.0f} GiB ({'fits' if fits else 'does not fit'}: up to "
        f"{HOST_USABLE:.0%} of it, accounting.offload); over the host link at "
        f"{(cluster.host_link_bytes_per_s or 0) / 1e9:g} GB/s a direction {parts['h2d']:.3f} s in and "
        f"{parts['d2h']:.3f} s out a step, {parts['exposed']:.3f} s of them not hidden behind compute; Adam on the "
        f"CPU {parts['adam']:.3f} s ({kernel}, {CPU_ADAM_PARAMS_PER_S[kernel] / 1e9:.2f}B parameters/s a node, "
        f"shared by its ranks: {CPU_ADAM_SOURCE}); {parts['total']:.3f} s a step (cost.offload)"
    )


__all__ = ["CPU_ADAM_KERNEL", "CPU_ADAM_PARAMS_PER_S", "CPU_ADAM_SOURCE", "offload_note", "offload_seconds"]
