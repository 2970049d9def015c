"""`exatrain train`: run a plan (or the embedded default) with PyTorch's distributed engine.

Everything a user can get wrong is checked here, before any rank starts: the layout (Plan.validate),
degrees against the launcher's world size, the device, memory on a CPU run, the data (a prepared
dataset, or the default corpus prepared into a cache here) and its vocabulary against the model's,
the checkpoint to resume (complete, verified, for this model and tokenizer). Then the ranks start:
from torchrun/srun's environment when present, otherwise spawned here. Torch and the trainer are
imported only when the command runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from exatrain.catalog import ClusterSpec, ModelSpec, cluster_catalog, get_cluster, match_device
from exatrain.cli.common import (_MODEL_FLAGS, add_cluster_args, add_layout_args, add_model_args, nonneg_int,
                                 positive_int, resolve_cluster, resolve_model, resolve_plan)
from exatrain.errors import PlanError, UserError
from exatrain.plan import ParallelDims, Plan, TrainShape

DEFAULT_MODEL = "gpt-small"


def embedded_default(model: ModelSpec) -> Plan:
    """The layout `exatrain train` runs with no layout flags: every kind of parallelism at once on
    8 CPU ranks (tp2 x pp2 x dp2, 1F1B over 4 micro-batches), float32."""
    return Plan(model=model, dims=ParallelDims(tp=2, pp=2, dp=2), shape=TrainShape(micro_batch=2, global_batch=16),
                schedule="1f1b", dtype="float32", cluster="local-cpu")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a plan (default: a small GPT on 8 CPU ranks)",
        description="Train a plan with PyTorch's distributed engine (DeviceMesh, DTensor, pipelining, "
                    "FSDP2/DDP). With no flags: a small GPT over the standard library's source text, "
                    "tp2 x pp2 x dp2 on 8 CPU ranks. Under torchrun/srun each process is one rank; "
                    "otherwise the ranks are started here.")
    p.add_argument("--plan", metavar="PATH", help="a plan written by `exatrain search/estimate --json`; "
                   "flags override it")
    add_model_args(p, default=DEFAULT_MODEL)
    add_layout_args(p)
    add_cluster_args(p, default="local-cpu")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=positive_int, default=100, help="optimizer steps (default 100)")
    g.add_argument("--seed", type=nonneg_int, default=0, help="weights and data order (default 0)")
    g.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    g.add_argument("--warmup", type=nonneg_int, default=10, help="linear warm-up steps (default 10)")
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine decay floor, x lr (default 0.1)")
    g.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (default 0.1)")
    g.add_argument("--grad-clip", type=float, default=1.0, help="max global grad norm, 0 = off (default 1)")
    g.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cuda for a plan made for a GPU cluster, else cpu")
    g.add_argument("--metrics-file", metavar="PATH", default=None,
                   help="append one JSON line per step and a RunRecord at the end")
    g.add_argument("--quiet", action="store_true", help="no progress output")
    g.add_argument("--nan-policy", choices=("stop", "skip"), default="stop",
                   help="a non-finite loss or gradient norm: stop with the step number (default), or skip "
                        "that step's update and count it")
    g.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="also write TensorBoard event files (loss, grad norm, lr, tokens/s, step time)")
    g.add_argument("--calibration", metavar="PATH", default=None,
                   help="predict the step time with this calibration file (exatrain bench / calibrate); the "
                        "prediction is recorded beside the measurement")
    g.add_argument("--compile", action="store_true",
                   help="torch.compile each transformer block and the loss (tp 1 only; the first steps compile)")
    g.add_argument("--record-samples", action="store_true",
                   help="list in each metrics line the global sample indices each data-parallel rank read")
    d = p.add_argument_group("data and checkpoints")
    d.add_argument("--data", metavar="DIR", default=None,
                   help="a dataset made by `exatrain prepare` (default: the standard library's source, bytes)")
    d.add_argument("--checkpoint-dir", metavar="DIR", default=None,
                   help="save checkpoints here (after the last step, and every --save-every steps)")
    d.add_argument("--save-every", type=nonneg_int, default=0, metavar="N", help="save every N steps (default: "
                   "only after the last step)")
    d.add_argument("--keep-last", type=nonneg_int, default=0, metavar="K",
                   help="keep only the newest K checkpoints (default: all)")
    d.add_argument("--async-save", action="store_true", help="write checkpoints in the background")
    d.add_argument("--resume", metavar="auto|PATH", default=None,
                   help="auto: continue from the newest complete checkpoint in --checkpoint-dir (start fresh if "
                        "there is none); PATH: from that checkpoint. Any other layout may load it")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from exatrain.trainer.config import TrainConfig

    base = Plan.load(args.plan) if args.plan else None
    model = _resolve_train_model(args, base)
    if base is None and all(getattr(args, k) is None for k in ("tp", "pp", "dp", "gpus")):
        base = embedded_default(model)
    device = _pick_device(args, base)
    cluster = _pick_cluster(args, base, device)
    plan = resolve_plan(args, model, cluster, base=base, default_dtype="float32" if device == "cpu" else "bfloat16")
    plan = _attach_estimate(plan, base, cluster, args.calibration)
    data_dir, manifest = _check_data_and_resume(args, plan)
    config = TrainConfig(plan=plan, steps=args.steps, seed=args.seed, lr=args.lr, warmup_steps=args.warmup,
                         min_lr_ratio=args.min_lr_ratio, weight_decay=args.weight_decay,
                         grad_clip=args.grad_clip, device=device, metrics_file=args.metrics_file,
                         quiet=args.quiet, data_dir=data_dir, checkpoint_dir=args.checkpoint_dir,
                         save_every=args.save_every, keep_last=args.keep_last, async_save=args.async_save,
                         resume_from=None if manifest is None else str(manifest.path), nan_policy=args.nan_policy,
                         tensorboard_dir=args.tensorboard, record_samples=args.record_samples,
                         compile=args.compile).check()
    from exatrain.trainer.spawn import dist_env, launch_local, run_distributed

    if manifest is not None and manifest.step >= config.steps:
        if not args.quiet:
            print(f"{manifest.path} is at step {manifest.step}, which reaches --steps {config.steps}: nothing to do")
        return 0
    if manifest is not None and not args.quiet:
        print(f"resuming from {manifest.path} (step {manifest.step})")
    env = dist_env()
    if env is not None and env.world_size != plan.gpus:
        raise PlanError(f"the plan needs tp*pp*dp = {plan.tp}*{plan.pp}*{plan.dp} = {plan.gpus} ranks but "
                        f"the launcher started {env.world_size}; change --dp (or --gpus) or the launcher")
    _check_device(plan, device, env.local_world_size if env else plan.gpus)
    if device == "cpu":
        _check_cpu_memory(plan)
    if env is not None:
        run_distributed(config, env)
    else:
        launch_local([config])
    from exatrain.cli.bench_cmds import print_run_comparison

    print_run_comparison(config.metrics_file, quiet=args.quiet)  # the prediction beside what was measured
    return 0


def _check_data_and_resume(args: argparse.Namespace, plan: Plan):
    """The dataset (its metadata, tokenizer and shard sizes; the default corpus is prepared into the
    cache now) and its vocabulary against the model; the checkpoint --resume names, verified and
    checked against this model, tokenizer and sequence length. Returns (data dir, manifest or None)."""
    from exatrain.data.dataset import read_meta
    from exatrain.data.prepare import stdlib_dataset
    from exatrain.trainer.checkpoint import files as ckpt_files
    from exatrain.trainer.checkpoint.compat import check_model
    from exatrain.trainer.sampler import check_vocab

    data_dir = args.data if args.data else str(stdlib_dataset(quiet=args.quiet))
    meta = read_meta(data_dir)
    check_vocab(meta.vocab_size, plan.model.vocab, plan.model.name,
                where=f"the training data ({'the default corpus' if not args.data else data_dir})")
    manifest = ckpt_files.resolve(args.resume, args.checkpoint_dir,
                                  warn=lambda line: sys.stderr.write(f"exatrain train: {line}\n"))
    if manifest is not None:
        check_model(manifest, plan.model)
        t = manifest.trainer
        if t.get("tokenizer_sha256") != meta.tokenizer_sha256:
            raise ckpt_files.CheckpointError(f"{manifest.path} was trained with another tokenizer than the data in "
                                             f"{data_dir}; resume with the data it was trained on")
        if t.get("seq_len") != plan.model.seq_len:
            raise ckpt_files.CheckpointError(f"{manifest.path} was trained with seq_len {t.get('seq_len')}, this run "
                                             f"has {plan.model.seq_len}: the sampler's windows would differ")
    return data_dir, manifest


def _resolve_train_model(args: argparse.Namespace, base: Plan | None) -> ModelSpec:
    """The model: --model/--model-file/flags as everywhere; with --plan, shape flags edit its model."""
    if base is None or args.model or args.model_file:
        return resolve_model(args)
    overrides = {field: getattr(args, dest) for dest, field in _MODEL_FLAGS.items()
                 if getattr(args, dest, None) is not None}
    if not overrides:
        return base.model
    fields = base.model.to_dict()
    if "hidden" in overrides and "ffn_hidden" not in overrides and fields["arch"] == "gpt":
        fields["ffn_hidden"] = 0  # back to the family default for the new width
    if "heads" in overrides and "kv_heads" not in overrides and fields["kv_heads"] == fields["heads"]:
        fields["kv_heads"] = 0
    if "arch" in overrides and overrides["arch"] != fields["arch"]:
        fields["tied_embeddings"] = None
    fields.update(overrides)
    fields["name"] = f"{base.model.name}*"
    return ModelSpec.from_dict(fields, source="model flags")


def _pick_device(args: argparse.Namespace, base: Plan | None) -> str:
    if args.device:
        return args.device
    clusters = cluster_catalog()
    if base is not None and base.cluster in clusters and clusters[base.cluster].device.name != "cpu":
        return "cuda"  # the plan was made for GPUs
    return "cpu"


def _pick_cluster(args: argparse.Namespace, base: Plan | None, device: str) -> ClusterSpec | None:
    """--cluster/--cluster-file; else the plan's; else the local CPU or the cluster of this GPU."""
    if args.cluster or args.cluster_file:
        return resolve_cluster(args)
    if base is not None and base.cluster in cluster_catalog():
        return get_cluster(base.cluster)
    if device == "cpu":
        return get_cluster("local-cpu")
    import torch

    if torch.cuda.is_available():
        spec = match_device(torch.cuda.get_device_name(0))
        for cluster in cluster_catalog().values():
            if spec is not None and cluster.device.name == spec.name:
                return cluster
    return None


def _attach_estimate(plan: Plan, base: Plan | None, cluster: ClusterSpec | None,
                     calibration: str | None = None) -> Plan:
    """The planner's prediction for this plan, carried into the RunRecord: with --calibration, made
    with that file's parameters; else kept from --plan when the layout is unchanged, else computed
    by exatrain.planner.estimate when that module is present."""
    if calibration is not None:
        if cluster is None:
            raise UserError("--calibration needs a catalog cluster (--cluster or --cluster-file) to predict for")
        from exatrain.cli.planner_cmds import calibrated
        from exatrain.planner.estimate import estimate_plan

        cal_cluster, params = calibrated(argparse.Namespace(calibration=calibration), cluster)
        return plan.with_estimate(estimate_plan(plan, cal_cluster, params))
    if base is not None and base.estimate is not None and plan.with_estimate(None) == base.replace(
            estimate=None, cluster=plan.cluster):
        return plan.with_estimate(base.estimate)
    if cluster is None:
        return plan
    try:
        estimate = importlib.import_module("exatrain.planner.estimate")
    except ModuleNotFoundError as exc:
        if exc.name in ("exatrain.planner.estimate", "exatrain.planner"):
            return plan  # the cost model is not part of this install yet
        raise
    try:
        return plan.with_estimate(estimate.estimate_plan(plan, cluster))
    except Exception as exc:  # the prediction is an extra; never let it stop a training run
        sys.stderr.write(f"exatrain train: note: no prediction for this plan ({type(exc).__name__}: {exc})\n")
        return plan


def _check_device(plan: Plan, device: str, local_ranks: int) -> None:
    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise UserError("this is a GPU run but no CUDA/ROCm device is visible here; "
                        "pass --device cpu to run the plan on the CPU")
    count = torch.cuda.device_count()
    if local_ranks > count:
        raise UserError(f"{local_ranks} ranks on this node but only {count} GPU(s): one rank per GPU; "
                        "lower the degrees or use more nodes (torchrun/srun)")


def _check_cpu_memory(plan: Plan) -> None:
    """Refuse a CPU run whose model states alone (fp32 weights, gradients, Adam moments: 16 B per
    parameter, less what ZeRO shards) exceed this machine's memory."""
    from exatrain.accounting.params import stage_params

    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return
    z, dp = plan.zero_stage, plan.dp
    per_param = 4 / (dp if z >= 3 else 1) + 4 / (dp if z >= 2 else 1) + 8 / (dp if z >= 1 else 1)
    need = sum(n * plan.tp * plan.dp * per_param for n in stage_params(plan))
    if need > 0.8 * ram:
        raise UserError(f"{plan.model.name} needs about {need / 2**30:.1f} GiB of model states on the CPU "
                        f"but this machine has {ram / 2**30:.1f} GiB; choose a smaller model (e.g. --model "
                        "gpt-tiny) or run on GPUs")


__all__ = ["DEFAULT_MODEL", "embedded_default", "register"]
