"""`exatrain bench`'s attention fit stays inside what it measured: a rate still rising at the longest
sequence measured is not extrapolated to an asymptote (the CPU bench measures 64 and 128 tokens; a fitted
half-point of thousands of tokens once printed "attention: 2209139474.9% of peak"), no fitted rate exceeds
the physical bound (fit.ATTN_EFF_MAX: twice the peak in the full-count FLOPs a causal kernel runs half of),
and the summary prints the efficiencies at the measured points beside the fit.

Seen to fail with the bound taken out of ``fit_attention`` (the 3-parameter fit accepted whatever its
half-point: the first two tests and the summary's), and with the clamp taken out (the third)."""

from __future__ import annotations

import pytest

from exatrain.bench.machine import BenchResult
from exatrain.planner.cost.calibrate import ATTN_EFF_MAX, fit_attention
from exatrain.planner.cost.coefficients import Calibration, default_params

# Causal SDPA forward + backward on this project's 2-core CPU (float32, `exatrain bench`, 2026-12-05), with the
# peak that bench fitted to its GEMMs: the points that fitted a half-point of 1,175 tokens and an asymptote of
# 84% of peak from efficiencies of 3-10%.
CPU_PEAK = 1.6707e11
CPU_POINTS = [
    {"batch": 1, "heads": 4, "seq": 64, "head_dim": 16, "seconds": 6.421e-4, "flops": 3670016.0},
    {"batch": 4, "heads": 4, "seq": 64, "head_dim": 16, "seconds": 1.5859e-3, "flops": 14680064.0},
    {"batch": 1, "heads": 6, "seq": 128, "head_dim": 32, "seconds": 2.7057e-3, "flops": 44040192.0},
    {"batch": 4, "heads": 6, "seq": 128, "head_dim": 32, "seconds": 1.4985e-2, "flops": 176160768.0},
]


def _points(rate, peak: float) -> list[dict]:
    """The CPU bench's four shapes, timed at ``rate(seq)`` of ``peak``."""
    out = []
    for b, h, s, d in ((1, 4, 64, 16), (4, 4, 64, 16), (1, 6, 128, 32), (4, 6, 128, 32)):
        flops = 3.5 * 4.0 * b * s * s * h * d
        out.append(
            {"batch": b, "heads": h, "seq": s, "head_dim": d, "flops": flops, "seconds": flops / (peak * rate(s))}
        )
    return out


def test_the_cpu_points_fit_a_curve_that_stays_inside_them() -> None:
    fit = fit_attention(CPU_POINTS, CPU_PEAK)
    measured = [c["efficiency"] for c in fit["curve"]]
    assert fit["attn_seq_half"] <= 128 and fit["attn_eff"] <= 1.5 * max(measured), fit
    assert "beyond the measured 64-128 tokens" in fit["note"]
    for c in fit["curve"]:  # the fit still describes each point
        assert c["model_efficiency"] == pytest.approx(c["efficiency"], rel=0.3), c


def test_a_rate_still_rising_at_the_last_point_is_not_extrapolated() -> None:
    """Efficiency growing in proportion to the sequence (0.1% of peak per token, 6.4% at 64, 12.8% at 128):
    the unbounded fit puts the half-point at millions of tokens and the asymptote at thousands of times the
    peak; the bounded one keeps the rate at longer sequences what the longest points measured."""
    fit = fit_attention(_points(lambda s: 1e-3 * s, 1e11), 1e11)
    assert fit["attn_seq_half"] <= 128 and fit["attn_eff"] <= 1.5 * 0.128, fit


def test_no_fitted_rate_exceeds_the_physical_bound() -> None:
    """Points timed at three times the peak (a peak set too low): attn_eff is clamped to the bound, and says so."""
    fit = fit_attention(_points(lambda s: 3.0, 1e11), 1e11)
    assert fit["attn_eff"] == ATTN_EFF_MAX and "clamped" in fit["note"]
    one = fit_attention(_points(lambda s: 3.0, 1e11)[:2], 1e11)  # the one-rate fallback too
    assert one["attn_eff"] == ATTN_EFF_MAX


def test_the_summary_prints_the_measured_points_beside_the_fit() -> None:
    fit = fit_attention(CPU_POINTS, CPU_PEAK)
    fitted = {k: fit[k] for k in ("attn_eff", "attn_seq_half", "attn_call_overhead_s")}
    params = default_params("cpu").replace(peak_flops=CPU_PEAK, **fitted)
    cal = Calibration(
        devices={"cpu": params},
        cluster_tiers={},
        extra={"bench": {"curves": {"attention": fit["curve"]}, "notes": [fit["note"]]}},
    )
    lines = BenchResult(
        calibration=cal, device="cpu", dtype="float32", ranks=2, threads_per_rank=1, seconds=1.0
    ).summary_lines()
    (attention,) = [line for line in lines if line.startswith("attention")]
    assert "measured 3.4%/5.5% at 64, 9.7%/7.0% at 128; the fit: " in attention, attention
    assert f"{params.attn_eff:.1%} at 128 tokens and beyond" in attention, attention
    assert any(line.startswith("note: the rate's fitted half-point") for line in lines), lines
