"""Time `exatrain estimate --trace` on the README's 175B example (tp 4 · pp 16 · dp 2 on 128 frontier
GPUs, 64 micro-batches a step; ``--tp 8``: tp 8 · pp 16 · dp 1, 128 micro-batches): the fast trace (one
rank per stage shape, every stage replayed) as the command a user runs, and, with ``--full-stages``, some
stages traced in full (every micro-batch, the ``--trace full`` path), each checked to the byte against the
fast trace's peak for that stage, with the whole full trace extrapolated from them (the first stage, the
middle stages at the time of the middle one measured, the last stage).

    python benchmarks/trace_speed.py                       # the fast command: wall and CPU seconds
    python benchmarks/trace_speed.py --full-stages 1,2,16  # also those stages in full (1-based)
    python benchmarks/trace_speed.py --tp 8                # the tp 8 · pp 16 layout
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

ARGS = ["--model", "gpt-175b", "--cluster", "frontier", "--gpus", "128", "--tp", "4", "--pp", "16"]
TP = ARGS.index("--tp") + 1


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_command(extra: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of `exatrain estimate ARGS extra --json` in a process of its own."""
    argv = [sys.executable, "-m", "exatrain", "estimate", *ARGS, *extra, "--json"]
    cpu0, t0 = child_cpu(), time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall, cpu = time.perf_counter() - t0, child_cpu() - cpu0
    if out.returncode != 0:
        raise SystemExit(f"`{' '.join(argv[1:])}` failed: {out.stderr.strip().splitlines()[-1:]}")
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full-stages", default="", help="comma list of 1-based stages to trace in full as well")
    ap.add_argument("--tp", default="4", choices=("4", "8"), help="tensor-parallel degree (default 4, the README's)")
    args = ap.parse_args()
    ARGS[TP] = args.tp
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    wall, cpu = time_command(["--trace"])
    print(f"exatrain estimate {' '.join(ARGS)} --trace --json: {wall:.1f} s wall, {cpu:.1f} s CPU")
    if not args.full_stages:
        return

    from exatrain import api
    from exatrain.bench.trace import fast_trace, trace_stage

    plan = api.estimate(
        **{
            ARGS[i][2:].replace("-", "_"): (int(ARGS[i + 1]) if ARGS[i + 1].isdigit() else ARGS[i + 1])
            for i in range(0, len(ARGS), 2)
        }
    )
    fast = fast_trace(plan, accelerator=True).stages
    per: dict[int, tuple[float, float]] = {}
    for stage in (int(s) for s in args.full_stages.split(",")):
        r = stage - 1
        c0, t0 = time.process_time(), time.perf_counter()
        full = trace_stage(plan, r, accelerator=True)
        per[r] = (time.perf_counter() - t0, time.process_time() - c0)
        same = "equal to the byte" if full == fast[r] else f"DIFFERS: full {full} fast {fast[r]}"
        print(
            f"stage {stage} in full ({plan.num_microbatches} micro-batches): {per[r][0]:.1f} s wall, "
            f"{per[r][1]:.1f} s CPU; peak {full.total / 2**30:.2f} GiB, {same}"
        )
    p = plan.pp
    middle = [r for r in per if 0 < r < p - 1]
    if 0 in per and p - 1 in per and middle:
        for i, what in ((0, "wall"), (1, "CPU")):
            total = per[0][i] + per[p - 1][i] + (p - 2) * per[middle[0]][i]
            print(
                f"full trace of all {p} stages, extrapolated (stage 1 + {p - 2} x stage {middle[0] + 1} + "
                f"stage {p}): {total:.0f} s {what}, plus the command's start"
            )


if __name__ == "__main__":
    main()
