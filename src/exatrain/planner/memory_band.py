"""How sure a predicted peak memory is, and the three-way verdict it gives: fits, tight, does not fit.

The memory band is the step-time band's machinery (``planner/band.py``) fitted on other residuals:
``benchmarks/prediction_error.py --write-bands`` takes every measured peak memory it has (published runs that state
one, and the trainer's own measured peaks in RunRecords), the log ratio r = log(measured / predicted) of each, and
fits, with every source weighing the same, a spread that grows with a plan's distance from what those runs validated
(``MEMORY_FEATURES``: the engine, the engine on its hardware family, the family, a thinly validated family, model
size and sequence length outside the validated ranges, a recomputation mode or ZeRO stage no validated run of the
family ran, FP8, context or expert parallelism, a run planned through another engine's profile), plus the settings a
plan leaves to its engine's version-dependent default (``band.VERSIONED_DEFAULTS``). Measured memories are few (a
handful of sources), too few to give each feature its own scale, so the spread grows with one distance, ``far``:
how many of those features lie outside what was measured (each counted once, octaves at most one):

    scale = base + far * sigma_far + sum of the widest scale over the features no measured run lies at
            (+ defaults * default)

(a distance no run of the fit lies at cannot be measured and takes the widest scale the runs did show, as in
band.py). The band is [low, high] of measured / predicted: exp(center -+ q * scale), q the 80th percentile of the
absolute residuals each standardized out of its own source (``benchmarks/prediction_error.py`` ``_memory_fit``), so
the offsets between sources, which few sources cannot average away, are in its width, on both sides alike: with a
handful of sources, which side of the center the next one lands on is not known (split-conformal with the absolute
residual as its score; it holds 80% of an unseen source's peaks, as a p10-p90 would). The measured peaks are
torch's max allocated (compared without the allocator allowance) and max reserved (with it) as each source states
them; a source that states both gives both (``prediction_error.memory_figures``), the reserved one measuring the
allocator's cache the allowance stands for.

Verdict (``verdict``), with p the predicted peak of the worst stage, a its allocated part (p without the engine's
allocator allowance, ``EngineProfile.allocator_allowance``: p = a * (1 + allowance)) and C the device's capacity:
  "does not fit" when a * low > C (even the band's low end of what the tensors themselves take is above capacity);
  "fits" when p * high < C (capacity above the whole band, the allowance included);
  "tight" otherwise, both ends included.
The allowance is caching slack, not a requirement: PyTorch's caching allocator, when a device allocation fails, frees
its cached blocks and retries before it raises out-of-memory (c10/cuda/CUDACachingAllocator.cpp,
``release_cached_blocks``), so a run whose tensors fit can train with less slack than the allowance; such a layout is
tight, not out.
A search drops only "does not fit" (``strict_memory``: "tight" too); a plan's JSON keeps ``fits`` for readers of
older files as "not does not fit" (what a search keeps). Without a stored table every plan gets
``MEMORY_WIDE_DEFAULT``, a stated convention (a quarter either way), not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.plan import Plan, StepEstimate
from exatrain.planner.band import MIN_RUNS, VERSIONED_DEFAULTS, Traits, distance, fit, interval, load_bands, traits_of

MEMORY_BANDS_PATH = Path(__file__).resolve().parents[1] / "catalog" / "data" / "memory_bands.json"
MEMORY_WIDE_DEFAULT = (0.8, 1.25)  # measured / predicted where no table is stored (convention, module doc)
VERDICTS = ("fits", "tight", "does not fit")
# The distances a memory band grows with (module doc); size and seq are octaves outside the validated range.
MEMORY_FEATURES = ("engine", "cell", "family", "thin", "size", "seq", "recompute", "zero", "fp8", "cp", "ep", "proxy")
FIT_FEATURES = ("far",)  # what the scale is fitted on (module doc): the count of MEMORY_FEATURES at a distance
SCALE_FEATURES = FIT_FEATURES + MEMORY_FEATURES  # what a plan's scale reads: far, and the unmeasured features
_WHY = {
    "engine": "no measured memory of {runtime}",
    "cell": "no measured memory of {runtime} on {family}",
    "family": "no measured memory on {family}",
    "thin": "fewer than {min_runs} measured memories on {family}",
    "size": "model size {n:.1f} octaves outside the measured sizes",
    "seq": "sequence {n:.1f} octaves outside the measured lengths",
    "recompute": "recomputation {recompute} not measured on {family}",
    "zero": "ZeRO-{zero} not measured on {family}",
    "fp8": "FP8 not measured on {family}",
    "cp": "context parallelism not measured on {family}",
    "ep": "expert parallelism not measured on {family}",
    "proxy": "the engine has no profile of its own",
}


def memory_distance(t: Traits, validated: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The plan's distance from the memory runs ``validated`` (``band.validated_summary``): the one band distance
    (``band.distance``) over ``MEMORY_FEATURES``, and ``far``, how many of them are at a distance (module doc)."""
    d = distance(t, validated, MEMORY_FEATURES)
    d["far"] = float(sum(min(1.0, d[f]) for f in MEMORY_FEATURES))
    return d


def fit_scale(
    residuals: Sequence[float],
    distances: Sequence[Mapping[str, float]],
    sources: Sequence[str],
    defaults: Sequence[int],
) -> dict[str, Any]:
    """``band.fit`` over ``FIT_FEATURES``, every ``MEMORY_FEATURES`` entry no run of the fit lies at taking the
    widest scale the fit found (module doc; the others 0: their spread is in ``far``)."""
    params = fit(residuals, distances, sources, defaults, FIT_FEATURES)
    widest = max(params["sigma"]["base"], params["sigma"]["far"])
    unseen = [f for f in MEMORY_FEATURES if not any(d[f] > 0 for d in distances)]
    params["sigma"].update({f: (widest if f in unseen else 0.0) for f in MEMORY_FEATURES})
    params["unseen"] = unseen
    return params


def verdict(predicted: float, capacity: float, low: float, high: float, *, allowance: float) -> str:
    """ "fits", "tight" or "does not fit" of a worst stage predicted at ``predicted`` bytes (``allowance``: the
    allocator allowance it includes, a fraction of the rest) on a device of ``capacity`` bytes whose measured peak
    lies in [low, high] x the prediction (module doc)."""
    return VERDICTS[int(verdict_codes(predicted, capacity, low, high, allowance=allowance))]


def verdict_codes(predicted, capacity: float, low, high, *, allowance: float) -> np.ndarray:
    """``verdict`` over arrays, as indices into ``VERDICTS`` (0 fits, 1 tight, 2 does not fit)."""
    p, lo, hi = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (predicted, low, high)))
    return np.where(p / (1.0 + allowance) * lo > capacity, 2, np.where(p * hi < capacity, 0, 1)).astype(np.int64)


def allowance_of(runtime: str) -> float:
    """The allocator allowance the predicted peak of a plan run by ``runtime`` includes (its engine profile's)."""
    from exatrain.accounting.engines import get_engine

    return get_engine(runtime).allocator_allowance


@dataclass(frozen=True)
class MemoryBand:
    """A range of measured / predicted peak memory and where it came from."""

    low: float  # measured / predicted: the central 80%'s low end
    high: float  # its high end
    n: int  # measured memories behind it (0 for the default)
    sources: int
    basis: str  # "out of sample" | "default"
    widened: tuple[str, ...] = field(default_factory=tuple)
    statistic: str = "central 80% of measured/predicted peak memory"

    def describe(self) -> str:
        if self.basis == "default":
            return f"×{self.low:g}–×{self.high:g}: no measured-memory table, a stated convention"
        extra = ("; widened: " + ", ".join(self.widened)) if self.widened else ""
        return f"central 80% from n={self.n} measured memories of {self.sources} sources, out of sample{extra}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ratio_low": self.low,
            "ratio_high": self.high,
            "n": self.n,
            "sources": self.sources,
            "basis": self.basis,
            "statistic": self.statistic,
            "widened": list(self.widened),
            "text": self.describe(),
        }


def load_memory_bands(path: Path = MEMORY_BANDS_PATH) -> Mapping[str, Any]:
    """The stored table ({} when the file is absent: every plan then gets the default); read as the step band's
    (``band.load_bands``, cached per path)."""
    return load_bands(path)


def memory_band_of(t: Traits, table: Mapping[str, Any]) -> MemoryBand:
    """The memory band of a plan with traits ``t`` under a stored table (``MEMORY_WIDE_DEFAULT`` without one)."""
    if not table.get("sigma") or not table.get("validated"):
        return MemoryBand(*MEMORY_WIDE_DEFAULT, 0, 0, "default")
    d = memory_distance(t, table["validated"])
    lo, hi, _ = interval(t, d, table, SCALE_FEATURES)
    sigma = table["sigma"]
    why = [
        _WHY[f].format(
            runtime=t.runtime, family=t.family, n=d[f], min_runs=MIN_RUNS, recompute=t.recompute, zero=t.zero
        )
        for f in MEMORY_FEATURES
        if d[f] > 0 and (sigma.get(f, 0.0) > 0 or sigma.get("far", 0.0) > 0)
    ]
    if t.defaults:
        why.append(", ".join(n.replace("_", "-") for n in t.left) + f" left to {t.runtime}'s default")
    return MemoryBand(lo, hi, int(table["runs"]), int(table["sources"]), "out of sample", tuple(why))


def memory_band_for(plan: Plan, cluster: ClusterSpec, table: Mapping[str, Any] | None = None) -> MemoryBand:
    """The memory band of ``plan`` on ``cluster``."""
    return memory_band_of(traits_of(plan, cluster), load_memory_bands() if table is None else table)


def with_memory_band(estimate: StepEstimate, plan: Plan, cluster: ClusterSpec) -> StepEstimate:
    """``estimate`` carrying its memory band and verdict; ``fits`` becomes "not does not fit" (module doc)."""
    b = memory_band_for(plan, cluster)
    allowance = allowance_of(plan.runtime)
    v = verdict(estimate.memory_bytes.total, estimate.capacity_bytes, b.low, b.high, allowance=allowance)
    return estimate.replace(
        memory_verdict=v, memory_band={**b.to_dict(), "allocator_allowance": allowance}, fits=v != "does not fit"
    )


def tight_window(band: Mapping[str, Any]) -> tuple[float, float]:
    """The capacities, as fractions of the predicted peak, between which a plan is tight (module doc): the band's low
    end on the tensors without the allocator allowance (a plan's ``memory_band`` carries it), its high end on the
    whole prediction."""
    return band["ratio_low"] / (1.0 + band.get("allocator_allowance", 0.0)), band["ratio_high"]


def layout_ratios(
    plan: Plan, cluster: ClusterSpec, *, zero, recompute, cp, ep, table: Mapping[str, Any] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the memory band of many layouts of one search at once: ``plan`` carries what they share
    (model, runtime, FP8, the settings left to the engine), ``zero``, ``recompute`` (names), ``cp`` and ``ep``
    arrays what varies; one band per distinct combination."""
    table = load_memory_bands() if table is None else table
    base = traits_of(plan, cluster)
    names = VERSIONED_DEFAULTS.get(plan.runtime, ())
    zero, cp, ep = (np.asarray(x) for x in (zero, cp, ep))
    rec = np.broadcast_to(np.asarray(recompute).astype(str), zero.shape)
    modes, rec_code = np.unique(rec, return_inverse=True)
    keys = np.stack([zero.astype(np.int64).ravel(), np.ravel(rec_code), (cp > 1).ravel(), (ep > 1).ravel()], axis=1)
    combos, inverse = np.unique(keys.astype(np.int64), axis=0, return_inverse=True)
    ends = np.empty((len(combos), 2))
    for j, (z, r, c, e) in enumerate(combos):
        cp_left = bool(c) and plan.runtime in ("megatron-core", "torchtitan") and not plan.cp_comm
        left = tuple(n for n in names if not getattr(plan, n, "")) + (("cp_comm",) if cp_left else ())
        t = Traits(
            **{
                **base.__dict__,
                "zero": int(z),
                "recompute": str(modes[r]),
                "cp": bool(c),
                "ep": bool(e),
                "left": left,
                "defaults": len(left),
            }
        )
        b = memory_band_of(t, table)
        ends[j] = b.low, b.high
    low, high = (ends[np.ravel(inverse), k].reshape(zero.shape) for k in (0, 1))
    return low, high


STRICT_MEMORY_HELP = (
    "drop tight layouts too: those whose device capacity lies inside their band of measured peak "
    "memory (kept and marked by default; only layouts that do not fit are dropped)"
)

__all__ = [
    "FIT_FEATURES",
    "MEMORY_BANDS_PATH",
    "MEMORY_FEATURES",
    "MEMORY_WIDE_DEFAULT",
    "MemoryBand",
    "SCALE_FEATURES",
    "STRICT_MEMORY_HELP",
    "VERDICTS",
    "allowance_of",
    "fit_scale",
    "layout_ratios",
    "load_memory_bands",
    "memory_band_for",
    "memory_band_of",
    "memory_distance",
    "tight_window",
    "verdict",
    "verdict_codes",
    "with_memory_band",
]
