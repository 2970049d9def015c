"""The uncertainty band of a step-time estimate: how far published runs landed from the prediction, widened
by how far the plan lies from what those runs validated.

``benchmarks/prediction_error.py --write-bands`` predicts every published run it can price out of sample
(leave one source out) and fits, on the log ratios r = log(measured / predicted) of every source pooled
(each source weighing the same, however many runs it gives), a spread that grows with a plan's distance
from the validated runs (``FEATURES``):

    scale = base + sum_f d_f * sigma_f   (+ defaults * default)

where d_f is 1 (or octaves, for model size and sequence length) where the plan's engine anywhere, its engine
on its hardware family, the family itself (or more than a few of its runs), its size, its sequence length, a
tp/ep group spanning nodes, FP8, MoE, synchronous launches, or an engine exatrain has no profile of (a run planned
through another's) lies outside what runs of *other* sources cover, and d_disagree how much the sources that
validate the plan's family disagree (the spread of their median log ratios: where they tell different stories, a
new plan there is less certain); and ``defaults`` counts the settings whose engine default changed across that
engine's versions and which the plan leaves to the engine (``VERSIONED_DEFAULTS``); the scales are fitted by
non-negative least squares of |r - center|. The band is the prediction times exp(center + scale * [q10, q90])
with q10, q90 the quantiles of the residuals over their scale (split-conformal: the coverage holds on sources
the fit never saw, which ``prediction_error.py`` measures by leaving each source out of the fit in turn). The
file also holds, per family, what was validated (``validated_summary``), so an estimate measures its own
distance.

A distance no run of the fit lies at (no validated MoE at all, say) cannot be measured and takes the widest
scale the runs did show. The default-settings term is the one scale not fitted directly:
``default = proxy / PROXY_SETTINGS``, the spread of runs planned through another engine's profile (every
version-dependent setting another engine's) shared over the settings such a plan takes from it. Without a
stored table every estimate gets ``WIDE_DEFAULT``, a stated convention (a factor of three either way), not a
measurement.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.plan import Plan, StepEstimate
from exatrain.planner.cost import shrinkage  # the share of the bias a calibration on few runs took

BANDS_PATH = Path(__file__).resolve().parents[1] / "catalog" / "data" / "error_bands.json"
WIDE_DEFAULT = (0.33, 3.0)  # measured / predicted where nothing is known (convention, see above)

# Hardware family of each catalog device (catalog/data/hardware.toml): devices whose kernels and
# software stacks behave alike share one family's published runs.
FAMILIES = {
    "a100-80gb": "A100",
    "h100-sxm": "H100/H200",
    "h200-sxm": "H100/H200",
    "h100-sxm-500w": "H100 500W",
    "b200": "B200",
    "mi250x-gcd": "MI250X",
    "mi300x": "MI300X",
    "mi355x": "MI355X",
    "cpu": "CPU",
}

# The distances the spread grows with (module doc); size and seq are octaves outside the validated range.
FEATURES = ("engine", "cell", "family", "thin", "size", "seq", "spans", "fp8", "moe", "proxy", "disagree", "blocking")
_WHY = {
    "engine": "no published run of {runtime} validated",
    "cell": "{runtime} not validated on {family}",
    "family": "no validated run on {family}",
    "thin": "fewer than {min_runs} validated runs on {family}",
    "size": "model size {n:.1f} octaves outside the validated sizes",
    "seq": "sequence {n:.1f} octaves outside the validated lengths",
    "spans": "a tp/ep group across nodes, not validated on {family}",
    "fp8": "FP8 not validated on {family}",
    "moe": "MoE not validated on {family}",
    "proxy": "the engine has no profile of its own",
    "disagree": "the validated sources on {family} disagree (their medians spread {n:.0%})",
    "blocking": "synchronous launches not validated on {family}",
}
OCTAVES_CAP = 4.0  # a size or sequence distance counts at most this many octaves
MIN_RUNS = 5  # a family validated by fewer runs than this is thinly validated (feature "thin")
# Plan settings whose default, under each runtime, changed across that engine's versions or is one of its config
# choices (the engine profiles' sources: torch's SDPA backend from 2.11, torchtitan's compile switch, compiled loss
# (2025-04) and fused Adam (2025-02); Megatron-LM's gradient-accumulation fusion (2022-02: the runs of Megatron-LM
# before it are planned as megatron-core); DeepSpeed's BF16_Optimizer or not; llm-foundry's attn_impl (triton in its
# 2023 YAMLs, flash later) and Composer's mixed-precision mode (bf16 or fp32 reduction); the cp exchange each engine's
# flags choose, added where cp > 1): left to the engine, each widens the band, and the band names it.
VERSIONED_DEFAULTS = {
    "torchtitan": ("attention_kernel", "elementwise", "cross_entropy", "adam_kernel"),
    "megatron-core": ("grad_accum_fusion",),
    "megatron-deepspeed": ("grad_accum",),
    "llm-foundry": ("attention_kernel", "grad_accum"),
    "exatrain": (),
}
PROXY_SETTINGS = 4  # the version-dependent settings a run planned through torchtitan's profile takes from it
DISAGREE_NAMED = 0.25  # the sources' spread is named among a band's widenings from this share of the base scale


def hardware_family(device_name: str) -> str:
    """The family a device's band is looked up under (its own name when the table has none)."""
    return FAMILIES.get(device_name, device_name)


@dataclass(frozen=True)
class Traits:
    """What a plan's distance from the validated runs is measured on."""

    runtime: str
    family: str
    params: float  # total parameters
    seq: int
    spans: bool  # a tp or ep group crosses nodes
    fp8: bool
    moe: bool
    proxy: bool = False  # planned through another engine's profile (a published run whose engine has none)
    defaults: int = 0  # VERSIONED_DEFAULTS the plan leaves to its runtime
    left: tuple[str, ...] = ()  # which ones
    # what a memory band's distance also reads (planner/memory_band.py)
    recompute: str = "none"
    zero: int = 0
    cp: bool = False  # context parallelism
    ep: bool = False  # expert parallelism
    blocking: bool = False  # synchronous kernel launches (Plan.launch_blocking)


def traits_of(plan: Plan, cluster: ClusterSpec, *, proxy: bool = False) -> Traits:
    """The plan's ``Traits`` on ``cluster``."""
    from exatrain.accounting.params import total_params

    gpn = cluster.gpus_per_node
    ep_span = (plan.ep - 1) * plan.tp * plan.cp + 1
    spans = plan.tp > gpn or (plan.ep > 1 and ep_span > gpn)
    names = VERSIONED_DEFAULTS.get(plan.runtime, ())
    if plan.cp > 1 and plan.runtime in ("megatron-core", "torchtitan"):
        names = names + ("cp_comm",)
    left = tuple(n for n in names if not getattr(plan, n, ""))
    return Traits(
        runtime=plan.runtime,
        family=hardware_family(cluster.device.name),
        params=float(total_params(plan.model)),
        seq=int(plan.model.seq_len),
        spans=bool(spans),
        fp8=bool(plan.fp8),
        moe=bool(plan.model.is_moe),
        proxy=proxy,
        defaults=0 if proxy else len(left),
        left=() if proxy else left,
        recompute=plan.recompute,
        zero=int(plan.zero_stage),
        cp=plan.cp > 1,
        ep=plan.ep > 1,
        blocking=bool(plan.launch_blocking),
    )


def validated_summary(
    traits: Sequence[Traits], residuals: Sequence[float] | None = None, sources: Sequence[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per family, what a set of runs validated: the runtimes whose profile runs were planned with (their own
    engine's, or another engine's run planned through it: fms-fsdp's plain FSDP1 through llm-foundry's FSDP1
    profile exercises that profile), the size and sequence ranges, whether any had a tp/ep group across nodes, FP8,
    MoE, context or expert parallelism, synchronous launches, and the recomputation modes and ZeRO stages they ran.
    With the runs' log ratios ``residuals`` and ``sources``, also how much the family's sources disagree
    (``disagree``: the standard deviation of the sources' median log ratios, each source one value; 0 with fewer than
    two sources)."""
    out: dict[str, dict[str, Any]] = {}
    if residuals is not None and sources is not None:
        by: dict[str, dict[str, list[float]]] = {}
        for t, r, src in zip(traits, residuals, sources):
            by.setdefault(t.family, {}).setdefault(src, []).append(float(r))
        for fam, srcs in by.items():
            medians = [float(np.median(v)) for v in srcs.values()]
            out[fam] = {"disagree": float(np.std(medians)) if len(medians) > 1 else 0.0}
    for t in traits:
        s = out.setdefault(t.family, {})
        if "runs" not in s:
            s.update(
                {
                    "runtimes": [],
                    "params": [t.params, t.params],
                    "seq": [t.seq, t.seq],
                    "spans": False,
                    "fp8": False,
                    "moe": False,
                    "cp": False,
                    "ep": False,
                    "blocking": False,
                    "recompute": [],
                    "zero": [],
                    "runs": 0,
                }
            )
        s["runs"] += 1
        if t.runtime not in s["runtimes"]:
            s["runtimes"] = sorted(s["runtimes"] + [t.runtime])
        s["params"] = [min(s["params"][0], t.params), max(s["params"][1], t.params)]
        s["seq"] = [min(s["seq"][0], t.seq), max(s["seq"][1], t.seq)]
        for k in ("spans", "fp8", "moe", "cp", "ep", "blocking"):
            s[k] = s[k] or getattr(t, k)
        s["recompute"] = sorted(set(s["recompute"]) | {t.recompute})
        s["zero"] = sorted(set(s["zero"]) | {t.zero})
    return out


def _octaves(x: float, lo: float, hi: float) -> float:
    return min(OCTAVES_CAP, max(0.0, math.log2(lo / x), math.log2(x / hi)))


def distance(
    t: Traits, validated: Mapping[str, Mapping[str, Any]], features: Sequence[str] = FEATURES
) -> dict[str, float]:
    """The plan's distance from ``validated`` (``validated_summary``), feature by feature: the step band's
    ``FEATURES`` by default, or ``features`` (the memory band's, ``memory_band.MEMORY_FEATURES``, which add the
    recomputation mode, ZeRO stage, context and expert parallelism no validated run of the family ran)."""
    s = validated.get(t.family)
    engine = float(not t.proxy and not any(t.runtime in v["runtimes"] for v in validated.values()))
    if not s:
        d = {
            "engine": engine,
            "cell": 1.0,
            "family": 1.0,
            "thin": 1.0,
            "size": 0.0,
            "seq": 0.0,
            "spans": float(t.spans),
            "fp8": float(t.fp8),
            "moe": float(t.moe),
            "proxy": float(t.proxy),
            "disagree": 0.0,
            "blocking": float(t.blocking),
            "recompute": 0.0,
            "zero": 0.0,
            "cp": float(t.cp),
            "ep": float(t.ep),
        }
    else:
        d = {
            "engine": engine,
            "cell": float(not t.proxy and t.runtime not in s["runtimes"]),
            "family": 0.0,
            "thin": float(s["runs"] < MIN_RUNS),
            "size": _octaves(t.params, *s["params"]),
            "seq": _octaves(t.seq, *s["seq"]),
            "spans": float(t.spans and not s["spans"]),
            "fp8": float(t.fp8 and not s["fp8"]),
            "moe": float(t.moe and not s["moe"]),
            "proxy": float(t.proxy),
            "disagree": float(s.get("disagree", 0.0)),
            "blocking": float(t.blocking and not s.get("blocking", False)),
            "recompute": float(t.recompute not in s.get("recompute", ())),
            "zero": float(t.zero not in s.get("zero", ())),
            "cp": float(t.cp and not s.get("cp", False)),
            "ep": float(t.ep and not s.get("ep", False)),
        }
    return {f: d[f] for f in features}


def sigma_of(
    d: Mapping[str, float], defaults: int, sigma: Mapping[str, float], features: Sequence[str] = FEATURES
) -> float:
    """The scale (typical |log ratio|) of a plan at distance ``d`` (over ``features``) leaving ``defaults`` settings
    to its engine."""
    return sigma["base"] + sum(d[f] * sigma.get(f, 0.0) for f in features) + defaults * sigma.get("default", 0.0)


def weighted_quantile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    """The q-quantile of ``x`` with weights ``w`` (midpoint interpolation)."""
    order = np.argsort(x)
    x, w = x[order], w[order]
    cum = np.cumsum(w) - 0.5 * w
    return float(np.interp(q * w.sum(), cum, x))


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with non-negative solution (active set: drop the most negative until none is)."""
    free = list(range(a.shape[1]))
    while True:
        x = np.zeros(a.shape[1])
        if free:
            x[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
        neg = [i for i in free if x[i] < 0]
        if not neg:
            return x
        free.remove(min(neg, key=lambda i: x[i]))


def fit(
    residuals: Sequence[float],
    distances: Sequence[Mapping[str, float]],
    sources: Sequence[str],
    defaults: Sequence[int] | None = None,
    features: Sequence[str] = FEATURES,
) -> dict[str, Any]:
    """The band's parameters from out-of-sample log ratios, their plans' distances (over ``features``: the step
    time's ``FEATURES``, or a memory band's, planner/memory_band.py) and sources (module doc): every source weighs
    the same; the scales by non-negative least squares of the absolute deviations from the (weighted) median
    (robust to a source far off); the quantiles of the residuals over their scale."""
    r = np.asarray(residuals, dtype=float)
    n_src = {s: sources.count(s) for s in set(sources)}
    w = np.array([1.0 / (len(n_src) * n_src[s]) for s in sources])
    center = weighted_quantile(r, w, 0.5)
    d = np.array([[1.0] + [dist[f] for f in features] for dist in distances])
    sw = np.sqrt(w)
    coef = _nnls(d * sw[:, None], np.abs(r - center) * sw)
    sigma = {"base": max(float(coef[0]), 1e-3), **{f: float(v) for f, v in zip(features, coef[1:])}}
    # a distance no run of the fit lies at cannot be measured: it takes the widest scale the runs did show (a
    # feature's scale at the farthest distance a run lies at: octaves and the sources' spread are not 0/1)
    unseen = [f for i, f in enumerate(features) if not np.any(d[:, i + 1] > 0)]
    farthest = d[:, 1:].max(axis=0)
    widest = max([sigma["base"]] + [sigma[f] * farthest[i] for i, f in enumerate(features) if f not in unseen])
    for f in unseen:
        sigma[f] = widest
    sigma["default"] = sigma.get("proxy", widest) / PROXY_SETTINGS
    defaults = list(defaults) if defaults is not None else [0] * len(r)
    s = np.array([sigma_of(dist, k, sigma, features) for dist, k in zip(distances, defaults)])
    u = (r - center) / s
    return {
        "center": center,
        "sigma": sigma,
        "unseen": unseen,
        "quantiles": [weighted_quantile(u, w, 0.1), weighted_quantile(u, w, 0.9)],
        "runs": int(r.size),
        "sources": len(n_src),
    }


def fit_across_sources(
    residuals: Sequence[float],
    distances: Sequence[Mapping[str, float]],
    sources: Sequence[str],
    defaults: Sequence[int] | None = None,
    features: Sequence[str] = FEATURES,
) -> dict[str, Any]:
    """``fit``'s center and scales on every run, with the quantiles of residuals each standardized out of its own
    source: every source of the fit left out of an inner ``fit`` in turn, its runs measured by that fit's center and
    scale, each source weighing the same. Quantiles of in-fit residuals describe how runs scatter around sources the
    fit saw; these describe how a source the fit never saw lands, the between-source spread included, which is what
    an estimate of a user's run needs (its cluster and software are a new source)."""
    params = fit(residuals, distances, sources, defaults, features)
    r = np.asarray(residuals, dtype=float)
    srcs = sorted(set(sources))
    if len(srcs) < 3:
        return params
    k = list(defaults) if defaults is not None else [0] * len(r)
    u, w = [], []
    for src in srcs:
        keep = [i for i, s in enumerate(sources) if s != src]
        inner = fit(
            [r[i] for i in keep],
            [distances[i] for i in keep],
            [sources[i] for i in keep],
            [k[i] for i in keep],
            features,
        )
        mine = [i for i, s in enumerate(sources) if s == src]
        for i in mine:
            u.append((r[i] - inner["center"]) / sigma_of(distances[i], k[i], inner["sigma"], features))
            w.append(1.0 / (len(srcs) * len(mine)))
    u_, w_ = np.asarray(u), np.asarray(w)
    return {
        **params,
        "quantiles": [weighted_quantile(u_, w_, 0.1), weighted_quantile(u_, w_, 0.9)],
        "quantiles_from": "each source standardized by a fit without it",
    }


def interval(
    t: Traits, d: Mapping[str, float], params: Mapping[str, Any], features: Sequence[str] = FEATURES
) -> tuple[float, float, float]:
    """(low, high, sigma): the band of measured / predicted for a plan at distance ``d`` (over ``features``) under
    ``params``."""
    s = sigma_of(d, t.defaults, params["sigma"], features)
    q10, q90 = params["quantiles"]
    return math.exp(params["center"] + q10 * s), math.exp(params["center"] + q90 * s), s


@dataclass(frozen=True)
class Band:
    """A range of measured / predicted step time and where it came from."""

    low: float  # measured / predicted, 10th percentile
    high: float  # 90th percentile
    n: int  # out-of-sample runs behind it (0 for the default)
    engine: str  # the plan's runtime
    family: str  # the plan's hardware family
    basis: str  # "out of sample" | "default"
    statistic: str = "p10-p90 of measured/predicted step time"
    sources: int = 0
    widened: tuple[str, ...] = field(default_factory=tuple)  # why the band is wider than the validated runs'

    @property
    def cell(self) -> str:
        return "default" if self.basis == "default" else f"{self.engine}/{self.family}"

    def describe(self) -> str:
        """One phrase for the estimate's step line."""
        if self.basis == "calibrated":
            return f"p10–p90 of {self.n} runs of this cluster's calibration, each predicted without itself"
        if self.basis == "default":
            return f"×{self.low:g}–×{self.high:g}: no published-run table, wide default"
        extra = ("; widened: " + ", ".join(self.widened)) if self.widened else ""
        return f"p10–p90 from n={self.n} runs of {self.sources} sources, out of sample{extra}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "engine": self.engine,
            "family": self.family,
            "n": self.n,
            "sources": self.sources,
            "ratio_low": self.low,
            "ratio_high": self.high,
            "basis": self.basis,
            "statistic": self.statistic,
            "widened": list(self.widened),
            "text": self.describe(),
        }


@lru_cache(maxsize=4)
def load_bands(path: Path = BANDS_PATH) -> Mapping[str, Any]:
    """The stored table ({} when the file is absent: every estimate then gets the default)."""
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def band_of(t: Traits, table: Mapping[str, Any]) -> Band:
    """The band of a plan with traits ``t`` under a stored table (``WIDE_DEFAULT`` without one)."""
    if not table.get("sigma") or not table.get("validated"):  # no table, or one of an older format
        return Band(*WIDE_DEFAULT, 0, t.runtime, t.family, "default")
    d = distance(t, table["validated"])
    lo, hi, _ = interval(t, d, table)
    sigma = table["sigma"]
    # the sources' spread is named where it adds a quarter of the base scale or more (a stated threshold, for the
    # reader: every family with two sources has some spread, and a few hundredths widen the band by a few percent)
    why = [
        _WHY[f].format(runtime=t.runtime, family=t.family, n=d[f], min_runs=MIN_RUNS)
        for f in FEATURES
        if d[f] > 0 and sigma.get(f, 0.0) > 0 and (f != "disagree" or d[f] * sigma[f] >= DISAGREE_NAMED * sigma["base"])
    ]
    if t.defaults:
        names = ", ".join(n.replace("_", "-") for n in t.left) or f"{t.defaults} setting{'s' * (t.defaults > 1)}"
        why.append(f"{names} left to {t.runtime}'s default, which its versions change")
    return Band(
        lo,
        hi,
        int(table["runs"]),
        t.runtime,
        t.family,
        "out of sample",
        sources=int(table["sources"]),
        widened=tuple(why),
    )


def band_for(plan: Plan, cluster: ClusterSpec, table: Mapping[str, Any] | None = None) -> Band:
    """The band an estimate of ``plan`` on ``cluster`` carries."""
    return band_of(traits_of(plan, cluster), load_bands() if table is None else table)


def centred(b: Band, runs: int, table: Mapping[str, Any] | None = None) -> Band:
    """The published-run band ``b`` without its centre (the pooled sources' median bias, exp(center)) for an estimate
    calibrated on ``runs`` runs of its cluster and engine, which removed that cluster's own bias: the spread about
    the calibrated prediction. (``benchmarks/one_shot.py`` measures both: on 253 runs of 13 published groups
    calibrated on one run each, 75% inside the centred band, 64% inside the uncentred one.)"""
    table = load_bands() if table is None else table
    if b.basis == "default" or "center" not in table:
        return b
    c = math.exp(float(table["center"]) * shrinkage.taken(runs))
    why = f"centred on the prediction calibrated on {runs} run{'s' * (runs > 1)} (the sources' median bias taken out)"
    return Band(b.low / c, b.high / c, b.n, b.engine, b.family, b.basis, sources=b.sources, widened=(*b.widened, why))


def step_range(step_s: float, tokens_per_step: int, band: Band) -> tuple[tuple[float, float], tuple[float, float]]:
    """([low, high] seconds, [low, high] tokens/s) of a step predicted at ``step_s``."""
    lo, hi = step_s * band.low, step_s * band.high
    return (lo, hi), (tokens_per_step / hi, tokens_per_step / lo)


def with_best_case(b: Band, ratio: float | None) -> Band:
    """``b`` with its low end reaching the best case of the settings a plan leaves unstated: ``ratio`` is that best
    case's step over the predicted one (below 1; None: nothing unstated), and the low end becomes the best case's own
    low end (``planner.estimate``: --overlap not stated is priced at the engine's defaults)."""
    if ratio is None or ratio >= 1:
        return b
    return dataclasses.replace(
        b,
        low=b.low * ratio,
        widened=b.widened + (f"--overlap not stated: the low end reaches every overlap on ({ratio - 1:+.1%})",),
    )


def with_band(
    estimate: StepEstimate, plan: Plan, cluster: ClusterSpec, params: Any = None, best_s: float | None = None
) -> StepEstimate:
    """``estimate`` carrying the band of ``plan`` on ``cluster`` (unchanged without a time). The table measures
    the shipped priors; an estimate made with a calibration file gets the same band, unless `exatrain calibrate`
    measured one on held-out runs of the cluster (``params``, CostParams: ``band_runs`` > 0). ``best_s``: the step
    with every overlap on where the plan states none (``with_best_case``)."""
    if estimate.time_s is None:
        return estimate
    if params is not None and getattr(params, "band_runs", 0) > 0:
        b = Band(
            params.band_low,
            params.band_high,
            int(params.band_runs),
            plan.runtime,
            hardware_family(cluster.device.name),
            "calibrated",
        )
    else:
        b = band_for(plan, cluster)
        if params is not None and getattr(params, "calibrated_runs", 0) > 0:
            b = centred(b, int(params.calibrated_runs))
    b = with_best_case(b, None if best_s is None else best_s / estimate.time_s.step)
    steps, tokens = step_range(estimate.time_s.step, plan.tokens_per_step, b)
    return estimate.replace(step_range_s=steps, tokens_per_s_range=tokens, band=b.to_dict())
