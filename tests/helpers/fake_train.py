"""A stand-in for `python -m exatrain.train`, used as the tuner's launcher in fast tests:

    exatrain tune ... --launcher "python fake_train.py {cmd}"

It reads the trainer's own arguments (--plan, --steps, --metrics-file), writes what the trainer writes
(one "step" line per step, then a "run_record" with the medians after the 2 warm-up steps) and logs
each invocation (layout, pid) as a JSON line to $FAKE_TRAIN_LOG. What a layout does comes from
$FAKE_TRAIN_SPEC, a JSON object of {regex on the layout key: behaviour}, first match wins:
  {"tokens_per_s": x}  run normally at x tokens/s      {"crash": "message"}  print message, exit 3
  {"oom": true}        a CUDA out-of-memory error       {"hang": true}       never finish
  {"reject": "message"}  refuse the plan like the trainer (one line, exit 2)
  {"hang_once": PATH}  hang the first time (creates PATH), run normally afterwards
  any of them may add "step_s": seconds to sleep per step.
Unmatched layouts run at (predicted tokens/s) / 10, x 0.7 when tp > 1: a cost model that is right
about everything but tensor parallelism.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

from exatrain.plan import Measured, Plan, RunRecord
from exatrain.records import append_run_record
from exatrain.tuning.sampler import layout_key, plan_params


def main() -> int:
    argv = sys.argv[1:]
    if argv[:2] and argv[1:3] == ["-m", "exatrain.train"]:
        argv = argv[3:]
    ap = argparse.ArgumentParser()
    for flag in ("--plan", "--metrics-file", "--device"):
        ap.add_argument(flag)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    plan = Plan.load(args.plan)
    key = layout_key(plan_params(plan))
    spec = json.loads(os.environ.get("FAKE_TRAIN_SPEC", "{}"))
    what = next((v for pattern, v in spec.items() if re.search(pattern, key)), {})
    if os.environ.get("FAKE_TRAIN_LOG"):
        with open(os.environ["FAKE_TRAIN_LOG"], "a") as f:
            f.write(json.dumps({"layout": key, "pid": os.getpid(), "pgid": os.getpgid(0)}) + "\n")
    if what.get("crash"):
        sys.stderr.write(f"Traceback (most recent call last):\n  ...\nRuntimeError: {what['crash']}\n")
        return 3
    if what.get("reject"):
        sys.stderr.write(f"exatrain train: error: {what['reject']}\n")
        return 2
    if what.get("oom"):
        sys.stderr.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
        return 1
    once = what.get("hang_once")
    if what.get("hang") or (once and not Path(once).exists()):
        if once:
            Path(once).touch()
        while True:
            time.sleep(1)
    rate = what.get("tokens_per_s") or plan.estimate.tokens_per_s / 10 * (0.7 if plan.tp > 1 else 1)
    tokens = plan.global_batch * plan.model.seq_len
    steps = []
    for step in range(1, args.steps + 1):
        time.sleep(float(what.get("step_s", 0.0)))
        line = {
            "kind": "step",
            "step": step,
            "loss": 5.0 - 0.1 * step,
            "step_time_s": tokens / rate,
            "tokens_per_s": rate,
        }
        steps.append(line)
        with open(args.metrics_file, "a") as f:
            f.write(json.dumps(line) + "\n")
    kept = steps[2:] or steps
    measured = Measured(
        steps=len(steps),
        step_time_s=statistics.median(s["step_time_s"] for s in kept),
        tokens_per_s=statistics.median(s["tokens_per_s"] for s in kept),
    )
    append_run_record(args.metrics_file, RunRecord(plan=plan, measured=measured, device="fake", env={"fake": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
