"""``train``: run a plan (or the embedded default) with PyTorch's distributed engine.

Everything a user can get wrong is checked before any rank starts: every path named (outputs
writable, inputs present, room for a checkpoint), the layout (Plan.validate), degrees against the
launcher's world size, the device, the model states against this machine's memory on a CPU run,
the data and its vocabulary, the checkpoint to resume. Then the ranks start: from torchrun/srun's
environment when present, otherwise spawned here. Torch is imported only when a run starts.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exatrain.api.plans import (
    Warn,
    calibrated,
    layout_values,
    load_plan,
    make_plan,
    resolve_cluster,
    resolve_model,
    warner,
)
from exatrain.api.requests import ClusterQuery, Layout, ModelQuery, SettingsArg, TrainRun, TrainStore, coerce, routed
from exatrain.catalog import ClusterSpec, ModelSpec, cluster_catalog, get_cluster, match_device
from exatrain.errors import OutOfMemoryPredicted, PlanError, UserError
from exatrain.paths import check_input_dir, check_output_dir, check_output_file
from exatrain.plan import ParallelDims, Plan, RunRecord, TrainShape

DEFAULT_MODEL = "gpt-small"


def embedded_default(model: ModelSpec) -> Plan:
    """The layout `exatrain train` runs with no layout values: every kind of parallelism at once on
    8 CPU ranks (tp2 x pp2 x dp2, 1F1B over 4 micro-batches of 2), float32."""
    return Plan(
        model=model,
        dims=ParallelDims(tp=2, pp=2, dp=2),
        shape=TrainShape(micro_batch=2, global_batch=16),
        schedule="1f1b",
        dtype="float32",
        cluster="local-cpu",
    )


def describe_default() -> str:
    """What ``train`` runs with no plan and no layout values, in words (for --help)."""
    from exatrain.catalog import get_model

    p = embedded_default(get_model(DEFAULT_MODEL))
    steps = TrainRun().steps
    return (
        f"{DEFAULT_MODEL} over the built-in corpus (bytes), tp{p.tp} x pp{p.pp} x dp{p.dp} on "
        f"{p.gpus} CPU ranks: {p.schedule} over {p.num_microbatches} micro-batches of {p.micro_batch}, "
        f"global batch {p.global_batch}, {p.dtype}, {steps} steps"
    )


@dataclass(frozen=True)
class TrainResult:
    plan: Plan  # what ran, with the prediction it carried
    config: Any  # the trainer's TrainConfig
    record: RunRecord | None  # the run's RunRecord (this process wrote or read it); None when none
    calibrated: bool  # the prediction was made with parameters measured on this machine
    ran: bool = True  # False: a resumed checkpoint already reached the steps asked for

    def summary_lines(self) -> list[str]:
        """Measured step time (beside the prediction only when calibrated here) and peak memory."""
        if self.record is None:
            return []
        from exatrain.planner.compare import compare, summary_lines

        return summary_lines(compare(self.record), self.calibrated)


def state_bytes(plan: Plan) -> float:
    """Model states of all the plan's ranks: weights, gradients and optimizer states per parameter
    by precision and ZeRO stage (accounting.memory.state_bytes_per_param), times each rank's
    parameters (accounting.params.stage_params) over every tp and dp rank."""
    from exatrain.accounting.memory import state_bytes_per_param
    from exatrain.accounting.params import stage_params

    per = state_bytes_per_param(plan.dtype, plan.zero_stage, plan.dp).total
    return sum(n * per for n in stage_params(plan)) * plan.tp * plan.dp


def checkpoint_bytes(plan: Plan) -> float:
    """One checkpoint: fp32 weights and AdamW's two fp32 moments of every parameter (the model
    states without gradients or 16-bit copies, accounting.memory.state_bytes_per_param at ZeRO-0
    in float32), which the trainer saves whatever the layout."""
    from exatrain.accounting.memory import state_bytes_per_param
    from exatrain.accounting.params import total_params

    per = state_bytes_per_param("float32", 0, 1)
    return total_params(plan.model) * (per.weights + per.optimizer)


def machine_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def check_cpu_memory(plan: Plan, ranks_here: int | None = None) -> None:
    """Refuse (OutOfMemoryPredicted) a CPU run whose model states alone, on the ranks of this
    machine, exceed 80% of its memory."""
    ram = machine_memory_bytes()
    if ram is None:
        return
    ranks = ranks_here or plan.gpus
    need = state_bytes(plan) * ranks / plan.gpus
    if need > 0.8 * ram:
        most = int(0.8 * ram * ranks // need)  # ranks of this layout's size whose states would fit
        if most >= 1 and ranks > 1:
            advice = f"use at most {most:,} ranks here (a lower --dp, --tp or --pp), or run on GPUs"
        else:
            advice = (
                "choose a smaller model"
                + (" (e.g. --model gpt-tiny)" if plan.model.name != "gpt-tiny" else "")
                + " or run on GPUs"
            )
        raise OutOfMemoryPredicted(
            f"{plan.model.name} on {ranks:,} CPU ranks needs about {need / 2**30:.1f} GiB of "
            f"model states but this machine has {ram / 2**30:.1f} GiB; {advice}"
        )


def _pick_device(device: str | None, base: Plan | None) -> str:
    if device:
        return device
    clusters = cluster_catalog()
    if base is not None and base.cluster in clusters and clusters[base.cluster].device.name != "cpu":
        return "cuda"  # the plan was made for GPUs
    return "cpu"


def _pick_cluster(cluster: Any, cluster_file: Any, base: Plan | None, device: str) -> ClusterSpec | None:
    """The cluster given; else the plan's; else the local CPU or the catalog cluster of this GPU."""
    if cluster is not None or cluster_file is not None:
        return resolve_cluster(cluster, cluster_file)
    if base is not None and base.cluster in cluster_catalog():
        return get_cluster(base.cluster)
    if device == "cpu":
        return get_cluster("local-cpu")
    import torch

    if torch.cuda.is_available():
        spec = match_device(torch.cuda.get_device_name(0))
        for c in cluster_catalog().values():
            if spec is not None and c.device.name == spec.name:
                return c
    return None


def _attach_estimate(plan: Plan, base: Plan | None, cluster: ClusterSpec | None, calibration: Any, warn: Warn) -> Plan:
    """The planner's prediction for this plan, carried into the RunRecord: made with the calibration
    file's parameters when one is given; else kept from the base plan when the layout is unchanged;
    else made with the device's prior parameters."""
    from exatrain.planner.estimate import estimate_plan

    if calibration is not None:
        if cluster is None:
            raise UserError("--calibration needs a catalog cluster (--cluster or --cluster-file) to predict for")
        cal_cluster, params = calibrated(cluster, calibration, "exatrain")
        return plan.with_estimate(estimate_plan(plan, cal_cluster, params))
    if (
        base is not None
        and base.estimate is not None
        and plan.with_estimate(None) == base.replace(estimate=None, cluster=plan.cluster)
    ):
        return plan.with_estimate(base.estimate)
    if cluster is None:
        return plan
    try:
        return plan.with_estimate(estimate_plan(plan, cluster))
    except Exception as exc:  # the prediction is an extra; never let it stop a training run
        warn(f"no prediction for this plan ({type(exc).__name__}: {exc})")
        return plan


def _check_data_and_resume(data: Any, resume: Any, checkpoint_dir: Any, plan: Plan, quiet: bool, warn: Warn):
    """The dataset (the default corpus is prepared into the cache now) and its vocabulary against
    the model; the checkpoint to resume, verified, for this model, tokenizer and sequence length."""
    from exatrain.data.dataset import check_dataset_for
    from exatrain.data.prepare import default_dataset
    from exatrain.trainer.checkpoint import files as ckpt_files

    data_dir = str(data) if data else str(default_dataset(quiet=quiet))
    meta = check_dataset_for(
        plan, data_dir, where=f"the training data ({'the default corpus' if not data else data_dir})"
    )
    manifest = ckpt_files.resolve(
        None if resume is None else str(resume), None if checkpoint_dir is None else str(checkpoint_dir), warn=warn
    )
    if manifest is not None:
        from exatrain.trainer.checkpoint.compat import check_model  # imports torch: only to resume

        check_model(manifest, plan.model)
        t = manifest.trainer
        if t.get("tokenizer_sha256") != meta.tokenizer_sha256:
            raise ckpt_files.CheckpointError(
                f"{manifest.path} was trained with another tokenizer than the data in "
                f"{data_dir}; resume with the data it was trained on"
            )
        if t.get("seq_len") != plan.model.seq_len:
            raise ckpt_files.CheckpointError(
                f"{manifest.path} was trained with seq_len {t.get('seq_len')}, this run "
                f"has {plan.model.seq_len}: the sampler's windows would differ"
            )
    return data_dir, manifest


def _check_device(device: str, local_ranks: int) -> None:
    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise UserError(
            "this is a GPU run but no CUDA/ROCm device is visible here; pass --device cpu to run the plan on the CPU"
        )
    count = torch.cuda.device_count()
    if local_ranks > count:
        raise UserError(
            f"{local_ranks} ranks on this node but only {count} GPU(s): one rank per GPU; "
            "lower the degrees or use more nodes (torchrun/srun)"
        )


def _plan_keeping_batch(
    m: ModelSpec,
    c: ClusterSpec | None,
    gpus: int | None,
    base: Plan | None,
    keep: bool,
    layout: dict[str, Any],
    default_dtype: str,
) -> Plan:
    """make_plan over ``base``; with ``keep`` (a user's plan and no --global-batch) the plan's global batch
    is the run's whatever the layout flags change (another dp or micro-batch only changes how it is split into
    micro-batches), and a layout that cannot split it is refused in one line rather than given another batch."""
    from exatrain.rules import RuleError

    if not keep or base is None:
        return make_plan(m, c, gpus=gpus, base=base, default_dtype=default_dtype, **layout)
    gb = base.global_batch
    try:
        return make_plan(m, c, gpus=gpus, base=base, default_dtype=default_dtype, **{**layout, "global_batch": gb})
    except RuleError as exc:
        if exc.reason != "global batch not divisible by micro-batch*dp":
            raise
        split = make_plan(m, c, gpus=gpus, base=base, default_dtype=default_dtype, **{**layout, "global_batch": None})
        raise PlanError(
            f"the plan's global batch {gb} does not split over micro-batch x dp = {split.micro_batch} x "
            f"{split.dp}: pass --global-batch (a multiple of {split.micro_batch * split.dp}) to train "
            f"another batch, or a layout whose micro-batch x dp divides {gb}"
        ) from None


TRAIN_SETTINGS = ("fp8",)  # the run settings the trainer takes as flags (trainer/fp8.py runs "current")


def train(
    plan: str | Path | Plan | None = None,
    model: ModelQuery | str | ModelSpec | None = None,
    cluster: ClusterQuery | str | ClusterSpec | None = None,
    *,
    layout: Layout | None = None,
    settings: SettingsArg = None,
    run: TrainRun | None = None,
    store: TrainStore | None = None,
    **pins: Any,
) -> TrainResult:
    """Train ``plan`` (a Plan, or a file holding one: a plan, `estimate --json`, or `search --json`,
    whose first ranked plan is taken), with layout and model values overriding it (its global batch stays the
    run's unless ``layout.global_batch`` is given: a layout that cannot split it is refused); with neither a
    plan nor any of tp/pp/dp/gpus, the embedded default (``embedded_default``: gpt-small, tp2 pp2
    dp2 on 8 CPU ranks, float32). The device is cuda for a plan made for a GPU cluster, else cpu.
    ``layout.cp`` (context parallel) and ``layout.ep`` (expert parallel) degrees: None keeps the plan's (else 1); cp
    adds ranks (gpus = tp*cp*pp*dp), ep splits dp. ``settings``: ``fp8``, the FP8 GEMM recipe (trainer/fp8.py runs
    "current"); None keeps the plan's; given, the dtype is bfloat16 unless ``layout.dtype`` says otherwise.
    ``run``: how it runs (``TrainRun``), ``store``: its data and checkpoints (``TrainStore``; ``resume``: 'auto',
    the newest complete checkpoint in ``checkpoint_dir``, or a checkpoint path). Every field may be given flat by
    name (``train(model="gpt-tiny", tp=2, steps=20)``)."""
    parts = {
        "model": coerce(ModelQuery, model, "model"),
        "cluster": coerce(ClusterQuery, cluster, "cluster"),
        **{k: coerce(c, v, "") for k, c, v in (("layout", Layout, layout), ("run", TrainRun, run))},
        "store": coerce(TrainStore, store, ""),
    }
    r = routed("train", pins, parts, settings)
    wrong = [k for k in r["settings"] if k not in TRAIN_SETTINGS]
    if wrong:
        raise TypeError(f"train() got an unexpected keyword argument {wrong[0]!r}")
    lay = r["layout"]
    if r["settings"].get("fp8") and lay.dtype is None:  # FP8 GEMMs run inside bfloat16 training (exatrain.rules)
        lay = dataclasses.replace(lay, dtype="bfloat16")
    p, device, warn = _train_plan(plan, r["model"], r["cluster"], lay, r["settings"], r["run"], r["store"])
    return _run(p, device, r["run"], r["store"], warn)


def _check_paths(run: TrainRun, store: TrainStore) -> None:
    """Every path named, before anything is read: outputs writable, inputs present."""
    if run.metrics_file is not None:
        check_output_file(run.metrics_file, "--metrics-file")
    if run.tensorboard is not None:
        check_output_dir(run.tensorboard, "--tensorboard")
    if store.checkpoint_dir is not None:
        check_output_dir(store.checkpoint_dir, "--checkpoint-dir")
    if store.data is not None and Path(store.data).exists():  # a missing one: the dataset reader names it (below)
        check_input_dir(store.data, "--data")
    if store.resume is not None and str(store.resume) != "auto":
        check_input_dir(store.resume, "--resume")


def _train_plan(plan: Any, mq: ModelQuery, cq: ClusterQuery, lay: Layout, settings: dict, run: TrainRun, store):
    """(the plan to train, with its prediction; the device; the warning hook): ``train``'s plan from the base plan,
    the model, cluster and layout values."""
    warn = warner(run.warn)
    _check_paths(run, store)
    base = load_plan(plan, warn=warn) if plan is not None else None
    m = resolve_model(mq.model, mq.model_file, base=base.model if base else None, default=DEFAULT_MODEL, **mq.shape())
    from exatrain.trainer.config import check_model_built

    check_model_built(m)
    gpus = cq.gpus
    if base is None and all(v is None for v in (lay.tp, lay.pp, lay.dp, gpus, lay.cp, lay.ep)):
        base = embedded_default(m)
    device = _pick_device(run.device, base)
    c = _pick_cluster(cq.cluster, cq.cluster_file, base, device)
    stage_layers = tuple(lay.stage_layers) if lay.stage_layers is not None else None
    layout = {**layout_values({**lay.values(), "settings": settings}), "stage_layers": stage_layers}
    p = _plan_keeping_batch(
        m,
        c,
        gpus,  # type: ignore[arg-type]
        base,
        plan is not None and lay.global_batch is None,
        layout,
        default_dtype="float32" if device == "cpu" else "bfloat16",
    )
    p = _attach_estimate(p, base, c, run.calibration, warn)
    if store.checkpoint_dir is not None:
        check_output_dir(store.checkpoint_dir, "--checkpoint-dir", need_bytes=int(checkpoint_bytes(p)))
    return p, device, warn


def _config(p: Plan, device: str, run: TrainRun, store: TrainStore):
    """The trainer's TrainConfig of the plan and the run, checked."""
    from exatrain.trainer.config import TrainConfig

    return TrainConfig(
        plan=p,
        steps=run.steps,
        seed=run.seed,
        lr=run.lr,
        warmup_steps=run.warmup,
        min_lr_ratio=run.min_lr_ratio,
        weight_decay=run.weight_decay,
        grad_clip=run.grad_clip,
        device=device,
        quiet=run.quiet,
        checkpoint_dir=None if store.checkpoint_dir is None else str(store.checkpoint_dir),
        save_every=store.save_every,
        keep_last=store.keep_last,
        async_save=store.async_save,
        nan_policy=run.nan_policy,
        tensorboard_dir=None if run.tensorboard is None else str(run.tensorboard),
        record_samples=run.record_samples,
        compile=run.compile,
        watchdog_s=run.watchdog,
    ).check()


def _run(p: Plan, device: str, run: TrainRun, store: TrainStore, warn: Warn) -> TrainResult:
    """Check the launcher, the device, this machine's memory, the data and the checkpoint to resume; then start the
    ranks (torchrun/srun's, or spawned here) and read back the RunRecord."""
    from exatrain.trainer import spawn as launcher

    say = run.progress or (lambda message: None)
    config = _config(p, device, run, store)
    env = launcher.dist_env()
    if env is not None and env.world_size != p.gpus:
        raise PlanError(
            f"the plan needs tp*pp*dp = {p.tp}*{p.pp}*{p.dp} = {p.gpus} ranks but "
            f"the launcher started {env.world_size}; change --dp (or --gpus) or the launcher"
        )
    _check_device(device, env.local_world_size if env else p.gpus)
    if device == "cpu":
        check_cpu_memory(p, env.local_world_size if env else p.gpus)
    data_dir, manifest = _check_data_and_resume(store.data, store.resume, store.checkpoint_dir, p, run.quiet, warn)
    from exatrain.planner.compare import calibrated_on

    here = calibrated_on(p.estimate, platform.node())
    if manifest is not None and manifest.step >= config.steps:
        say(f"{manifest.path} is at step {manifest.step}, which reaches --steps {config.steps}: nothing to do")
        return TrainResult(plan=p, config=config, record=None, calibrated=here, ran=False)
    if manifest is not None:
        say(f"resuming from {manifest.path} (step {manifest.step})")
    # Without a metrics file a local run writes one in a scratch folder, for the end-of-run comparison.
    metrics_file = run.metrics_file
    scratch = tempfile.TemporaryDirectory(prefix="exatrain-train-") if metrics_file is None and env is None else None
    metrics = (
        str(metrics_file)
        if metrics_file is not None
        else (str(Path(scratch.name) / "metrics.jsonl") if scratch is not None else None)
    )
    config = dataclasses.replace(
        config, data_dir=data_dir, metrics_file=metrics, resume_from=None if manifest is None else str(manifest.path)
    )
    try:
        if env is not None:
            launcher.run_distributed(config, env)
            return TrainResult(plan=p, config=config, record=_last_record(metrics, env), calibrated=here)
        from exatrain.loadwatch import LoadWatch

        with LoadWatch() as watch:  # the machine's load while the ranks ran, against the calibration's bench
            launcher.launch_local([config])
        return TrainResult(
            plan=p, config=config, record=_record_load(metrics, watch.load, run.calibration), calibrated=here
        )
    finally:
        if scratch is not None:
            scratch.cleanup()


def _record_load(metrics: str | None, load: Any, calibration: Any) -> RunRecord | None:
    """The run's RunRecord with the machine's load during training (``env.load``) and during the bench of the
    calibration it was predicted with (``env.bench_load``, where the calibration file recorded one) added to it,
    in the metrics file too (``loadwatch.py``)."""
    record = _last_record(metrics, None)
    if record is None or load is None:
        return record
    env = {"load": load.to_dict()}
    if calibration is not None:
        from exatrain.planner.cost.coefficients import load_calibration

        bench = load_calibration(calibration).extra.get("bench") or {}
        if isinstance(bench, dict) and bench.get("load") is not None:
            env["bench_load"] = bench["load"]
    from exatrain.records import amend_last_run_record

    return amend_last_run_record(metrics, env) or record


def _last_record(metrics: str | None, env: Any) -> RunRecord | None:
    """The RunRecord the run appended (rank 0 writes it), or None."""
    if metrics is None or (env is not None and env.rank != 0) or not Path(metrics).is_file():
        return None
    from exatrain.records import read_run_records

    try:
        records = read_run_records(metrics)
    except UserError:
        return None
    return records[-1] if records else None


__all__ = [
    "DEFAULT_MODEL",
    "TrainResult",
    "check_cpu_memory",
    "checkpoint_bytes",
    "describe_default",
    "embedded_default",
    "state_bytes",
    "train",
]
