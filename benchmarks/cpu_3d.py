"""Time the trainer on 8 CPU ranks: gpt-tiny, tp2 x pp2 x dp2, 20 steps.

Prints the wall time of the whole run (spawning 8 ranks, building and initialising the model,
20 steps) and the per-step time (median after 2 warm-up steps, from the run's own metrics).

    python benchmarks/cpu_3d.py [--steps 20] [--schedule 1f1b] [--zero 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from exatrain.catalog import get_model
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.spawn import launch_local


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--zero", type=int, default=0)
    args = ap.parse_args()
    plan = Plan(
        model=get_model("gpt-tiny"),
        dims=ParallelDims(tp=2, pp=2, dp=2),
        shape=TrainShape(micro_batch=2, global_batch=16),
        schedule=args.schedule,
        zero_stage=args.zero,
        interleave=2 if args.schedule in ("interleaved", "zero_bubble") else 1,
        dtype="float32",
    ).validate()
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        config = TrainConfig(plan=plan, steps=args.steps, metrics_file=str(metrics), quiet=True).check()
        t0 = time.perf_counter()
        launch_local([config])
        wall = time.perf_counter() - t0
        lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "step"]
    times = [s["step_time_s"] for s in steps]
    median = statistics.median(times[2:] or times)
    print(
        f"gpt-tiny tp2 pp2 dp2 (8 CPU ranks, gloo), {plan.schedule}, ZeRO-{plan.zero_stage}, "
        f"global batch {plan.global_batch} x {plan.model.seq_len} tokens, {args.steps} steps"
    )
    print(f"wall time: {wall:.1f} s (spawn + build + {args.steps} steps); steps alone {sum(times):.1f} s")
    print(f"per step: {median:.3f} s median after 2 warm-up steps (first step {times[0]:.3f} s)")
    print(f"loss: {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}")


if __name__ == "__main__":
    main()
