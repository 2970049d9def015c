"""A plan as text to run elsewhere: ``launch`` (a SLURM batch script or a multi-node torchrun
command) and ``export_config`` (Megatron-LM, Megatron-DeepSpeed or torchtitan configuration).

Every file written is checked before any is written, and written aside then renamed into place.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from exatrain.api.plans import Warn, load_plan, resolve_cluster, warner
from exatrain.api.requests import ClusterQuery, JobOptions, SlurmJob, TorchrunJob, coerce, routed
from exatrain.catalog import ClusterSpec
from exatrain.errors import UserError
from exatrain.paths import check_output_file
from exatrain.plan import Plan

SCHEDULERS = ("slurm", "torchrun")


def write_text(path: str | Path, text: str, *, executable: bool = False) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, then rename it."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o755 if executable else 0o644)
        os.replace(tmp, p)
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from None


def check_fits(
    plan: Plan,
    cluster: ClusterSpec,
    *,
    force: bool,
    warn: Warn,
    what: str,
    name: str = "the plan",
    runtime: str | None = None,
) -> None:
    """One line on a plan that is tight on ``cluster`` or predicted above its capacity; a plan that does not fit
    (even the low end of its band of measured peaks is above the capacity, planner/memory_band.py) is refused
    unless ``force``. The plan is estimated as ``runtime`` runs it (the engine the output runs; as the plan's own
    runtime where that engine does not run its layout: the export's notes say what it runs instead). ``what``
    names the output in the lines ("the job", "the run"), ``name`` the plan. A CPU cluster is not checked here:
    its ranks share the machine's memory (``_cpu_job_warnings``)."""
    from exatrain.planner.estimate import estimate_plan
    from exatrain.planner.memory_band import tight_window
    from exatrain.units import GiB

    if cluster.device.is_host:
        return
    est = None
    if runtime is not None and runtime != plan.runtime:
        try:
            swapped = plan.replace(runtime=runtime).validate(cluster)
            est, plan = estimate_plan(swapped, cluster), swapped
        except UserError:
            est = None
    if est is None:
        est = estimate_plan(plan, cluster)
    need, cap = est.memory_bytes.total / GiB, est.capacity_bytes / GiB
    amount = (
        f"its worst stage is predicted at {need:,.1f} GiB of {cap:,.0f} GiB on {cluster.name} as {plan.runtime} runs it"
    )
    if est.verdict == "does not fit":
        if not force:
            raise UserError(
                f"{name} does not fit: {amount}, above even its band of measured peaks; choose a "
                "layout that fits (exatrain search) or give --force to write it anyway"
            )
        warn(f"{name} does not fit: {amount}; written because of --force")
    elif est.verdict == "tight":
        lo, hi = tight_window(est.memory_band or {"ratio_low": 1.0, "ratio_high": 1.0})
        over = ", above the capacity" if need > cap else ""
        warn(
            f"{name} is tight: {amount}{over}, and measured peaks of such plans range over {lo:.2f}–{hi:.2f}x "
            f"the prediction: {what} may run out of memory"
        )


TARGET_RUNTIMES = {
    "megatron": "megatron-core",
    "deepspeed": "megatron-deepspeed",
    "torchtitan": "torchtitan",
    "torchtitan-0.3": "torchtitan",
}  # the engine each export target's run is priced as


def _plan_name(plan: str | Path | Plan) -> str:
    return str(plan) if isinstance(plan, (str, Path)) else "the plan"


def _cpu_job_warnings(plan: Plan, cluster: ClusterSpec, ranks_per_node: int, warn: Warn) -> None:
    """One line each: a plan made for CPU ranks rendered as a GPU job, and a model whose states
    (training.state_bytes) on one CPU node's ranks exceed this machine's memory."""
    from exatrain.api.training import machine_memory_bytes, state_bytes
    from exatrain.catalog import cluster_catalog

    made_for = cluster_catalog().get(plan.cluster)
    if made_for is not None and made_for.device.name == "cpu" and cluster.device.name != "cpu":
        warn(
            f"the plan was made for {plan.cluster} (CPU ranks, {plan.dtype}) but this is a GPU job on {cluster.name}: "
            f"its layout and prediction are for the CPU; re-plan with --cluster {cluster.name}"
        )
    ram = machine_memory_bytes()
    if cluster.device.name == "cpu" and ram:
        need = state_bytes(plan) * ranks_per_node / plan.gpus
        if need > 0.8 * ram:
            warn(
                f"{plan.model.name} on CPU ranks needs about {need / 2**30:,.0f} GiB of model states per node "
                f"({ranks_per_node} ranks) but this machine has {ram / 2**30:,.0f} GiB: the job will likely be "
                "refused or run out of memory; use a GPU cluster or a smaller model"
            )


def launch(
    plan: str | Path | Plan,
    scheduler: str,
    cluster: ClusterQuery | str | ClusterSpec | None = None,
    *,
    job: JobOptions | None = None,
    slurm: SlurmJob | None = None,
    torchrun: TorchrunJob | None = None,
    warn: Warn | None = None,
    **pins: Any,
) -> str:
    """The job that trains ``plan`` (a Plan or a file holding one) as text: an sbatch script
    (``scheduler='slurm'``, its values in ``slurm``) or the torchrun command to run on every node ('torchrun',
    ``torchrun``). The cluster is the plan's unless given. ``job``: nodes, steps, files (``job.out``: also write it
    there, executable). A plan that does not fit the cluster's memory as exatrain's trainer (the job's) runs it is
    refused unless ``job.force``; a tight one gets a warning (``check_fits``). Every field may be given flat by
    name (``launch("plan.json", "slurm", "frontier", account="ABC123")``)."""
    parts = {"cluster": coerce(ClusterQuery, cluster, "cluster"), "job": coerce(JobOptions, job, "")}
    parts.update(slurm=coerce(SlurmJob, slurm, ""), torchrun=coerce(TorchrunJob, torchrun, ""))
    r = routed("launch", pins, parts)
    if r["settings"] or r["cluster"].gpus is not None:
        raise TypeError(f"launch() got an unexpected keyword argument {next(iter(r['settings']), 'gpus')!r}")
    return _launch(plan, scheduler, r["cluster"], r["job"], r["slurm"], r["torchrun"].master, warner(warn))


def _launch(plan: Any, scheduler: str, cq: ClusterQuery, job: JobOptions, sl: SlurmJob, master: str, warn) -> str:
    from exatrain.launch import SlurmOptions, TorchrunOptions, TrainArgs, node_layout, render_slurm, render_torchrun

    nodes, out, time = job.nodes, job.out, sl.time
    if scheduler not in SCHEDULERS:
        raise UserError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
    if out is not None:
        check_output_file(out, "--out")
    p = load_plan(plan, warn=warn)
    c = resolve_cluster(cq.cluster, cq.cluster_file, default=p.cluster or None)
    train = TrainArgs(
        checkpoint_dir=os.path.abspath(job.checkpoint_dir),
        steps=job.steps,
        metrics_file=os.path.abspath(job.metrics_file) if job.metrics_file else None,
    )
    if scheduler == "slurm":
        from exatrain.launch.slurm import time_limit

        seconds, form = time_limit(time)
        if form == "minutes:seconds":
            warn(
                f"--time {time} is {seconds // 60} min {seconds % 60} s to sbatch (minutes:seconds); for hours "
                f"write hours:minutes:seconds, e.g. {time}:00"
            )
        if master:
            raise UserError(
                "--master is for --scheduler torchrun; under SLURM the first allocated host "
                "is the master (set the port with --master-port)"
            )
        text = render_slurm(
            p,
            c,
            SlurmOptions(
                train=train,
                account=sl.account,
                time=time,
                partition=sl.partition,
                job_name=sl.job_name,
                nodes=nodes,
                master_port=sl.master_port,
                rccl_plugin_dir=job.rccl_plugin_dir,
                setup=tuple(sl.setup),
            ),
        )
    else:
        if not isinstance(plan, (str, Path)):
            raise UserError("a torchrun command refers to the plan by its file: give the plan as a path")
        text = render_torchrun(
            p,
            c,
            TorchrunOptions(
                plan_path=os.path.abspath(plan),
                train=train,
                nodes=nodes,
                master=master,
                rccl_plugin_dir=job.rccl_plugin_dir,
            ),
        )
    _cpu_job_warnings(p, c, node_layout(p, c, nodes).ranks_per_node, warn)
    check_fits(p, c, force=job.force, warn=warn, what="the job", name=_plan_name(plan), runtime="exatrain")
    if out is not None:
        write_text(out, text, executable=True)
    return text


def export_config(
    *,
    plan: str | Path | Plan,
    target: str,
    out: str | Path | None = None,
    force: bool = False,
    warn: Warn | None = None,
):
    """``plan``'s layout as another engine's configuration (an Export: text, notes, extra files).
    ``target``: megatron | deepspeed | torchtitan (v0.2.2 TOML) | torchtitan-0.3. ``out``: write the text there
    (deepspeed: and ds_config.json beside it; both are checked before either is written). A plan that does not fit
    its cluster's memory as the target's engine runs it is refused unless ``force``; a tight one gets a warning
    (``check_fits``)."""
    from exatrain.engine_configs import export

    from exatrain.catalog import cluster_catalog

    warn = warner(warn)
    p = load_plan(plan, warn=warn)
    ds_config = Path(out).with_name("ds_config.json") if out is not None else Path("ds_config.json")
    result = export(p, target, ds_config_path=str(ds_config))
    made_for = cluster_catalog().get(p.cluster)  # a plan for a cluster file's cluster is not checked here
    if made_for is not None:
        check_fits(
            p, made_for, force=force, warn=warn, what="the run", name=_plan_name(plan), runtime=TARGET_RUNTIMES[target]
        )
    if out is not None:
        targets = [Path(out)] + [Path(name) for name, _ in result.files]
        for path in targets:
            check_output_file(path, "--out")
        if len({t.absolute() for t in targets}) < len(targets):
            raise UserError(
                f"--out {out}: the {target} config and its {', '.join(n for n, _ in result.files)} "
                "would be the same file; choose another name"
            )
        for name, content in result.files:
            write_text(name, content)
        write_text(out, result.text)
    return result


__all__ = ["SCHEDULERS", "export_config", "launch", "write_text"]
