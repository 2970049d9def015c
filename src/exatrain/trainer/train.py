"""The step loop and per-rank setup.

``train(config, local_rank)`` is one rank's whole run on an initialised default process group:
data, mesh, model (parallel/build.py), optimizer, the checkpoint to resume from, then per step:
forward and backward over the micro-batches (a pipeline schedule when pp > 1), the tied-embedding
gradient sync, the global gradient norm and clipping, the loss; then the optimizer step, unless the
loss or the norm is not finite (``--nan-policy``: stop with the step number, or skip the update and
count it); metrics, and a checkpoint every ``save_every`` steps and after the last. The learning
rate is a function of the step number alone, so a resumed run continues the same schedule.
``spawn.py`` starts the ranks; ``health.py`` watches them: the loop tells its RankMonitor which phase
it is in and feeds the straggler windows (``_health_*`` below). A signal asks for a stop: every rank's
vote rides on the step's last collective, so all ranks stop after the same step, save its checkpoint
(when the run has a checkpoint directory) and end as interrupted (``_stop``).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
import time
from pathlib import Path
from typing import Callable, ContextManager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from exatrain.data.prepare import default_dataset
from exatrain.errors import TrainingStopped
from exatrain.plan import Measured, RunRecord
from exatrain.records import append_run_record
from exatrain.trainer.checkpoint import files as ckpt_files
from exatrain.trainer.checkpoint.files import CheckpointError
from exatrain.trainer.checkpoint.manager import Checkpointer
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.sampler import SampleOrder, TokenShards, check_vocab, local_batch
from exatrain.trainer.debug import Dump
from exatrain.trainer.failures import summarize_windows
from exatrain.trainer.health import RankMonitor, StepClock, Stopped, StragglerWindows, straggler_lines
from exatrain.trainer.metrics import (
    Progress,
    StepMetrics,
    TensorBoardLog,
    append_json_line,
    device_name,
    plan_model_flops,
    peak_flops,
    peak_memory_bytes,
    run_env,
    summarize,
    supersede_redone_steps,
)
from exatrain.trainer.model import dropout_keys
from exatrain.trainer.parallel.build import ParallelModel, execution_plan, parallelize
from exatrain.trainer.parallel.context import shard_batch
from exatrain.trainer.parallel.expert import finish_moe_step
from exatrain.trainer.parallel.grads import (
    average_over_dp,
    clip_grad_norm,
    local_grad,
    settle_grads,
    sync_tied_embedding,
)
from exatrain.trainer.parallel.mesh import Mesh, build_mesh, coordinates, cuda_index
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
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    kw: dict = dict(lr=config.lr, betas=(config.beta1, config.beta2), eps=1e-8)
    if config.plan.zero_stage == 1 and config.plan.dp * config.plan.cp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(
            groups, optimizer_class=torch.optim.AdamW, process_group=mesh.grad_mesh.get_group(), **kw
        )
    if fused_adamw_ok(params, mesh.device):
        kw["fused"] = True
    return torch.optim.AdamW(groups, **kw)


def fused_adamw_ok(params: list[torch.Tensor], device: torch.device) -> bool:
    """AdamW's fused kernel (one launch for all tensors instead of a chain of foreach kernels) on a
    GPU, for plain tensors; DTensor parameters (tensor parallelism, FSDP) keep the foreach path. Not
    on the CPU, where the foreach path is what the parity tests pin."""
    return device.type == "cuda" and not any(isinstance(p, DTensor) for p in params)


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


HALF = {"bfloat16": torch.bfloat16, "float16": torch.float16}  # autocast's dtype for each mixed precision


class LossScaler:
    """float16 training's dynamic loss scaling with torch's gradient scaler (a ShardedGradScaler over the world
    group: its unscale all-reduces found_inf, so every rank skips an overflowed step together). The scaler unscales
    each parameter's local gradient in place, a DTensor's local shard included (its foreach unscale takes plain
    tensors), through a view of the optimizer whose parameters are those gradients' holders."""

    def __init__(self, optimizer: torch.optim.Optimizer, entries, device: torch.device) -> None:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        self.optimizer, self.entries = optimizer, entries
        self.scaler = ShardedGradScaler(device=device.type, process_group=dist.group.WORLD)
        self.view = None

    @property
    def scale(self) -> float:
        return float(self.scaler.get_scale())

    def unscale(self) -> None:
        """Divide every local gradient by the scale; record (and all-reduce) whether any is not finite."""
        holders = []
        for e in self.entries:
            g = local_grad(e.param)
            if g is not None:
                holder = g.detach()
                holder.grad = g  # the same storage: unscaled in place
                holders.append(holder)
        self.scaler.scale(torch.ones((), device=self.scaler._device))  # ranks without the loss start the scale too
        self.view = _OptimizerView(self.optimizer, holders)
        self.scaler.unscale_(self.view)

    @property
    def found_inf(self) -> bool:
        found = self.scaler._per_optimizer_states[id(self.view)]["found_inf_per_device"]
        return any(float(v) > 0 for v in found.values())

    def step(self) -> None:
        self.scaler.step(self.view)  # the optimizer's step (the found_inf above was 0)

    def update(self) -> None:
        self.scaler.update()


class _OptimizerView:
    """What the gradient scaler reads of an optimizer (its parameters, here gradient holders) and its step."""

    def __init__(self, optimizer: torch.optim.Optimizer, holders: list[torch.Tensor]) -> None:
        self.optimizer, self.param_groups = optimizer, [{"params": holders}]

    def step(self, *args, **kwargs):
        return self.optimizer.step()


class Stepper:
    """Forward + backward of one step's local batch, with or without a pipeline schedule."""

    def __init__(self, pm: ParallelModel, mesh: Mesh, compile: bool = False) -> None:
        self.pm, self.plan, self.mesh = pm, pm.plan, mesh
        self.schedule = None
        self.mark: Callable[[str], None] = lambda phase: None  # tells the rank's monitor the phase (health.py)
        self.step_kwargs: dict = {}
        # Compiled, inductor can fuse the float32 upcast of the logits into the loss's kernels instead
        # of materialising a float32 copy of all b x s x V logits (not yet measured on a GPU).
        self.loss_fn: Callable = torch.compile(lm_loss) if compile else lm_loss
        # float16: the loss the backward starts from is multiplied by the gradient scaler's scale (LossScaler)
        self.scale = 1.0
        if self.plan.pp > 1:
            self.schedule = build_schedule(
                self.plan,
                pm.stages,
                mesh.device,
                mesh.pp_group,
                lambda out, target: self.loss_fn(out, target) * self.scale,
            )
            if "return_outputs" in inspect.signature(self.schedule.step).parameters:
                self.step_kwargs["return_outputs"] = False  # the loss is all we need; keep no logits
        half = HALF.get(self.plan.dtype)
        self.amp: Callable[[], ContextManager] = (
            (lambda: torch.autocast(mesh.device.type, dtype=half)) if half is not None else contextlib.nullcontext
        )
        if self.plan.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            self.loss_ctx: Callable[[], ContextManager] = loss_parallel
        else:
            self.loss_ctx = contextlib.nullcontext

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """Accumulate the gradient of the batch-mean loss; return this rank's mean loss over its
        micro-batches (0 on ranks without the last stage, whose losses are not known there).
        ``keys``: the dropout key of each sequence (model.py), split into micro-batches like the inputs."""
        zero = torch.zeros((), device=self.mesh.device)
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            args = (inputs,) if self.pm.holds_first else ()
            kwargs = dict(target=targets, losses=losses) if self.pm.holds_last else {}
            self.mark("forward/backward")
            if keys is not None:  # every stage's forward gets its micro-batch's keys
                kwargs["dropout_keys"] = keys
            with self.amp(), self.loss_ctx():
                self.schedule.step(*args, **kwargs, **self.step_kwargs)
            return torch.stack([_scalar(x) for x in losses]).mean() / self.scale if self.pm.holds_last else zero
        module = self.pm.modules[0]
        n = self.plan.num_microbatches
        total = zero
        mb = self.plan.micro_batch
        for i, (x, y) in enumerate(zip(inputs.split(mb), targets.split(mb))):
            kw = {} if keys is None else {"dropout_keys": keys[i * mb : (i + 1) * mb]}
            with _grad_sync(module, i == n - 1), self.amp(), self.loss_ctx():
                self.mark("forward")
                loss = self.loss_fn(module(x, **kw), y)
                self.mark("backward")
                (loss * self.scale / n).backward()
            total = total + _scalar(loss)
        return total / n


class Trainer:
    """One rank's run: its mesh, model, optimizer and data (built in __init__), and the step."""

    def __init__(self, config: TrainConfig, local_rank: int = 0, health: RankMonitor | None = None) -> None:
        self.config = config
        # Under spawn.py's launchers the monitor watches this rank and its launcher reports a failure;
        # a Trainer built on its own records its failure itself (and runs no watchdog thread).
        self.records_failures = health is None
        self.health = health or RankMonitor(dist.get_rank(), dist.get_world_size(), None, supervised=True, watch=False)
        self.plan = plan = execution_plan(config.plan)
        self.device = device = (
            torch.device("cuda", cuda_index(local_rank)) if config.device == "cuda" else torch.device("cpu")
        )
        if device.type == "cuda":
            torch.cuda.set_device(device)
            torch.cuda.reset_peak_memory_stats(device)
        self.data_dir = Path(config.data_dir) if config.data_dir else default_dataset()
        manifest = ckpt_files.verify(config.resume_from, hashes=False) if config.resume_from else None
        data_seed, shuffle = config.seed, config.data_shuffle
        if manifest is not None:  # the sampler continues the checkpoint's order
            data_seed, shuffle = int(manifest.trainer["seed"]), bool(manifest.trainer["data_shuffle"])
        self.source = TokenShards(self.data_dir, seed=data_seed, shuffle=shuffle)
        check_vocab(self.source.vocab_size, plan.model.vocab, plan.model.name)
        self.mesh = build_mesh(plan, device)
        # The global generator: dropout does not draw from it (its masks are keyed by sample, model.py);
        # seeded per (pp, dp) position for anything else that may.
        torch.manual_seed(config.seed * 1_000_003 + self.mesh.pp_rank * 1009 + self.mesh.dp_rank)
        self.pm = parallelize(
            plan, self.mesh, config.seed, compile=config.compile, moe_aux_loss_coef=config.moe_aux_loss_coef
        )
        self.stepper = Stepper(self.pm, self.mesh, compile=config.compile)
        self.optimizer = build_optimizer(self.pm, config, self.mesh)
        self.scaler = LossScaler(self.optimizer, self.pm.entries, device) if plan.dtype == "float16" else None
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, config))
        self.flops = plan_model_flops(plan)
        self.peak = peak_flops(device, plan.dtype)
        self.rank0 = self.mesh.rank == 0
        self.nan_skipped = 0
        self.checkpointer = None
        if config.checkpoint_dir or manifest is not None:
            self.checkpointer = Checkpointer(
                config.checkpoint_dir,
                rank=self.mesh.rank,
                device=device,
                keep_last=config.keep_last,
                async_save=config.async_save,
                tokenizer=self.data_dir / "tokenizer.json",
            )
        self.start_step, start_sample = 0, 0
        if manifest is not None:
            self.start_step, start_sample = self._resume(manifest)
        self.order = SampleOrder(plan.global_batch, plan.dp, self.start_step, start_sample)
        # Tests' per-parameter dump (debug.py): the weights as the run starts, gradients of its first step,
        # weights after its last.
        self.dump = Dump(config.dump_dir, self.pm, self.mesh) if config.dump_dir else None
        if self.dump is not None:
            self.dump.weights(self.start_step)
        self._health_attach()

    def _health_attach(self) -> None:
        """Phases and step clocks to the rank's monitor, the straggler windows; a resumed run marks the
        metrics lines of the steps it redoes as superseded (metrics.py) before writing any."""
        self.health.resumed(self.start_step)
        self.health.attach_clock(StepClock(self.device))
        self.stepper.mark = self.health.enter
        self.stragglers = StragglerWindows(self.config.straggler_every, self.plan, self.device)
        self.step_split: tuple[float, float] | None = None
        self.stop_votes: dict[int, int] = {}  # rank -> the signal it was asked to stop with, as of the last step
        if self.rank0 and self.start_step and self.config.metrics_file:
            supersede_redone_steps(self.config.metrics_file, self.start_step)

    def _health_window(self, m: StepMetrics, progress: Progress) -> None:
        """Feed the step's compute/wait split to the straggler windows; at a window's end (a collective
        on every rank) rank 0 writes its line and names the stragglers on stderr and the progress display."""
        if self.step_split is None:
            return
        self.health.enter("metrics")
        window = self.stragglers.add(m.step, *self.step_split)
        if window is None or not self.rank0:
            return
        if self.config.metrics_file:
            append_json_line(self.config.metrics_file, window)
        for line in straggler_lines(window):
            sys.stderr.write(f"exatrain: {line}\n")
            sys.stderr.flush()
            progress.note(line)

    def _layout(self) -> dict[str, int]:
        return ckpt_files.layout_of(self.plan)

    def _resume(self, manifest: ckpt_files.Manifest) -> tuple[int, int]:
        """Load parameters, optimizer states (and, on the same layout, RNG states) in place; set the
        schedule to the checkpoint's step. Returns (step, samples consumed)."""
        t = manifest.trainer
        if t["tokenizer_sha256"] != self.source.tokenizer_sha256:
            raise CheckpointError(f"{manifest.path} was trained on data of another tokenizer than {self.data_dir}")
        same_layout = t["layout"] == self._layout()
        assert self.checkpointer is not None
        self.checkpointer.load(manifest, self.pm, self.optimizer, restore_rng_state=same_layout)
        step = int(t["step"])
        self.nan_skipped = int(t["nan_skipped"])
        self.scheduler.last_epoch = step
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
            group["lr"] = base * lr_factor(step, self.config)
        if not same_layout:  # another layout's streams cannot be mapped onto these ranks
            torch.manual_seed(self.config.seed * 1_000_003 + self.mesh.pp_rank * 1009 + self.mesh.dp_rank + step * 7919)
        return step, int(t["samples_consumed"])

    def _trainer_state(self, step: int) -> dict:
        """The JSON half of a checkpoint: everything but tensors (see checkpoint/files.py)."""
        meta = self.source.meta
        return {
            "step": step,
            "samples_consumed": self.order.consumed(step),
            "global_batch": self.plan.global_batch,
            "seq_len": self.plan.model.seq_len,
            "seed": self.source.seed,
            "data_shuffle": self.source.shuffle,
            "data_dir": str(self.data_dir),
            "tokenizer_sha256": self.source.tokenizer_sha256,
            "separator": meta.separator,
            "separator_id": meta.separator_id,
            "nan_skipped": self.nan_skipped,
            "layout": self._layout(),
            "plan": self.config.plan.to_dict(),
            "steps": self.config.steps,
            "torch": torch.__version__,
        }

    def step(self, step: int) -> StepMetrics:
        """One optimizer step: batch, forward/backward, gradient sync and clipping, update, metrics."""
        plan, mesh, pm, device = self.plan, self.mesh, self.pm, self.device
        t0 = time.perf_counter()
        self.health.step_begin()
        inputs, targets = local_batch(self.source, self.order, step, mesh.dp_rank, plan.model.seq_len)
        # under cp: this rank's positions of every sequence (parallel/context.py)
        inputs, targets = shard_batch(inputs, pm.context), shard_batch(targets, pm.context)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.zero_grad(set_to_none=True)
        kw = {}
        if plan.model.dropout > 0:  # masks keyed by (seed, global sample): the same on any layout
            kw["keys"] = dropout_keys(self.source.seed, self.order.indices(step, mesh.dp_rank)).to(device)
        if self.scaler is not None:
            self.stepper.scale = self.scaler.scale
        local_loss = self.stepper(inputs.to(device), targets.to(device), **kw)
        self.health.enter("grad-sync")
        settle_grads(pm.entries)
        if pm.reduce_after_schedule:
            average_over_dp(pm.entries, mesh.grad_mesh.get_group(), plan.dp * plan.cp)
        sync_tied_embedding(pm.tied_copies, mesh.embed_group)
        if self.dump is not None:
            self.dump.grads(step + 1)
        if self.scaler is not None:  # the gradients unscaled, an overflow on any rank known to every rank
            self.scaler.unscale()
        grad_norm = clip_grad_norm(pm.entries, self.config.grad_clip, device)
        self.health.enter("metrics")
        loss_sum = local_loss.double().reshape(1)
        dist.all_reduce(loss_sum)  # only the tp*cp*dp ranks of the last stage contribute
        loss = float(loss_sum) / (plan.tp * plan.cp * plan.dp)  # cp: equal token shares, so means average
        skipped = not (math.isfinite(loss) and math.isfinite(grad_norm))
        # float16: gradients that overflowed at the loss scale skip the step and lower the scale (not a NaN)
        overflow = skipped and self.scaler is not None and math.isfinite(loss) and self.scaler.found_inf
        if skipped and not overflow and self.config.nan_policy == "stop":
            raise TrainingStopped(
                f"loss {loss} (gradient norm {grad_norm}) at step {step + 1}: stopped by "
                "--nan-policy stop before the update; lower --lr, use float32, or --nan-policy skip"
            )
        self.health.enter("optimizer")
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
            self.nan_skipped += not overflow
        elif self.scaler is not None:
            self.scaler.step()
        else:
            self.optimizer.step()
        if self.scaler is not None:
            self.scaler.update()
        aux_loss = finish_moe_step(pm.inner, mesh, plan, bias_rate=self.config.moe_bias_update_rate, update=not skipped)
        self.scheduler.step()
        self.health.enter("metrics")
        samples = self._gather_samples(step) if self.config.record_samples else None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        self.step_split = self.health.step_end(dt)
        # The step's last collective: every rank's peak memory, and its stop vote (health.py), so that all
        # ranks see the same votes after the same step.
        mems = [torch.zeros(2, dtype=torch.float64, device=device) for _ in range(plan.gpus)]
        mine = [float(peak_memory_bytes(device)), float(self.health.stop_vote())]
        dist.all_gather(mems, torch.tensor(mine, dtype=torch.float64, device=device))
        rows = [x.tolist() for x in mems]
        self.stop_votes = {r: int(v) for r, (_, v) in enumerate(rows) if v}
        return StepMetrics(
            step=step + 1,
            loss=loss,
            grad_norm=grad_norm,
            lr=lr,
            step_time_s=dt,
            tokens_per_s=plan.tokens_per_step / dt,
            model_tflops_per_gpu=self.flops / dt / plan.gpus / 1e12,
            mfu=None if self.peak is None else self.flops / (dt * plan.gpus * self.peak),
            peak_memory_bytes=tuple(int(m) for m, _ in rows),
            skipped=skipped,
            samples=samples,
            aux_loss=aux_loss,
        )

    def _gather_samples(self, step: int) -> tuple[tuple[int, ...], ...]:
        """The global sample indices every rank read this step, by dp rank; every rank of a dp
        position (its tp and pp peers) must have read the same ones."""
        mine = torch.tensor(list(self.order.indices(step, self.mesh.dp_rank)), dtype=torch.int64, device=self.device)
        every = [torch.empty_like(mine) for _ in range(self.plan.gpus)]
        dist.all_gather(every, mine)
        by_dp: dict[int, tuple[int, ...]] = {}
        for rank, got in enumerate(every):
            _, dp_rank, _ = coordinates(rank, self.plan)
            seen = tuple(got.tolist())
            if by_dp.setdefault(dp_rank, seen) != seen:
                raise RuntimeError(f"rank {rank} read other samples than its dp peers at step {step + 1}")
        return tuple(by_dp[d] for d in range(self.plan.dp))

    def run(self) -> list[StepMetrics]:
        """Every step, the metrics lines, checkpoints, and the closing RunRecord (written by rank 0)."""
        config, plan = self.config, self.plan
        title = (
            f"{plan.model.name}: tp{plan.tp} {f'cp{plan.cp} ' if plan.cp > 1 else ''}pp{plan.pp} dp{plan.dp} "
            f"zero{plan.zero_stage} "
            f"{plan.schedule if plan.pp > 1 else ''} {plan.dtype} on {plan.gpus} x {device_name(self.device)}"
            + (f", offload {plan.offload}" if plan.offload != "none" else "")
            + (f", resumed at step {self.start_step}" if self.start_step else "")
        )
        progress = Progress(
            config.steps, quiet=config.quiet or not self.rank0, title=" ".join(title.split()), start=self.start_step
        )
        board = TensorBoardLog(config.tensorboard_dir) if self.rank0 and config.tensorboard_dir else None
        history: list[StepMetrics] = []
        start = time.perf_counter()
        try:
            self.health.stoppable = True  # a signal from here on asks for a stop at a step boundary
            for step in range(self.start_step, config.steps):
                m = self.step(step)
                history.append(m)
                if self.rank0 and config.metrics_file:
                    append_json_line(config.metrics_file, m.to_dict())
                if board is not None:
                    board.log(m)
                progress.update(m)
                self._health_window(m, progress)
                done = step + 1
                saved = bool(config.checkpoint_dir) and (
                    done == config.steps or bool(config.save_every and done % config.save_every == 0)
                )
                if saved:
                    assert self.checkpointer is not None
                    self.health.enter("checkpoint")
                    self.checkpointer.save(done, self.pm, self.optimizer, self._trainer_state(done))
                if self.stop_votes and done < config.steps:  # the last step ends the run as it is
                    self._stop(done, saved, progress)
            self.health.stoppable = False
            if self.checkpointer is not None:
                self.health.enter("checkpoint")
                self.checkpointer.close()  # the last asynchronous save is published before the run ends
            if self.dump is not None and history:
                self.dump.weights(config.steps)
            self.health.enter("done")
        except BaseException as exc:  # noqa: B036 - DCP's CheckpointException is a BaseException
            self.health.stoppable = False
            if self.records_failures:  # otherwise the launcher records the run's failure (failures.py)
                oom = "out of memory" in str(exc).lower()
                status = "interrupted" if isinstance(exc, Stopped) else "oom" if oom else "failed"
                self._record(history, time.perf_counter() - start, status, f"{type(exc).__name__}: {exc}"[:2000])
            raise
        finally:
            if board is not None:
                board.close()
        wall = time.perf_counter() - start
        measured = self._record(history, wall, "ok", "")
        if history:
            skipped = f", {self.nan_skipped} skipped (non-finite)" if self.nan_skipped else ""
            progress.close(
                f"first loss {history[0].loss:.4f}, last loss {history[-1].loss:.4f}, "
                f"{len(history)} steps in {wall:.1f} s ({measured.step_time_s:.3f} s/step median){skipped}"
            )
        else:
            progress.close(f"nothing to do: the checkpoint is at step {self.start_step} of {config.steps}")
        return history

    def _stop(self, done: int, saved: bool, progress: Progress) -> None:
        """Every rank saw a stop vote after step ``done``: save that step's checkpoint (unless just saved),
        publish it, and end the run (Stopped, which the rank's guard records as interrupted)."""
        cause = self.health.stop_agreed(done, self.stop_votes)
        if self.checkpointer is not None and self.config.checkpoint_dir:
            self.health.enter("checkpoint")
            if not saved:
                self.checkpointer.save(done, self.pm, self.optimizer, self._trainer_state(done))
            self.checkpointer.close()  # an asynchronous save is published before the rank ends
        self.health.enter("stopped")
        progress.close(f"stopped after step {done}: {cause}")
        raise Stopped(done, self.stop_votes, cause, self.health.stop_signal)

    def _record(self, history: list[StepMetrics], wall_s: float, status: str, error: str) -> Measured | None:
        """Append the RunRecord (rank 0, when there is a metrics file); a failed run keeps what it measured."""
        measured = summarize(history, self.plan, self.config.measure_after) if history else None
        if self.rank0 and self.config.metrics_file:
            append_run_record(
                self.config.metrics_file,
                RunRecord(
                    plan=self.config.plan,
                    measured=measured,
                    status=status,
                    device=device_name(self.device),
                    env=run_env(dist.get_backend(), dist.get_world_size(), wall_s, self.device.type),
                    error=error,
                    rank_times=summarize_windows(self.stragglers.windows),
                ),
            )
        return measured


def train(config: TrainConfig, local_rank: int = 0, health: RankMonitor | None = None) -> list[StepMetrics]:
    """One rank's run. Needs the default process group initialised with plan.gpus ranks; ``health`` is
    the rank's monitor when a launcher of spawn.py started it. Returns every step's metrics (the same
    list on every rank)."""
    return Trainer(config, local_rank, health).run()


__all__ = ["Stepper", "Trainer", "build_optimizer", "lm_loss", "lr_factor", "train"]
