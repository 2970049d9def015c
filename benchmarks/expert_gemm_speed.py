"""Routed experts' GEMMs at few rows per expert, measured beside the cost model's price, on one device.

    python benchmarks/expert_gemm_speed.py [--out DIR] [--rows 16,32,...] [--experts 16] [--cluster dgx-h200]
    python benchmarks/expert_gemm_speed.py --smoke     # the plumbing on a CPU: two small shapes, float32

Why: every published MoE run with many small experts is predicted too fast (GPT-OSS 120B −24.7%, DeepSeek-V3
−9.7%, Qwen3-235B −9.5%: ``benchmarks/prediction_error.py``); their experts see about a hundred rows a
micro-batch each, where a GEMM's rate is least known. This measures it instead of fitting it.

For the routed experts of each model below (fc1: rows x hidden @ hidden x (2 x expert width) for a gated MLP,
else 1 x; fc2: rows x expert width @ expert width x hidden; the forward's two GEMMs, whose backward the cost
model prices at twice their time) at each rows-per-expert r, over E local experts:

* ``per_expert``: E ``torch.mm`` calls, one after another on one stream (Megatron-Core and DeepSpeed launch one
  GEMM per local expert; Transformer Engine's GroupedLinear spreads them over up to four streams, so this is its
  one-stream bound);
* ``grouped``: one ``torch._grouped_mm`` over all E (torchtitan's and exatrain's path), where this torch runs it
  for the device and dtype (else recorded as unavailable, with torch's reason);

beside the cost model's seconds for the same calls (``cost.compute.gemm_time_s`` on the cluster's device
prior, or ``--calibration``): ``per_expert`` as E calls of one expert's shape, ``grouped`` as one call of E.
Prints measured TFLOPS and predicted / measured per case; JSON to DIR/expert_gemm_speed.json (DIR: --out,
else $OUT, else ./expert_gemm_speed_out). Import-safe: torch is imported in main() only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

MODELS = ("gpt-oss-120b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3")
ROWS = (16, 32, 64, 128, 256, 512, 1024, 4096)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="results folder (default $OUT, else ./expert_gemm_speed_out)")
    ap.add_argument("--models", default=",".join(MODELS), help="catalog MoE presets, comma-separated")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="rows per expert, comma-separated")
    ap.add_argument("--experts", type=int, default=16, help="local experts per call (default 16)")
    ap.add_argument("--cluster", default="dgx-h200", help="catalog cluster of this device (its prior)")
    ap.add_argument("--calibration", default=None, help="cost parameters from `exatrain bench` for the price")
    ap.add_argument("--repeats", type=int, default=20, help="timed repeats per case (median; default 20)")
    ap.add_argument("--smoke", action="store_true", help="CPU check of the plumbing: small shapes, float32")
    args = ap.parse_args(argv)
    if args.experts < 1 or args.repeats < 1:
        ap.error("--experts and --repeats must be positive")
    try:
        args.rows = tuple(int(r) for r in args.rows.split(","))
    except ValueError:
        ap.error(f"--rows must be integers, got {args.rows!r}")
    if any(r < 1 for r in args.rows):
        ap.error("--rows must be positive")
    args.models = tuple(m for m in args.models.split(",") if m)
    return args


def out_dir(args: argparse.Namespace) -> Path:
    return Path(args.out or os.environ.get("OUT") or "expert_gemm_speed_out")


def expert_shapes(model) -> tuple[tuple[str, int, int], ...]:
    """(name, n, k) of one routed expert's forward GEMMs: fc1 (hidden -> the expert width, twice for a gated MLP)
    and fc2 (the expert width -> hidden)."""
    width = model.expert_width
    return (("fc1", (2 if model.gated_mlp else 1) * width, model.hidden), ("fc2", model.hidden, width))


def predicted_s(cluster, params, *, rows: int, n: int, k: int, experts: int, how: str, dtype: str) -> float:
    """The cost model's seconds for E experts' GEMM of (rows x k) @ (k x n): E calls of one (``per_expert``) or one
    call of E (``grouped``), as ``cost.layer.layer_times`` prices them."""
    from exatrain.accounting.flops import Gemm
    from exatrain.planner.cost import compute

    dev = compute.device_for(cluster, dtype, params, 1)
    if how == "per_expert":
        return float(compute.gemm_time_s(Gemm("expert", rows, n, k, 1), dev, calls=experts))
    return float(compute.gemm_time_s(Gemm("expert", rows, n, k, experts), dev))


def _timed(fn, sync, repeats: int) -> float:
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from exatrain.catalog import get_cluster, get_model
    from exatrain.planner.cost.coefficients import default_params, load_calibration

    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        print("expert_gemm_speed: no CUDA device here (use --smoke for the plumbing on a CPU)", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    dtype, dname = (torch.bfloat16, "bfloat16") if cuda else (torch.float32, "float32")
    cluster = get_cluster(args.cluster if cuda else "local-cpu")
    params = default_params(cluster.device.name)
    if args.calibration:
        found = load_calibration(args.calibration).params_for(cluster.device.name)
        params = found or params
    models = [get_model(m) for m in args.models]
    rows = args.rows
    experts = args.experts
    if args.smoke:  # two small shapes, a few rows: the plumbing, not a figure
        models, rows, experts = models[:1], tuple(r for r in rows if r <= 64)[:2] or (16,), min(experts, 4)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    results: dict = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "cluster": cluster.name,
        "dtype": dname,
        "experts": experts,
        "cases": [],
    }
    grouped_mm = getattr(torch, "_grouped_mm", None)
    for model in models:
        for name, n, k in expert_shapes(model):
            if args.smoke:
                n, k = min(n, 256), min(k, 128)
            w = torch.randn(experts, k, n, device=device, dtype=dtype) / k**0.5
            for r in rows:
                x = torch.randn(experts * r, k, device=device, dtype=dtype)
                parts = x.split(r)
                flops = 2.0 * experts * r * n * k
                case = {"model": model.name, "gemm": name, "rows": r, "n": n, "k": k, "flops": flops}
                loop_s = _timed(
                    lambda w=w, parts=parts: [torch.mm(p, w[e]) for e, p in enumerate(parts)], sync, args.repeats
                )
                case["per_expert_s"] = loop_s
                case["per_expert_predicted_s"] = predicted_s(
                    cluster, params, rows=r, n=n, k=k, experts=experts, how="per_expert", dtype=dname
                )
                if grouped_mm is None:
                    case["grouped_unavailable"] = "this torch has no torch._grouped_mm"
                else:
                    offs = torch.arange(r, experts * r + 1, r, device=device, dtype=torch.int32)
                    try:
                        case["grouped_s"] = _timed(
                            lambda x=x, w=w, offs=offs: grouped_mm(x, w, offs=offs), sync, args.repeats
                        )
                    except (RuntimeError, TypeError, NotImplementedError) as e:
                        case["grouped_unavailable"] = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                case["grouped_predicted_s"] = predicted_s(
                    cluster, params, rows=r, n=n, k=k, experts=experts, how="grouped", dtype=dname
                )
                results["cases"].append(case)
                del x, parts
            del w
    d = out_dir(args)
    d.mkdir(parents=True, exist_ok=True)
    (d / "expert_gemm_speed.json").write_text(json.dumps(results, indent=2))
    print(
        f"{results['device']}, {dname}, {experts} local experts; TFLOPS measured, and the cost model's "
        "predicted / measured time"
    )
    print(
        f"{'model':16s} {'gemm':4s} {'rows':>5s} {'per-expert TF':>13s} {'pred/meas':>9s} "
        f"{'grouped TF':>10s} {'pred/meas':>9s}"
    )
    for c in results["cases"]:
        loop_tf = c["flops"] / c["per_expert_s"] / 1e12
        grouped = (
            f"{c['flops'] / c['grouped_s'] / 1e12:10.3g} {c['grouped_predicted_s'] / c['grouped_s']:9.2f}"
            if "grouped_s" in c
            else f"{'—':>10s} {'—':>9s}"
        )
        print(
            f"{c['model']:16s} {c['gemm']:4s} {c['rows']:5d} {loop_tf:13.3g} "
            f"{c['per_expert_predicted_s'] / c['per_expert_s']:9.2f} {grouped}"
        )
    unavailable = {c["grouped_unavailable"] for c in results["cases"] if "grouped_unavailable" in c}
    for why in sorted(unavailable):
        print(f"grouped: unavailable here ({why})")
    print(f"-> {d / 'expert_gemm_speed.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
