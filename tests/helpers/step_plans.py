"""Plans whose step time is set by hand, so the whole-run figures built on it (time to train, goodput) follow
from numbers a test writes down."""

from __future__ import annotations

import dataclasses

import exatrain
from exatrain.plan import Plan

# The Frontier study's 175B layout as the README estimates it (megatron-deepspeed), as command-line arguments.
GPT_175B = [
    "--model", "gpt-175b", "--cluster", "frontier", "--gpus", "128", "--tp", "4", "--pp", "16",
    "--micro-batch", "1", "--global-batch", "640", "--zero", "1", "--recompute", "full",
    "--runtime", "megatron-deepspeed",
]  # fmt: skip


def step_plan(
    step_s: float,
    band: tuple[float, float] | None,
    gpus: int = 64,
    global_batch: int = 1024,
    runtime: str = "exatrain",
) -> Plan:
    """gpt-1.3b (seq_len 2048) on ``gpus`` H100s (8 a node) at ``global_batch`` under ``runtime``, its estimate's
    step time set to ``step_s`` and its band to ``band`` (seconds; None: no band)."""
    plan = exatrain.estimate(
        model="gpt-1.3b", cluster="dgx-h100", gpus=gpus, global_batch=global_batch, runtime=runtime
    )
    est = plan.estimate
    assert est is not None and est.time_s is not None and plan.model.seq_len == 2048
    return plan.with_estimate(
        est.replace(
            time_s=dataclasses.replace(est.time_s, step=step_s),
            step_range_s=band,
            band={"text": "a band"} if band else None,
        )
    )
