"""Predicted per-GPU memory under each engine profile vs what published runs measured.

Reads benchmarks/data/published_runs_by_engine.csv, keeps the rows that state a measured memory per
GPU, turns each into a Plan and prints, for every engine profile (accounting.engines) and for the
default path, the worst pipeline stage's predicted memory and its error against the measurement;
then the median and maximum absolute error per profile, over all rows and over the rows each
profile's own engine ran.

How a row becomes a Plan (each approximation is flagged in the printed notes):
  * 16-bit runs (bf16, fp16) are planned as bfloat16; fp8 runs too (the model states stay bf16/fp32;
    Float8 linears keep fp8 copies and scales the profiles do not count);
  * context parallelism cp is planned as a sequence of seq/cp per rank with the states sharded over
    dp x cp (torchtitan's FSDP mesh); the ring attention's in-flight key/value chunks are not counted;
  * a row measured as torch's max *allocated* memory is compared with the prediction before the
    allocator allowance, a *reserved* one with the prediction including it.

    python benchmarks/engine_memory.py [--csv PATH]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.errors import UserError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.settings import RECOMPUTE, RUNTIMES
from exatrain.accounting.engines import get_engine
from exatrain.accounting.memory import FRAGMENTATION_ALLOWANCE, memory_by_stage

CSV_PATH = Path(__file__).resolve().parent / "data" / "published_runs_by_engine.csv"
GIB = 2.0**30
PROFILES = (*RUNTIMES, "default")


def _int(text: str, default: int | None = None) -> int | None:
    text = (text or "").strip()
    return int(text) if text else default


def row_plan(r: dict) -> tuple[Plan, list[str]]:
    """The Plan a measured row ran, as closely as a Plan can say it, and what had to be approximated."""
    notes = []
    cp = _int(r["cp"], 1)
    seq = _int(r["seq"])
    if cp > 1:
        notes.append(f"cp {cp}: seq/cp per rank")
    model = ModelSpec(
        name=r["model"],
        arch=r["arch"],
        layers=_int(r["layers"]),
        hidden=_int(r["hidden"]),
        heads=_int(r["heads"]),
        kv_heads=_int(r["kv_heads"], 0),
        ffn_hidden=_int(r["ffn"], 0),
        seq_len=seq // cp,
        vocab=_int(r["vocab"]),
        dropout=float(r["dropout"] or 0.0),
    )
    tp, pp, dp, mb = _int(r["tp"]), _int(r["pp"]), _int(r["dp"]), _int(r["micro_batch"])
    microbatches = _int(r["global_batch"]) // (mb * dp)
    v = _int(r["vpp"], 1)
    schedule = "interleaved" if pp > 1 and v > 1 else "1f1b"
    if r["dtype"] not in ("bf16", "fp16"):
        notes.append(f"{r['dtype']} planned as bf16")
    if r["recompute"] not in RECOMPUTE:
        raise UserError(f"{r['model']}: recompute {r['recompute']!r} is not one of {', '.join(RECOMPUTE)}")
    plan = Plan(
        model=model,
        dims=ParallelDims(tp, pp, dp * cp),
        shape=TrainShape(mb, mb * dp * cp * microbatches),
        zero_stage=_int(r["zero"]),
        recompute=r["recompute"],
        sequence_parallel=r["sp"] == "y",
        schedule=schedule,
        interleave=v if schedule == "interleaved" else 1,
        dtype="bfloat16",
        flash_attention=r["attention"].startswith("flash"),
    ).validate()
    return plan, notes


def predicted_gib(plan: Plan, profile: str, allocated: bool) -> float | None:
    """Worst pipeline stage's bytes in GiB under ``profile``; None where the engine lacks the ZeRO stage."""
    engine = None if profile == "default" else get_engine(profile)
    try:
        worst = max(mb.total for mb in memory_by_stage(plan, engine))
    except UserError:
        return None
    allowance = FRAGMENTATION_ALLOWANCE if engine is None else engine.allocator_allowance
    return (worst / (1 + allowance) if allocated else worst) / GIB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=CSV_PATH)
    args = ap.parse_args(argv)
    if not args.csv.is_file():
        print(f"{args.csv}: no such file", file=sys.stderr)
        return 2
    rows = [r for r in csv.DictReader(args.csv.open(encoding="utf-8")) if r["memory_per_gpu_gib"].strip()]
    errors: dict[str, list[float]] = {p: [] for p in PROFILES}
    own: dict[str, list[float]] = {p: [] for p in RUNTIMES}
    subsets: dict[str, dict[str, list[float]]] = {"16-bit, no cp": {p: [] for p in PROFILES}}
    head = " ".join(f"{p[:18]:>18}" for p in PROFILES)
    print(f"{'run':58} {'engine':18} {'measured':>9} {head}  notes")
    for r in rows:
        plan, notes = row_plan(r)
        measured = float(r["memory_per_gpu_gib"])
        allocated = "allocated" in r["memory_kind"]
        cells = []
        for p in PROFILES:
            got = predicted_gib(plan, p, allocated)
            if got is None:
                cells.append(f"{'n/a':>18}")
                continue
            err = got / measured - 1
            errors[p].append(abs(err))
            if p == r["engine"]:
                own[p].append(abs(err))
            if not notes:
                subsets["16-bit, no cp"][p].append(abs(err))
            cells.append(f"{got:9.1f} {err:+7.1%} ")
        label = f"{r['model']} {r['source'].split('(')[-1].rstrip(')')}"[:58]
        kind = "alloc" if allocated else "resv"
        print(f"{label:58} {r['engine']:18} {measured:6.1f}{kind:>3} {' '.join(cells)}  {'; '.join(notes)}")
    print("\n|predicted / measured - 1| of the memory per GPU")

    def line(name: str, errs: list[float]) -> str:
        if not errs:
            return f"{name:34} n= 0"
        a = np.array(errs)
        return f"{name:34} n={a.size:2d}  median {np.median(a):6.1%}  max {a.max():6.1%}"

    for p in PROFILES:
        print(line(f"{p}: every row it can plan", errors[p]))
    for p in RUNTIMES:
        print(line(f"{p}: its own engine's rows", own[p]))
    for name, by in subsets.items():
        for p in PROFILES:
            print(line(f"{p}: {name}", by[p]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
