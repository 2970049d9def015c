"""``exatrain bench``: measure this machine and fit the cost model's parameters to it.

Picks what to measure (the CPU, or the catalog device this GPU is), runs the micro-benchmarks
(``bench.run``) and fits them (``planner.cost.calibrate.calibration_from_bench``) into a
Calibration for that device and, where collectives ran, a measured link tier for its cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from exatrain.errors import UserError
from exatrain.planner.cost.coefficients import Calibration


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

    def to_dict(self) -> dict:
        """`exatrain bench --json`: the device, its fitted parameters, the measuring time and the link tiers."""
        tiers = self.calibration.cluster_tiers
        return {
            "device": self.device,
            "params": self.params.to_dict(),
            "seconds": self.seconds,
            "tiers": {k: [t.__dict__ for t in v] for k, v in tiers.items()},
        }

    def summary_lines(self) -> list[str]:
        """What was measured, in the cost model's terms: GEMM throughput and its fall-off, attention at
        the sequence lengths measured (and where the fitted rate goes beyond them), memory bandwidth and
        overheads, and each measured link tier."""
        from exatrain.catalog import device_catalog

        p, spec = self.params, device_catalog().get(self.device)
        peak = p.peak_flops or (spec.peak_flops(self.dtype) if spec else None) or 0.0
        lines = [
            f"{self.device} ({self.dtype}, {self.threads_per_rank} thread(s) per rank) "
            f"measured in {self.seconds:.1f} s",
            f"GEMM: {peak * p.gemm_eff / 1e12:.3f} TFLOPS at large sizes (peak {peak / 1e12:.3f}, eff "
            f"{p.gemm_eff:.2f}), dimension half-point {p.gemm_dim_half:.0f}, "
            f"{p.gemm_overhead_s * 1e6:.1f} µs per call",
            *self._attention_lines(),
            f"memory: {(p.mem_bytes_per_s or 0) / 1e9:.1f} GB/s copy, "
            f"element-wise at {p.mem_eff:.0%} of it + {p.op_overhead_s * 1e6:.1f} µs per kernel; "
            f"{p.step_overhead_s * 1e3:.1f} ms fixed per step",
        ]
        lines += [f"note: {n}" for n in self.calibration.extra.get("bench", {}).get("notes", [])]
        for cluster, tiers in self.calibration.cluster_tiers.items():
            lines += [
                f"links ({cluster}, {t.name}): {t.bytes_per_s / 1e9:.2f} GB/s, {t.latency_s * 1e6:.0f} µs latency"
                for t in tiers
            ]
        return lines

    def _attention_lines(self) -> list[str]:
        """Attention's efficiency (counted FLOPs / seconds / peak) at each sequence length measured, and the
        fitted rate at the longest of them and beyond (attn_eff x n / (n + attn_seq_half), at most its
        asymptote attn_eff): the fit is only printed beside the points it was fitted to."""
        p = self.params
        curve = self.calibration.extra.get("bench", {}).get("curves", {}).get("attention", [])
        if not curve:
            return [f"attention: {p.attn_eff:.1%} of peak (the prior: not measured)"]
        by_seq: dict[int, list[float]] = {}
        for c in curve:
            by_seq.setdefault(int(c["seq"]), []).append(float(c["efficiency"]))
        measured = ", ".join(f"{'/'.join(f'{e:.1%}' for e in effs)} at {s}" for s, effs in sorted(by_seq.items()))
        longest = max(by_seq)
        at_longest = p.attn_eff * longest / (longest + p.attn_seq_half)
        fitted = (
            f"the fit: {at_longest:.1%} at {longest} tokens"
            + (
                f", rising to at most {p.attn_eff:.1%} beyond (half-point {p.attn_seq_half:.0f} tokens)"
                if p.attn_seq_half
                else " and beyond"
            )
            + f", + {p.attn_call_overhead_s * 1e6:.0f} µs per call"
        )
        return [f"attention (fwd+bwd, % of peak by tokens): measured {measured}; {fitted}"]


def measure(
    *,
    device: str = "cpu",
    ranks: int | None = None,
    dtype: str | None = None,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> BenchResult:
    """Run every micro-benchmark on ``device`` (cpu | cuda) and fit the calibration."""
    from exatrain.catalog import cluster_catalog, get_cluster, match_device
    from exatrain.planner.cost.calibrate import calibration_from_bench
    from exatrain.planner.cost.coefficients import default_params

    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda, got {device!r}")
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA/ROCm device is visible here")
        name = torch.cuda.get_device_name(0)
        spec = match_device(name)
        if spec is None:
            raise UserError(
                f"GPU {name!r} is not in the catalog (`exatrain hardware`); add it with a "
                "cluster file before calibrating it"
            )
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
    from exatrain.loadwatch import LoadWatch

    with LoadWatch() as watch:  # how busy the machine was while measuring: `train` compares its own run with it
        raw: dict[str, Any] = run_bench(device=device, dtype=dtype, ranks=ranks, quick=quick, progress=progress)
    raw["load"] = watch.load.to_dict() if watch.load is not None else None
    if progress is not None:
        progress("fitting the cost model")
    cal = calibration_from_bench(
        raw, device_name=device_name, base=default_params(device_name), catalog_peak=catalog_peak, cluster=cluster
    )
    return BenchResult(
        calibration=cal,
        device=device_name,
        dtype=dtype,
        ranks=ranks,
        threads_per_rank=int(raw["options"]["threads_per_rank"]),
        seconds=float(raw["seconds"]),
    )


__all__ = ["BenchResult", "measure"]
