"""What a run measures: one JSON line per step, a RunRecord at the end, a progress display.

A metrics file holds, in order: ``step`` lines, ``ranks`` lines (a straggler window every N steps:
trainer/health.py), and the ``run_record`` that closes the run. A run resumed from a checkpoint redoes
the steps after it; before it writes anything, ``supersede_redone_steps`` rewrites the lines those
steps (and windows) got from the interrupted run as ``{"kind": "superseded", "resumed_from_step": K,
"line": {...}}``, so every reader that reads step lines (by kind, or any object with a step and a loss)
sees each step once, and the interrupted run's numbers stay in the file.

Model FLOPs per step are the plan's estimate (``plan.estimate.model_flops_per_step``, attached by the
CLI from the planner) when it carries one; otherwise the same count made here from the model shape.
MFU needs the device's catalog peak, so it is null on the CPU and on accelerators the catalog lacks.
Torch is imported inside the functions that need it: a launcher writes a failed run's RunRecord with
this module, and importing torch there would delay its one line by seconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
from datetime import datetime, timezone
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from exatrain.catalog.hardware import match_device
from exatrain.plan import Measured, Plan

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class StepMetrics:
    step: int  # 1-based
    loss: float  # mean over the global batch
    grad_norm: float  # global L2 norm before clipping
    lr: float  # learning rate used by this step
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float | None
    mfu: float | None
    peak_memory_bytes: tuple[int, ...]  # per rank, in rank order
    skipped: bool = False  # a non-finite loss or gradient norm: no update (--nan-policy skip)
    samples: tuple[tuple[int, ...], ...] | None = None  # global sample indices read, per dp rank (when recorded)
    # MoE models: the load-balancing loss (trainer/moe.py), mean over MoE layers and micro-batches;
    # 1.0 at a uniform load. Not part of ``loss``, which stays the language-model loss.
    aux_loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.aux_loss is None:
            del d["aux_loss"]
        d["peak_memory_bytes"] = list(self.peak_memory_bytes)
        if self.samples is None:
            del d["samples"]
        else:
            d["samples"] = [list(x) for x in self.samples]
        return {"kind": "step", **d}


def plan_model_flops(plan: Plan) -> float:
    """Model FLOPs of one optimizer step of the whole job (no recomputation counted).

    The planner's figure when the plan carries an estimate; otherwise Korthikanti et al. 2022 Eq. 7,
    72*B*s*L*h^2*(1 + s/(6h) + V/(12hL)), written per matrix so that it also covers grouped-query
    attention, SwiGLU and any ffn width: 3 passes (forward + 2x backward) x 2 FLOPs per
    multiply-add x (layer matrices + the s x s score and value products + the head)."""
    if plan.estimate is not None and plan.estimate.model_flops_per_step > 0:
        return float(plan.estimate.model_flops_per_step)
    m = plan.model
    if m.is_moe:  # counted on the active parameters (the accounting's MoE convention)
        from exatrain.accounting.flops import model_flops_per_step as accounted

        return float(accounted(m, plan.global_batch))
    h, s, f = m.hidden, m.seq_len, m.ffn_hidden
    matrices = 2 * h * h + 2 * h * m.kv_hidden + (3 if m.gated_mlp else 2) * h * f
    per_token = 3 * 2 * (m.layers * (matrices + 2 * s * h) + m.vocab * h)
    return float(per_token * plan.tokens_per_step)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return "cpu"


def peak_flops(device: torch.device, dtype: str) -> float | None:
    """The catalog's dense peak FLOP/s for this accelerator and dtype; None if unknown (CPU)."""
    if device.type != "cuda":
        return None
    spec = match_device(device_name(device))
    return None if spec is None else spec.peak_flops(dtype)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this rank: allocated device memory, or the process's peak RSS on the CPU."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device))
    try:
        import resource
    except ImportError:  # pragma: no cover - not Unix
        return 0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


def summarize(steps: Sequence[StepMetrics], plan: Plan, measure_after: int) -> Measured:
    """Medians over the steps after the first ``measure_after`` (all steps if there are no more)."""
    kept = list(steps[measure_after:]) or list(steps)
    mem = [max(s.peak_memory_bytes[r] for s in steps) for r in range(plan.gpus)]
    per_stage = plan.tp * plan.cp * plan.dp  # ranks of one pipeline stage are consecutive
    tflops = [s.model_tflops_per_gpu for s in kept if s.model_tflops_per_gpu is not None]
    mfus = [s.mfu for s in kept if s.mfu is not None]
    return Measured(
        steps=len(steps),
        step_time_s=statistics.median(s.step_time_s for s in kept),
        tokens_per_s=statistics.median(s.tokens_per_s for s in kept),
        model_tflops_per_gpu=statistics.median(tflops) if tflops else None,
        mfu=statistics.median(mfus) if mfus else None,
        peak_memory_bytes=float(max(mem)),
        peak_memory_by_stage=tuple(float(max(mem[p * per_stage : (p + 1) * per_stage])) for p in range(plan.pp)),
        first_loss=steps[0].loss,
        last_loss=steps[-1].loss,
    )


def append_json_line(path: str | Path, obj: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj) + "\n")


def supersede_redone_steps(path: str | Path, resumed_from: int) -> int:
    """Mark the step and window lines after the file's last successful RunRecord whose steps come after
    ``resumed_from`` (the checkpoint's step) as superseded: the resumed run writes them again. Returns
    how many lines were marked; the file is rewritten aside and renamed (untouched when none is)."""
    path = Path(path)
    if not path.is_file():
        return 0
    raw = path.read_text(encoding="utf-8").splitlines()
    parsed: list[Any] = []
    for line in raw:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            parsed.append(None)
    start = 0
    for i, obj in enumerate(parsed):
        if isinstance(obj, dict) and obj.get("kind") == "run_record" and obj.get("status") == "ok":
            start = i + 1
    marked = 0
    for i in range(start, len(parsed)):
        obj = parsed[i]
        if not isinstance(obj, dict):
            continue
        last = (
            obj.get("step")
            if obj.get("kind") == "step"
            else obj.get("last_step")
            if obj.get("kind") == "ranks"
            else None
        )
        if isinstance(last, int) and last > resumed_from:
            raw[i] = json.dumps({"kind": "superseded", "resumed_from_step": resumed_from, "line": obj})
            marked += 1
    if marked:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(x + "\n" for x in raw), encoding="utf-8")
        os.replace(tmp, path)
    return marked


def torch_versions() -> dict[str, str | None]:
    """torch's version and the HIP and CUDA versions it was built with (a RunRecord's ``env``)."""
    import torch

    return {"torch": torch.__version__, "hip": getattr(torch.version, "hip", None), "cuda": torch.version.cuda}


def run_env(
    backend: str, world_size: int, wall_s: float, device: str, versions: Mapping[str, str | None] | None = None
) -> dict[str, Any]:
    """A RunRecord's ``env``: versions, backend, world size, host, date and the run's wall time.
    ``versions``: ``torch_versions()`` as a rank found them (a launcher then needs no torch)."""
    v = dict(versions) if versions is not None else torch_versions()
    return {
        "torch": v.get("torch"),
        "backend": backend,
        "world_size": world_size,
        "host": platform.node(),
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 3),
        "hip": v.get("hip"),
        "cuda": v.get("cuda") if device == "cuda" else None,
    }


class TensorBoardLog:
    """TensorBoard event files (torch.utils.tensorboard): loss, gradient norm, learning rate,
    tokens/s and step time per step, for rank 0."""

    def __init__(self, log_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, m: StepMetrics) -> None:
        for tag, value in (
            ("train/loss", m.loss),
            ("train/grad_norm", m.grad_norm),
            ("train/lr", m.lr),
            ("perf/tokens_per_s", m.tokens_per_s),
            ("perf/step_time_s", m.step_time_s),
        ):
            self.writer.add_scalar(tag, value, m.step)
        if m.skipped:
            self.writer.add_scalar("train/skipped", 1.0, m.step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class Progress:
    """A rich progress bar on a terminal; a plain line every tenth of the run otherwise; nothing
    when quiet. Only rank 0 makes one."""

    def __init__(self, total: int, quiet: bool, title: str, start: int = 0) -> None:
        """``total`` steps of the run, of which ``start`` were done before (a resumed run)."""
        self.total, self.quiet = total, quiet
        self.every = max(1, total // 10)
        self._bar = None
        if quiet:
            return
        from rich.console import Console

        self.console = Console()
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

            self._bar = Bar(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._task = self._bar.add_task(title, total=total, completed=start, loss="-")
            self._bar.start()
        else:
            self.console.print(title)

    def update(self, m: StepMetrics) -> None:
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(self._task, advance=1, loss=f"{m.loss:.4f}")
        elif m.step == 1 or m.step % self.every == 0 or m.step == self.total:
            self.console.print(
                f"step {m.step:>5}/{self.total}  loss {m.loss:.4f}  grad norm {m.grad_norm:.3f}  "
                f"{m.step_time_s:.3f} s/step  {m.tokens_per_s:,.0f} tokens/s"
            )

    def note(self, line: str) -> None:
        """A line above the bar (or among the plain lines), unless quiet."""
        if self.quiet:
            return
        (self._bar.console if self._bar is not None else self.console).print(line, markup=False, highlight=False)

    def close(self, summary: str) -> None:
        if self._bar is not None:
            self._bar.stop()
        if not self.quiet:
            self.console.print(summary)


__all__ = [
    "Progress",
    "StepMetrics",
    "TensorBoardLog",
    "append_json_line",
    "device_name",
    "peak_flops",
    "peak_memory_bytes",
    "plan_model_flops",
    "run_env",
    "summarize",
    "supersede_redone_steps",
    "torch_versions",
]
