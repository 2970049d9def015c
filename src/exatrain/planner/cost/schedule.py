"""Pipeline schedules, simulated: step time, bubble, activations in flight and a timeline.

Virtual stage k (0 <= k < pp*v) lives on pipeline rank k % pp (looped placement, ``Plan.stages_of_rank``).
Per virtual stage, per micro-batch: forward F[k], backward B[k] and weight-gradient W[k] seconds.
``backward_s`` is the input-gradient pass and ``weight_s`` the weight-gradient pass; schedules that do
not split the backward (gpipe, 1f1b, interleaved) run one backward op of B[k] + W[k], zero_bubble runs
them as separate ops, so one (F, B, W) triple compares every schedule fairly. ``p2p_s[k]`` is the
transfer time across the boundary between stage k and k+1 (activation forward, gradient backward); it
delays the receiver and does not occupy either rank's compute (asynchronous send/recv).

Each rank executes its ops one at a time in the order its schedule dictates; an op starts when its rank
is free and its input has arrived: F(j,k) after F(j,k-1) + p2p, B(j,k) after B(j,k+1) + p2p (the last
stage's B after its own F), W(j,k) after B(j,k). Uneven stages, p2p exposure and the bubble therefore
come out of the simulation. Per-rank orders:

- gpipe: all forwards, then all backwards in micro-batch order (torch ``ScheduleGPipe``).
- 1f1b: pp-rank-1 warm-up forwards, then one forward / one backward, then the remaining backwards
  (Narayanan et al. 2021, Sec. 2.2.1; torch ``Schedule1F1B``).
- interleaved: Megatron's interleaved 1F1B over v chunks (Narayanan et al. 2021, Sec. 2.2.2; torch
  ``ScheduleInterleaved1F1B``): micro-batches in groups of g (``group_size``, = pp when pp divides m),
  each group through chunks 0..v-1 forward and v-1..0 backward; warm-up (v-1)*g + 2*(pp-1-rank).
- zero_bubble: torch ``ScheduleInterleavedZeroBubble`` (Qi et al. 2023, "Zero Bubble Pipeline
  Parallelism"; ZB-H1's rule on the interleaved order): warm-up (v-1)*g + (pp-1-rank) forwards, steady
  F, B(input), W, where rank r defers its first r weight passes (so every rank holds at most as many
  micro-batches as 1F1B's first stage) and flushes them at the end. With v = 1 this is exactly ZB-H1.
- zbh1: zero_bubble's order over one stage per rank (torch ``ScheduleInterleavedZeroBubble`` given one stage).
- zbv, dualpipev: torch ``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV`` over two stages per rank placed in a
  V (stage r and 2 pp - 1 - r on rank r, so the boundary between stages pp - 1 and pp costs no transfer); their
  orders are ``accounting.vorders``'. dualpipev runs some backwards whole (input and weight gradient in one op)
  and pairs of one chunk's forward with the other's backward, one after the other as torch runs them.

``simulate`` is exact and returns the timeline: it evaluates the op graph in rounds vectorised over
ranks (about ops-per-rank + 2*pp rounds), 0.04 s for pp 64, m 1,536 (1F1B) and 0.1-0.15 s with v = 2
on a 2-core CPU (benchmarks/schedule_speed.py): the timeline pictures, and the oracle of the cost
model's closed-form pipeline term (``cost.pipeline``). ``step_time_fast`` (``cost.closed_form``) is a vectorised
closed form (uniform stages, optionally a different first and last), which ``cost.pipeline`` uses on the smallest
stage as one of its lower bounds; ``peak_in_flight_fast`` (``accounting.inflight``) the activations in
flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple, Sequence, Union

import numpy as np

from exatrain.accounting.inflight import group_size
from exatrain.accounting.vorders import v_order, v_rank_of_stages
from exatrain.planner.cost.closed_form import FastStepTimes, step_time_fast
from exatrain.settings import SCHEDULES, V_SCHEDULES

Times = Union[float, Sequence[float], np.ndarray]
_V_CODES = [SCHEDULES.index(s) for s in V_SCHEDULES]
KINDS = ("F", "B", "W")


class Event(NamedTuple):
    """One op of the timeline: which rank ran which pass of which micro-batch and stage, and when."""

    rank: int
    kind: str  # 'F' forward, 'B' backward (input gradient; whole backward unless zero_bubble), 'W' weight
    microbatch: int
    virtual_stage: int
    start_s: float
    end_s: float


@dataclass(frozen=True, eq=False)
class Timeline:
    """Every op of one simulated step as parallel arrays (one entry per op, grouped by rank in
    execution order); ``events()`` gives them as ``Event`` tuples for the timeline picture."""

    rank: np.ndarray
    kind: np.ndarray  # 0 = F, 1 = B, 2 = W
    microbatch: np.ndarray
    virtual_stage: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray

    def __len__(self) -> int:
        return len(self.rank)

    def events(self) -> list[Event]:
        return [
            Event(r, KINDS[k], j, s, a, b)
            for r, k, j, s, a, b in zip(
                self.rank.tolist(),
                self.kind.tolist(),
                self.microbatch.tolist(),
                self.virtual_stage.tolist(),
                self.start_s.tolist(),
                self.end_s.tolist(),
            )
        ]


@dataclass(frozen=True)
class ScheduleResult:
    """One simulated optimizer step of the pipeline (one data-parallel replica).

    ``step_s`` runs from the first op's start to the last op's end. ``bubble_s`` = step_s - the busiest
    rank's compute (so step = compute + bubble, as in ``TimeBreakdown``); ``idle_s`` is each rank's own.
    ``peak_in_flight[r]``: most (micro-batch, virtual stage) activation sets rank r holds at once, counted
    from the start of a forward to the end of the pass that frees it (B, or W for zero_bubble, whose
    weight pass still reads the saved inputs); divide by v for units of one full stage's activations.
    """

    schedule: str
    pp: int
    interleave: int
    num_microbatches: int
    step_s: float
    bubble_s: float
    busy_s: tuple[float, ...]
    idle_s: tuple[float, ...]
    peak_in_flight: tuple[int, ...]
    peak_in_flight_by_stage: tuple[int, ...]
    timeline: Timeline = field(repr=False, compare=False)

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def peak_in_flight_stage_units(self) -> tuple[float, ...]:
        return tuple(n / self.interleave for n in self.peak_in_flight)


# ---- inputs ----------------------------------------------------------------------------------------


def _check_shape(schedule: str, pp: int, v: int, m: int) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    for name, x in (("pp", pp), ("interleave", v), ("num_microbatches", m)):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
            raise ValueError(f"{name} must be a positive integer, got {x!r}")
    if schedule in ("gpipe", "1f1b", "zbh1") and v != 1:
        raise ValueError(
            f"schedule {schedule} runs one stage per rank; interleave {v} needs interleaved or zero_bubble"
        )
    if schedule in V_SCHEDULES and (v != 2 or pp < 2):
        raise ValueError(f"schedule {schedule} places 2 stages on each of 2 or more ranks; got pp {pp}, interleave {v}")
    if schedule == "dualpipev" and m < 2 * pp:
        raise ValueError(f"dualpipev needs at least 2 pp = {2 * pp} micro-batches, got {m}")


def _base(schedule: str) -> str:
    """The looped schedule whose op order ``schedule`` runs: zbh1 is zero_bubble over one stage per rank."""
    return "zero_bubble" if schedule == "zbh1" else schedule


def _per_stage(x: Times, n: int, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        a = np.full(n, float(a))
    if a.shape != (n,):
        raise ValueError(f"{name} needs a scalar or {n} values, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name} must be finite and >= 0")
    return a


# ---- per-rank op orders ------------------------------------------------------------------------------


def _chunk_table(m: int, v: int, g: int) -> tuple[np.ndarray, np.ndarray]:
    """(chunk, micro-batch) of each forward of a rank in order: each group of g micro-batches runs
    through chunk 0..v-1 (Megatron-core ``get_schedule_table``)."""
    chunks, mbs = [], []
    for s in range(0, m, g):
        e = min(s + g, m)
        for c in range(v):
            chunks.append(np.full(e - s, c))
            mbs.append(np.arange(s, e))
    return np.concatenate(chunks), np.concatenate(mbs)


def warmup_forwards(schedule: str, rank: int, pp: int, v: int, m: int) -> int:
    """Forwards a rank runs before its first backward (warm-up), capped at all its forwards."""
    n = m * v
    schedule = _base(schedule)
    if schedule == "gpipe":
        return n
    if schedule == "1f1b":
        return min(pp - 1 - rank, n)  # Narayanan et al. 2021, Sec. 2.2.1
    g = group_size(pp, m)
    factor = 2 if schedule == "interleaved" else 1  # torch _get_warmup_ops multiply_factor
    return min((v - 1) * g + factor * (pp - 1 - rank), n)


def rank_order(schedule: str, rank: int, pp: int, v: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(kind, virtual stage, micro-batch) of every op of ``rank`` in execution order."""
    _check_shape(schedule, pp, v, m)
    if schedule in V_SCHEDULES:
        return v_order(schedule, rank, pp, m)[:3]
    return _order_from_table(schedule, rank, pp, v, *_chunk_table(m, v, group_size(pp, m)))


def _order_from_table(
    schedule: str, rank: int, pp: int, v: int, chunk: np.ndarray, mb: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(chunk)
    m = n // v
    w = warmup_forwards(schedule, rank, pp, v, m)
    split = _base(schedule) == "zero_bubble"
    d = min(rank, n) if split else n  # weight passes deferred (torch num_1f1b_microbatches = rank)
    idx = np.arange(n)
    # Steady step b runs F(w+b), B(b) and, from step d on, W(b-d); cool-down steps b >= n-w run B(b), W.
    w_before = np.maximum(0, idx - d) if split else np.zeros(n, int)  # W ops issued before step b
    b_pos = np.where(idx < n - w, w + 2 * idx + 1, n + idx) + w_before
    f_step = np.maximum(idx - w, 0)
    f_pos = np.where(idx < w, idx, w + 2 * f_step + w_before[np.minimum(f_step, n - 1)])
    total = 3 * n if split else 2 * n
    kind = np.empty(total, np.int64)
    stage = np.empty(total, np.int64)
    micro = np.empty(total, np.int64)
    kind[f_pos], stage[f_pos], micro[f_pos] = 0, chunk * pp + rank, mb
    bstage = (v - 1 - chunk) * pp + rank
    kind[b_pos], stage[b_pos], micro[b_pos] = 1, bstage, mb
    if split:
        widx = np.arange(n)  # W of the widx-th backward: after step widx + d's B, or flushed at the end
        w_pos = np.where(widx + d < n, b_pos[np.minimum(widx + d, n - 1)] + 1, 2 * n + widx)
        kind[w_pos], stage[w_pos], micro[w_pos] = 2, bstage, mb
    return kind, stage, micro


# ---- exact simulation --------------------------------------------------------------------------------

PAD = 3  # an op slot past a rank's last op (ranks of the V schedules run different numbers of ops)


def _orders(schedule: str, p: int, v: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(kind, stage, micro-batch, full) of every rank's ops as (pp, L) arrays, padded with PAD; ``full``
    marks a backward that also runs the weight gradient (every backward of an unsplit schedule)."""
    if schedule in V_SCHEDULES:
        per = [v_order(schedule, r, p, m) for r in range(p)]
    else:
        chunk, mb = _chunk_table(m, v, group_size(p, m))
        split = _base(schedule) == "zero_bubble"
        per = []
        for r in range(p):
            k, st, j = _order_from_table(schedule, r, p, v, chunk, mb)
            per.append((k, st, j, (k == 1) & (not split)))
    L = max(len(x[0]) for x in per)
    out = (
        np.full((p, L), PAD, np.int64),
        np.zeros((p, L), np.int64),
        np.zeros((p, L), np.int64),
        np.zeros((p, L), bool),
    )
    for r, ops in enumerate(per):
        for a, x in zip(out, ops):
            a[r, : len(x)] = x
    return out


def rank_of_stages(schedule: str, p: int, v: int) -> np.ndarray:
    """The pipeline rank of each of the p v stages: looped (k % pp), or V (``accounting.vorders``)."""
    return v_rank_of_stages(p) if schedule in V_SCHEDULES else np.arange(p * v) % p


@dataclass(frozen=True, eq=False)
class _Graph:
    """The op graph of one (schedule, pp, v, m): each rank's ops, the flat position of the op each waits on
    (``dep``), which stage boundary its input crosses (-1: none, or one on the same rank)."""

    kind: np.ndarray
    stage: np.ndarray
    full: np.ndarray
    micro: np.ndarray
    dep: np.ndarray  # (p, L + 1) flat positions; p (L + 1): never ready, p (L + 1) + 1: no dependency
    boundary: np.ndarray  # (p, L + 1)


@lru_cache(maxsize=64)
def _graph(schedule: str, p: int, v: int, m: int) -> _Graph:
    kind, stage, micro, full = _orders(schedule, p, v, m)
    S = p * v
    L = kind.shape[1]
    Lp = L + 1
    real = kind != PAD
    # Each op waits on one op elsewhere: F(j,k) on F(j,k-1); B(j,k) on B(j,k+1), the last stage's B on its
    # own F. W(j,k) follows its B on the same rank by construction of the order.
    has = real & (((kind == 0) & (stage > 0)) | (kind == 1))
    dep_ks = np.where(kind == 0, stage - 1, np.where(stage < S - 1, S + stage + 1, stage))
    ident = np.where(real, kind * S + stage, 0) * m + micro
    pos_of = np.full(3 * S * m, -1, np.int64)
    pos_of[ident[real]] = np.arange(p * Lp).reshape(p, Lp)[:, :L][real]
    never, none = p * Lp, p * Lp + 1
    dep = np.full((p, Lp), never, np.int64)
    dep[:, :L] = np.where(has, pos_of[np.where(has, dep_ks * m + micro, 0)], none)
    ranks = rank_of_stages(schedule, p, v)
    cross = np.concatenate([ranks[:-1] != ranks[1:], [False]])  # boundary b (stage b to b+1) changes rank
    b = np.where(kind == 0, stage - 1, stage)
    boundary = np.full((p, Lp), -1, np.int64)
    valid = has & ~((kind == 1) & (stage == S - 1))
    boundary[:, :L] = np.where(valid & cross[np.clip(b, 0, S - 1)], b, -1)
    return _Graph(kind=kind, stage=stage, full=full, micro=micro, dep=dep, boundary=boundary)


def _durations(g: _Graph, F: np.ndarray, B: np.ndarray, W: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate (rows of F, B, W (N, S) and c (N, S - 1)): every op's duration and input latency, flat
    (N, p (L + 1))."""
    N = F.shape[0]
    p, L = g.kind.shape
    st = g.stage
    dur = np.zeros((N, p, L + 1))
    dur[:, :, :L] = np.where(
        g.kind == 0, F[:, st], np.where(g.kind == 1, B[:, st] + g.full * W[:, st], np.where(g.kind == 2, W[:, st], 0.0))
    )
    cpad = np.concatenate([c, np.zeros((N, 1))], axis=1)
    lat = np.where(g.boundary >= 0, cpad[:, np.maximum(g.boundary, 0)], 0.0)
    return dur.reshape(N, -1), lat.reshape(N, -1)


def simulate(
    forward_s: Times,
    backward_s: Times,
    *,
    pp: int,
    num_microbatches: int,
    schedule: str = "1f1b",
    interleave: int = 1,
    weight_s: Times = 0.0,
    p2p_s: Times = 0.0,
) -> ScheduleResult:
    """Simulate one step of ``schedule`` op by op (see the module docstring for the model).

    forward_s, backward_s, weight_s: seconds per micro-batch for each of the pp*interleave virtual
    stages (or one scalar for all); p2p_s: seconds per stage boundary (pp*interleave - 1 values, or
    a scalar), applied only between stages on different ranks.
    """
    p, v, m = pp, interleave, num_microbatches
    _check_shape(schedule, p, v, m)
    S = p * v
    F = _per_stage(forward_s, S, "forward_s")
    B = _per_stage(backward_s, S, "backward_s")
    W = _per_stage(weight_s, S, "weight_s")
    c = _per_stage(p2p_s, S - 1, "p2p_s") if S > 1 else np.zeros(0)
    g = _graph(schedule, p, v, m)
    dur, lat = _durations(g, F[None], B[None], W[None], c[None])
    L = g.kind.shape[1]
    end = _run(p, L, g.dep.ravel(), lat, dur)[0].reshape(p, L + 1)[:, :L]
    dur = dur[0].reshape(p, L + 1)[:, :L]
    real = g.kind != PAD
    start = end - dur
    step = float(end[real].max() - start[real].min())
    busy = dur.sum(axis=1)
    delta = (g.kind == 0).astype(np.int32) - (g.kind == 2) - ((g.kind == 1) & g.full)
    by_stage = np.zeros(S, np.int64)
    chunk_of = g.stage // p
    for k in range(v):  # activation sets of chunk k held by each rank
        by_stage[k * p : (k + 1) * p] = np.cumsum(np.where(chunk_of == k, delta, 0), axis=1).max(axis=1)
    keep = real.ravel()
    return ScheduleResult(
        schedule=schedule,
        pp=p,
        interleave=v,
        num_microbatches=m,
        step_s=step,
        bubble_s=step - float(busy.max()),
        busy_s=tuple(busy.tolist()),
        idle_s=tuple((step - busy).tolist()),
        peak_in_flight=tuple(np.cumsum(delta, axis=1).max(axis=1).tolist()),
        peak_in_flight_by_stage=tuple(by_stage.tolist()),
        timeline=Timeline(
            np.repeat(np.arange(p), L)[keep],
            g.kind.ravel()[keep],
            g.micro.ravel()[keep],
            g.stage.ravel()[keep],
            start.ravel()[keep],
            end.ravel()[keep],
        ),
    )


def simulate_many(
    forward_s: np.ndarray,
    backward_s: np.ndarray,
    weight_s: np.ndarray,
    p2p_s: np.ndarray,
    *,
    pp: int,
    interleave: int,
    num_microbatches: int,
    schedule: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``simulate`` of N candidates that share the op order (schedule, pp, v, m), in one pass: F, B, W (N, S)
    per stage, p2p_s (N,) one boundary. The order fixes when each op's input is ready whatever the durations,
    so the rounds are shared and only the times are per candidate. Returns (step, rank end, rank busy, rank
    start): (N,), (N, pp), (N, pp), (N, pp) seconds."""
    p, v, m = int(pp), int(interleave), int(num_microbatches)
    _check_shape(schedule, p, v, m)
    F = np.asarray(forward_s, dtype=np.float64)
    N, S = F.shape
    c = np.repeat(np.asarray(p2p_s, dtype=np.float64).reshape(N, 1), max(S - 1, 0), axis=1)
    g = _graph(schedule, p, v, m)
    dur, lat = _durations(g, F, np.asarray(backward_s, dtype=np.float64), np.asarray(weight_s, dtype=np.float64), c)
    L = g.kind.shape[1]
    end = _run(p, L, g.dep.ravel(), lat, dur).reshape(N, p, L + 1)[:, :, :L]
    dur = dur.reshape(N, p, L + 1)
    rank_end = end.max(axis=2)
    return rank_end.max(axis=1), rank_end, dur.sum(axis=2), end[:, :, 0] - dur[:, :, 0]


def _run(p: int, L: int, dep: np.ndarray, lat: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """End time of every op (flat position r*(L+1) + i) of N candidates ((N, p (L + 1)) durations and input
    latencies), by rounds: in each round every rank whose next op has its input starts it. Longest-path
    evaluation of the op graph, vectorised over ranks and candidates (whether an input is ready does not
    depend on the durations); the rounds number about L + 2*pp, each a dozen numpy calls on pp-long arrays."""
    N = dur.shape[0]
    if N == 1:
        return _run_one(p, L, dep, lat[0], dur[0])[None]
    end = np.full((N, p * (L + 1) + 2), -1.0)
    end[:, -1] = 0.0  # the "no dependency" slot; end[:, -2] stays -1 ("never")
    cur = np.arange(p) * (L + 1)
    last = cur + L
    free = np.zeros((N, p))
    done_before = -1
    rounds = 0
    while True:
        d = dep[cur]
        adv = end[0, d] >= 0.0
        if adv.any():
            at = cur[adv]
            t = np.maximum(free[:, adv], end[:, d[adv]] + lat[:, at]) + dur[:, at]
            end[:, at] = t
            free[:, adv] = t
            cur = cur + adv
        rounds += 1
        if rounds % 16 == 0:
            done = int(cur.sum())
            if done == int(last.sum()):
                return end[:, :-2]
            if done == done_before:
                stuck = np.flatnonzero(cur != last).tolist()
                raise RuntimeError(f"schedule deadlocks: ranks {stuck} wait on each other (a bug in the op order)")
            done_before = done


def _run_one(p: int, L: int, dep: np.ndarray, lat: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """``_run`` of one candidate on flat arrays (one simulated plan: about twice as fast as the batched path)."""
    end = np.full(p * (L + 1) + 2, -1.0)
    end[-1] = 0.0
    cur = np.arange(p) * (L + 1)
    last = cur + L
    free = np.zeros(p)
    done_before = -1
    rounds = 0
    while True:
        e = end[dep[cur]]
        adv = e >= 0.0
        t = np.maximum(free, e + lat[cur])
        t += dur[cur]
        end[cur] = np.where(adv, t, -1.0)
        np.copyto(free, t, where=adv)
        cur += adv
        rounds += 1
        if rounds % 16 == 0:
            done = int(cur.sum())
            if done == int(last.sum()):
                return end[:-2]
            if done == done_before:
                stuck = np.flatnonzero(cur != last).tolist()
                raise RuntimeError(f"schedule deadlocks: ranks {stuck} wait on each other (a bug in the op order)")
            done_before = done


# ---- vectorised closed forms ----------------------------------------------------------------------


__all__ = [
    "Event",
    "FastStepTimes",
    "KINDS",
    "ScheduleResult",
    "Timeline",
    "group_size",
    "rank_order",
    "simulate",
    "simulate_many",
    "step_time_fast",
]
