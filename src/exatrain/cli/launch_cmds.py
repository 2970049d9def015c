"""`exatrain launch` and `exatrain export-config`: a plan as a job script or as another engine's config."""

from __future__ import annotations

import argparse
import sys

from exatrain import api
from exatrain.api.jobs import SCHEDULERS
from exatrain.api.requests import JobOptions, SlurmJob, TorchrunJob, TrainRun
from exatrain.cli.common import add_cluster_args, call, flag, positive_int, request_group, warn_line

PLAN_HELP = "plan JSON: `estimate/search --out`, `estimate --json`, or `search --json` (its first ranked plan)"
FORCE_HELP = (
    "write it even when the plan does not fit the cluster's memory (refused otherwise; a tight plan, "
    "its capacity inside the band of measured peaks, gets a warning)"
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch",
        help="render a SLURM batch script or multi-node torchrun command for a plan",
        description="Render the job that trains a plan: an sbatch script (ROCm/RCCL environment on Frontier, NCCL "
        "on NVIDIA clusters, gloo on CPU; requeue-safe) or a torchrun command to run on every node "
        "(c10d rendezvous).",
        epilog="examples:\n  exatrain launch --plan plan.json --scheduler slurm --cluster frontier --account ABC123 "
        "--time 02:00:00 > job.sbatch\n  exatrain launch --plan plan.json --scheduler torchrun --nodes 2 "
        "--master node0:29500",
    )
    p.add_argument("--plan", required=True, metavar="PATH", help=PLAN_HELP + "; its cluster is used unless --cluster")
    p.add_argument("--scheduler", required=True, choices=SCHEDULERS)
    add_cluster_args(p, "the plan's", gpus=False)
    j = request_group(p, "job", JobOptions, "job")
    j.add_argument("--nodes", type=positive_int, help="nodes to use (default: gpus / gpus_per_node, rounded up)")
    flag(
        j,
        JobOptions,
        "--checkpoint-dir",
        "shared directory for checkpoints (made absolute); a restarted job resumes from it",
        metavar="DIR",
    )
    j.add_argument("--steps", type=positive_int, help=f"training steps (default {TrainRun().steps})")
    j.add_argument("--metrics-file", metavar="PATH", help="per-step JSON lines")
    j.add_argument(
        "--rccl-plugin-dir",
        default="",
        metavar="DIR",
        help="aws-ofi-rccl install on Slingshot clusters (default: $AWS_OFI_RCCL_DIR at run time)",
    )
    j.add_argument("--out", metavar="FILE", help="write here (executable) instead of stdout")
    j.add_argument("--force", action="store_true", help=FORCE_HELP)
    g = request_group(p, "slurm", SlurmJob, "slurm")
    g.add_argument("--account", default="", help="#SBATCH --account")
    flag(g, SlurmJob, "--time", "wall-clock limit", metavar="HH:MM:SS")
    g.add_argument("--partition", default="", help="#SBATCH --partition")
    g.add_argument("--job-name", default="", help="default exatrain-<model>")
    flag(g, SlurmJob, "--master-port", "rendezvous port", type=positive_int)
    g.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="LINE",
        help="shell line run before the ranks start, e.g. 'module load rocm' (repeatable)",
    )
    g = request_group(p, "torchrun", TorchrunJob, "torchrun")
    g.add_argument(
        "--master",
        default="",
        metavar="HOST:PORT",
        help="c10d rendezvous endpoint (default: $MASTER_ADDR:${MASTER_PORT:-29500} at run time)",
    )

    e = sub.add_parser(
        "export-config",
        help="the plan's layout as Megatron-LM, Megatron-DeepSpeed or torchtitan config",
        description="Render the plan's layout (tp, pp, virtual stages, dp, batch, ZeRO, recompute, sequence "
        "parallel, precision, model shape) as Megatron-LM flags (megatron, for Megatron-LM d98e8a64), "
        "Megatron-DeepSpeed flags + DeepSpeed JSON (deepspeed), a torchtitan v0.2.2 TOML job config "
        "(torchtitan) or torchtitan 0.3's command line (torchtitan-0.3). Where an engine cannot express "
        "part of the plan, a note says so; where it cannot build the planned model, one line says why.",
        epilog="example: exatrain export-config --plan plan.json --for megatron > megatron_args.sh",
    )
    e.add_argument("--plan", required=True, metavar="PATH", help=PLAN_HELP)
    e.add_argument("--for", dest="target", required=True, choices=api.EXPORT_TARGETS)
    e.add_argument("--out", metavar="FILE", help="write here instead of stdout (deepspeed: ds_config.json beside it)")
    e.add_argument("--force", action="store_true", help=FORCE_HELP)


def cmd_launch(args: argparse.Namespace) -> int:
    text = call(api.launch, args, warn=warn_line("launch"))
    if args.out is None:
        sys.stdout.write(text)
    return 0


def cmd_export_config(args: argparse.Namespace) -> int:
    result = call(api.export_config, args, warn=warn_line("export-config"))
    for note in result.notes:
        sys.stderr.write(f"exatrain export-config: note: {note}\n")
    if args.out is None:
        sys.stdout.write(result.text)
    return 0
