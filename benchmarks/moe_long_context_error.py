"""Predicted vs published tokens/s per GPU for the mixture-of-experts, long-context and FP8 rows of
benchmarks/data/published_runs_by_engine.csv — out of sample: the cost model's default parameters for
the cluster (planner/cost/coefficients.py), nothing fitted to these rows.

A row is used when its shape is known: the CSV's own columns, or the catalog preset its notes name
(llama3-8b / 70b / 405b, qwen3-30b-a3b, deepseek-v3; Qwen3-235B-A22B from the Qwen3 preset with the
CSV's layers, width, heads and expert width), at the row's sequence length. Rows without a shape
(GPT3-5B/20B, Nemotron, GPT-OSS) are listed as skipped. What the pages do not state is assumed, the
same way for every row: Megatron-Core rows run the distributed optimizer (ZeRO-1), sequence parallel
when tp > 1, no recomputation and 1F1B (interleaved with vpp > 1); "fp8" without a recipe is Megatron's
default delayed scaling, "fp8-cs" current scaling; torchtitan's Float8 is current (tensorwise)
scaling, its rowwise recipe exatrain's block scaling. The H100 of torchtitan's runs (96 GB, 500 W) is
priced as the catalog's dgx-h100. Throughput is compared whether or not the plan fits in memory.

    python benchmarks/moe_long_context_error.py
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import numpy as np

from exatrain.catalog import get_cluster, get_model
from exatrain.errors import UserError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.planner.estimate import estimate_plan

CSV = Path(__file__).resolve().parent / "data" / "published_runs_by_engine.csv"
PRESETS = {"llama3": {8: "llama3-8b", 70: "llama3-70b", 405: "llama3-405b"}}


def _model(r: dict):
    """The row's model at its sequence length, or None when no shape is known."""
    name, seq = r["model"], int(r["seq"])
    low = name.lower().replace("_", " ").replace(".", "")
    if "qwen3 30b" in low:
        return get_model("qwen3-30b-a3b").replace(seq_len=seq)
    if "qwen3 235b" in low:
        return get_model("qwen3-30b-a3b").replace(name="qwen3-235b-a22b", layers=94, hidden=4096, heads=64,
                                                  kv_heads=4, expert_ffn_hidden=1536, seq_len=seq)
    if "deepseekv3" in low.replace(" ", ""):
        return get_model("deepseek-v3").replace(seq_len=seq)
    size = re.search(r"(\d+)b", low)
    if "llama3" in low.replace(" ", "") or "llama 3" in low:
        return get_model(PRESETS["llama3"][int(size.group(1))]).replace(seq_len=seq) if size else None
    if r["layers"] and r["hidden"] and r["heads"] and r["vocab"] and r["arch"]:
        from exatrain.catalog.models import ModelSpec

        return ModelSpec(name=name, arch=r["arch"], layers=int(r["layers"]), hidden=int(r["hidden"]),
                         heads=int(r["heads"]), kv_heads=int(r["kv_heads"] or r["heads"]),
                         ffn_hidden=int(r["ffn"]), seq_len=seq, vocab=int(r["vocab"]))
    if "gpt3 175b" in low:
        return get_model("gpt3-175b").replace(seq_len=seq)
    return None


def _fp8(r: dict) -> str:
    d = r["dtype"]
    if not d.startswith("fp8"):
        return ""
    if r["engine"] == "torchtitan":
        return "block" if "rowwise" in d else "current"
    return "current" if d.startswith("fp8-cs") else "delayed"


def _plan(r: dict, model) -> Plan:
    tp, pp, dp, v = (int(r[k] or 1) for k in ("tp", "pp", "dp", "vpp"))
    cp, ep, mb, gb = (int(r[k] or 1) for k in ("cp", "ep", "micro_batch", "global_batch"))
    megatron = r["engine"] == "megatron-core"
    sp = (r["sp"] == "y") if r["sp"] else (megatron and tp > 1)
    recompute = r["recompute"] or "none"
    zero = int(r["zero"]) if r["zero"] else 1
    schedule = "interleaved" if v > 1 and pp > 1 else "1f1b"
    return Plan(model=model, dims=ParallelDims(tp, pp, dp, ep=ep, cp=cp), shape=TrainShape(mb, gb),
                zero_stage=zero, recompute=recompute, sequence_parallel=sp, schedule=schedule,
                interleave=v if schedule == "interleaved" else 1, fp8=_fp8(r), dtype="bfloat16",
                flash_attention=True, cluster="dgx-h100")


def main() -> int:
    cluster = get_cluster("dgx-h100")
    rows = [r for r in csv.DictReader(CSV.open(encoding="utf-8"))
            if r["kind"] in ("moe", "long-context") or r["dtype"].startswith("fp8")]
    errors: dict[str, list[float]] = {}
    print(f"{'engine':11} {'kind':12} {'run':34} {'layout':28} {'fp8':8} {'published':>10} {'predicted':>10} {'error':>8}")
    for r in rows:
        model = _model(r)
        if model is None:
            print(f"{r['engine'][:11]:11} {r['kind']:12} {r['model'][:34]:34} skipped: shape not stated")
            continue
        try:
            plan = _plan(r, model).validate(cluster)
        except UserError as e:
            print(f"{r['engine'][:11]:11} {r['kind']:12} {r['model'][:34]:34} skipped: {e}")
            continue
        est = estimate_plan(plan, cluster)
        pred = est.tokens_per_s / plan.gpus
        pub = float(re.match(r"[\d.]+", r["throughput"]).group())
        err = pred / pub - 1
        kind = r["kind"] if r["kind"] != "dense" else "dense fp8"
        errors.setdefault(kind, []).append(abs(err))
        print(f"{r['engine'][:11]:11} {kind:12} {r['model'][:34]:34} {plan.label[:28]:28} {plan.fp8 or '-':8} "
              f"{pub:10.1f} {pred:10.1f} {err:+8.1%}")
    print()
    every = [e for v in errors.values() for e in v]
    for name, errs in [*errors.items(), ("all", every)]:
        a = np.array(errs)
        print(f"{name:14} n={a.size:2d}  median |error| {np.median(a):6.1%}  p90 {np.percentile(a, 90):6.1%}  "
              f"max {a.max():6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
