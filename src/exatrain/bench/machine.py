"""``exatrain bench``: measure this machine and fit the cost model's parameters to it.

Picks what to measure (the CPU, or the catalog device this GPU is), runs the micro-benchmarks
(``bench.run``) and fits them (``planner.cost.calibrate.calibration_from_bench``) into a
Calibration for that device and, where collectives ran, a measured link tier for its cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from exatrain.errors import UserError
from exatrain.planner.cost.params import Calibration


@dataclass(frozen=True)
class BenchResult:
    calibration: Calibration
    device: str  # catalog device name ("cpu" for the host)
    dtype: str
    ranks: int
    threads_per_rank: int
    seconds: float  # measuring time

    @property
    def params(self):
        return self.calibration.devices[self.device]


def measure(*, device: str = "cpu", ranks: int | None = None, dtype: str | None = None, quick: bool = False,
            progress: Callable[[str], None] | None = None) -> BenchResult:
    """Run every micro-benchmark on ``device`` (cpu | cuda) and fit the calibration."""
    from exatrain.catalog import cluster_catalog, get_cluster, match_device
    from exatrain.planner.cost.calibrate import calibration_from_bench
    from exatrain.planner.cost.params import default_params

    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda, got {device!r}")
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA/ROCm device is visible here")
        name = torch.cuda.get_device_name(0)
        spec = match_device(name)
        if spec is None:
            raise UserError(f"GPU {name!r} is not in the catalog (`exatrain hardware`); add it with a "
                            "cluster file before calibrating it")
        device_name, dtype = spec.name, dtype or "bfloat16"
        catalog_peak = spec.peak_flops(dtype)
        cluster = next((c for c in cluster_catalog().values() if c.device.name == spec.name), None)
        ranks = ranks or torch.cuda.device_count()
        if ranks > torch.cuda.device_count():
            raise UserError(f"--ranks {ranks}: only {torch.cuda.device_count()} GPU(s) here")
    else:
        device_name, catalog_peak, dtype = "cpu", None, dtype or "float32"
        cluster = get_cluster("local-cpu")
        ranks = ranks or 2
    from exatrain.bench.run import run_bench

    raw: dict[str, Any] = run_bench(device=device, dtype=dtype, ranks=ranks, quick=quick, progress=progress)
    if progress is not None:
        progress("fitting the cost model")
    cal = calibration_from_bench(raw, device_name=device_name, base=default_params(device_name),
                                 catalog_peak=catalog_peak, cluster=cluster)
    return BenchResult(calibration=cal, device=device_name, dtype=dtype, ranks=ranks,
                       threads_per_rank=int(raw["options"]["threads_per_rank"]), seconds=float(raw["seconds"]))


__all__ = ["BenchResult", "measure"]
