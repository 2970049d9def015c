"""Weak and strong scaling: the best (or a pinned) layout at each GPU count and its efficiency.

Weak scaling grows the global batch with the GPU count (the per-GPU batch held), strong scaling
keeps it. At every count the layout is what ``search`` ranks first under the same options, so
pinning ``--tp/--pp`` pins the layout. Efficiency relative to the first (smallest) count n0:

    efficiency(n) = (T(n) / n) / (T(n0) / n0),    T = predicted tokens/s,

per-GPU throughput against the first point's; for strong scaling this equals the speed-up over
the GPU ratio, (T(n) / T(n0)) / (n / n0). It is the definition behind the efficiencies the Frontier
study reports (Dash et al. 2023, arXiv 2312.12705: "100% weak scaling efficiency", "strong scaling
efficiencies of 89% and 87%"), which the catalog holds beside (``catalog.studies``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.catalog.studies import MeasuredScaling, study_scaling
from exatrain.errors import UserError
from exatrain.limits import MAX_COUNT
from exatrain.plan import Plan
from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.results import estimate_json
from exatrain.planner.search.search import SearchResult, search
from exatrain.planner.search.space import SpaceOptions

MODES = ("weak", "strong")


@dataclass(frozen=True)
class ScalingPoint:
    gpus: int
    global_batch: int
    plan: Plan  # the best (or pinned) layout at this count, with its estimate
    efficiency: float  # see the module doc; 1.0 at the first point


@dataclass(frozen=True)
class ScalingResult:
    mode: str  # weak | strong
    model: ModelSpec
    cluster: ClusterSpec
    points: tuple[ScalingPoint, ...]
    measured: tuple[MeasuredScaling, ...] = ()  # what a published study measured for this model and cluster

    def to_dict(self) -> dict[str, Any]:
        """The `scaling --json` object (what `exatrain report --scaling` reads)."""
        return {
            "mode": self.mode,
            "points": [
                {"gpus": p.gpus, "global_batch": p.global_batch, "efficiency": p.efficiency, **estimate_json(p.plan)}
                for p in self.points
            ],
        }


def efficiency(tokens_per_s: float, gpus: int, first_tokens_per_s: float, first_gpus: int) -> float:
    """Per-GPU throughput relative to the first point (the module doc's formula)."""
    return (tokens_per_s / gpus) / (first_tokens_per_s / first_gpus)


def global_batches(counts: Sequence[int], global_batch: int, mode: str) -> list[int]:
    """The global batch at each count: ``global_batch`` throughout (strong), or grown in proportion
    to the count from the first one (weak; it must scale to a whole number of sequences)."""
    if mode not in MODES:
        raise UserError(f"--mode must be weak or strong, got {mode!r}")
    if not counts or list(counts) != sorted(set(counts)) or counts[0] <= 0:
        raise UserError("--gpus: give increasing GPU counts, e.g. 128,256,512")
    if mode == "strong":
        return [global_batch] * len(counts)
    out = []
    for n in counts:
        if (global_batch * n) % counts[0]:
            raise UserError(f"weak scaling: {n} GPUs do not scale global batch {global_batch} evenly")
        out.append(global_batch * n // counts[0])
        if out[-1] > MAX_COUNT:
            raise UserError(
                f"weak scaling: {n} GPUs grow global batch {global_batch} to {out[-1]:,}, beyond "
                f"{MAX_COUNT:,}; use a smaller batch or --mode strong"
            )
    return out


def no_feasible_layout(result: SearchResult, gpus: int, cluster: ClusterSpec) -> UserError:
    """The error for a search that found nothing, with the reason that removed the most."""
    # more devices help only where memory left nothing; a count with no legal layout needs another count or batch
    advice = (
        "try more devices, another global batch, or fewer pinned flags"
        if result.legal
        else "try another device count or global batch, or fewer pinned flags"
    )
    return UserError(f"no feasible layout on {gpus:,} devices: {result.why_empty(cluster.device.hbm_bytes)}; {advice}")


def scaling(
    model: ModelSpec,
    cluster: ClusterSpec,
    counts: Sequence[int],
    global_batch: int,
    *,
    mode: str = "weak",
    options: SpaceOptions = SpaceOptions(),
    params: CostParams | None = None,
    dtype: str = "bfloat16",
    flash: bool = True,
    runtime: str = "exatrain",
    overlap: str | None = None,
    strict_memory: bool = False,
) -> ScalingResult:
    """The best layout ``search`` finds at each GPU count (under ``options``; ``strict_memory``: tight layouts
    dropped, as search drops them), and its efficiency."""
    points: list[ScalingPoint] = []
    for n, gb in zip(counts, global_batches(counts, global_batch, mode)):
        result = search(
            model,
            cluster,
            n,
            gb,
            top=1,
            options=options,
            params=params,
            dtype=dtype,
            flash=flash,
            runtime=runtime,
            overlap=overlap,
            strict_memory=strict_memory,
        )
        if not result.ranked:
            raise no_feasible_layout(result, n, cluster)
        best = result.ranked[0]
        first = points[0] if points else None
        tps = best.estimate.tokens_per_s  # type: ignore[union-attr]
        eff = 1.0 if first is None else efficiency(tps, n, first.plan.estimate.tokens_per_s, first.gpus)  # type: ignore[union-attr]
        points.append(ScalingPoint(gpus=n, global_batch=gb, plan=best, efficiency=eff))
    return ScalingResult(
        mode=mode, model=model, cluster=cluster, points=tuple(points), measured=study_scaling(model.name, cluster.name)
    )


__all__ = ["MODES", "ScalingPoint", "ScalingResult", "efficiency", "global_batches", "no_feasible_layout", "scaling"]
