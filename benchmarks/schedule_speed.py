"""Time the pipeline schedule simulator and the vectorised fast path.

Prints simulate() wall time (best of --repeat) for pp 64, m 1,536 with 1f1b (v 1), interleaved and
zero_bubble (v 2), and the 1T extreme pp 128, v 4; then step_time_fast and peak_in_flight_fast
throughput over --configs random configurations of mixed schedules (configs/s).

    python benchmarks/schedule_speed.py [--repeat 3] [--configs 100000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from exatrain.settings import SCHEDULES
from exatrain.accounting.inflight import peak_in_flight_fast
from exatrain.planner.cost.schedule import simulate, step_time_fast

CASES = [  # (schedule, pp, v, m)
    ("1f1b", 64, 1, 1536),
    ("interleaved", 64, 2, 1536),
    ("zero_bubble", 64, 2, 1536),
    ("interleaved", 128, 4, 1536),
    ("zero_bubble", 128, 4, 1536),
]


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--configs", type=int, default=100_000)
    args = ap.parse_args()

    for schedule, pp, v, m in CASES:
        # Per-chunk times of a 1T-like layer stack (seconds); p2p of one activation.
        kw = dict(pp=pp, num_microbatches=m, schedule=schedule, interleave=v, p2p_s=0.002)
        f, b, w = 0.040 / v, 0.040 / v, 0.040 / v
        run = lambda: simulate(f, b, weight_s=w, **kw)  # noqa: E731
        r = run()
        t = best_of(args.repeat, run)
        ops = len(r.timeline)
        print(
            f"simulate {schedule:11s} pp {pp:3d} v {v} m {m}: {t:.3f} s ({ops:,} ops, "
            f"{ops / t / 1e6:.1f} M ops/s), bubble {r.bubble_fraction:.2%}"
        )

    rng = np.random.default_rng(0)
    n = args.configs
    pp = rng.choice([1, 2, 4, 8, 16, 32, 64, 128], n)
    sched = rng.integers(0, SCHEDULES.index("zero_bubble") + 1, n)  # the closed forms' four (V schedules: simulated)
    v = np.where(sched >= 2, rng.choice([2, 3, 4], n), 1)
    m = pp * rng.integers(1, 32, n)
    F, B, W = rng.uniform(0.01, 0.1, (3, n))
    ends = dict(first_forward_s=F * 1.1, first_backward_s=B * 1.1, last_forward_s=F * 1.5, last_backward_s=B * 1.5)

    def fast():
        return step_time_fast(
            F, B, weight_s=W, p2p_s=0.002, pp=pp, interleave=v, num_microbatches=m, schedule=sched, **ends
        )

    fast()
    t = best_of(args.repeat, fast)
    print(
        f"step_time_fast: {n:,} configs in {t * 1e3:.1f} ms = {n / t / 1e6:.2f} M configs/s "
        "(mixed schedules, first/last stages differing)"
    )
    peak = lambda: peak_in_flight_fast(pp=pp, num_microbatches=m, schedule=sched, interleave=v)  # noqa: E731
    t = best_of(args.repeat, peak)
    print(f"peak_in_flight_fast: {n:,} configs in {t * 1e3:.1f} ms = {n / t / 1e6:.2f} M configs/s")


if __name__ == "__main__":
    main()
