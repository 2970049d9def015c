"""Micro-batches in flight on a pipeline rank: how many activation sets a schedule makes it hold.

Counts only (no time), so the memory accounting can use them without the cost model; the schedule
simulator (``planner.cost.schedule``) runs the same op orders and its tests check these counts
against the simulated peaks. Schedule names and the micro-batch grouping of interleaved schedules
are torch.distributed.pipelining's (see ``planner.cost.schedule`` for the op orders).
"""

from __future__ import annotations

import numpy as np

from exatrain.layout_arrays import among
from exatrain.accounting.vorders import v_peak_in_flight
from exatrain.settings import SCHEDULES, V_SCHEDULES

_ZBH1, _ZERO_BUBBLE = SCHEDULES.index("zbh1"), SCHEDULES.index("zero_bubble")
_V_CODES = [SCHEDULES.index(s) for s in V_SCHEDULES]


def group_size(pp: int, m: int) -> int:
    """Micro-batches per interleaving group: the smallest divisor of m that is >= pp (m when m < pp).
    This is torch's rule (rounds = m // pp, m // rounds per round; = pp when pp divides m) wherever
    torch accepts m, and keeps groups equal and >= pp, without which the order can deadlock."""
    if m <= pp:
        return m
    return next(g for g in range(pp, m + 1) if m % g == 0)


def schedule_codes(schedule, shape) -> np.ndarray:
    """Indices into SCHEDULES of one schedule name or an array of names (or indices), broadcast to ``shape``."""
    if isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
        return np.full(shape, SCHEDULES.index(schedule))
    names = np.asarray(schedule)
    if names.dtype.kind in "iu":
        codes = names
    else:
        lookup = {s: i for i, s in enumerate(SCHEDULES)}
        bad = sorted(set(names.ravel().tolist()) - set(lookup))
        if bad:
            raise ValueError(f"unknown schedule(s) {bad}; choose among {', '.join(SCHEDULES)}")
        codes = np.vectorize(lookup.__getitem__, otypes=[int])(names)
    return np.broadcast_to(codes, shape)


def closed_form_codes(code: np.ndarray) -> np.ndarray:
    """Schedule codes as the closed forms know them: zbh1 runs zero_bubble's order over one stage per rank."""
    return np.where(np.asarray(code) == _ZBH1, _ZERO_BUBBLE, code)


def group_sizes(pp: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``group_size`` elementwise: m or pp in closed form, the rest once per distinct (pp, m)."""
    pp, m = np.broadcast_arrays(np.asarray(pp, dtype=np.int64), np.asarray(m, dtype=np.int64))
    g = np.where(m <= pp, m, pp)
    odd = (m > pp) & (m % pp != 0)
    if odd.any():
        keys, inverse = np.unique(pp[odd] * (int(m.max()) + 1) + m[odd], return_inverse=True)
        sizes = np.array([group_size(int(k // (m.max() + 1)), int(k % (m.max() + 1))) for k in keys])
        g = g.copy()
        g[odd] = sizes[np.ravel(inverse)]
    return g


def peak_in_flight_fast(*, pp, num_microbatches, schedule, interleave=1, rank=0) -> np.ndarray:
    """Peak (micro-batch, virtual stage) activation sets held by pipeline rank ``rank`` (default 0,
    the largest), vectorised; equals ``simulate(...).peak_in_flight[rank]``. Divide by v for
    full-stage units: 1F1B's rank 0 holds min(p, m); GPipe m; interleaved min((v-1)g + 2p - 1, m v)
    = p + (p-1)/v stages when g = p (Narayanan et al. 2021 Sec. 2.2.2: p (1 + (p-1)/(p v))); zero
    bubble min((v-1) g + p, m v), i.e. p stages, the same as 1F1B, as ZB-H1 is designed to hold (zbh1, its v = 1
    case, too); zbv and dualpipev count their op orders (``accounting.vorders``): zbv's rank 0 holds 2p
    chunk-sets (p stages), dualpipev's 2p + 1 (DeepSeek-V3's PP + 1)."""
    p = np.asarray(pp, dtype=np.int64)
    v = np.asarray(interleave, dtype=np.int64)
    m = np.asarray(num_microbatches, dtype=np.int64)
    r = np.asarray(rank, dtype=np.int64)
    shape = np.broadcast_shapes(p.shape, v.shape, m.shape, r.shape)
    p, v, m, r = (np.broadcast_to(x, shape) for x in (p, v, m, r))
    code = closed_form_codes(schedule_codes(schedule, shape))
    isv = among(code, _V_CODES)
    n = m * v
    g = group_sizes(p, m)
    w = np.choose(np.where(isv, 0, code), [n, p - 1 - r, (v - 1) * g + 2 * (p - 1 - r), (v - 1) * g + (p - 1 - r)])
    w = np.minimum(w, n)
    held = np.where(code == _ZERO_BUBBLE, w + 1 + np.minimum(r, np.maximum(n - w - 1, 0)), w + 1)  # + deferred W
    held = np.minimum(held, n)
    if isv.any():  # the V schedules' counts, from their op orders (accounting.vorders), once per distinct case
        flat = isv.ravel()
        keys = np.stack([x.ravel()[flat] for x in (code, p, m, r)], axis=1)
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        counts = np.array([v_peak_in_flight(SCHEDULES[a], b, c, d) for a, b, c, d in uniq.tolist()])
        out = np.array(held, dtype=np.int64).ravel().copy()
        out[flat] = counts[np.ravel(inverse)]
        held = out.reshape(shape)
    return held
