"""``exatrain bench``: every micro-benchmark of this machine, as raw points for the planner's fit."""

from __future__ import annotations

import time

import torch

from exatrain.bench.collectives import collective_points
from exatrain.bench.micro import (
    BenchOptions,
    attention_points,
    bandwidth_points,
    flash2_points,
    fp8_gemm_points,
    gemm_points,
    layer_points,
    machine,
    overhead_points,
)


def run_bench(
    *, device: str = "cpu", dtype: str = "float32", ranks: int = 2, quick: bool = False, progress=None
) -> dict:
    """Raw measurements: {"gemm", "fp8_gemm", "attention", "attention_fa2", "bandwidth", "overhead",
    "layers", "collectives", "machine", "options", "seconds"} ("fp8_gemm" where FP8 GEMMs run,
    "attention_fa2" on a CUDA device; else empty).

    On the CPU the single-rank kernels run on one thread (as each training rank does); the
    collectives run over ``ranks`` spawned processes."""
    say = progress or (lambda msg: None)
    opts = BenchOptions(device=device, dtype=dtype, quick=quick)
    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        say("GEMMs")
        gemm = gemm_points(opts)
        say("FP8 GEMMs")
        fp8_gemm = fp8_gemm_points(opts)
        say("attention")
        attention = attention_points(opts)
        attention_fa2 = flash2_points(opts)
        say("memory bandwidth")
        bandwidth = bandwidth_points(opts)
        say("per-kernel overhead")
        overhead = overhead_points(opts)
        layers = layer_points(opts)
    finally:
        torch.set_num_threads(threads)
    say(
        f"collectives and the trainer's framework overheads on {ranks} ranks"
        if ranks > 1
        else "collectives skipped (one rank)"
    )
    collectives = collective_points(ranks, device=device, quick=quick, framework=True)
    return {
        "gemm": gemm,
        "fp8_gemm": fp8_gemm,
        "attention": attention,
        "attention_fa2": attention_fa2,
        "bandwidth": bandwidth,
        "overhead": overhead,
        "layers": layers,
        "collectives": collectives,
        "ranks": ranks,
        "machine": machine(),
        "options": {
            "device": device,
            "dtype": dtype,
            "ranks": ranks,
            "quick": quick,
            "threads_per_rank": 1 if device == "cpu" else threads,
        },
        "seconds": time.perf_counter() - t0,
    }


__all__ = ["run_bench"]
