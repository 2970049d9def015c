"""The pipeline schedules' step time in closed form (``step_time_fast``): numpy over many configurations at once,
uniform stages with optionally a different first and last; ``cost.pipeline`` uses it on the smallest stage as one
of its lower bounds and ``cost.schedule.simulate`` is its oracle."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.layout_arrays import among
from exatrain.accounting.inflight import closed_form_codes, group_sizes, schedule_codes
from exatrain.settings import SCHEDULES, V_SCHEDULES

_V_CODES = [SCHEDULES.index(s) for s in V_SCHEDULES]


@dataclass(frozen=True, eq=False)
class FastStepTimes:
    """``step_time_fast`` over N configurations (arrays of shape N): the step (makespan), the busiest
    rank's compute and the bubble = step - compute, all in seconds."""

    step_s: np.ndarray
    compute_s: np.ndarray
    bubble_s: np.ndarray

    @property
    def bubble_fraction(self) -> np.ndarray:
        return np.divide(self.bubble_s, self.step_s, out=np.zeros_like(self.step_s), where=self.step_s > 0)


def step_time_fast(
    forward_s,
    backward_s,
    *,
    pp,
    num_microbatches,
    schedule,
    interleave=1,
    weight_s=0.0,
    p2p_s=0.0,
    first_forward_s=None,
    first_backward_s=None,
    first_weight_s=None,
    last_forward_s=None,
    last_backward_s=None,
    last_weight_s=None,
) -> FastStepTimes:
    """Step time of many configurations at once, in closed form (numpy, no per-config loop).

    Every argument broadcasts to N configurations; ``schedule`` is one name or an array of names
    (or indices into ``SCHEDULES``). forward_s/backward_s/weight_s: one middle virtual stage per
    micro-batch, split as in ``simulate``; first_*/last_*: virtual stages 0 and pp*v-1 (default: as
    the middle); p2p_s: one stage boundary. The closed forms were derived from, and are tested
    against, ``simulate`` (tests/planner/test_schedule.py). Uniform stages, t = F + B + W, S = p v,
    c = p2p_s, k = max(m - 2, 0):
    - gpipe: (m + p - 1) t + 2 (p - 1) c. Exact.
    - 1f1b: (m + p - 1) t + 2 c (p - 1 + k - floor(k/p)). Exact for every c: the warm-up of
      p - 1 - rank forwards has no slack, so most micro-batches expose 2 c (Narayanan 2021 Sec. 2.2.1
      gives the c = 0 bubble (p - 1) t).
    - interleaved: (v max(m,p) + min(m,p) - 1) t + latency; the bubble at c = 0 is (p - 1) t for
      per-chunk t, 1/v of 1F1B's (Narayanan 2021 Sec. 2.2.2). Latency 2 (p - 1) c plus, per chunk
      wrap-around (rank p-1 to 0) filling and draining, what p c exceeds the g - p spare
      micro-batches of a group. Exact at c = 0; exact for m >= p while c <= min(F, B + W) / 2.
    - zero_bubble, m >= p: m v t + wrap + the longest of three critical paths, (p - 1) (F + B - W)
      + (4 (p-1) - 2 [m = p]) c, (p - 1) F + (3 (p-1) - 2 [m = p]) c, (p - 1) B + 2 (p-1) c. At c = 0
      the bubble is (p - 1) max(F + B - W, F, B), ZB-H1's (p - 1)(F + B - W) while W <= min(F, B)
      (Qi et al. 2023 Sec. 3.1). Exact at c = 0; exact while c <= W / 2.
      m < p (Plan.validate rejects it): v = 1 exact at c = 0, otherwise a lower bound.
    Outside those ranges the forms are lower bounds (never above ``simulate``); measured over 12,000
    random configurations: for c <= 0.2 min(F, B + W) interleaved is exact and zero_bubble within
    11% (only when W < 2c; realistic W ~ F keeps it exact); for p2p up to twice a stage's forward,
    interleaved within 41% and zero_bubble within 62% (there the schedule is latency-bound).

    First/last stages that differ (embedding, head), D0 and DL their extra F + B + W:
    gpipe, interleaved, zero_bubble: uniform(middle) + D0 + DL + (m - 1) max(D0, DL, 0): the fill
    and drain cross both stages once and the slower of rank 0 and rank p-1 paces the steady state.
    1f1b: the longest of its c = 0 critical paths (``_one_f_one_b_paths``) plus the fill/drain
    latency, or uniform + D0 + DL where the uniform p2p exposure is larger. Measured against
    ``simulate`` over pp 2-12, v 2-4, m in {p, 2p, 4p, 8p, p+1, 2p+3, 3p+1}, first stage -50%..+30%,
    last -33%..+200%, c <= 0.2 F (6,000 configs): gpipe exact (the same stage slowest in F and B);
    1f1b +8.4% / -6.0%; interleaved +11.2% / -8.9% (worst: small p and m with a lighter last
    stage); zero_bubble +3.6% / -9.0%; mean |error| <= 1%, p95 <= 4%.
    """
    p, v, m, F, B, W, c, code = _fast_inputs(
        pp, interleave, num_microbatches, forward_s, backward_s, weight_s, p2p_s, schedule
    )
    t = F + B + W
    forms = _uniform_forms(p, v, m, F, B, W, c)
    step = np.choose(code, list(forms))
    compute = m * v * t
    ends = (first_forward_s, first_backward_s, first_weight_s, last_forward_s, last_backward_s, last_weight_s)
    if any(x is not None for x in ends):
        step, compute = _with_uneven_ends(step, compute, forms[1], ends, (p, v, m, F, B, W, c), code)
    return FastStepTimes(step_s=step, compute_s=compute, bubble_s=step - compute)


def _fast_inputs(pp, interleave, num_microbatches, forward_s, backward_s, weight_s, p2p_s, schedule) -> tuple:
    """``step_time_fast``'s arguments broadcast to one shape: (p, v, m, F, B, W, c, schedule code), c 0 without a
    pipeline; a ValueError for a V schedule or a degree under 1."""
    p = np.asarray(pp, dtype=np.int64)
    v = np.asarray(interleave, dtype=np.int64)
    m = np.asarray(num_microbatches, dtype=np.int64)
    F = np.asarray(forward_s, dtype=np.float64)
    B = np.asarray(backward_s, dtype=np.float64)
    W = np.asarray(weight_s, dtype=np.float64)
    c = np.asarray(p2p_s, dtype=np.float64)
    shape = np.broadcast_shapes(p.shape, v.shape, m.shape, F.shape, B.shape, W.shape, c.shape)
    p, v, m, F, B, W, c = (np.broadcast_to(x, shape) for x in (p, v, m, F, B, W, c))
    code = closed_form_codes(schedule_codes(schedule, shape))
    if np.any(among(code, _V_CODES)):
        raise ValueError("step_time_fast has no closed form of the V schedules: use simulate_many")
    if np.any(p < 1) or np.any(v < 1) or np.any(m < 1):
        raise ValueError("pp, interleave and num_microbatches must be >= 1")
    c = np.where(p > 1, c, 0.0)
    return p, v, m, F, B, W, c, code


def _uniform_forms(p, v, m, F, B, W, c) -> tuple:
    """(gpipe, 1f1b, interleaved, zero_bubble) step seconds with uniform stages (``step_time_fast``'s forms)."""
    t = F + B + W
    S = p * v
    lo, hi = np.minimum(m, p), np.maximum(m, p)
    gpipe = (m + p - 1) * t + 2 * (p - 1) * c
    k = np.maximum(m - 2, 0)
    one_f = (m + p - 1) * t + 2 * c * (p - 1 + np.where(m >= 2, k - k // p, 0))
    # Chunk wrap-around (rank p-1 -> rank 0): hidden by the g - p extra micro-batches of a group,
    # exposed by p c beyond that, once per chunk boundary filling and once draining.
    g = group_sizes(p, m)
    wrap_f = (v - 1) * np.maximum(p * c - (g - p) * F, 0.0)
    wrap_b = (v - 1) * np.maximum(p * c - (g - p) * (B + W), 0.0)  # the unsplit backward
    inter = (v * hi + lo - 1) * t + np.where(m <= p, 2 * (S - 1) * c, 2 * (p - 1) * c + wrap_f + wrap_b)
    return gpipe, one_f, inter, _zero_bubble_form(p, v, m, F, B, W, c, wrap_f)


def _zero_bubble_form(p, v, m, F, B, W, c, wrap_f):
    """zero_bubble's step seconds with uniform stages: for m >= p the longest of three critical paths; below
    (rejected by Plan.validate for zero_bubble) v = 1 is ZB-H1's exact fill and v > 1 the larger of two lower
    bounds, the last micro-batch's chain through every stage and the m >= p form."""
    t = F + B + W
    S = p * v
    at_p = np.where(m == p, 2, 0)
    zb = (
        m * v * t
        + wrap_f
        + np.maximum.reduce(
            [
                (p - 1) * (F + B - W) + (4 * (p - 1) - at_p) * c,
                (p - 1) * F + (3 * (p - 1) - at_p) * c,
                (p - 1) * B + 2 * (p - 1) * c,
            ]
        )
    )
    zb_small_v1 = m * t + (p - 1) * (F + B) - (m - 1) * np.minimum(np.minimum(F, B), W) + 2 * (S - 1) * c
    zb_small = np.maximum((S + m - 1) * (F + B) + W + 2 * (S - 1) * c, zb)
    return np.where(m >= p, zb, np.where(v == 1, zb_small_v1, zb_small))


def _with_uneven_ends(step, compute, one_f, ends: tuple, arrays: tuple, code):
    """(step, compute) of ``step_time_fast`` where the first or last stage differs (``ends``: first F, B, W, last
    F, B, W, each None where as the middle): the paced forms for gpipe, interleaved and zero_bubble, 1F1B's
    critical paths (``_one_f_one_b_paths``), a single stage's own sum."""
    p, v, m, F, B, W, c = arrays
    t, S = F + B + W, p * v
    f0, b0, w0, fl, bl, wl = ends

    def extra(x, mid):
        return 0.0 if x is None else np.asarray(x, dtype=np.float64) - mid

    d0 = extra(f0, F) + extra(b0, B) + extra(w0, W)
    dl = extra(fl, F) + extra(bl, B) + extra(wl, W)
    d0, dl = np.broadcast_to(d0, step.shape), np.broadcast_to(dl, step.shape)
    # Extra per micro-batch of the busiest rank: rank 0 holds the first stage, rank p-1 the last,
    # ranks in between (p > 2) neither; with p = 1 one rank holds both.
    busiest = np.where(p == 1, d0 + dl, np.maximum(d0, dl))
    busiest = np.where(p > 2, np.maximum(busiest, 0.0), busiest)
    paced = step + d0 + dl + (m - 1) * busiest  # gpipe (exact), interleaved, zero_bubble
    # 1F1B: the longest of its c = 0 critical paths, plus the fill/drain latency; the uniform
    # per-micro-batch p2p exposure counts only where no slower stage hides it.
    paths = _one_f_one_b_paths(
        p,
        m,
        F,
        B + W,
        F + extra(f0, F),
        B + W + extra(b0, B) + extra(w0, W),
        F + extra(fl, F),
        B + W + extra(bl, B) + extra(wl, W),
    )
    exposed = one_f - (m + p - 1) * t - 2 * (p - 1) * c
    one_f_uneven = np.where(p == 2, paths + 2 * c + exposed, np.maximum(paths + 2 * (p - 1) * c, one_f + d0 + dl))
    step = np.where(code == SCHEDULES.index("1f1b"), one_f_uneven, paced)
    step = np.where(S == 1, m * (t + d0 + dl), step)
    return step, compute + m * busiest


def _one_f_one_b_paths(p, m, F, B, F0, B0, FL, BL) -> np.ndarray:
    """Longest of two path families of 1F1B at c = 0 with first/middle/last stage times, for the
    rank k in {0, p-2, p-1}: (a) fill to k, the first micro-batch's round trip below k, then k's
    remaining work and the drain; (b) fill to k, k never idle, drain. Exact for uniform stages."""

    def before(k):  # forward and backward time of the stages above rank k (k >= 1)
        return F0 + (k - 1) * F, B0 + (k - 1) * B

    w0 = np.minimum(p - 1, m - 1)
    a0 = F0 + (p - 2) * (F + B) + FL + BL + B0 + (m - w0 - 1) * F0 + (m - 1) * B0
    b0 = m * (F0 + B0)
    fl, bl = before(p - 1)
    last = fl + bl + m * (FL + BL)
    fm, bm = before(np.maximum(p - 2, 1))
    wm = np.minimum(1, m - 1)
    am = fm + F + FL + BL + B + (m - wm - 1) * F + (m - 1) * B + bm
    bmid = fm + bm + m * (F + B)
    mid = np.where(p >= 3, np.maximum(am, bmid), 0.0)
    return np.maximum.reduce([a0, b0, last, mid])


__all__ = ["FastStepTimes", "step_time_fast"]
