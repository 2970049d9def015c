"""The RunRecord of a run that failed or was interrupted: what its steps measured (the metrics lines of the run
being written), the per-rank times of its straggler windows, the failure that exatrain.trainer.failures named
and its one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from exatrain.errors import Interrupted
from exatrain.plan import Plan, RunRecord
from exatrain.records import append_run_record

if TYPE_CHECKING:
    from exatrain.trainer.failures import Diagnosis


def versions_of(fails: Mapping[int, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The torch versions a rank's failure record carries (the first that has them), else None."""
    return next((dict(f["versions"]) for _, f in sorted(fails.items()) if isinstance(f.get("versions"), dict)), None)


def run_lines(metrics_file: str | Path) -> list[dict]:
    """The metrics lines of the run being written: those after the file's last RunRecord."""
    path = Path(metrics_file)
    if not path.is_file():
        return []
    lines: list[dict] = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if obj.get("kind") == "run_record":
            lines = []
        else:
            lines.append(obj)
    return lines


def summarize_windows(windows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A RunRecord's ``rank_times``: per rank, the mean compute and wait seconds per step over every
    window (weighted by its steps), the stragglers named in any, and how many steps were measured."""
    windows = [w for w in windows if w.get("kind", "ranks") == "ranks" and w.get("compute_s")]
    if not windows:
        return None
    n = len(windows[0]["compute_s"])
    steps = sum(int(w["last_step"]) - int(w["first_step"]) + 1 for w in windows)

    def mean(key: str, r: int) -> float:
        total = sum(float(w[key][r]) * (int(w["last_step"]) - int(w["first_step"]) + 1) for w in windows)
        return round(total / steps, 6)

    return {
        "steps": steps,
        "windows": len(windows),
        "compute_s": [mean("compute_s", r) for r in range(n)],
        "wait_s": [mean("wait_s", r) for r in range(n)],
        "stragglers": sorted({r for w in windows for r in w.get("stragglers", [])}),
    }


def write_failed_record(
    metrics_file: str | None,
    plan: Plan,
    diag: Diagnosis,
    *,
    device: str,
    wall_s: float,
    measure_after: int,
    versions: Mapping[str, Any] | None = None,
) -> None:
    """Append the failed or interrupted run's RunRecord: what its steps measured (from the metrics lines
    rank 0 wrote), the per-rank times of its straggler windows, the failure and its one line. ``device``:
    cpu or cuda; ``versions``: torch's, as a rank recorded them (``versions_of``; without them torch is
    imported here to ask)."""
    if not metrics_file:
        return
    from exatrain.trainer.metrics import StepMetrics, run_env, summarize

    name = "cpu"
    if device == "cuda":
        import torch

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cuda"

    lines = run_lines(metrics_file)
    steps = []
    for d in lines:
        if d.get("kind") == "step":
            d = {k: v for k, v in d.items() if k != "kind"}
            d["peak_memory_bytes"] = tuple(d.get("peak_memory_bytes", ()))
            d["samples"] = None if d.get("samples") is None else tuple(tuple(x) for x in d["samples"])
            try:
                steps.append(StepMetrics(**d))
            except TypeError:
                continue
    windows = [d for d in lines if d.get("kind") == "ranks"]
    message = str(diag.error)
    status = (
        "interrupted"
        if isinstance(diag.error, Interrupted)
        else "oom"
        if "out of memory" in diag.failure.get("cause", "").lower()
        else "failed"
    )
    append_run_record(
        metrics_file,
        RunRecord(
            plan=plan,
            measured=summarize(steps, plan, measure_after) if steps else None,
            status=status,
            device=name,
            env=run_env("nccl" if device == "cuda" else "gloo", plan.gpus, wall_s, device, versions),
            error=message[:4000],
            failure=diag.failure,
            rank_times=summarize_windows(windows),
        ),
    )


__all__ = ["run_lines", "summarize_windows", "versions_of", "write_failed_record"]
