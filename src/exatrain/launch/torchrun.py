"""Multi-node torchrun for a plan: one script, the same on every node, c10d rendezvous.

With the c10d rendezvous backend the agents agree on node ranks themselves, so no node needs a
``--node-rank``: run the identical script on each node (any order, any time within the rendezvous
timeout). torchrun numbers ranks node by node, local ranks consecutive, so with a multiple of tp
ranks per node (common.node_layout) a tensor-parallel group never crosses nodes whichever node
rank an agent draws.

The plan is referenced by absolute path here (no scheduler keeps a copy of the script): put it on
a filesystem every node reads.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from exatrain.catalog.hardware import ClusterSpec
from exatrain.errors import UserError
from exatrain.launch.common import (
    TrainArgs,
    environment,
    job_label,
    node_layout,
    parse_master,
    plan_summary,
    platform,
    render_env,
    train_device,
)
from exatrain.plan import Plan


@dataclass(frozen=True)
class TorchrunOptions:
    """What the torchrun command needs beside the plan and the cluster."""

    plan_path: str  # absolute path every node can read
    train: TrainArgs = TrainArgs()
    nodes: int | None = None  # default ceil(gpus / gpus_per_node)
    master: str = ""  # host:port of the rendezvous; "" = $MASTER_ADDR:${MASTER_PORT:-29500} at run time
    rdzv_id: str = ""  # default exatrain-<model>
    max_restarts: int = 0  # torchrun restarts of the whole local worker group after a failure
    rccl_plugin_dir: str = ""


def torchrun_argv(plan: Plan, cluster: ClusterSpec, options: TorchrunOptions) -> list[str]:
    """The command as shell words (torch.distributed.run's options: --nnodes, --nproc-per-node,
    --rdzv-backend, --rdzv-endpoint, --rdzv-id, --max-restarts, -m)."""
    o = options
    layout = node_layout(plan, cluster, o.nodes)
    if o.master:
        host, port = parse_master(o.master)
        endpoint = shlex.quote(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    else:
        endpoint = '"${MASTER_ADDR:?set MASTER_ADDR to the rendezvous host (or pass --master)}:${MASTER_PORT:-29500}"'
    if o.max_restarts < 0:
        raise UserError(f"--max-restarts must be >= 0, got {o.max_restarts}")
    return [
        "torchrun",
        f"--nnodes={layout.nodes}",
        f"--nproc-per-node={layout.ranks_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={shlex.quote(o.rdzv_id or job_label(plan))}",
        f"--max-restarts={o.max_restarts}",
        "-m",
        "exatrain.train",
        *_quoted(o.train).argv(shlex.quote(o.plan_path), train_device(cluster)),
    ]


def _quoted(train: TrainArgs) -> TrainArgs:
    """The paths of ``train`` as literal shell words."""
    return dataclasses.replace(
        train,
        checkpoint_dir=shlex.quote(train.checkpoint_dir),
        metrics_file=shlex.quote(train.metrics_file) if train.metrics_file else None,
    )


def render_torchrun(plan: Plan, cluster: ClusterSpec, options: TorchrunOptions) -> str:
    """A bash script to run on every node."""
    if not options.plan_path.startswith("/"):
        raise UserError(f"the plan path {options.plan_path!r} must be absolute: every node resolves it")
    layout = node_layout(plan, cluster, options.nodes)
    argv = torchrun_argv(plan, cluster, options)
    lines = [
        "#!/bin/bash",
        f"# Rendered by `exatrain launch --scheduler torchrun` for {plan_summary(plan, cluster, layout)}.",
        f"# Run this same script on each of the {layout.nodes} node(s); the c10d rendezvous assigns node ranks.",
        "# A restarted job continues from the newest checkpoint in the checkpoint directory (--resume auto).",
        "",
        "set -euo pipefail",
        "",
    ]
    lines += render_env(environment(plan, cluster, rccl_plugin_dir=options.rccl_plugin_dir))
    if platform(cluster) == "rocm":
        lines.append('mkdir -p "$MIOPEN_USER_DB_PATH"  # node-local, so every node makes its own')
    lines += ["", " \\\n  ".join(_groups(argv)), ""]
    return "\n".join(lines)


def _groups(argv: list[str]) -> list[str]:
    """Split the command into readable continuation lines: launcher options, then the trainer."""
    i = argv.index("-m")
    return [" ".join(argv[:4]), " ".join(argv[4:i]), " ".join(argv[i : i + 2]), " ".join(argv[i + 2 :])]


__all__ = ["TorchrunOptions", "render_torchrun", "torchrun_argv"]
