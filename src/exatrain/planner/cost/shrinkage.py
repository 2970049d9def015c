"""How much of a run's miss a calibration on one or two runs takes: the shrinkage of its step_scale.

A run's measured over predicted step time is the product of what its cluster and engine share with every other run
there (what a calibration is for) and what is its own (the layout, the model, the day: what the next run will not
share). On published runs the two are measured apart (``estimate``, each run predicted out of sample): two runs of one
source share ``between``^2 of their log misses' product (the source's bias, about no bias), and each run holds
``within``^2 more of its own. Given n runs of one cluster, the estimate of the shared part that errs
least on the next run is their mean log ratio times ``weight(n)`` = between^2 / (between^2 + within^2 / n) (the
posterior mean of a normal centre under a normal prior: James & Stein 1961, Efron & Morris 1975). One run
whose miss is all its own then moves the prediction of the others by less than its own miss.

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
from typing import Iterator, Mapping, Sequence

import numpy as np

SHRINKAGE_PATH = Path(__file__).resolve().parents[2] / "catalog" / "data" / "calibration_shrinkage.json"
SCALE_ONLY_RUNS = 2  # up to this many runs a calibration fits step_scale alone (calibrate.run_factors), shrunk


@dataclass(frozen=True)
class Shrinkage:
    """Spread, in log(measured / predicted), of sources' centres (``between``) and of runs about their
    source's centre (``within``)."""

    between: float
    within: float
    runs: int = 0
    sources: int = 0

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
    where it fits step_scale alone (``SCALE_ONLY_RUNS``), else all of it (its physical factors are not shrunk)."""
    s = current()
    return s.weight(n) if s is not None and n <= SCALE_ONLY_RUNS else 1.0


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
    return {
        "kind": "exatrain-calibration-shrinkage",
        "version": 1,
        "date": date,
        "command": command,
        "statistic": "log(measured/predicted), each run out of sample, every source weighing the same: "
        "between^2 the mean product of two runs' ratios (one source), within^2 a run's mean square less that "
        "(planner/cost/shrinkage.py)",
        "between": round(s.between, 5),
        "within": round(s.within, 5),
        "runs": s.runs,
        "sources": s.sources,
    }


@lru_cache(maxsize=2)
def _load(path: Path) -> Shrinkage | None:
    if not path.is_file():
        return None
    d = json.loads(path.read_text(encoding="utf-8"))
    return Shrinkage(float(d["between"]), float(d["within"]), int(d.get("runs", 0)), int(d.get("sources", 0)))


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


__all__ = ["SCALE_ONLY_RUNS", "SHRINKAGE_PATH", "Shrinkage", "current", "estimate", "taken", "to_dict", "using"]
