"""The run as it will go: checkpoints, interruptions and restarts on top of the failure-free time to train.

A run of ``T`` failure-free seconds (``time_to_train``: steps times the step time) on ``N`` nodes saves a checkpoint
of ``C`` bytes every ``τ`` seconds of training and, at each interruption, restarts from the last one:

    C          = parameters · (weights + optimizer bytes per parameter a resume loads, per engine)
    save δ     = C / write rate,  load L = C / read rate   (the file system's aggregate rate, capped by the nodes'
                                                           network: N · gpus_per_node · the network tier's rate)
    M          = node MTBF / N                               the job's mean time between interruptions
    τ          = sqrt(2δM)·[1 + ⅓·sqrt(δ/2M) + ⅑·(δ/2M)] − δ   (Daly 2006; Young 1974's sqrt(2δM) to first order;
                                                           τ = M where δ ≥ 2M)
    lost each  = R + L + (τ + δ)/2                            restart, load, and on average half a save period redone
    wall       = T·(1 + δ/τ) / (1 − lost each / M)           interruptions arrive through the whole wall-clock time
    interruptions = wall / M = N · wall hours / node MTBF
    fraction   = T / wall                                    the effective training time of Llama 3's report

Interruptions are a Poisson process at a constant rate (no infant mortality, no correlated failures); every save is
synchronous (an asynchronous save hides most of δ, so the figures are conservative there); the file system's whole
aggregate rate goes to this job; the interval is not rounded to whole steps (``interval_steps`` says how many it
comes to, at least one). ``wall`` is linear in ``T``, so days, GPU-hours, energy, cost, interruptions and
lost hours carry the step time's band as ``time_to_train``'s figures do; the checkpoint, its save and load, the
interval and the fraction do not depend on the step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.accounting.params import total_params
from exatrain.catalog.hardware import ClusterSpec, FileSystemSpec, filesystem_catalog
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.settings import HALF_DTYPES

# The job's interruption rate per node, from the one large run that published its count: Llama 3 405B saw 419
# unexpected interruptions in a 54-day snapshot on 16,384 H100s, 2,048 nodes of 8 (Llama 3 Herd of Models, 2024,
# Sec. 3.3.4, Table 5): 2,048 x 54 x 24 / 419 node-hours per interruption. The 47 planned ones are left out: a
# plan's maintenance is the operator's choice, not a failure rate.
LLAMA3_NODES, LLAMA3_DAYS, LLAMA3_UNEXPECTED = 2048, 54, 419
DEFAULT_NODE_MTBF_HOURS = LLAMA3_NODES * LLAMA3_DAYS * 24 / LLAMA3_UNEXPECTED  # 6,334.5 h
NODE_MTBF_SOURCE = (
    "Llama 3 405B: 419 unexpected interruptions in 54 days on 2,048 nodes (Llama 3 Herd of Models, Sec. 3.3.4)"
)
# Seconds from an interruption to the job running again, before it loads its checkpoint: the median interval of the
# automatic retries of a 63-node B200 cluster's training sessions, 11 minutes (IQR 10-11; "From Detection to
# Recovery: Operational Analysis on LLM Pre-training with 504 GPUs", arXiv 2605.09370). Purpose-built recovery is
# faster (FlashRecovery restores 4,800 devices in 150 s, arXiv 2509.03047): --restart-minutes.
DEFAULT_RESTART_S = 11 * 60.0
RESTART_SOURCE = "the median automatic retry interval of a 504-GPU B200 cluster, 11 min (arXiv 2605.09370)"
DEFAULT_FILESYSTEM = "lustre"  # the catalog's typical parallel file system, for a cluster that names none
# Engines whose model holds its parameters in the 16-bit training dtype and saves them beside the fp32 main copy
# the optimizer keeps (so a resume loads both): Megatron-Core's Float16Module with the (distributed) optimizer's
# fp32 main params, exp_avg and exp_avg_sq (dist-ckpt); Megatron-DeepSpeed's bf16 module states beside the ZeRO
# optimizer's fp32 partitions. The others keep fp32 parameters (FSDP2's or DDP's, the 16-bit copy made for the
# forward), and save those with the two moments: torchtitan's and exatrain's DCP, llm-foundry's FSDP.
SAVES_16BIT_MODULE = ("megatron-core", "megatron-deepspeed")


@dataclass(frozen=True)
class GoodputOptions:
    """What prices the failures: a node's mean time between failures, the restart before a load, and a write
    rate (bytes/s) replacing the file system's (None: the cluster's)."""

    node_mtbf_hours: float = DEFAULT_NODE_MTBF_HOURS
    restart_s: float = DEFAULT_RESTART_S
    bandwidth_bytes_per_s: float | None = None


def checkpoint_bytes_per_param(plan: Plan) -> tuple[float, str]:
    """Bytes per parameter a resume of ``plan`` loads, and what they are: Adam's two fp32 moments (the engine
    state rule's optimizer bytes) and the weights it keeps (the rule's weights where the engine's 16-bit module is
    persistent, SAVES_16BIT_MODULE; else the fp32 parameters). Gradients are not saved: a step ends with them used."""
    from exatrain.accounting.engines import plan_run

    engine = plan_run(plan).engine
    rule = engine.state_rule(plan.dtype, plan.zero_stage)
    optimizer = sum(rule.optimizer)
    if plan.runtime in SAVES_16BIT_MODULE:
        weights = sum(rule.weights)
        what = (
            f"{plan.dtype} module + fp32 main weights {weights:g}"
            if plan.dtype in HALF_DTYPES
            else f"fp32 weights {weights:g}"
        )
    else:
        weights = float(COMPUTE_BYTES["float32"])
        what = f"fp32 parameters {weights:g}"
    return weights + optimizer, f"{what} + Adam moments {optimizer:g} ({plan.runtime})"


def checkpoint_bytes(plan: Plan) -> int:
    """The checkpoint of ``plan``'s whole model, every rank's shards together (bytes)."""
    per, _ = checkpoint_bytes_per_param(plan)
    return int(round(total_params(plan.model) * per))


def nodes_of(plan: Plan, cluster: ClusterSpec) -> int:
    return -(-plan.gpus // cluster.gpus_per_node)


def filesystem_of(cluster: ClusterSpec) -> tuple[FileSystemSpec, bool]:
    """The cluster's file system, and whether it named one (else the catalog's DEFAULT_FILESYSTEM)."""
    if cluster.filesystem is not None:
        return cluster.filesystem, True
    return filesystem_catalog()[DEFAULT_FILESYSTEM], False


def rates(plan: Plan, cluster: ClusterSpec, bandwidth: float | None) -> tuple[float, float, str]:
    """(write, read) bytes/s a checkpoint of ``plan`` moves at, and their basis in words: the file system's
    aggregate rates (or ``bandwidth`` for both), each capped by what the job's nodes can push over the network."""
    nodes = nodes_of(plan, cluster)
    cap = nodes * cluster.gpus_per_node * cluster.network.bytes_per_s
    if bandwidth is not None:
        write = read = bandwidth
        where = f"--checkpoint-bandwidth {bandwidth / 1e9:,g} GB/s"
    else:
        fs, named = filesystem_of(cluster)
        write, read = fs.write_bytes_per_s, fs.read_bytes_per_s
        where = (
            f"{fs.name} ({write / 1e12:,.3g} TB/s write, {read / 1e12:,.3g} TB/s read"
            + ("" if named else f"; the typical file system: {cluster.name} names none")
            + ")"
        )
    capped = " capped by the nodes' network" if cap < max(write, read) else ""
    return min(write, cap), min(read, cap), where + capped


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order optimum of the compute time between checkpoints for a save of ``save_s`` and a
    mean time between interruptions of ``mtbf_s``; ``mtbf_s`` where the save takes two MTBFs or more."""
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    x = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - save_s


@dataclass(frozen=True)
class Schedule:
    """The failure pricing of one run, independent of its length: what each interruption costs and how the
    wall-clock time follows from the failure-free time (``wall = failure_free · stretch``)."""

    checkpoint_bytes: int
    save_s: float
    load_s: float
    interval_s: float
    mtbf_s: float  # the job's mean time between interruptions
    lost_each_s: float
    stretch: float | None  # None: an interruption costs an MTBF or more, the run never finishes

    @property
    def fraction(self) -> float:
        return 0.0 if self.stretch is None else 1.0 / self.stretch


def schedule(ckpt_bytes: int, write: float, read: float, nodes: int, options: GoodputOptions) -> Schedule:
    """The module doc's formulas for a checkpoint of ``ckpt_bytes`` moved at ``write``/``read`` bytes/s by a job
    of ``nodes`` nodes."""
    save, load = ckpt_bytes / write, ckpt_bytes / read
    mtbf = options.node_mtbf_hours * 3600 / nodes
    tau = daly_interval(save, mtbf) if save > 0 else math.inf
    lost = options.restart_s + load + ((tau + save) / 2 if math.isfinite(tau) else 0.0)
    overhead = save / tau if math.isfinite(tau) and tau > 0 else 0.0
    stretch = (1 + overhead) / (1 - lost / mtbf) if lost < mtbf else None
    return Schedule(ckpt_bytes, save, load, tau, mtbf, lost, stretch)


def _scaled(figure: dict[str, Any], factor: float | None, per: float = 1.0) -> dict[str, Any] | None:
    """``figure`` (value, low, high) times ``factor`` / ``per``; None where the run never finishes."""
    if factor is None:
        return None
    return {k: None if v is None else v * factor / per for k, v in figure.items()}


def goodput(plan: Plan, cluster: ClusterSpec, ttt: dict[str, Any], options: GoodputOptions) -> dict[str, Any]:
    """The ``goodput`` object of ``time_to_train`` ``ttt`` for ``plan`` on ``cluster`` (the module doc)."""
    nodes = nodes_of(plan, cluster)
    per, what = checkpoint_bytes_per_param(plan)
    write, read, where = rates(plan, cluster, options.bandwidth_bytes_per_s)
    s = schedule(checkpoint_bytes(plan), write, read, nodes, options)
    days = _scaled(ttt["days"], s.stretch)
    hours = _scaled(ttt["days"], s.stretch, 1 / 24)
    interruptions = None if hours is None else _scaled(hours, nodes / options.node_mtbf_hours)
    lost = None if interruptions is None else _scaled(interruptions, s.lost_each_s / 3600)
    return {
        "checkpoint_bytes": s.checkpoint_bytes,
        "checkpoint_bytes_per_param": per,
        "save_s": s.save_s,
        "load_s": s.load_s,
        "interval_s": s.interval_s,
        "interval_steps": max(1, round(s.interval_s / ttt["step_s"])),
        "interruptions": interruptions,
        "lost_hours": lost,
        "days": days,
        "gpu_hours": _scaled(ttt["gpu_hours"], s.stretch),
        "energy_mwh": None if ttt.get("energy_mwh") is None else _scaled(ttt["energy_mwh"], s.stretch),
        "cost": None if ttt.get("cost") is None else _scaled(ttt["cost"], s.stretch),
        "fraction": s.fraction,
        "nodes": nodes,
        "node_mtbf_hours": options.node_mtbf_hours,
        "mtbf_hours": s.mtbf_s / 3600,
        "restart_s": options.restart_s,
        "lost_each_s": s.lost_each_s,
        "write_bytes_per_s": write,
        "read_bytes_per_s": read,
        "basis": {
            "checkpoint": f"{per:g} bytes/param: {what}",
            "filesystem": where,
            "node_mtbf": (
                "--node-mtbf-hours" if options.node_mtbf_hours != DEFAULT_NODE_MTBF_HOURS else NODE_MTBF_SOURCE
            ),
            "restart": "--restart-minutes" if options.restart_s != DEFAULT_RESTART_S else RESTART_SOURCE,
            "never_finishes": s.stretch is None,
        },
    }


def goodput_options(
    node_mtbf_hours: Any = None, checkpoint_bandwidth: Any = None, restart_minutes: Any = None
) -> GoodputOptions:
    """The flags checked (each a positive finite number; a one-line UserError otherwise) as GoodputOptions."""

    def positive(flag: str, value: Any) -> float:
        try:
            x = float(value)
        except (TypeError, ValueError):
            x = math.nan
        if isinstance(value, bool) or not math.isfinite(x) or x <= 0:
            raise UserError(f"{flag} must be a finite number above 0, got {value!r}")
        return x

    return GoodputOptions(
        node_mtbf_hours=DEFAULT_NODE_MTBF_HOURS
        if node_mtbf_hours is None
        else positive("--node-mtbf-hours", node_mtbf_hours),
        restart_s=DEFAULT_RESTART_S if restart_minutes is None else 60 * positive("--restart-minutes", restart_minutes),
        bandwidth_bytes_per_s=None
        if checkpoint_bandwidth is None
        else 1e9 * positive("--checkpoint-bandwidth", checkpoint_bandwidth),
    )


__all__ = [
    "DEFAULT_FILESYSTEM",
    "DEFAULT_NODE_MTBF_HOURS",
    "DEFAULT_RESTART_S",
    "GoodputOptions",
    "Schedule",
    "checkpoint_bytes",
    "checkpoint_bytes_per_param",
    "daly_interval",
    "filesystem_of",
    "goodput",
    "goodput_options",
    "rates",
    "schedule",
]
