"""A SLURM batch script for a plan: `sbatch` it and the plan trains, and a requeued job continues.

Layout: nodes = ceil(gpus / gpus_per_node) (or --nodes), one task per device, tp groups inside a
node (common.node_layout). Rendezvous: the first host of the allocation is MASTER_ADDR. Each rank
gets torch.distributed's env:// variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) from
SLURM's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE).

Where the plan lives: it is embedded in the script and written to the checkpoint directory when
the job starts. SLURM keeps the submitted script and reruns exactly that text on requeue, so a
requeued job trains the plan it was submitted with even if plan.json was edited, moved or deleted
since; and the plan lands beside the checkpoints it describes, on the shared filesystem every node
reads. (Referencing plan.json by absolute path would break on all three counts.)
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from exatrain.catalog.hardware import ClusterSpec
from exatrain.errors import UserError
from exatrain.launch.common import (
    TrainArgs,
    environment,
    job_label,
    node_layout,
    plan_summary,
    platform,
    render_env,
    shell_double_quoted,
    train_device,
    uses_slingshot,
)
from exatrain.plan import Plan

_HEREDOC = "EXATRAIN_PLAN_JSON"
# sbatch --time formats (sbatch(1)): minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds.
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")
_SAFE = re.compile(r"^[A-Za-z0-9._%@+,:/=-]+$")  # what may appear unquoted in a #SBATCH line


@dataclass(frozen=True)
class SlurmOptions:
    """Everything the batch script needs beside the plan and the cluster."""

    train: TrainArgs = TrainArgs()
    account: str = ""
    time: str = "02:00:00"
    partition: str = ""
    job_name: str = ""  # default exatrain-<model>
    nodes: int | None = None  # default ceil(gpus / gpus_per_node)
    master_port: int = 29500
    output: str = "%x-%j.out"  # %x job name, %j job id; appended to across requeues
    rccl_plugin_dir: str = ""  # aws-ofi-rccl install; "" = read $AWS_OFI_RCCL_DIR at run time
    setup: tuple[str, ...] = ()  # shell lines run before the ranks start (module load, venv)


def time_limit(text: str) -> tuple[int, str]:
    """An sbatch --time value -> (seconds, the form it was read as: "minutes:seconds", ...); a one-line
    UserError for a value sbatch(1) does not define or a field beyond its range (99:99, 1-25, 1:60:00).
    sbatch itself adds an overflowing field to the next (Slurm's time_str2secs), so 99:99 would be a
    limit nobody meant."""
    m = _TIME.match(text) if isinstance(text, str) else None
    if m is None:
        raise UserError(f"--time must be a SLURM duration such as 02:00:00 or 1-12:00:00, got {text!r}")
    days, first, second, third = m.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        fields = [
            ("days", int(days), None),
            ("hours", int(first), 24),
            ("minutes", int(second or 0), 60),
            ("seconds", int(third or 0), 60),
        ]
        form = "days-hours" + (":minutes" if second is not None else "") + (":seconds" if third is not None else "")
    elif third is not None:  # hours:minutes:seconds
        fields = [("hours", int(first), None), ("minutes", int(second), 60), ("seconds", int(third), 60)]
        form = "hours:minutes:seconds"
    else:  # minutes[:seconds]
        fields = [("minutes", int(first), None), ("seconds", int(second or 0), 60)]
        form = "minutes:seconds" if second is not None else "minutes"
    for name, value, limit in fields:
        if limit is not None and value >= limit:
            raise UserError(
                f"--time {text}: {value} {name} in {form} (at most {limit - 1}); write e.g. 02:00:00 "
                "(hours:minutes:seconds) or 1-12:00:00"
            )
    scale = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}
    return sum(scale[name] * value for name, value, _ in fields), form


def _check_options(o: SlurmOptions, name: str) -> None:
    """UserError for an option that would make an invalid #SBATCH line, a bad time limit or master port."""
    for label, value in (
        ("--account", o.account),
        ("--partition", o.partition),
        ("--job-name", name),
        ("--output", o.output),
    ):
        if value and not _SAFE.match(value):
            raise UserError(f"{label} {value!r} has characters a #SBATCH line cannot carry unquoted")
    time_limit(o.time)
    if not 0 < o.master_port < 65536:
        raise UserError(f"master port must be in 1..65535, got {o.master_port}")


def _sbatch_lines(plan: Plan, cluster: ClusterSpec, o: SlurmOptions, layout, name: str) -> list[str]:
    """The script's header: what it runs, and the sbatch(1) options."""
    kind = platform(cluster)
    # sbatch(1) options. Frontier: one task per GCD, bound to its closest GCD (OLCF user guide:
    # `--gpus-per-node=8 --ntasks-per-node=8 --gpu-bind=closest`, 7 cores per task).
    head = [
        "#!/bin/bash",
        f"# Rendered by `exatrain launch --scheduler slurm` for {plan_summary(plan, cluster, layout)}.",
        "# Submit with: sbatch <this file>. Requeue-safe: the plan is embedded below and the trainer",
        "# resumes from the newest checkpoint in CHECKPOINT_DIR (--resume auto).",
        f"#SBATCH --job-name={name}",
    ]
    head.append(
        f"#SBATCH --account={o.account}"
        if o.account
        else "# #SBATCH --account=<project>   (most sites require one: exatrain launch --account)"
    )
    if o.partition:
        head.append(f"#SBATCH --partition={o.partition}")
    head += [
        f"#SBATCH --time={o.time}",
        f"#SBATCH --nodes={layout.nodes}",
        f"#SBATCH --ntasks-per-node={layout.ranks_per_node}",
    ]
    if kind != "cpu":
        head.append(f"#SBATCH --gpus-per-node={layout.ranks_per_node}")
    if kind == "rocm":
        head.append("#SBATCH --cpus-per-task=7")
    head += ["#SBATCH --requeue", "#SBATCH --open-mode=append", f"#SBATCH --output={o.output}"]

    return head


def _setup_lines(plan: Plan, cluster: ClusterSpec, o: SlurmOptions, layout) -> list[str]:
    """Site setup, the plan written beside the checkpoints, the rendezvous and the communication environment."""
    kind = platform(cluster)
    ckpt = o.train.checkpoint_dir
    body = [""]
    if o.setup:  # before `set -u`: environment-module scripts read unset variables
        body += ["# ---- site setup (exatrain launch --setup)", *o.setup, ""]
    body += ["set -euo pipefail", ': "${SLURM_JOB_ID:?submit this script with sbatch (SLURM_JOB_ID is not set)}"', ""]
    body += [
        "# ---- the plan, written beside the checkpoints it describes (same text on every requeue)",
        f'CHECKPOINT_DIR="{shell_double_quoted(ckpt)}"',
        'mkdir -p "$CHECKPOINT_DIR"',
        'PLAN="$CHECKPOINT_DIR/plan-${SLURM_JOB_ID}.json"',
        f"cat > \"$PLAN\" <<'{_HEREDOC}'",
        plan.to_json(),
        _HEREDOC,
        "",
        "# ---- rendezvous: rank 0 runs on the first host of the allocation",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_NODELIST" | head -n1)"',
        ': "${MASTER_ADDR:?no first host in SLURM_NODELIST=$SLURM_NODELIST}"',
        f'export MASTER_PORT="{o.master_port}"',
        "",
    ]
    body.append(
        {
            "rocm": "# ---- ROCm + RCCL environment" + (" over Slingshot" if uses_slingshot(cluster) else ""),
            "cuda": "# ---- CUDA + NCCL environment (site-specific: NCCL_SOCKET_IFNAME, NCCL_IB_HCA)",
            "cpu": "# ---- CPU ranks: gloo over TCP",
        }[kind]
    )
    env = environment(plan, cluster, rccl_plugin_dir=o.rccl_plugin_dir, cache_tag="${SLURM_JOB_ID}")
    body += render_env(env)
    if kind == "rocm":
        body += [
            "# the MIOpen cache directory must exist on every node",
            f'srun --nodes={layout.nodes} --ntasks={layout.nodes} --ntasks-per-node=1 mkdir -p "$MIOPEN_USER_DB_PATH"',
        ]
    body.append("")

    return body


def _srun_lines(cluster: ClusterSpec, o: SlurmOptions, layout) -> list[str]:
    """The srun line that starts one trainer task per device, each told its rank."""
    kind = platform(cluster)
    metrics = o.train.metrics_file or "$CHECKPOINT_DIR/metrics-${SLURM_JOB_ID}.jsonl"
    train = TrainArgs(
        checkpoint_dir='"$CHECKPOINT_DIR"',
        resume=o.train.resume,
        steps=o.train.steps,
        metrics_file=_shell_word(metrics),
        python=o.train.python,
        extra=o.train.extra,
    )
    srun = [f"srun --nodes={layout.nodes} --ntasks={layout.world_size} --ntasks-per-node={layout.ranks_per_node}"]
    if kind == "rocm":
        srun.append("--gpu-bind=closest")
    srun.append("--kill-on-bad-exit=1")
    # Single quotes: the variables expand inside each task, where srun has set SLURM_PROCID etc.
    rank_env = (
        "'export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
        "LOCAL_WORLD_SIZE=" + str(layout.ranks_per_node) + '; exec "$@"\' exatrain-rank'
    )
    cmd = [shlex.quote(o.train.python), "-m", "exatrain.train", *train.argv('"$PLAN"', train_device(cluster))]
    return [
        "# ---- one task per device; a failing rank ends the step. After a node failure or preemption",
        "# SLURM requeues the job (--requeue; or `scontrol requeue <id>`) and this text runs again.",
        " ".join(srun) + " \\",
        f"  bash -c {rank_env} \\",
        "  " + " ".join(cmd),
        "",
    ]


def render_slurm(plan: Plan, cluster: ClusterSpec, options: SlurmOptions = SlurmOptions()) -> str:
    """The sbatch script as text. Raises UserError when the plan cannot be laid out on the cluster
    or an option would make an invalid #SBATCH line."""
    o = options
    layout = node_layout(plan, cluster, o.nodes)
    name = o.job_name or job_label(plan)
    _check_options(o, name)
    head = _sbatch_lines(plan, cluster, o, layout, name)
    body = _setup_lines(plan, cluster, o, layout) + _srun_lines(cluster, o, layout)
    return "\n".join(head + body)


def _shell_word(text: str) -> str:
    """A path for the command line: kept as a double-quoted word so $VARs still expand."""
    return f'"{text}"' if "$" in text else shlex.quote(text)


__all__ = ["SlurmOptions", "render_slurm", "time_limit"]
