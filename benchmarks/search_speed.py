"""Time a full configuration search: gpt-1t on 3,072 Frontier GCDs, global batch 1536.

Prints the size of the space, how much of it is legal and fits, and the wall time of
`planner.search.search` (enumeration + vectorised evaluation + the estimates of the best), best of
--repeat runs, and the process CPU time beside it (on a shared machine the wall time also counts
other processes' turns).

    python benchmarks/search_speed.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

from exatrain.catalog import get_cluster, get_model
from exatrain.planner.search.search import search


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    model, cluster = get_model("gpt-1t"), get_cluster("frontier")
    times, cpu = [], []
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = search(model, cluster, 3072, 1536, top=10)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    best = result.ranked[0]
    print(
        f"space: {result.examined:,} candidates examined, {result.collapsed:,} equivalent spellings "
        f"collapsed, {result.legal:,} legal, {result.feasible:,} fit in memory"
    )
    print(
        f"search time: best {min(times):.3f} s, median {sorted(times)[len(times) // 2]:.3f} s "
        f"over {args.repeat} runs (CPU time: best {min(cpu):.3f} s, median {sorted(cpu)[len(cpu) // 2]:.3f} s)"
    )
    print(
        f"winner: tp{best.tp} pp{best.pp} dp{best.dp} mb{best.micro_batch} ZeRO-{best.zero_stage} "
        f"{best.recompute} SP={best.sequence_parallel} {best.schedule}x{best.interleave}: "
        f"MFU {best.estimate.mfu:.1%}"
    )


if __name__ == "__main__":
    main()
