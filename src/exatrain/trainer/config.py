"""What one training run needs beside its Plan: steps, optimiser, device, outputs.

The CLI maps its flags onto this in one place (cli/train_cmds.py); every rank receives the same
frozen value.
"""

from __future__ import annotations

from dataclasses import dataclass

from exatrain.errors import PlanError, UserError
from exatrain.plan import Plan

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
    data_dir: str | None = None  # a prepared dataset; None: the default corpus (stdlib, cached)
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

    def check(self) -> "TrainConfig":
        if self.steps <= 0:
            raise UserError(f"--steps must be positive, got {self.steps}")
        if not self.lr > 0:
            raise UserError(f"--lr must be positive, got {self.lr}")
        if self.warmup_steps < 0:
            raise UserError(f"--warmup must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise UserError(f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip < 0:
            raise UserError(f"--grad-clip must be >= 0, got {self.grad_clip}")
        if self.device not in DEVICES:
            raise UserError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.save_every < 0 or self.keep_last < 0:
            raise UserError("--save-every and --keep-last must be >= 0")
        if self.nan_policy not in NAN_POLICIES:
            raise UserError(f"--nan-policy must be one of {', '.join(NAN_POLICIES)}, got {self.nan_policy!r}")
        if self.checkpoint_dir is None and (self.save_every or self.keep_last or self.async_save):
            raise UserError("--save-every, --keep-last and --async-save need --checkpoint-dir")
        p = self.plan
        if self.compile and p.tp > 1:
            raise PlanError("--compile runs without tensor parallelism only (DTensor blocks are not compiled "
                            "yet): use --tp 1, or drop --compile")
        if p.pp > 1 and p.schedule == "zero_bubble" and p.dp > 1 and p.zero_stage >= 2:
            # Its weight-gradient pass bypasses the hooks FSDP reduces from: wrong gradients (torch 2.13).
            raise PlanError("the zero_bubble schedule cannot run with FSDP (--zero 2/3) and dp > 1: "
                            "use --zero 0 or 1, or the interleaved schedule")
        return self


__all__ = ["DEVICES", "NAN_POLICIES", "TrainConfig"]
