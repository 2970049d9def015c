"""Pipeline step time of many layouts at once, from per-virtual-stage times (numpy, no per-op loop).

This is the pipeline term of the cost model (``cost.step``); ``cost.schedule.simulate`` runs the
same op orders op by op and is its oracle (and draws the timelines). Inputs per candidate: F[k],
B[k], W[k], seconds per micro-batch of each virtual stage k (its real layer split, the embedding on
stage 0 and the head on the last), and c, the send/recv time of one stage boundary; the op orders
and dependencies are the simulator's (its module docstring).

The makespan is the longest path through the op graph. Two lower bounds of it are evaluated and
the larger is taken, so the result is never above the simulation:

1. **Paths that change rank only at the first or the last micro-batch.** The key ops are every
   forward, backward and weight pass of micro-batches 0 and m-1 on every stage (6 v per rank at
   most). Where a key op sits in its rank's order, and how much work the rank does before it, is
   closed-form arithmetic on the schedule's op order (warm-up forwards, steady one-forward-one-
   backward, deferred weight passes, micro-batch groups of interleaving): ``_key_ops``. A path
   reaches a key op either along its rank (the previous key op there plus the work in between) or
   across ranks (the same micro-batch's previous forward, or next backward, plus c); within one
   chunk and micro-batch the cross-rank recurrence val[r] = max(D[r], val[r-1] + c + F[r]) is a
   running maximum (``np.maximum.accumulate``). Dependencies between micro-batch 0 and m-1 run
   both ways on a rank (a small m puts the last forward before the first backward), so the
   recurrences are swept until no value changes (two to six sweeps).
   GPipe's critical path (a forward staircase and a backward one, Narayanan et al. 2021 Sec. 2.2)
   and 1F1B's fill / slowest-stage / drain paths at c = 0 are of this kind, so those are exact.
2. **The uniform pipeline of the smallest stage** (``schedule.step_time_fast`` on the per-stage
   minima of F, B and W): the makespan cannot fall when a duration grows, so this bounds the real
   pipeline from below, and it carries the latency terms of steady states that change rank at
   every micro-batch (1F1B's 2c per micro-batch when stages are equal), which bound 1 misses.

Measured against ``simulate`` over random plans of the search space (tests/planner/test_cost_model.py
states the bounds): GPipe exact; elsewhere the error is one-sided (never above the simulation) and
largest for interleaved schedules whose chunks are unequal (the balanced split gives spare layers
to the first chunk), where the critical path changes rank at every micro-batch group.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from exatrain.layout_arrays import among
from exatrain.accounting.inflight import closed_form_codes, group_sizes, schedule_codes
from exatrain.accounting.vorders import steady_from
from exatrain.settings import SCHEDULES, V_SCHEDULES
from exatrain.planner.cost.schedule import simulate_many, step_time_fast

_ZERO_BUBBLE = SCHEDULES.index("zero_bubble")
_V_CODES = [SCHEDULES.index(s) for s in V_SCHEDULES]
MAX_SWEEPS = 64  # the sweeps stop as soon as nothing changes (two to six); a safety bound


@dataclass(frozen=True, eq=False)
class PipelineTimes:
    """Per candidate: the step (makespan), and per pipeline rank when it finishes (a lower bound:
    its last key op's path plus the work after it) and how long it is busy, in seconds."""

    step_s: np.ndarray  # (N,)
    rank_end_s: np.ndarray  # (N, pp)
    busy_s: np.ndarray  # (N, pp)


def _chunk_prefix(X: np.ndarray, E: np.ndarray, g: np.ndarray, v: int) -> np.ndarray:
    """Seconds of the first E entries of the micro-batch table on each rank, where an entry of
    chunk c takes X[:, c, r]. The table runs groups of g micro-batches through chunks 0..v-1
    (``schedule._chunk_table``), so E entries hold q = E // (g v) whole groups and then whole chunks
    of the last group and part of one. X (N, v, p); E (N, p, K) entry counts; g (N, 1) -> (N, p, K)."""
    N, _, p = X.shape
    g = g[:, :, None]
    gv = g * v
    q = E // gv
    rest = E - q * gv
    k = np.minimum(rest // g, v - 1)
    Xt = X.transpose(0, 2, 1)  # (N, p, v)
    C = np.concatenate([np.zeros((N, p, 1)), np.cumsum(Xt, axis=2)], axis=2)  # (N, p, v + 1)
    row = np.arange(N * p).reshape(N, p, 1)
    return (
        q * g * C[:, :, v:]
        + g * C.reshape(-1)[row * (v + 1) + k]
        + (rest - k * g) * np.ascontiguousarray(Xt).reshape(-1)[row * v + k]
    )


def _key_ops(code, p: int, v: int, m, split):
    """For each key op (kind, micro-batch 0 or m-1, chunk), per candidate and rank: how many
    forwards, backwards and weight passes the rank runs up to and including it (entry counts of
    the micro-batch table). Closed forms of ``schedule._order_from_table``: a rank runs w warm-up
    forwards, then steady steps b of F(w+b), B(b) and (zero bubble, from step d = rank on) W(b-d),
    then the remaining backwards; deferred weight passes run last."""
    N = m.shape[0]
    n = m * v
    g = group_sizes(np.full_like(m, p), m)
    r = np.arange(p)[None, :]
    zero = np.zeros((N, p), dtype=np.int64)
    w = np.choose(
        np.broadcast_to(code, (N, p)),
        [
            n + zero,  # gpipe: every forward first
            np.minimum(p - 1 - r, n),  # 1f1b (Narayanan et al. 2021 Sec. 2.2.1)
            np.minimum((v - 1) * g + 2 * (p - 1 - r), n),  # interleaved (torch _get_warmup_ops)
            np.minimum((v - 1) * g + (p - 1 - r), n),
        ],
    )  # zero bubble
    d = np.where(split, np.minimum(r, n), n)
    ops = {}
    for last in (False, True):
        j = (m - 1) if last else (0 * m)
        first = (j // g) * g * v + j % g + zero  # table entry of micro-batch j in chunk 0
        for u in range(v):  # forward of chunk u
            i = first + u * g
            ops["F", last, u] = (i + 1, np.maximum(i - w, 0), np.where(split, np.maximum(i - w - d, 0), zero))
        for u in range(v):  # backward of chunk u: the entry of table chunk v-1-u
            b = first + (v - 1 - u) * g
            ops["B", last, u] = (np.minimum(w + b + 1, n), b + 1, np.where(split, np.maximum(b - d, 0), zero))
        for u in range(v):  # weight pass of chunk u: after B(b + d), or flushed at the end (the last d)
            b = first + (v - 1 - u) * g
            early = b + d < n
            ops["W", last, u] = (
                np.where(early, np.minimum(w + b + d + 1, n), n),
                np.where(early, b + d + 1, n),
                np.where(split, b + 1, zero),
            )
    return ops, g, n


@dataclass(frozen=True, eq=False)
class _Order:
    """What the op orders fix, whatever the durations: the key ops, the entry counts (forwards,
    backwards, weight passes) each rank has run up to and including each of them (last column: the
    whole step), and the key op just before each on its rank (flat indices into an (N, p, K + 1)
    array whose last column stands for the rank's start)."""

    keys: tuple
    counts: tuple  # 3 x (N, p, K + 1)
    prev: np.ndarray  # (N, p, K)
    g: np.ndarray  # (N, 1) micro-batches per interleaving group


def _order(code: np.ndarray, p: int, v: int, m: np.ndarray) -> _Order:
    N = m.shape[0]
    split = code == _ZERO_BUBBLE
    ops, g, n = _key_ops(code, p, v, m, split)
    zero = np.zeros((N, p), dtype=np.int64)
    keys = tuple(k for k in ops if k[0] != "W" or split.any())
    K = len(keys)
    counts = tuple(
        np.stack([ops[k][x] for k in keys] + [n + zero if x < 2 else np.where(split, n, 0) + zero], axis=-1)
        for x in range(3)
    )
    # Index of each key op in its rank's order; schedules without weight passes sort theirs last,
    # where they precede nothing.
    pos = np.where(
        split[:, :, None] | np.array([k[0] != "W" for k in keys]),
        counts[0][..., :K] + counts[1][..., :K] + counts[2][..., :K] - 1,
        4 * n[:, :, None],
    )
    order = np.argsort(pos, axis=-1, kind="stable")
    prev = np.empty_like(order)
    np.put_along_axis(prev, order, np.concatenate([np.full((N, p, 1), K), order[..., :-1]], axis=-1), axis=-1)
    return _Order(keys=keys, counts=counts, prev=prev + (np.arange(N * p) * (K + 1)).reshape(N, p, 1), g=g)


@lru_cache(maxsize=4096)
def _order_of_few(codes: tuple, p: int, v: int, ms: tuple) -> _Order:
    """``_order`` for a handful of layouts (a single plan), remembered: estimates of the same shape
    repeat in calibration and tuning loops."""
    return _order(np.array(codes).reshape(-1, 1), p, v, np.array(ms, dtype=np.int64).reshape(-1, 1))


def pipeline_times(
    forward_s, backward_s, weight_s, *, pp: int, interleave: int, num_microbatches, schedule, p2p_s
) -> PipelineTimes:
    """Step time of N candidates that share pp and interleave (so S = pp * interleave stages).

    forward_s, backward_s, weight_s: (N, S) seconds per micro-batch of each virtual stage (the
    backward split as in ``simulate``: schedules that do not split it run B + W as one op);
    num_microbatches, p2p_s: (N,); schedule: a name or (N,) names / indices into SCHEDULES."""
    F = np.asarray(forward_s, dtype=np.float64)
    N, S = F.shape
    p, v = int(pp), int(interleave)
    if S != p * v:
        raise ValueError(f"{S} stage times for pp {p} x interleave {v}")
    m = np.asarray(num_microbatches, dtype=np.int64).reshape(N, 1)
    code = schedule_codes(schedule, (N,)).reshape(N, 1)
    c = np.where(p > 1, np.broadcast_to(np.asarray(p2p_s, dtype=np.float64), (N,)), 0.0).reshape(N, 1)
    B = np.broadcast_to(np.asarray(backward_s, dtype=np.float64), (N, S))
    W = np.broadcast_to(np.asarray(weight_s, dtype=np.float64), (N, S))
    isv = among(code[:, 0], _V_CODES)
    if isv.any():  # the V schedules are simulated; the rest take the closed forms below
        return _with_v(F, B, W, c, code, m, p, v, isv)
    return _closed_form(F, B, W, c, code, m, p, v)


def _with_v(F, B, W, c, code, m, p: int, v: int, isv) -> PipelineTimes:
    """``pipeline_times`` where some layouts (``isv``) run a V schedule (``_v_times``), the others its closed
    form."""
    N = len(isv)
    step, rank_end, busy = np.zeros(N), np.zeros((N, p)), np.zeros((N, p))
    step[isv], rank_end[isv], busy[isv] = _v_times(F[isv], B[isv], W[isv], c[isv, 0], code[isv, 0], p, m[isv, 0])
    if not isv.all():
        o = ~isv
        rest = pipeline_times(
            F[o], B[o], W[o], pp=p, interleave=v, num_microbatches=m[o, 0], schedule=code[o, 0], p2p_s=c[o, 0]
        )
        step[o], rank_end[o], busy[o] = rest.step_s, rest.rank_end_s, rest.busy_s
    return PipelineTimes(step_s=step, rank_end_s=rank_end, busy_s=busy)


def _closed_form(F, B, W, c, code, m, p: int, v: int) -> PipelineTimes:
    """``pipeline_times`` of the looped schedules: each rank's key ops relaxed along the stages (``_relax``) until
    nothing changes, each rank's end its latest key op plus the work after it; never under the uniform-stage
    closed form (``step_time_fast`` of the fastest stage)."""
    N, S = F.shape
    code = closed_form_codes(code)
    split = code == _ZERO_BUBBLE
    Fv = F.reshape(N, v, p)  # stage k = chunk * p + rank
    Bv = np.where(split, B, B + W).reshape(N, v, p)
    Wv = np.where(split, W, 0.0).reshape(N, v, p)
    order = (
        _order_of_few(tuple(code.ravel().tolist()), p, v, tuple(m.ravel().tolist()))
        if N <= 4
        else _order(code, p, v, m)
    )
    keys, counts, g = order.keys, order.counts, order.g
    K = len(keys)
    # The work before each key op: the times of the entries run up to it (a backward entry of table
    # chunk c runs stage chunk v-1-c, hence the reversed chunk axis).
    work = (
        _chunk_prefix(Fv, counts[0], g, v)
        + _chunk_prefix(Bv[:, ::-1], counts[1], g, v)
        + _chunk_prefix(Wv[:, ::-1], counts[2], g, v)
    )
    before, busy = work[..., :K], work[..., K]  # (N, p, K) up to and including each op; (N, p)
    # Cross-rank sums along the stages (stage k = chunk * p + rank; rank p-1 hands on to rank 0 of
    # the next chunk): a forward from stage s reaches stage k >= s after sum_{s<l<=k} (c + F[l]);
    # a backward from stage s reaches k <= s after sum_{k<=l<s} (c + B[l]).
    a = c + F
    a[:, 0] = 0.0
    fwd = np.cumsum(a, axis=1)
    bwd = np.concatenate([np.zeros((N, 1)), np.cumsum(c + Bv.reshape(N, S)[:, :-1], axis=1)], axis=1)
    slack = _relax(keys, order.prev, before, split, fwd, bwd, p, v)
    # A rank ends no earlier than any key op's path plus the work left after it.
    rank_end = slack.max(axis=-1) + busy
    uniform = step_time_fast(
        F.min(axis=1),
        B.min(axis=1),
        weight_s=W.min(axis=1),
        p2p_s=c[:, 0],
        pp=p,
        num_microbatches=m[:, 0],
        schedule=code[:, 0],
        interleave=v,
    ).step_s
    return PipelineTimes(step_s=np.maximum(rank_end.max(axis=1), uniform), rank_end_s=rank_end, busy_s=busy)


def _relax(keys, prev, before, split, fwd, bwd, p: int, v: int) -> np.ndarray:
    """(N, p, K + 1) each key op's start less the work before it on its rank (0: from the rank's start), swept
    wave by wave (one micro-batch's key ops of one kind, chunk by chunk) until nothing changes."""
    N, K = before.shape[0], len(keys)
    start = {k[:2]: i for i, k in reversed(list(enumerate(keys)))}  # first column of each wave
    slack = np.zeros((N, p, K + 1))  # val - before per key op; 0 = "from the rank's start"
    flat = slack.reshape(-1)
    waves = [(kind, last) for last in (False, True) for kind in "FBW" if (kind, last) in start]
    for _ in range(MAX_SWEEPS):
        old = slack.copy()
        for kind, last in waves:
            for u in range(v - 1, -1, -1) if kind == "B" else range(v):
                i = start[kind, last] + u
                D = flat[prev[..., i]] + before[..., i]  # along the rank: (N, p)
                if kind == "W":  # a weight pass has no dependency on another rank
                    slack[..., i] = np.where(split, D, 0.0) - before[..., i]
                    continue
                val = (
                    _forward_val(D, slack, before, fwd, i, u, p)
                    if kind == "F"
                    else _backward_val(D, slack, before, bwd, i, u, p, v)
                )
                slack[..., i] = val - before[..., i]
        if np.array_equal(slack, old):
            break
    return slack


def _forward_val(D, slack, before, fwd, i: int, u: int, p: int) -> np.ndarray:
    """A forward wave's key ops of chunk ``u``: val[k] = max_{s<=k} D[s] + fwd[k] - fwd[s], from the previous
    chunk's end."""
    k = slice(u * p, (u + 1) * p)
    if u:
        D[:, 0] = np.maximum(
            D[:, 0],
            slack[:, p - 1, i - 1] + before[:, p - 1, i - 1] + fwd[:, u * p] - fwd[:, u * p - 1],
        )
    return fwd[:, k] + np.maximum.accumulate(D - fwd[:, k], axis=1)


def _backward_val(D, slack, before, bwd, i: int, u: int, p: int, v: int) -> np.ndarray:
    """A backward wave's key ops of chunk ``u``: val[k] = max_{s>=k} D[s] + bwd[s] - bwd[k], from the next
    chunk's start."""
    k = slice(u * p, (u + 1) * p)
    if u < v - 1:
        D[:, p - 1] = np.maximum(
            D[:, p - 1],
            slack[:, 0, i + 1] + before[:, 0, i + 1] + bwd[:, (u + 1) * p] - bwd[:, (u + 1) * p - 1],
        )
    return np.maximum.accumulate((D + bwd[:, k])[:, ::-1], axis=1)[:, ::-1] - bwd[:, k]


def _v_times(F, B, W, c, code, p: int, m) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step, rank end and rank busy seconds of the V schedules (zbv, dualpipev) by ``simulate_many``: exact up to
    ``steady_from(pp) + 2`` micro-batches (for one plan as for a search, so that both agree).
    Beyond, their orders only repeat steady steps: each rank's end grows by what two simulations two
    micro-batches apart measure per micro-batch, or, once its idle time is used up, by its own work (the
    larger of the two). tests/planner/test_vschedules.py measures this against the exact simulation."""
    N = len(m)
    step, end, busy = np.zeros(N), np.zeros((N, p)), np.zeros((N, p))
    m1 = steady_from(p)
    m2 = m1 + 2
    for k in np.unique(code):
        name = SCHEDULES[int(k)]
        small = m <= m2
        for mm in np.unique(m[(code == k) & small]):
            i = (code == k) & (m == mm)
            step[i], end[i], busy[i], _ = simulate_many(
                F[i], B[i], W[i], c[i], pp=p, interleave=2, num_microbatches=int(mm), schedule=name
            )
        i = (code == k) & ~small
        if i.any():
            _, e1, b1, _ = simulate_many(F[i], B[i], W[i], c[i], pp=p, interleave=2, num_microbatches=m1, schedule=name)
            _, e2, _, start = simulate_many(
                F[i], B[i], W[i], c[i], pp=p, interleave=2, num_microbatches=m2, schedule=name
            )
            per_mb = b1 / m1
            busy[i] = per_mb * m[i][:, None]
            extra = (m[i] - m2).astype(float)[:, None]
            end[i] = np.maximum(e2 + extra * (e2 - e1) / 2, start + busy[i])
            step[i] = end[i].max(axis=1)
    return step, end, busy


__all__ = ["PipelineTimes", "pipeline_times"]
