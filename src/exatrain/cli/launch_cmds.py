"""`exatrain launch` and `exatrain export-config`: a plan as a job script or as another engine's config.

Flags map onto the launch package's typed options here and nowhere else; the renderers are pure,
this module reads the plan and writes the text.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from exatrain.cli.common import add_cluster_args, positive_int, resolve_cluster
from exatrain.errors import UserError
from exatrain.plan import Plan

SCHEDULERS = ("slurm", "torchrun")


def register(sub: argparse._SubParsersAction) -> None:
    from exatrain.engine_configs.common import TARGETS

    p = sub.add_parser(
        "launch", help="render a SLURM batch script or multi-node torchrun command for a plan",
        description="Render the job that trains a plan: an sbatch script (ROCm/RCCL environment on "
                    "Frontier, NCCL on NVIDIA clusters, gloo on CPU; requeue-safe) or a torchrun "
                    "command to run on every node (c10d rendezvous).",
        epilog="examples: exatrain launch --plan plan.json --scheduler slurm --cluster frontier --account "
               "ABC123 --time 02:00:00 > job.sbatch;  exatrain launch --plan plan.json --scheduler torchrun "
               "--nodes 2 --master node0:29500")
    p.add_argument("--plan", required=True, metavar="PATH",
                   help="plan JSON (exatrain estimate/search --out); its cluster is used unless --cluster")
    p.add_argument("--scheduler", required=True, choices=SCHEDULERS)
    add_cluster_args(p, gpus=False)
    p.add_argument("--nodes", type=positive_int, default=None,
                   help="nodes to use (default: gpus / gpus_per_node, rounded up)")
    p.add_argument("--checkpoint-dir", default="checkpoints", metavar="DIR",
                   help="shared directory for checkpoints (made absolute); a restarted job resumes from it")
    p.add_argument("--steps", type=positive_int, default=None, help="training steps (trainer default if omitted)")
    p.add_argument("--metrics-file", default=None, metavar="PATH", help="per-step JSON lines")
    p.add_argument("--rccl-plugin-dir", default="", metavar="DIR",
                   help="aws-ofi-rccl install on Slingshot clusters (default: $AWS_OFI_RCCL_DIR at run time)")
    p.add_argument("--out", default=None, metavar="FILE", help="write here (executable) instead of stdout")
    g = p.add_argument_group("slurm")
    g.add_argument("--account", default="", help="#SBATCH --account")
    g.add_argument("--time", default="02:00:00", metavar="HH:MM:SS", help="wall-clock limit (default 02:00:00)")
    g.add_argument("--partition", default="", help="#SBATCH --partition")
    g.add_argument("--job-name", default="", help="default exatrain-<model>")
    g.add_argument("--master-port", type=positive_int, default=29500, help="rendezvous port (default 29500)")
    g.add_argument("--setup", action="append", default=[], metavar="LINE",
                   help="shell line run before the ranks start, e.g. 'module load rocm' (repeatable)")
    g = p.add_argument_group("torchrun")
    g.add_argument("--master", default="", metavar="HOST:PORT",
                   help="c10d rendezvous endpoint (default: $MASTER_ADDR:${MASTER_PORT:-29500} at run time)")
    p.set_defaults(func=cmd_launch)

    e = sub.add_parser(
        "export-config", help="the plan's layout as Megatron-LM, Megatron-DeepSpeed or torchtitan config",
        description="Render the plan's layout (tp, pp, virtual stages, dp, batch, ZeRO, recompute, "
                    "sequence parallel, precision, model shape) as Megatron-LM flags (megatron), "
                    "Megatron-DeepSpeed flags + DeepSpeed JSON (deepspeed) or a torchtitan TOML job "
                    "config (torchtitan). Where an engine cannot express part of the plan, a note says so.",
        epilog="example: exatrain export-config --plan plan.json --for megatron > megatron_args.sh")
    e.add_argument("--plan", required=True, metavar="PATH", help="plan JSON")
    e.add_argument("--for", dest="target", required=True, choices=TARGETS)
    e.add_argument("--out", default=None, metavar="FILE",
                   help="write here instead of stdout (deepspeed: ds_config.json is written beside it)")
    e.set_defaults(func=cmd_export)


def load_plan(path: str) -> Plan:
    try:
        return Plan.load(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot read the plan ({exc.strerror or exc})") from None


def cmd_launch(args: argparse.Namespace) -> int:
    from exatrain.launch import SlurmOptions, TorchrunOptions, TrainArgs, render_slurm, render_torchrun

    plan = load_plan(args.plan)
    if not args.cluster and not args.cluster_file and plan.cluster:
        args._cluster_default = plan.cluster
    cluster = resolve_cluster(args)
    train = TrainArgs(checkpoint_dir=os.path.abspath(args.checkpoint_dir), steps=args.steps,
                      metrics_file=os.path.abspath(args.metrics_file) if args.metrics_file else None)
    if args.scheduler == "slurm":
        if args.master:
            raise UserError("--master is for --scheduler torchrun; under SLURM the first allocated host "
                            "is the master (set the port with --master-port)")
        text = render_slurm(plan, cluster, SlurmOptions(
            train=train, account=args.account, time=args.time, partition=args.partition,
            job_name=args.job_name, nodes=args.nodes, master_port=args.master_port,
            rccl_plugin_dir=args.rccl_plugin_dir, setup=tuple(args.setup)))
    else:
        text = render_torchrun(plan, cluster, TorchrunOptions(
            plan_path=os.path.abspath(args.plan), train=train, nodes=args.nodes, master=args.master,
            rccl_plugin_dir=args.rccl_plugin_dir))
    _emit(text, args.out, executable=True)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from exatrain.engine_configs import export

    plan = load_plan(args.plan)
    ds_config = str(Path(args.out).with_name("ds_config.json")) if args.out else "ds_config.json"
    result = export(plan, args.target, ds_config_path=ds_config)
    for note in result.notes:
        sys.stderr.write(f"exatrain export-config: note: {note}\n")
    for name, content in result.files:
        if args.out:
            _emit(content, name)
    _emit(result.text, args.out)
    return 0


def _emit(text: str, out: str | None, *, executable: bool = False) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    path = Path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if executable:
            path.chmod(0o755)
    except OSError as exc:
        raise UserError(f"{out}: cannot write ({exc.strerror or exc})") from None
