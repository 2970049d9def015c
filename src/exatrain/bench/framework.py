"""What the trainer's parallel machinery costs beyond arithmetic and bytes, measured on itself.

Each case runs the real ``Trainer`` (DTensor tensor parallelism, DDP, FSDP2, a pipeline schedule)
on 2 ranks with a model so small that its arithmetic is negligible, at two depths. What a step
takes beyond the cost model's prediction for it is framework time: per layer (the slope between
the two depths) and per step (the rest). ``planner.cost.calibrate.fit_framework`` turns the points
into the cost model's ``tp_layer_overhead_s``, ``fsdp_layer_overhead_s``,
``pp_microbatch_overhead_s`` and ``dp_step_overhead_s``.
"""

from __future__ import annotations

import statistics
import time

# (case, tp, pp, dp, ZeRO stage, micro-batch, global batch): 2 ranks each.
CASES = (
    ("dp", 1, 1, 2, 0, 1, 2),
    ("tp", 2, 1, 1, 0, 1, 1),
    ("fsdp", 1, 1, 2, 3, 1, 2),
    ("pp", 1, 2, 1, 0, 1, 4),
)
DEPTHS = (2, 6)


def tiny_model(layers: int):
    from exatrain.catalog.models import ModelSpec

    return ModelSpec(name=f"bench-tiny-{layers}", arch="gpt", layers=layers, hidden=32, heads=2, seq_len=16, vocab=256)


def framework_points(rank: int, device: str, quick: bool) -> list[dict]:
    """Median step seconds of every case at every depth (rank 0's list; others return [])."""
    import torch.distributed as dist

    from exatrain.plan import ParallelDims, Plan, TrainShape
    from exatrain.trainer.config import TrainConfig
    from exatrain.trainer.train import Trainer

    steps = 5 if quick else 10
    out = []
    for case, tp, pp, dp, zero, mb, gb in CASES:
        for layers in DEPTHS:
            plan = Plan(
                model=tiny_model(layers),
                dims=ParallelDims(tp, pp, dp),
                shape=TrainShape(mb, gb),
                zero_stage=zero,
                dtype="float32",
                cluster="local-cpu" if device == "cpu" else "",
            )
            trainer = Trainer(TrainConfig(plan=plan, steps=steps, device=device, quiet=True), rank)
            times = []
            for step in range(steps):
                dist.barrier()
                t0 = time.perf_counter()
                trainer.step(step)
                times.append(time.perf_counter() - t0)
            del trainer
            out.append(
                {
                    "kind": "framework",
                    "case": case,
                    "ranks": 2,
                    "bytes": 0,
                    "plan": plan.to_dict(),
                    "seconds": statistics.median(times[2:]),
                }
            )
    return out if rank == 0 else []
