"""The pipeline schedule simulator against closed forms, hand-derived numbers and its own invariants,
and the vectorised fast path against the simulator."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from exatrain.accounting.inflight import peak_in_flight_fast
from exatrain.planner.cost.schedule import Event, group_size, rank_order, simulate, step_time_fast

# The looped schedules these closed forms cover (tests/planner/test_vschedules.py: zbh1, zbv, dualpipev).
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero_bubble")

# Stage times that are exact in binary, so closed forms hold to the last bit.
F, B = 1.0, 2.0


def sim(schedule, p, m, v=1, f=F, b=B, w=0.0, c=0.0):
    return simulate(f, b, weight_s=w, p2p_s=c, pp=p, num_microbatches=m, schedule=schedule, interleave=v)


# ---- closed forms for uniform stages --------------------------------------------------------------


@pytest.mark.parametrize("p,m", [(1, 1), (1, 5), (2, 2), (2, 7), (4, 4), (4, 8), (4, 13), (8, 32)])
def test_uniform_1f1b_bubble_is_p_minus_1_stage_times(p, m):
    r = sim("1f1b", p, m)
    # Narayanan et al. 2021 Sec. 2.2.1: bubble (p-1)(F+B), i.e. (p-1)/(m+p-1) of the step.
    assert r.step_s == (m + p - 1) * (F + B)
    assert r.bubble_s == (p - 1) * (F + B)
    assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-15)
    assert all(idle == (p - 1) * (F + B) for idle in r.idle_s)  # every rank idles the same


@pytest.mark.parametrize("p,m", [(2, 3), (4, 8), (8, 16), (4, 2)])
def test_uniform_gpipe_same_bubble_but_all_microbatches_in_flight(p, m):
    g, o = sim("gpipe", p, m), sim("1f1b", p, m)
    assert g.bubble_s == o.bubble_s == (p - 1) * (F + B)
    assert g.peak_in_flight == (m,) * p
    assert o.peak_in_flight[0] == min(p, m)
    assert o.peak_in_flight == tuple(min(p - r, m) for r in range(p))


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 4, 16), (8, 2, 24), (3, 4, 9)])
def test_interleaving_divides_the_bubble_by_v(p, v, m):
    # The same model cut into v chunks per rank: each chunk takes 1/v of a stage's time.
    one = sim("1f1b", p, m)
    inter = sim("interleaved", p, m, v=v, f=F / v, b=B / v)
    assert inter.step_s - one.step_s == -(p - 1) * (F + B) * (1 - 1 / v)
    assert inter.bubble_s == pytest.approx(one.bubble_s / v, rel=1e-14)
    assert sum(inter.busy_s) == pytest.approx(sum(one.busy_s), rel=1e-14)


@pytest.mark.parametrize("p,v,m", [(4, 1, 8), (4, 2, 8), (8, 2, 16), (6, 3, 12), (4, 1, 5)])
def test_zero_bubble_beats_1f1b_and_meets_zb_h1(p, v, m):
    # Full backward 2F split into input and weight gradients of F each (W = B/2).
    bi = w = F
    zb = sim("zero_bubble", p, m, v=v, f=F / v, b=bi / v, w=w / v)
    one = sim("1f1b", p, m, f=F, b=bi + w)
    assert zb.bubble_s < one.bubble_s
    # Qi et al. 2023 Sec. 3.1, ZB-H1: (p-1)(T_F + T_B - T_W) = (p-1) F, a third of 1F1B's 3F(p-1).
    assert zb.bubble_s == pytest.approx((p - 1) * (F + bi - w) / v, rel=1e-14)
    assert one.bubble_s == 3 * (p - 1) * F
    # ...while holding no more than 1F1B's first stage: p stage-units on every rank.
    assert zb.peak_in_flight_stage_units == (float(p),) * p


def test_zero_bubble_bubble_when_w_is_not_the_smallest():
    for f, bi, w in [(1.0, 2.0, 2.0), (2.0, 1.0, 1.5), (1.0, 0.5, 1.0)]:
        r = sim("zero_bubble", 4, 8, v=2, f=f, b=bi, w=w)
        assert r.bubble_s == 3 * max(f + bi - w, f, bi)


def test_single_rank_has_no_bubble():
    for schedule, v in [("gpipe", 1), ("1f1b", 1), ("interleaved", 3), ("zero_bubble", 2)]:
        r = sim(schedule, 1, 5, v=v, w=0.5, c=7.0)
        assert r.bubble_s == 0.0 and r.step_s == 5 * v * (F + B + 0.5)


# ---- uneven stages ----------------------------------------------------------------------------------


def test_slow_middle_stage_paces_1f1b():
    f, b = [1.0, 1.0, 3.0, 1.0], [2.0, 2.0, 6.0, 2.0]  # stage 2 takes 9, the others 3
    r = simulate(f, b, pp=4, num_microbatches=8)
    # Fill to the slow stage (F0 + F1 = 2), it never idles (8 * 9 = 72), drain (B1 + B0 = 4): 78 =
    # (m-1) * 9 + the stage times up to it (3 + 3 + 9). The stage after it hides in its shadow.
    assert r.step_s == 78.0
    assert r.busy_s == (24.0, 24.0, 72.0, 24.0)
    assert r.bubble_s == 6.0 and r.idle_s[2] == 6.0
    # Moving the slow stage up one rank shortens the fill by one stage: 63 + 3 + 9.
    assert simulate([1.0, 3.0, 1.0, 1.0], [2.0, 6.0, 2.0, 2.0], pp=4, num_microbatches=8).step_s == 75.0
    # p2p 0.5: the slow stage's first micro-batch still makes the round trip below it (2 hops),
    # plus the two hops filling and two draining: 78 + 6 * 0.5.
    assert simulate(f, b, pp=4, num_microbatches=8, p2p_s=0.5).step_s == 81.0
    # GPipe: forward flow sum(F) + (m-1) max F, then the backward flow sum(B) + (m-1) max B.
    assert simulate(f, b, pp=4, num_microbatches=8, schedule="gpipe").step_s == 6 + 21 + 12 + 42


# ---- invariants of every timeline ----------------------------------------------------------------


def _random_configs(n, seed=7):
    rnd = random.Random(seed)
    for _ in range(n):
        schedule = rnd.choice(SCHEDULES)
        p = rnd.randint(1, 6)
        v = 1 if schedule in ("gpipe", "1f1b") else rnd.randint(1, 3)
        m = rnd.randint(1, 3 * p + 3)
        S = p * v
        times = [[rnd.choice([0.0, 0.25, 0.5, 1.0, 1.5, 3.0]) for _ in range(S)] for _ in range(3)]
        c = [rnd.choice([0.0, 0.125, 0.5]) for _ in range(S - 1)]
        yield schedule, p, v, m, times, c


@pytest.mark.parametrize("case", list(_random_configs(120)), ids=lambda c: f"{c[0]}-p{c[1]}v{c[2]}m{c[3]}")
def test_timeline_respects_dependencies_and_one_op_per_rank(case):
    schedule, p, v, m, (f, b, w), c = case
    r = simulate(f, b, weight_s=w, p2p_s=c, pp=p, num_microbatches=m, schedule=schedule, interleave=v)
    S, split = p * v, schedule == "zero_bubble"
    events = r.timeline.events()
    assert all(isinstance(e, Event) for e in events)
    ops = {(e.kind, e.virtual_stage, e.microbatch): e for e in events}
    kinds = "FBW" if split else "FB"
    assert len(ops) == len(events) == len(kinds) * S * m  # every op exactly once
    lat = [0.0 if p == 1 else x for x in c]
    eps = 1e-9
    for (kind, k, j), e in ops.items():
        assert e.rank == k % p  # looped placement
        dur = {"F": f[k], "B": b[k] + (0.0 if split else w[k]), "W": w[k]}[kind]
        assert e.end_s - e.start_s == pytest.approx(dur, abs=eps)
        if kind == "F" and k > 0:
            assert e.start_s >= ops["F", k - 1, j].end_s + lat[k - 1] - eps
        if kind == "B":
            assert e.start_s >= ops["F", k, j].end_s - eps
            if k < S - 1:
                assert e.start_s >= ops["B", k + 1, j].end_s + lat[k] - eps
        if kind == "W":
            assert e.start_s >= ops["B", k, j].end_s - eps
    for rank in range(p):
        mine = [e for e in events if e.rank == rank]  # execution order
        for a, z in itertools.pairwise(mine):
            assert z.start_s >= a.end_s - eps  # one op at a time, in the schedule's order
        kind, stage, micro = rank_order(schedule, rank, p, v, m)
        assert [(e.kind, e.virtual_stage, e.microbatch) for e in mine] == [
            ("FBW"[k], s, j) for k, s, j in zip(kind.tolist(), stage.tolist(), micro.tolist())
        ]
        assert r.busy_s[rank] == pytest.approx(sum(e.end_s - e.start_s for e in mine), abs=eps)
    assert r.step_s == pytest.approx(max(e.end_s for e in events) - min(e.start_s for e in events))
    assert r.bubble_s == pytest.approx(r.step_s - max(r.busy_s))
    assert peak_in_flight_fast(
        pp=p, num_microbatches=m, schedule=schedule, interleave=v, rank=np.arange(p)
    ).tolist() == list(r.peak_in_flight)


def test_orders_follow_the_papers():
    def kinds(sch, r, p, v, m):
        return "".join("FBW"[k] for k in rank_order(sch, r, p, v, m)[0])

    assert kinds("gpipe", 0, 4, 1, 3) == "FFFBBB"
    assert kinds("1f1b", 0, 4, 1, 6) == "FFF" + "FB" * 3 + "BBB"  # p-1 warm-up forwards
    assert kinds("1f1b", 3, 4, 1, 6) == "FB" * 6
    # Interleaved, p = 2, v = 2, m = 4: warm-up (v-1)*p + 2*(p-1-rank) = 4 on rank 0; micro-batches
    # in groups of p through chunk 0 then chunk 1 (stages 0 and 2 on rank 0).
    k, s, j = rank_order("interleaved", 0, 2, 2, 4)
    assert "".join("FBW"[x] for x in k) == "FFFF" + "FB" * 4 + "BBBB"
    fwd = [(st, mb) for x, st, mb in zip(k, s, j) if x == 0]
    assert fwd == [(0, 0), (0, 1), (2, 0), (2, 1), (0, 2), (0, 3), (2, 2), (2, 3)]
    # ZB-H1 (v = 1): rank r defers its first r weight passes.
    assert kinds("zero_bubble", 0, 3, 1, 4) == "FF" + "FBW" * 2 + "BW" * 2
    assert kinds("zero_bubble", 2, 3, 1, 4) == "FB" + "FB" * 1 + "FBW" * 2 + "WW"
    assert group_size(4, 8) == 4 and group_size(4, 10) == 5 and group_size(4, 7) == 7
    assert group_size(4, 3) == 3


# ---- activations in flight ----------------------------------------------------------------------


def test_interleaved_in_flight_matches_narayanan():
    for p, v in [(4, 2), (8, 2), (8, 4)]:
        r = sim("interleaved", p, 2 * p, v=v)
        # First rank: (v-1) p + 2(p-1) + 1 chunk-sets = p (1 + (p-1)/(p v)) stages (Sec. 2.2.2).
        assert r.peak_in_flight[0] == (v - 1) * p + 2 * (p - 1) + 1
        assert r.peak_in_flight_stage_units[0] == pytest.approx(p * (1 + (p - 1) / (p * v)))
        assert max(r.peak_in_flight) == r.peak_in_flight[0]
        for rank in range(p):  # per-stage peaks bound the rank's peak from both sides
            mine = [r.peak_in_flight_by_stage[k] for k in range(rank, p * v, p)]
            assert max(mine) <= r.peak_in_flight[rank] <= sum(mine)
    # p = 4, v = 2, m = 8: rank 0 runs chunk 0 of micro-batches 0-7 (stage 0) before its first
    # chunk-0 backward, which waits behind the chunk-1 backwards of micro-batches 0-3.
    assert sim("interleaved", 4, 8, v=2).peak_in_flight_by_stage[0] == 8


def test_peak_in_flight_fast_equals_simulation_over_a_grid():
    for schedule, p, v, m in itertools.product(SCHEDULES, [1, 2, 4, 5], [1, 2, 3], [1, 3, 4, 8, 9]):
        if schedule in ("gpipe", "1f1b") and v > 1:
            continue
        r = sim(schedule, p, m, v=v, w=0.5)
        fast = peak_in_flight_fast(pp=p, num_microbatches=m, schedule=schedule, interleave=v, rank=np.arange(p))
        assert fast.tolist() == list(r.peak_in_flight), (schedule, p, v, m)
        assert fast.max() == fast[0]  # rank 0 holds the most


# ---- the fast path -------------------------------------------------------------------------------


def _uniform_grid():
    """Configurations where step_time_fast claims to equal simulate: gpipe/1f1b always;
    interleaved for m >= p with c <= min(F, B + W)/2; zero_bubble for m >= p with c <= W/2."""
    for schedule, p, v, m, (f, b, w), cf in itertools.product(
        SCHEDULES,
        [1, 2, 3, 4, 8],
        [1, 2, 3],
        [1, 2, 4, 5, 8, 12, 16, 17],
        [(1.0, 2.0, 0.0), (1.0, 1.0, 1.0), (2.0, 0.5, 0.25), (0.5, 1.5, 1.0)],
        [0.0, 0.125, 0.5, 2.0],
    ):
        if schedule in ("gpipe", "1f1b") and v > 1:
            continue
        c = cf * f
        if schedule == "interleaved" and c > 0 and (m < p or c > min(f, b + w) / 2):
            continue
        if schedule == "zero_bubble" and (m < p or c > w / 2):
            continue
        yield schedule, p, v, m, f, b, w, c


def test_fast_equals_simulate_for_uniform_stages():
    grid = list(_uniform_grid())
    assert len(grid) > 1000
    cols = list(zip(*grid))
    fast = step_time_fast(
        np.array(cols[4]),
        np.array(cols[5]),
        weight_s=np.array(cols[6]),
        p2p_s=np.array(cols[7]),
        pp=np.array(cols[1]),
        interleave=np.array(cols[2]),
        num_microbatches=np.array(cols[3]),
        schedule=np.array(cols[0]),
    )
    for i, (schedule, p, v, m, f, b, w, c) in enumerate(grid):
        r = sim(schedule, p, m, v=v, f=f, b=b, w=w, c=c)
        assert fast.step_s[i] == pytest.approx(r.step_s, rel=1e-12), grid[i]
        assert fast.compute_s[i] == pytest.approx(max(r.busy_s), rel=1e-12)
        assert fast.bubble_s[i] == pytest.approx(r.bubble_s, rel=1e-9, abs=1e-9)


def test_fast_is_a_lower_bound_outside_its_exact_range():
    worst = 0.0
    for schedule, p, v, m, cf, w in itertools.product(
        ["interleaved", "zero_bubble"], [2, 4, 6], [2, 3], [6, 8, 12, 13], [0.3, 1.0, 2.0], [0.0, 0.5]
    ):
        r = sim(schedule, p, m, v=v, w=w, c=cf)
        fast = float(
            step_time_fast(F, B, weight_s=w, p2p_s=cf, pp=p, interleave=v, num_microbatches=m, schedule=schedule).step_s
        )
        assert fast <= r.step_s * (1 + 1e-12)
        worst = max(worst, 1 - fast / r.step_s)
    assert worst < 0.62  # the bound the docstring states for p2p up to twice a forward


def test_fast_first_last_stage_error_within_documented_bound():
    rnd = random.Random(3)
    errors = {s: [] for s in SCHEDULES}
    for _ in range(240):
        schedule = SCHEDULES[_ % 4]
        p = rnd.randint(2, 10)
        v = 1 if schedule in ("gpipe", "1f1b") else rnd.randint(2, 4)
        m = rnd.choice([p, 2 * p, 4 * p, p + 1, 2 * p + 3])
        b, w = (1.0, rnd.choice([0.5, 1.0])) if schedule == "zero_bubble" else (2.0, 0.0)
        c = rnd.choice([0.0, 0.05, 0.2])
        first, last = 1 + rnd.choice([-0.5, 0.0, 0.1, 0.3]), 1 + rnd.choice([-0.33, 0.16, 0.67, 2.0])
        S = p * v
        scale = np.ones(S)
        scale[0], scale[-1] = first, last
        r = simulate(
            F * scale, b * scale, weight_s=w * scale, p2p_s=c, pp=p, num_microbatches=m, schedule=schedule, interleave=v
        )
        fast = step_time_fast(
            F,
            b,
            weight_s=w,
            p2p_s=c,
            pp=p,
            interleave=v,
            num_microbatches=m,
            schedule=schedule,
            first_forward_s=F * first,
            first_backward_s=b * first,
            first_weight_s=w * first,
            last_forward_s=F * last,
            last_backward_s=b * last,
            last_weight_s=w * last,
        )
        errors[schedule].append(float(fast.step_s) / r.step_s - 1)
        assert float(fast.compute_s) == pytest.approx(max(r.busy_s), rel=1e-12)
    assert max(map(abs, errors["gpipe"])) < 1e-12
    for schedule in ("1f1b", "interleaved", "zero_bubble"):
        e = np.abs(errors[schedule])
        assert e.max() < 0.12 and e.mean() < 0.02, (schedule, e.max(), e.mean())  # docstring


def test_fast_vectorises_over_mixed_schedules_and_broadcasts():
    p = np.array([4, 4, 8, 8])
    fast = step_time_fast(
        F,
        B,
        pp=p,
        num_microbatches=16,
        interleave=np.array([1, 1, 2, 2]),
        schedule=["gpipe", "1f1b", "interleaved", "zero_bubble"],
        p2p_s=0.125,
    )
    one = [
        float(
            step_time_fast(
                F, B, pp=int(p[i]), num_microbatches=16, interleave=[1, 1, 2, 2][i], schedule=s, p2p_s=0.125
            ).step_s
        )
        for i, s in enumerate(SCHEDULES)
    ]
    assert fast.step_s.tolist() == one
    codes = step_time_fast(
        F, B, pp=p, num_microbatches=16, interleave=np.array([1, 1, 2, 2]), schedule=np.arange(4), p2p_s=0.125
    )
    assert codes.step_s.tolist() == one
    assert fast.bubble_fraction.shape == (4,)


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="unknown schedule"):
        simulate(F, B, pp=2, num_microbatches=2, schedule="pipedream")
    with pytest.raises(ValueError, match="interleave"):
        simulate(F, B, pp=2, num_microbatches=2, schedule="1f1b", interleave=2)
    with pytest.raises(ValueError, match="forward_s"):
        simulate([F, F, F], B, pp=2, num_microbatches=2)
    with pytest.raises(ValueError, match=">= 0"):
        simulate(F, -1.0, pp=2, num_microbatches=2)
    with pytest.raises(ValueError, match="num_microbatches"):
        simulate(F, B, pp=2, num_microbatches=0)
    with pytest.raises(ValueError, match="unknown schedule"):
        step_time_fast(F, B, pp=2, num_microbatches=2, schedule=["1f1b", "zb"])
