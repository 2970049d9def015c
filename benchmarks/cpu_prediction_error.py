"""Predicted vs measured step time of CPU training runs, with a calibration this machine measured.

    python benchmarks/cpu_prediction_error.py [--steps 12] [--dir DIR] [--calibration PATH]

1. ``exatrain bench --out DIR/calib.json`` (skipped with --calibration);
2. for each run below: the plan, estimated with that calibration (``exatrain estimate --calibration
   ... --out``), trained for a few steps with ``exatrain train --plan ... --metrics-file``, which
   records the prediction the plan carries beside the median measured step time;
3. prints predicted vs measured per run and the median |error|, and writes DIR/results.json.

No factor is fitted to these runs: the prediction is the bench calibration's. The load average of
the machine is printed with each run (other work on a shared machine slows the measured runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (name, model flags, layout flags): 1-4 ranks, three presets, tp / pp / dp / ZeRO / micro-batches.
RUNS = [
    ("gpt-tiny 1 rank", ["--model", "gpt-tiny"], ["--micro-batch", "4", "--global-batch", "8"]),
    ("gpt-small 1 rank", ["--model", "gpt-small"], ["--micro-batch", "2", "--global-batch", "4"]),
    ("llama-tiny dp2", ["--model", "llama-tiny"], ["--dp", "2", "--micro-batch", "4", "--global-batch", "8"]),
    ("gpt-small tp2", ["--model", "gpt-small"], ["--tp", "2", "--micro-batch", "2", "--global-batch", "4"]),
    ("gpt-small pp2 1f1b", ["--model", "gpt-small"], ["--pp", "2", "--micro-batch", "1", "--global-batch", "8"]),
    ("gpt-tiny tp2 pp2", ["--model", "gpt-tiny"], ["--tp", "2", "--pp", "2", "--micro-batch", "2",
                                                  "--global-batch", "8"]),
    ("llama-tiny tp2 dp2 ZeRO-1", ["--model", "llama-tiny"], ["--tp", "2", "--dp", "2", "--zero", "1",
                                                             "--micro-batch", "2", "--global-batch", "8"]),
    ("gpt-small dp2 ZeRO-2", ["--model", "gpt-small"], ["--dp", "2", "--zero", "2", "--micro-batch", "2",
                                                       "--global-batch", "8"]),
]


def exatrain(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "exatrain", *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"exatrain {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return out


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
        exatrain("bench", "--out", str(calib))
        print(f"bench: {time.perf_counter() - t0:.0f} s -> {calib}", flush=True)
    runs_file = work / "runs.jsonl"
    if runs_file.exists():
        runs_file.unlink()
    chosen = [RUNS[int(i) - 1] for i in args.only.split(",")] if args.only else RUNS
    rows = []
    for i, (name, model, layout) in enumerate(chosen, 1):
        plan_path = work / f"plan{i}.json"
        exatrain("estimate", *model, *layout, "--cluster", "local-cpu", "--dtype", "float32",
                 "--calibration", str(calib), "--out", str(plan_path), "--json")
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        exatrain("train", "--plan", str(plan_path), "--device", "cpu", "--steps", str(args.steps),
                 "--metrics-file", str(runs_file), "--quiet")
        wall = time.perf_counter() - t0
        record = [json.loads(line) for line in runs_file.read_text().splitlines()
                  if '"run_record"' in line][-1]
        pred = record["predicted"]["time_s"]["step"]
        meas = record["measured"]["step_time_s"]
        rows.append({"run": name, "ranks": record["plan"]["gpus"], "predicted_s": pred, "measured_s": meas,
                     "error": pred / meas - 1, "load_before": load0, "wall_s": wall})
        print(f"{i}. {name:28s} {record['plan']['gpus']} rank(s): predicted {pred:.4f} s, measured {meas:.4f} s "
              f"({pred / meas - 1:+.1%})  [load {load0:.1f}]", flush=True)
    med = statistics.median(abs(r["error"]) for r in rows)
    print(f"median |error| over {len(rows)} runs: {med:.1%} (max {max(abs(r['error']) for r in rows):.1%})")
    (work / "results.json").write_text(json.dumps({"runs": rows, "median_abs_error": med,
                                                   "calibration": str(calib), "steps": args.steps}, indent=2))
    print(f"-> {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
