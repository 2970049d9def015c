"""The slowest GPU's lag: a synchronous step runs at the pace of the slowest of its GPUs.

GPUs of one model and SKU in one cluster do not sustain the same speed: power management and manufacturing
variation leave some slower than others ("8% (max 22%) average performance variation" across the GPUs of
Summit, Vortex, Frontera, Longhorn and Corona, "with outliers up to 1.5X slower than the median GPU": Sinha et
al., "Not All GPUs Are Created Equal", SC22, arXiv 2208.11035v3, abstract; the SC22 programme's abstract, over
four clusters and another data set, gives 32% (max 72%): the arXiv figure is taken, the lower). Every collective of a
training step waits for its last member, so a step over N GPUs takes the typical GPU's busy time stretched by the
slowest one's deficit: with speeds spread normally by a relative standard deviation s, that is s x E[max of N standard
normals] (0 on one GPU, 1.42 s on 8, 2.59 s on 128, 3.44 s on 2,048). ``CostParams.speed_spread`` is s: the 8%
read as the whisker-to-whisker spread of a box plot over a cluster's GPUs (Tukey's 1.5 IQR whiskers reach
+-2.70 standard deviations of a normal), 8% / 5.4 = 1.5%. A single-GPU benchmark (``exatrain bench``) measures
one GPU and adds no lag; a host's processes share its cores and get none.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

# The cited spread (module docstring): Sinha et al.'s 8% average variation over 5.4 standard deviations.
SPEED_SPREAD = 0.08 / 5.4


@lru_cache(maxsize=1)
def _grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, the normal's pdf and cdf on the grid E[max] is integrated on (its mass outside it is < 1e-18); built on
    first use, not at import."""
    x = np.linspace(-9.0, 9.0, 18001)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    return x, np.exp(-x * x / 2.0) / math.sqrt(2.0 * math.pi), cdf


@lru_cache(maxsize=None)
def _expected_max(n: int) -> float:
    if n <= 1:
        return 0.0
    x, pdf, cdf = _grid()
    # E[max] = integral of x d(Phi(x)^n) = integral of x n phi(x) Phi(x)^(n-1) dx, by the trapezoid rule
    y = x * n * pdf * cdf ** (n - 1)
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2.0)


def slowest_of(n) -> np.ndarray:
    """E[max of ``n`` standard normal draws] for each element of ``n`` (GPU counts; 0 for one GPU)."""
    n = np.asarray(n)
    counts, where = np.unique(n, return_inverse=True)  # a search's layouts share a handful of GPU counts
    return np.array([_expected_max(int(k)) for k in counts], dtype=float)[where].reshape(n.shape)


def straggler_s(busy_s, gpus, spread: float, on_host: bool = False) -> np.ndarray:
    """Seconds a step over ``gpus`` GPUs adds because its slowest GPU runs ``busy_s`` (the step's pipeline and
    optimizer time) ``spread`` x E[max of gpus normals] slower than the typical one (module docstring)."""
    busy = np.asarray(busy_s, dtype=float)
    if on_host or spread <= 0:
        return np.zeros_like(busy)
    return spread * slowest_of(gpus) * busy


__all__ = ["SPEED_SPREAD", "slowest_of", "straggler_s"]
