"""The step loop and per-rank setup.

``train(config, local_rank)`` is one rank's whole run on an initialised default process group:
mesh, model (parallel/build.py), optimizer, data, then per step: forward and backward over the
micro-batches (a pipeline schedule when pp > 1), the tied-embedding gradient sync, the global
gradient norm and clipping, the optimizer step, metrics. ``launch.py`` starts the ranks.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import platform
import time
from datetime import datetime, timezone
from typing import Callable, ContextManager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from exatrain.plan import RunRecord, append_run_record
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.data import SampleOrder, StdlibBytes, check_vocab, local_batch
from exatrain.trainer.metrics import (Progress, StepMetrics, append_json_line, device_name, model_flops_per_step,
                                      peak_flops, peak_memory_bytes, summarize)
from exatrain.trainer.parallel.build import ParallelModel, execution_plan, parallelize
from exatrain.trainer.parallel.grads import average_over_dp, clip_grad_norm, settle_grads, sync_tied_embedding
from exatrain.trainer.parallel.mesh import Mesh, build_mesh
from exatrain.trainer.parallel.pipeline import build_schedule


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of one micro-batch, in float32. logits [b, s, V] (plain, or a
    vocab-sharded DTensor under tensor parallelism: then inside ``loss_parallel``), targets [b, s]."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def lr_factor(step: int, config: TrainConfig) -> float:
    """Linear warm-up to the peak, then cosine decay to min_lr_ratio (Loshchilov & Hutter 2017)."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = min(1.0, (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps))
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(pm: ParallelModel, config: TrainConfig, mesh: Mesh) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices and embeddings; ZeroRedundancyOptimizer for ZeRO-1."""
    params = pm.parameters()
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    kw = dict(lr=config.lr, betas=(config.beta1, config.beta2), eps=1e-8)
    if config.plan.zero_stage == 1 and config.plan.dp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW,
                                       process_group=mesh.dp_mesh.get_group(), **kw)
    return torch.optim.AdamW(groups, **kw)


def _scalar(loss: torch.Tensor) -> torch.Tensor:
    loss = loss.to_local() if isinstance(loss, DTensor) else loss  # replicated over tp
    return loss.detach().float().reshape(())


def _grad_sync(module: nn.Module, last: bool) -> ContextManager:
    """Synchronise gradients over dp only on the last micro-batch of a step."""
    if isinstance(module, DistributedDataParallel) and not last:
        return module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):  # an FSDP module
        module.set_requires_gradient_sync(last)
    return contextlib.nullcontext()


class Stepper:
    """Forward + backward of one step's local batch, with or without a pipeline schedule."""

    def __init__(self, pm: ParallelModel, mesh: Mesh) -> None:
        self.pm, self.plan, self.mesh = pm, pm.plan, mesh
        self.schedule = None
        self.step_kwargs: dict = {}
        if self.plan.pp > 1:
            self.schedule = build_schedule(self.plan, pm.stages, mesh.device, mesh.pp_group, lm_loss)
            if "return_outputs" in inspect.signature(self.schedule.step).parameters:
                self.step_kwargs["return_outputs"] = False  # the loss is all we need; keep no logits
        bf16 = self.plan.dtype == "bfloat16"
        self.amp: Callable[[], ContextManager] = (
            (lambda: torch.autocast(mesh.device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext)
        if self.plan.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            self.loss_ctx: Callable[[], ContextManager] = loss_parallel
        else:
            self.loss_ctx = contextlib.nullcontext

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Accumulate the gradient of the batch-mean loss; return this rank's mean loss over its
        micro-batches (0 on ranks without the last stage, whose losses are not known there)."""
        zero = torch.zeros((), device=self.mesh.device)
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            args = (inputs,) if self.pm.holds_first else ()
            kwargs = dict(target=targets, losses=losses) if self.pm.holds_last else {}
            with self.amp(), self.loss_ctx():
                self.schedule.step(*args, **kwargs, **self.step_kwargs)
            return torch.stack([_scalar(x) for x in losses]).mean() if self.pm.holds_last else zero
        module = self.pm.modules[0]
        n = self.plan.num_microbatches
        total = zero
        for i, (x, y) in enumerate(zip(inputs.split(self.plan.micro_batch), targets.split(self.plan.micro_batch))):
            with _grad_sync(module, i == n - 1), self.amp(), self.loss_ctx():
                loss = lm_loss(module(x), y)
                (loss / n).backward()
            total = total + _scalar(loss)
        return total / n


def train(config: TrainConfig, local_rank: int = 0) -> list[StepMetrics]:
    """One rank's run. Needs the default process group initialised with plan.gpus ranks.
    Returns every step's metrics (the same list on every rank)."""
    plan = execution_plan(config.plan)
    device = torch.device("cuda", local_rank) if config.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
    source = StdlibBytes(seed=config.seed, shuffle=config.data_shuffle)
    check_vocab(source, plan.model.vocab, plan.model.name)
    mesh = build_mesh(plan, device)
    # Dropout masks (the only randomness after init): one stream per (pp, dp) position, shared by the
    # tp group, whose ranks must drop the same entries of the activations they all hold (under
    # sequence parallelism their different slices then share one mask pattern).
    torch.manual_seed(config.seed * 1_000_003 + mesh.pp_rank * 1009 + mesh.dp_rank)
    pm = parallelize(plan, mesh, config.seed)
    stepper = Stepper(pm, mesh)
    optimizer = build_optimizer(pm, config, mesh)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, config))
    order = SampleOrder(plan.global_batch, plan.dp)
    flops = model_flops_per_step(plan)
    peak = peak_flops(device, plan.dtype)
    rank0 = mesh.rank == 0
    title = (f"{plan.model.name}: tp{plan.tp} pp{plan.pp} dp{plan.dp} zero{plan.zero_stage} "
             f"{plan.schedule if plan.pp > 1 else ''} {plan.dtype} on {plan.gpus} x {device_name(device)}")
    progress = Progress(config.steps, quiet=config.quiet or not rank0, title=" ".join(title.split()))
    history: list[StepMetrics] = []
    start = time.perf_counter()
    for step in range(config.steps):
        t0 = time.perf_counter()
        inputs, targets = local_batch(source, order, step, mesh.dp_rank, plan.model.seq_len)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.zero_grad(set_to_none=True)
        local_loss = stepper(inputs.to(device), targets.to(device))
        settle_grads(pm.entries)
        if pm.reduce_after_schedule:
            average_over_dp(pm.entries, mesh.dp_mesh.get_group(), plan.dp)
        sync_tied_embedding(pm.tied_copies, mesh.embed_group)
        grad_norm = clip_grad_norm(pm.entries, config.grad_clip, device)
        optimizer.step()
        scheduler.step()
        loss_sum = local_loss.double().reshape(1)
        dist.all_reduce(loss_sum)  # only the tp*dp ranks of the last stage contribute
        loss = float(loss_sum) / (plan.tp * plan.dp)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        mems = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(plan.gpus)]
        dist.all_gather(mems, torch.tensor([float(peak_memory_bytes(device))], dtype=torch.float64, device=device))
        m = StepMetrics(step=step + 1, loss=loss, grad_norm=grad_norm, lr=lr, step_time_s=dt,
                        tokens_per_s=plan.tokens_per_step / dt,
                        model_tflops_per_gpu=flops / dt / plan.gpus / 1e12,
                        mfu=None if peak is None else flops / (dt * plan.gpus * peak),
                        peak_memory_bytes=tuple(int(x.item()) for x in mems))
        history.append(m)
        if rank0 and config.metrics_file:
            append_json_line(config.metrics_file, m.to_dict())
        progress.update(m)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {step + 1}; lower --lr or use float32")
    wall = time.perf_counter() - start
    measured = summarize(history, plan, config.measure_after)
    if rank0 and config.metrics_file:
        append_run_record(config.metrics_file, RunRecord(
            plan=config.plan, measured=measured, status="ok", device=device_name(device), env=_env(device, wall)))
    progress.close(f"first loss {history[0].loss:.4f}, last loss {history[-1].loss:.4f}, "
                   f"{config.steps} steps in {wall:.1f} s ({measured.step_time_s:.3f} s/step median)")
    return history


def _env(device: torch.device, wall_s: float) -> dict:
    return {
        "torch": torch.__version__,
        "backend": dist.get_backend(),
        "world_size": dist.get_world_size(),
        "host": platform.node(),
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 3),
        "hip": getattr(torch.version, "hip", None),
        "cuda": torch.version.cuda if device.type == "cuda" else None,
    }


__all__ = ["Stepper", "build_optimizer", "lm_loss", "lr_factor", "train"]
