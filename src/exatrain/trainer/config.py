"""What one training run needs beside its Plan: steps, optimiser, device, outputs.

The CLI maps its flags onto this in one place (cli/train_cmds.py); every rank receives the same
frozen value.
"""

from __future__ import annotations

from dataclasses import dataclass

from exatrain import rules
from exatrain.errors import PlanError, UserError
from exatrain.limits import check_finite
from exatrain.plan import Plan
from exatrain.settings import SETTINGS, listed

DEVICES = ("cpu", "cuda")
NAN_POLICIES = ("stop", "skip")


@dataclass(frozen=True)
class TrainConfig:
    plan: Plan
    steps: int = 100
    seed: int = 0
    lr: float = 1e-3  # peak learning rate (AdamW)
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * min_lr_ratio
    warmup_steps: int = 10  # linear warm-up from lr / warmup_steps
    weight_decay: float = 0.1  # on matrices and embeddings; none on norms and biases
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global L2 norm; 0 disables clipping
    device: str = "cpu"  # cpu (gloo) or cuda (NCCL; ROCm's RCCL through the same backend)
    metrics_file: str | None = None  # JSON lines: one per step, then one RunRecord
    quiet: bool = False
    measure_after: int = 2  # steps excluded from the medians of the RunRecord (warm-up)
    data_shuffle: bool = True
    data_dir: str | None = None  # a prepared dataset; None: the built-in corpus (data/corpus.py, cached)
    checkpoint_dir: str | None = None  # where checkpoints are saved (None: no saving)
    save_every: int = 0  # save after every N steps; 0: only after the last step
    keep_last: int = 0  # keep the newest K checkpoints; 0: keep all
    async_save: bool = False  # write checkpoints from a background thread
    resume_from: str | None = None  # a verified checkpoint directory to continue from
    nan_policy: str = "stop"  # a non-finite loss or gradient norm: stop, or skip the update and count it
    tensorboard_dir: str | None = None  # TensorBoard event files (rank 0)
    record_samples: bool = False  # each step line lists the global sample indices each dp rank read
    dump_dir: str | None = None  # whole per-parameter weights and first-step gradients, for tests (debug.py)
    compile: bool = False  # torch.compile each transformer block and the loss (tp == 1 only)
    # Rank health (trainer/health.py): compare the ranks' compute and wait times every N steps (0: never);
    # the watchdog's limit for a step phase that does not complete (0: max(300 s, 20 x the median step));
    # where each rank keeps its heartbeat, failure record and stderr log (None: spawn.run_dir_of decides).
    straggler_every: int = 10
    watchdog_s: float = 0.0
    run_dir: str | None = None
    # MoE models: weight of each MoE layer's load-balancing loss (Switch Transformer, Fedus et al. 2022
    # Eq. 4; 0.01 is their alpha, Sec. 2.2), and the step of the routers' balancing-bias update
    # (DeepSeek-V3, arXiv 2412.19437, Sec. 2.1.2; gamma = 0.001 there, Sec. 4.2).
    moe_aux_loss_coef: float = 0.01
    moe_bias_update_rate: float = 1e-3

    def check(self) -> "TrainConfig":
        if self.steps <= 0:
            raise UserError(f"--steps must be positive, got {self.steps}")
        for flag, value in (
            ("--lr", self.lr),
            ("--min-lr-ratio", self.min_lr_ratio),
            ("--weight-decay", self.weight_decay),
            ("--grad-clip", self.grad_clip),
            ("--watchdog", self.watchdog_s),
        ):
            check_finite(flag, value)  # a NaN passes `x < 0`: --grad-clip nan would turn clipping off
        if not self.lr > 0:
            raise UserError(f"--lr must be positive, got {self.lr}")
        if self.warmup_steps < 0:
            raise UserError(f"--warmup must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise UserError(f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip < 0:
            raise UserError(f"--grad-clip must be >= 0, got {self.grad_clip}")
        if self.weight_decay < 0:
            raise UserError(f"--weight-decay must be >= 0, got {self.weight_decay}")
        if self.device not in DEVICES:
            raise UserError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.save_every < 0 or self.keep_last < 0:
            raise UserError("--save-every and --keep-last must be >= 0")
        if self.nan_policy not in NAN_POLICIES:
            raise UserError(f"--nan-policy must be one of {', '.join(NAN_POLICIES)}, got {self.nan_policy!r}")
        if self.straggler_every < 0:
            raise UserError(f"straggler_every must be >= 0 steps, got {self.straggler_every}")
        if not self.watchdog_s >= 0:
            raise UserError(f"watchdog_s must be >= 0 seconds, got {self.watchdog_s}")
        if self.checkpoint_dir is None and (self.save_every or self.keep_last or self.async_save):
            raise UserError("--save-every, --keep-last and --async-save need --checkpoint-dir")
        check_model_built(self.plan.model)
        # The layouts this trainer refuses to run, with cp, ep and MoE among them (exatrain.rules: the
        # list the search's --runtime exatrain uses).
        rules.check(self.plan, scopes=("run", "trainer"), compile=self.compile)
        # The run settings it does not run (settings.SETTINGS: each one's trainer refusal), in that order
        for setting in SETTINGS:
            refusal = setting.trainer(getattr(self.plan.settings, setting.name), self.compile)
            if refusal:
                raise UserError(refusal)
        if self.plan.fp8:  # what --fp8 runs here (trainer/fp8.py): current scaling, dense models
            from exatrain.trainer.fp8 import check_fp8

            check_fp8(self.plan, self.device, compile=self.compile)
        if not self.moe_aux_loss_coef >= 0 or not self.moe_bias_update_rate >= 0:
            raise UserError("--moe-aux-loss-coef and --moe-bias-update-rate must be >= 0")
        return self


def check_model_built(m) -> None:
    """A one-line PlanError for a model the trainer does not build yet (``ModelSpec.unbuilt_by_trainer``); `train`
    checks it before it lays the plan out for the trainer, so a plan made for another engine hears this first,
    not where that engine's layout differs from the trainer's."""
    if m.unbuilt_by_trainer:
        raise PlanError(
            f"{m.name}: the trainer does not build kv_channels, qk_norm, latent or sliding-window "
            f"attention yet (this model has {listed(m.unbuilt_by_trainer)}; the planner counts "
            "them): train a model without them, or plan it for another runtime"
        )


__all__ = ["DEVICES", "NAN_POLICIES", "TrainConfig", "check_model_built"]
