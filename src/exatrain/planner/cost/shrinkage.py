"""How much of a run's miss a calibration on one or two runs takes, and which of the cost model's terms it moves.

A run's measured over predicted step time is the product of what its cluster and engine share with every other run
there (what a calibration is for) and what is its own (the layout, the model, the day: what the next run will not
share). On published runs the two are measured apart (``estimate``, each run predicted out of sample): two runs of one
source share ``between``^2 of their log misses' product (the source's bias, about no bias), and each run holds
``within``^2 more of its own. Given n runs of one cluster, the estimate of the shared part that errs
least on the next run is their mean log ratio times ``weight(n)`` = between^2 / (between^2 + within^2 / n) (the
posterior mean of a normal centre under a normal prior: James & Stein 1961, Efron & Morris 1975). One run
whose miss is all its own then moves the prediction of the others by less than its own miss.

What a cluster shares is not one factor on the whole step: its GEMMs, attention, element-wise kernels, collectives
and fixed overheads each run at their own rate (``FIT_TERMS``: the cost model's factors that scale each term's seconds).
A run's log miss is then about sum_k g_k theta_k + its own, g_k the share of its step that term k's seconds make
(``shares``: d log step / d log of the term's seconds, overlaps included) and theta_k the cluster's log factor on
that term, of prior spread ``sigma_k`` (``TermPrior``). Two runs of one source share sum_k sigma_k^2 g_ak g_jk of
their log misses' product; ``estimate_terms`` fits the sigma_k^2 to those products (non-negative least squares, every
source weighing the same) and ``within``^2 to what is left of a run's square. A calibration on n <= ``SHRUNK_RUNS``
runs fits the n terms that carry the most prior variance of the runs' log step times (sum over the runs of
sigma_k^2 g_k^2), each started at the prior and pulled to it by sigma_k, the other terms' variance counted with the
runs' own as noise (``calibrate.fit_runs``): one run that is mostly GEMM time moves gemm_eff, and the cluster's other
runs move by their own GEMM share of that, not by the anchor's whole miss. With one term of share 1 on every run this
is ``weight(n)`` above.

The shipped figures (catalog/data/calibration_shrinkage.json) are written by
``python benchmarks/prediction_error.py --write-bands``; benchmarks/one_shot.py measures them without the source it
predicts (``using``).
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.cost.fitting import nnls

SHRINKAGE_PATH = Path(__file__).resolve().parents[2] / "catalog" / "data" / "calibration_shrinkage.json"
SHRUNK_RUNS = 2  # up to this many runs a calibration fits one term a run, shrunk to its prior (calibrate.run_factors)

# Each term of the cost model and the CostParams fields that scale its seconds: an efficiency (its seconds go as
# 1 / the field) or a fixed time (its seconds go as the field). Communication's link_eff and net_eff move together
# (net_eff None: link_eff prices the network too); the overheads are every fixed time per call, layer or step.
FIT_TERMS: dict[str, tuple[tuple[str, ...], bool]] = {
    "gemm": (("gemm_eff",), True),
    "attention": (("attn_eff",), True),
    "elementwise": (("mem_eff",), True),
    "communication": (("link_eff", "net_eff"), True),
    "overhead": (
        (
            "gemm_overhead_s",
            "op_overhead_s",
            "attn_call_overhead_s",
            "collective_overhead_s",
            "step_overhead_s",
            "dp_step_overhead_s",
            "tp_layer_overhead_s",
            "fsdp_layer_overhead_s",
            "pp_microbatch_overhead_s",
            "blocking_launch_s",
        ),
        False,
    ),
}
TERM_NAMES = tuple(FIT_TERMS)
SHARE_STEP = 0.01  # the log step over which ``shares`` differentiates


@dataclass(frozen=True)
class TermPrior:
    """The log spread between clusters of each term's seconds (``sigma``, by ``FIT_TERMS`` name) and a run's own log
    miss beyond them (``within``), measured on published runs (``estimate_terms``)."""

    sigma: Mapping[str, float]
    within: float

    def variances(self) -> np.ndarray:
        return np.array([self.sigma.get(k, 0.0) ** 2 for k in TERM_NAMES])


def fields_of(term: str, params: CostParams) -> tuple[str, ...]:
    """The fields of ``params`` that scaling ``term`` changes (those set and not zero)."""
    return tuple(f for f in FIT_TERMS[term][0] if getattr(params, f) not in (None, 0, 0.0))


def scaled(params: CostParams, term: str, log_factor: float) -> CostParams:
    """``params`` with ``term``'s seconds multiplied by exp(``log_factor``)."""
    fields, is_rate = FIT_TERMS[term]
    m = math.exp(log_factor)
    return params.replace(**{f: getattr(params, f) * (1 / m if is_rate else m) for f in fields_of(term, params)})


def shares(predict: Callable[[CostParams], np.ndarray], params: CostParams) -> np.ndarray:
    """(runs, FIT_TERMS) d log step / d log of each term's seconds at ``params`` (``predict``: the runs' step times):
    the share of each run's step that the term's exposed seconds make, what an overlap hides counting for nothing."""
    base = np.log(np.asarray(predict(params), dtype=float))
    out = [
        (np.log(np.asarray(predict(scaled(params, k, SHARE_STEP)), dtype=float)) - base) / SHARE_STEP for k in FIT_TERMS
    ]
    return np.clip(np.stack(out, axis=1), 0.0, None)


def estimate_terms(samples: Mapping[str, Sequence[tuple[float, Sequence[float]]]]) -> TermPrior:
    """``TermPrior`` from each source's runs as (log(measured / predicted), ``shares``): sigma_k^2 fitted by
    non-negative least squares to the products of the log misses of two different runs of one source, which share
    sum_k sigma_k^2 g_ak g_jk (every source weighing the same, its pairs alike); within^2 a run's mean squared log
    miss less what the terms explain of it (module doc)."""
    groups = [
        (np.array([y for y, _ in v], dtype=float), np.array([g for _, g in v], dtype=float))
        for v in samples.values()
        if len(v) >= 2
    ]
    if len(groups) < 2:
        raise ValueError("term spreads need two sources or more with two runs or more")
    rows, target, weight, own = [], [], [], []
    for y, g in groups:
        n = y.size
        a, j = np.nonzero(~np.eye(n, dtype=bool))
        rows.append(g[a] * g[j])
        target.append(y[a] * y[j])
        weight.append(np.full(a.size, 1.0 / math.sqrt(n * (n - 1))))
    w = np.concatenate(weight)
    var = nnls(np.concatenate(rows) * w[:, None], np.concatenate(target) * w)
    for y, g in groups:
        own.append(float(np.mean(y**2 - (g**2) @ var)))
    return TermPrior(
        sigma={k: round(math.sqrt(v), 5) for k, v in zip(TERM_NAMES, var)},
        within=round(math.sqrt(max(float(np.mean(own)), 0.0)), 5),
    )


@dataclass(frozen=True)
class Shrinkage:
    """Spread, in log(measured / predicted), of sources' centres (``between``) and of runs about their
    source's centre (``within``)."""

    between: float
    within: float
    runs: int = 0
    sources: int = 0
    terms: TermPrior | None = None  # the spread per term (None: one-run fits take step_scale, ``weight``)

    def weight(self, n: int) -> float:
        """The share of the mean log ratio of ``n`` runs of one cluster that is the cluster's (module doc)."""
        if n <= 0:
            return 0.0
        if self.within <= 0:
            return 1.0
        b2 = self.between**2
        return b2 / (b2 + self.within**2 / n) if b2 > 0 else 0.0


def taken(n: int) -> float:
    """The share of the published runs' median bias that a calibration on ``n`` runs removes: the shrinkage weight
    where its factors are shrunk to the prior (``SHRUNK_RUNS``), else all of it (its physical factors are not
    shrunk)."""
    s = current()
    return s.weight(n) if s is not None and n <= SHRUNK_RUNS else 1.0


def estimate(log_ratios: Mapping[str, Sequence[float]]) -> Shrinkage:
    """``between`` and ``within`` of log(measured / predicted) grouped by source, every source of two runs or more
    weighing the same: between^2 is the mean product of the log misses of two different runs of one source (what one
    run's miss says of another's: the sources' shared bias, the pooled one included), within^2 a run's mean squared
    log miss less that. ``weight(1)`` is then the least-squares slope of a run's log miss on a sibling's."""
    groups = [np.asarray(v, dtype=float) for v in log_ratios.values() if len(v) >= 2]
    if len(groups) < 2:
        raise ValueError("shrinkage needs two sources or more with two runs or more")
    shared, single = [], []
    for v in groups:
        n, total, squares = v.size, float(v.sum()), float(v @ v)
        shared.append((total * total - squares) / (n * (n - 1)))  # the mean of x_a x_j over pairs a != j
        single.append(squares / n)
    c, q = float(np.mean(shared)), float(np.mean(single))
    return Shrinkage(
        math.sqrt(max(c, 0.0)),
        math.sqrt(max(q - max(c, 0.0), 0.0)),
        int(sum(len(v) for v in log_ratios.values())),
        len(log_ratios),
    )


def to_dict(s: Shrinkage, command: str, date: str) -> dict:
    terms = {}
    if s.terms is not None:
        terms = {
            "terms": dict(s.terms.sigma),
            "term_within": s.terms.within,
            "terms_statistic": "sigma_k: log spread between sources of term k's seconds, fitted to the products of "
            "two runs' log ratios (one source) over the products of their shares of the term (planner/cost/"
            "shrinkage.py)",
        }
    return {
        "kind": "exatrain-calibration-shrinkage",
        "version": 2,
        "date": date,
        "command": command,
        "statistic": "log(measured/predicted), each run out of sample, every source weighing the same: "
        "between^2 the mean product of two runs' ratios (one source), within^2 a run's mean square less that "
        "(planner/cost/shrinkage.py)",
        "between": round(s.between, 5),
        "within": round(s.within, 5),
        "runs": s.runs,
        "sources": s.sources,
        **terms,
    }


@lru_cache(maxsize=2)
def _load(path: Path) -> Shrinkage | None:
    if not path.is_file():
        return None
    d = json.loads(path.read_text(encoding="utf-8"))
    terms = None
    if "terms" in d:
        terms = TermPrior({k: float(v) for k, v in d["terms"].items()}, float(d["term_within"]))
    return Shrinkage(float(d["between"]), float(d["within"]), int(d.get("runs", 0)), int(d.get("sources", 0)), terms)


_override: list[Shrinkage] = []


def current() -> Shrinkage | None:
    """The shrinkage a calibration uses: the one set by ``using``, else the shipped one (None: no file, no
    shrinkage)."""
    return _override[-1] if _override else _load(SHRINKAGE_PATH)


@contextlib.contextmanager
def using(s: Shrinkage) -> Iterator[None]:
    """Calibrate with ``s`` instead of the shipped figures (a benchmark measuring them without the source it
    predicts)."""
    _override.append(s)
    try:
        yield
    finally:
        _override.pop()


__all__ = [
    "SHRINKAGE_PATH",
    "SHRUNK_RUNS",
    "FIT_TERMS",
    "TERM_NAMES",
    "Shrinkage",
    "TermPrior",
    "current",
    "estimate",
    "estimate_terms",
    "fields_of",
    "scaled",
    "shares",
    "taken",
    "to_dict",
    "using",
]
