"""Predicted vs measured step time of CPU training runs, with a calibration this machine measured.

    python benchmarks/cpu_prediction_error.py [--steps 12] [--dir DIR] [--calibration PATH]

1. ``exatrain.api.bench(out=DIR/calib.json)`` (skipped with --calibration);
2. for each run below: the plan, estimated with that calibration (``exatrain.estimate(...,
   calibration=..., out=...)``), trained for a few steps with ``exatrain.train(plan=...,
   metrics_file=...)``, which records the prediction the plan carries beside the median measured
   step time;
3. prints predicted vs measured per run and the median |error|, and writes DIR/results.json.

No factor is fitted to these runs: the prediction is the bench calibration's. The load average of
the machine is printed with each run (other work on a shared machine slows the measured runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from exatrain import api

# (name, model, layout): 1-4 ranks, three presets, tp / pp / dp / ZeRO / micro-batches.
RUNS = [
    ("gpt-tiny 1 rank", "gpt-tiny", dict(micro_batch=4, global_batch=8)),
    ("gpt-small 1 rank", "gpt-small", dict(micro_batch=2, global_batch=4)),
    ("llama-tiny dp2", "llama-tiny", dict(dp=2, micro_batch=4, global_batch=8)),
    ("gpt-small tp2", "gpt-small", dict(tp=2, micro_batch=2, global_batch=4)),
    ("gpt-small pp2 1f1b", "gpt-small", dict(pp=2, micro_batch=1, global_batch=8)),
    ("gpt-tiny tp2 pp2", "gpt-tiny", dict(tp=2, pp=2, micro_batch=2, global_batch=8)),
    ("llama-tiny tp2 dp2 ZeRO-1", "llama-tiny", dict(tp=2, dp=2, zero=1, micro_batch=2, global_batch=8)),
    ("gpt-small dp2 ZeRO-2", "gpt-small", dict(dp=2, zero=2, micro_batch=2, global_batch=8)),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="training steps per run (first 2 not measured)")
    ap.add_argument("--dir", default=None, help="where calib.json, plans and runs.jsonl go (default: a temp dir)")
    ap.add_argument("--calibration", default=None, help="use this calibration instead of running the bench")
    ap.add_argument("--only", default=None, help="comma-separated run numbers (1-based) to run")
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="exatrain-cpu-pred-"))
    work.mkdir(parents=True, exist_ok=True)
    calib = Path(args.calibration) if args.calibration else work / "calib.json"
    if not args.calibration:
        t0 = time.perf_counter()
        api.bench(out=calib)
        print(f"bench: {time.perf_counter() - t0:.0f} s -> {calib}", flush=True)
    runs_file = work / "runs.jsonl"
    if runs_file.exists():
        runs_file.unlink()
    chosen = [RUNS[int(i) - 1] for i in args.only.split(",")] if args.only else RUNS
    rows = []
    for i, (name, model, layout) in enumerate(chosen, 1):
        plan_path = work / f"plan{i}.json"
        api.estimate(model=model, cluster="local-cpu", dtype="float32", calibration=calib, out=plan_path, **layout)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        record = api.train(plan=plan_path, device="cpu", steps=args.steps, metrics_file=runs_file, quiet=True).record
        wall = time.perf_counter() - t0
        pred, meas = record.predicted.time_s.step, record.measured.step_time_s
        rows.append(
            {
                "run": name,
                "ranks": record.plan.gpus,
                "predicted_s": pred,
                "measured_s": meas,
                "error": pred / meas - 1,
                "load_before": load0,
                "wall_s": wall,
            }
        )
        print(
            f"{i}. {name:28s} {record.plan.gpus} rank(s): predicted {pred:.4f} s, measured {meas:.4f} s "
            f"({pred / meas - 1:+.1%})  [load {load0:.1f}]",
            flush=True,
        )
    med = statistics.median(abs(r["error"]) for r in rows)
    print(f"median |error| over {len(rows)} runs: {med:.1%} (max {max(abs(r['error']) for r in rows):.1%})")
    (work / "results.json").write_text(
        json.dumps({"runs": rows, "median_abs_error": med, "calibration": str(calib), "steps": args.steps}, indent=2)
    )
    print(f"-> {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
