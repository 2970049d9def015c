"""Small numpy solvers and error summaries shared by the cost model's fits (``cost.calibrate``): Nelder-Mead for
robust fits to micro-benchmarks, Levenberg-Marquardt for least squares over real runs, and the error figures
both report."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np


def nelder_mead(
    f: Callable[[np.ndarray], float], x0: Sequence[float], step: float = 0.3, max_iter: int = 600, tol: float = 1e-10
) -> tuple[np.ndarray, float]:
    """Minimise ``f`` from ``x0`` (Nelder & Mead 1965, standard coefficients 1, 2, 0.5, 0.5)."""
    x0 = np.asarray(x0, dtype=float)
    n = x0.size
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(max_iter):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) <= tol * (1 + abs(values[0])):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        xr = centroid + (centroid - worst)
        fr = f(xr)
        if fr < values[0]:
            xe = centroid + 2 * (centroid - worst)
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (worst - centroid) if fr >= values[-1] else centroid + 0.5 * (xr - centroid)
            fc = f(xc)
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = xc, fc
            else:
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (x - best) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    i = int(np.argmin(values))
    return simplex[i], float(values[i])


def levenberg_marquardt(
    residuals: Callable[[np.ndarray], np.ndarray],
    x0: Sequence[float],
    max_iter: int = 40,
    tol: float = 1e-12,
    h: float = 1e-4,
) -> tuple[np.ndarray, float]:
    """Minimise ||residuals(x)||^2 (Levenberg 1944, Marquardt 1963) with a forward-difference
    Jacobian: n + 1 evaluations an iteration, a handful of iterations for a smooth model."""
    x = np.asarray(x0, dtype=float)
    r = residuals(x)
    cost = float(r @ r)
    lam = 1e-2
    for _ in range(max_iter):
        J = np.empty((r.size, x.size))
        for i in range(x.size):
            dx = np.zeros_like(x)
            dx[i] = h
            J[:, i] = (residuals(x + dx) - r) / h
        g = J.T @ r
        A = J.T @ J
        improved = False
        for _ in range(8):
            step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
            r_new = residuals(x + step)
            c_new = float(r_new @ r_new)
            if c_new < cost:
                x, r, improved = x + step, r_new, True
                done = cost - c_new <= tol * (1 + cost)
                cost, lam = c_new, max(lam / 3, 1e-9)
                break
            lam *= 4
        if not improved or done:
            break
    return x, cost


def error_stats(predicted: Iterable[float], measured: Iterable[float]) -> dict[str, float]:
    """Relative error |predicted/measured - 1|: median, 90th percentile, max; the count; and the
    root-mean-square of log(predicted/measured), the quantity ``fit_runs`` minimises."""
    p, m = np.asarray(list(predicted), dtype=float), np.asarray(list(measured), dtype=float)
    if p.size == 0:
        return {"n": 0, "median": math.nan, "p90": math.nan, "max": math.nan, "rms_log": math.nan}
    err = np.abs(p / m - 1.0)
    return {
        "n": int(err.size),
        "median": float(np.median(err)),
        "p90": float(np.percentile(err, 90)),
        "max": float(err.max()),
        "rms_log": float(np.sqrt(np.mean(np.log(p / m) ** 2))),
    }


def _log_mse(model: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean((np.log(model) - np.log(measured)) ** 2))


def robust_log_error(model: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute log-error: a few disturbed timings on a shared machine do not drag the fit."""
    return float(np.mean(np.abs(np.log(model) - np.log(measured))))


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """x >= 0 minimising ||a x - b|| (Lawson & Hanson 1974, the active-set method): variables enter the passive set
    by the largest gradient, and a step that would make one negative stops at the boundary and drops it."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    tol = 1e-10 * max(1.0, float(np.abs(a).sum()))
    for _ in range(max_iter):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        passive[int(np.argmax(np.where(passive, -np.inf, w)))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = float(np.min(x[neg] / (x[neg] - z[neg])))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x
