"""What every launcher shares: where a plan's ranks land, the environment they need, and the
trainer's command line.

All pure functions of a ``Plan`` and a ``ClusterSpec``: nothing here runs a process or touches a
file, so the renderers built on it are deterministic text and their tests need no scheduler.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Sequence

from exatrain.catalog.hardware import ClusterSpec
from exatrain.errors import UserError
from exatrain.plan import Plan

PLATFORMS = ("rocm", "cuda", "cpu")


@dataclass(frozen=True)
class NodeLayout:
    """How many nodes a job takes and how many ranks run on each (one rank per device)."""

    nodes: int
    ranks_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


def node_layout(plan: Plan, cluster: ClusterSpec, nodes: int | None = None) -> NodeLayout:
    """Nodes = ceil(gpus / gpus_per_node) unless ``nodes`` is given; every node runs the same
    number of ranks, and that number is a multiple of tp, because ranks are numbered tp-fastest
    (plan.ParallelDims) and launchers give each node consecutive ranks: a tp group then never
    crosses a node boundary (the Frontier study's first lesson: keep TP inside a node)."""
    gpn = cluster.gpus_per_node
    gpus = plan.gpus
    if plan.tp > gpn:
        raise UserError(
            f"tp {plan.tp} needs {plan.tp} devices in one node but a {cluster.name} node "
            f"has {gpn}: lower tp to at most {gpn}"
        )
    if nodes is None:
        nodes = -(-gpus // gpn)
    elif nodes <= 0:
        raise UserError(f"--nodes must be a positive integer, got {nodes}")
    if nodes * gpn < gpus:
        raise UserError(
            f"--nodes {nodes} hold {nodes * gpn} devices ({gpn} per {cluster.name} node) "
            f"but the plan needs {gpus}: use at least {-(-gpus // gpn)} nodes"
        )
    if gpus % nodes:
        raise UserError(
            f"the plan's {gpus} ranks do not split evenly over {nodes} nodes; choose a node count that divides {gpus}"
        )
    per_node = gpus // nodes
    if per_node % plan.tp:
        raise UserError(
            f"{per_node} ranks per node is not a multiple of tp {plan.tp}: a tensor-parallel "
            "group would span two nodes; change --nodes or the plan's degrees"
        )
    return NodeLayout(nodes=nodes, ranks_per_node=per_node)


def platform(cluster: ClusterSpec) -> str:
    """'rocm' for AMD devices, 'cuda' for NVIDIA, 'cpu' otherwise (gloo over the host)."""
    vendor = cluster.device.vendor.lower()
    if vendor == "amd":
        return "rocm"
    if vendor == "nvidia":
        return "cuda"
    return "cpu"


def uses_slingshot(cluster: ClusterSpec) -> bool:
    """True when the inter-node tier is HPE Slingshot (Frontier): RCCL then needs libfabric/CXI."""
    return "slingshot" in cluster.network.name.lower()


def train_device(cluster: ClusterSpec) -> str:
    """The trainer's --device: PyTorch's ROCm build exposes GCDs through torch.cuda, so AMD is 'cuda'."""
    return "cpu" if platform(cluster) == "cpu" else "cuda"


@dataclass(frozen=True)
class EnvVar:
    """One exported variable. ``value`` is shell text rendered inside double quotes (so it may
    expand other variables); ``why`` becomes the comment above it."""

    name: str
    value: str
    why: str


def environment(
    plan: Plan, cluster: ClusterSpec, *, rccl_plugin_dir: str = "", cache_tag: str = "$$"
) -> tuple[EnvVar, ...]:
    """The per-rank environment for a plan on a cluster. ``cache_tag`` makes node-local cache
    paths unique per job (``${SLURM_JOB_ID}`` under SLURM)."""
    env = [EnvVar("OMP_NUM_THREADS", "1", "one host thread per rank: more oversubscribe the cores")]
    kind = platform(cluster)
    if kind in ("rocm", "cuda") and plan.tp > 1 and plan.zero_stage <= 1:
        # Megatron-LM's validate_args (megatron/training/arguments.py) asserts =1 for tensor
        # parallelism before Blackwell, and asserts it unset or >1 for its FSDP (ZeRO-2/3): sharded
        # data parallelism overlaps its gathers on several queues.
        env.append(
            EnvVar(
                "CUDA_DEVICE_MAX_CONNECTIONS",
                "1",
                "one hardware queue: tensor-parallel communication is issued in order and overlaps compute",
            )
        )
    if kind == "rocm":
        # OLCF Frontier user guide (PyTorch / RCCL sections) and the Frontier study's launch scripts.
        miopen = f"/tmp/${{USER:-exatrain}}-miopen-{cache_tag}"
        env += [
            EnvVar(
                "MIOPEN_USER_DB_PATH",
                miopen,
                "MIOpen's kernel database on node-local /tmp: on the shared filesystem its sqlite "
                "locks serialise thousands of ranks",
            ),
            EnvVar("MIOPEN_CUSTOM_CACHE_DIR", "${MIOPEN_USER_DB_PATH}", "compiled-kernel cache, same place"),
        ]
    if kind == "rocm" and uses_slingshot(cluster):
        plugin = (
            shell_double_quoted(rccl_plugin_dir)
            if rccl_plugin_dir
            else "${AWS_OFI_RCCL_DIR:?set AWS_OFI_RCCL_DIR to your aws-ofi-rccl install (it holds lib/librccl-net.so)}"
        )
        env += [
            EnvVar(
                "LD_LIBRARY_PATH",
                f"{plugin}/lib:${{LD_LIBRARY_PATH:-}}",
                "the aws-ofi-rccl plugin: without it RCCL falls back to TCP sockets over Slingshot",
            ),
            EnvVar("NCCL_NET_GDR_LEVEL", "3", "GPU-direct RDMA between a GCD and its NIC"),
            EnvVar("NCCL_SOCKET_IFNAME", "hsn0", "bootstrap over the Slingshot high-speed network"),
            EnvVar(
                "FI_CXI_ATS",
                "0",
                "libfabric's CXI provider without the address translation "
                "service, OLCF's setting for RCCL over Slingshot",
            ),
        ]
    return tuple(env)


def render_env(env: Sequence[EnvVar]) -> list[str]:
    lines: list[str] = []
    for var in env:
        lines.append(f"# {var.why}")
        lines.append(f'export {var.name}="{var.value}"')
    return lines


def shell_double_quoted(text: str) -> str:
    """``text`` made literal inside double quotes (escapes $, `, \\ and ")."""
    return re.sub(r'([$`\\"])', r"\\\1", text)


@dataclass(frozen=True)
class TrainArgs:
    """The trainer's command line, shared by every launcher.

    ``resume='auto'`` makes a restarted job (SLURM requeue, torchrun restart) continue from the
    newest checkpoint in ``checkpoint_dir`` instead of starting over."""

    checkpoint_dir: str = "checkpoints"
    resume: str = "auto"
    steps: int | None = None
    metrics_file: str | None = None
    python: str = "python"
    extra: tuple[str, ...] = ()

    def argv(self, plan_ref: str, device: str, *, quoted: bool = True) -> list[str]:
        """Arguments after ``python -m exatrain.train``. ``plan_ref``, checkpoint_dir and
        metrics_file are shell words as given (they may be "$VAR" references)."""
        q = shlex.quote if quoted else (lambda s: s)
        out = ["--plan", plan_ref, "--checkpoint-dir", self.checkpoint_dir, "--resume", self.resume, "--device", device]
        if self.steps is not None:
            out += ["--steps", str(self.steps)]
        if self.metrics_file:
            out += ["--metrics-file", self.metrics_file]
        out += [q(a) for a in self.extra]
        return out


def job_label(plan: Plan) -> str:
    """A name for jobs and rendezvous ids: letters, digits, '-', '_' and '.' only."""
    return "exatrain-" + (re.sub(r"[^A-Za-z0-9._-]+", "", plan.model.name) or "model")


def plan_summary(plan: Plan, cluster: ClusterSpec, layout: NodeLayout) -> str:
    virt = f" x{plan.interleave} virtual" if plan.interleave > 1 else ""
    return (
        f"{plan.model.name}: tp {plan.tp}, pp {plan.pp}{virt}, dp {plan.dp} = {plan.gpus} ranks on "
        f"{layout.nodes} {cluster.name} node(s) x {layout.ranks_per_node}; micro-batch "
        f"{plan.micro_batch}, global batch {plan.global_batch}, ZeRO-{plan.zero_stage}, "
        f"recompute {plan.recompute}, {plan.dtype}"
    )


def parse_master(text: str) -> tuple[str, int]:
    """'host:port' (or '[v6addr]:port') -> (host, port); UserError when malformed."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--master must be host:port with a port in 1..65535, got {text!r}")
    if re.search(r"[\s'\"$`\\;&|<>]", host):
        raise UserError(f"--master host {host!r} contains characters a hostname cannot have")
    return host, int(port)


__all__ = [
    "EnvVar",
    "NodeLayout",
    "PLATFORMS",
    "TrainArgs",
    "environment",
    "job_label",
    "node_layout",
    "parse_master",
    "plan_summary",
    "platform",
    "render_env",
    "shell_double_quoted",
    "train_device",
    "uses_slingshot",
]
