"""`exatrain bench`, `exatrain calibrate`, `exatrain validate`: closing the loop between the cost
model and this machine's measurements; plus the hooks `estimate --trace` and `train` call."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from exatrain.cli.common import make_console, positive_int, print_json
from exatrain.errors import UserError

GiB = 1024**3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="measure this machine: GEMMs, attention, bandwidth, collectives -> calibration file",
        description="Micro-benchmarks of this machine over the shapes the catalog's models use (GEMMs, "
                    "fused attention, element-wise bandwidth and per-kernel overhead, collectives over "
                    "local ranks), fitted to the cost model's parameters and written as a calibration file "
                    "that `estimate/search/scaling --calibration` read.",
        epilog="example: exatrain bench --out calib.json && exatrain estimate --model gpt-small --cluster "
               "local-cpu --gpus 2 --calibration calib.json")
    p.add_argument("--out", required=True, metavar="PATH", help="calibration file to write (JSON)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="what to measure (default cpu)")
    p.add_argument("--ranks", type=positive_int, default=None,
                   help="local ranks for the collectives (default: 2 on the CPU, every GPU on CUDA)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="GEMM/attention dtype (default: float32 on the CPU, bfloat16 on GPUs, as `train`)")
    p.add_argument("--quick", action="store_true", help="a few seconds: fewer shapes and sizes (tests)")
    p.add_argument("--json", action="store_true", help="print the fitted parameters as JSON")
    p.set_defaults(func=cmd_bench)

    c = sub.add_parser(
        "calibrate", help="fit the cost model's shared factors to measured runs",
        description="Fit a few cost-model factors, shared by all runs of a device (never one per run), to the "
                    "RunRecords of real runs by minimising the log-error of step time; print the error "
                    "before and after and write a calibration file.",
        epilog="example: exatrain calibrate runs.jsonl --out calib.json --calibration bench.json")
    c.add_argument("runs", metavar="RUNS", help="JSON-lines file with RunRecords (`train --metrics-file`)")
    c.add_argument("--out", required=True, metavar="PATH", help="calibration file to write")
    c.add_argument("--calibration", metavar="PATH", help="start from this calibration (e.g. `exatrain bench`'s)")
    c.add_argument("--cluster", metavar="NAME", help="cluster of runs whose plan names none")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=cmd_calibrate)

    v = sub.add_parser(
        "validate", help="predicted vs measured step time and memory of recorded runs",
        description="Compare each run's prediction (the one stored in its RunRecord, or a new one from "
                    "--calibration) with what it measured, and the distribution of the errors.",
        epilog="example: exatrain validate runs.jsonl --calibration calib.json")
    v.add_argument("runs", metavar="RUNS", help="JSON-lines file with RunRecords")
    v.add_argument("--calibration", metavar="PATH", help="re-predict with this calibration file")
    v.add_argument("--cluster", metavar="NAME", help="cluster of runs whose plan names none")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    v.set_defaults(func=cmd_validate)


# ---- bench ------------------------------------------------------------------------------------------
def cmd_bench(args: argparse.Namespace) -> int:
    from exatrain.catalog import cluster_catalog, get_cluster, match_device
    from exatrain.planner.cost.calibrate import calibration_from_bench
    from exatrain.planner.cost.params import default_params, save_calibration

    _check_writable(args.out)
    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA/ROCm device is visible here")
        name = torch.cuda.get_device_name(0)
        spec = match_device(name)
        if spec is None:
            raise UserError(f"GPU {name!r} is not in the catalog (`exatrain hardware`); add it with a "
                            "cluster file before calibrating it")
        device_name, catalog_peak = spec.name, None
        dtype = args.dtype or "bfloat16"
        catalog_peak = spec.peak_flops(dtype)
        cluster = next((c for c in cluster_catalog().values() if c.device.name == spec.name), None)
        ranks = args.ranks or torch.cuda.device_count()
        if ranks > torch.cuda.device_count():
            raise UserError(f"--ranks {ranks}: only {torch.cuda.device_count()} GPU(s) here")
    else:
        device_name, catalog_peak, dtype = "cpu", None, args.dtype or "float32"
        cluster = get_cluster("local-cpu")
        ranks = args.ranks or 2
    from exatrain.bench.run import run_bench

    con = make_console(stderr=True)
    raw = run_bench(device=args.device, dtype=dtype, ranks=ranks, quick=args.quick,
                    progress=lambda msg: con.print(f"[dim]bench: {msg}[/]"))
    cal = calibration_from_bench(raw, device_name=device_name, base=default_params(device_name),
                                 catalog_peak=catalog_peak, cluster=cluster)
    save_calibration(args.out, cal)
    params = cal.devices[device_name]
    if args.json:
        print_json({"device": device_name, "params": params.to_dict(),
                    "tiers": {k: [t.__dict__ for t in v] for k, v in cal.cluster_tiers.items()},
                    "seconds": raw["seconds"], "out": args.out})
        return 0
    out = make_console()
    peak = params.peak_flops or catalog_peak or 0.0
    out.print(f"[bold]{device_name}[/] ({dtype}, {raw['options']['threads_per_rank']} thread(s) per rank) "
              f"measured in {raw['seconds']:.1f} s -> {args.out}")
    out.print(f"GEMM: {peak * params.gemm_eff / 1e12:.3f} TFLOPS at large sizes (peak {peak / 1e12:.3f}, "
              f"eff {params.gemm_eff:.2f}), dimension half-point {params.gemm_dim_half:.0f}, "
              f"{params.gemm_overhead_s * 1e6:.1f} µs per call")
    out.print(f"attention: {params.attn_eff:.1%} of peak; memory: {(params.mem_bytes_per_s or 0) / 1e9:.1f} GB/s "
              f"copy, element-wise at {params.mem_eff:.0%} of it + {params.op_overhead_s * 1e6:.1f} µs per kernel; "
              f"{params.step_overhead_s * 1e3:.1f} ms fixed per step")
    for cname, tiers in cal.cluster_tiers.items():
        for t in tiers:
            out.print(f"links ({cname}, {t.name}): {t.bytes_per_s / 1e9:.2f} GB/s, {t.latency_s * 1e6:.0f} µs latency")
    return 0


def _check_writable(path: str) -> None:
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UserError(f"--out {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UserError(f"--out {path}: folder {parent} is not writable")


# ---- calibrate --------------------------------------------------------------------------------------
def _records(path: str):
    from exatrain.plan import read_run_records

    records = read_run_records(path)
    if not records:
        raise UserError(f"{path}: no RunRecords in it (lines of kind 'run_record', written by "
                        "`exatrain train --metrics-file`)")
    return records


def _cluster_arg(name: str | None):
    if not name:
        return None
    from exatrain.catalog import get_cluster

    return get_cluster(name)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from exatrain.planner.cost.calibrate import RunPoint, fit_runs
    from exatrain.planner.cost.params import Calibration, default_params, load_calibration, save_calibration
    from exatrain.planner.compare import cluster_for, layout_label

    records = _records(args.runs)
    base_cal = load_calibration(args.calibration) if args.calibration else None
    _check_writable(args.out)
    override = _cluster_arg(args.cluster)
    groups: dict[str, list[RunPoint]] = {}
    skipped = 0
    for r in records:
        if r.status != "ok" or r.measured is None or not r.measured.step_time_s:
            skipped += 1
            continue
        c = cluster_for(r, override)
        if c is None:
            raise UserError(f"{args.runs}: cannot tell the cluster of run {layout_label(r)} "
                            f"(device {r.device!r}); pass --cluster")
        if base_cal is not None:
            c = base_cal.apply(c)
        groups.setdefault(c.device.name, []).append(RunPoint(r.plan, c, r.measured.step_time_s, layout_label(r)))
    if not groups:
        raise UserError(f"{args.runs}: no successful run with a measured step time")
    devices = dict(base_cal.devices) if base_cal else {}
    report: dict[str, Any] = {}
    for device, points in groups.items():
        base = (base_cal.params_for(device) if base_cal else None) or default_params(device)
        fit = fit_runs(points, base)
        devices[device] = fit.params
        report[device] = {"runs": len(points), "factors": {f: getattr(fit.params, f) for f in fit.factors},
                          "before": fit.before, "after": fit.after}
    extra = dict(base_cal.extra) if base_cal else {}
    extra["calibrate"] = {"runs_file": str(args.runs), "skipped": skipped, **report}
    save_calibration(args.out, Calibration(devices=devices, cluster_tiers=dict(base_cal.cluster_tiers) if base_cal
                                           else {}, extra=extra))
    if args.json:
        print_json({"out": args.out, "devices": report, "skipped": skipped})
        return 0
    con = make_console()
    for device, rep in report.items():
        b, a = rep["before"], rep["after"]
        con.print(f"[bold]{device}[/]: {rep['runs']} runs; fitted " + ", ".join(
            f"{k}={v:.3g}" for k, v in rep["factors"].items()))
        con.print(f"  step-time error before: median {b['median']:.1%}, p90 {b['p90']:.1%}, max {b['max']:.1%} "
                  f"(rms log-error {b['rms_log']:.3f})")
        con.print(f"  step-time error after:  median {a['median']:.1%}, p90 {a['p90']:.1%}, max {a['max']:.1%} "
                  f"(rms log-error {a['rms_log']:.3f}, the quantity fitted)")
    if skipped:
        con.print(f"[dim]{skipped} record(s) without a successful measurement skipped[/]")
    con.print(f"-> {args.out}")
    return 0


# ---- validate ---------------------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    from exatrain.planner.cost.params import load_calibration
    from exatrain.planner.compare import compare_all, distribution

    records = _records(args.runs)
    cal = load_calibration(args.calibration) if args.calibration else None
    comps = compare_all(records, cal, _cluster_arg(args.cluster))
    if not comps:
        raise UserError(f"{args.runs}: no successful run with measurements to compare")
    dist = distribution(comps)
    if args.json:
        print_json({"runs": [c.to_dict() for c in comps], "distribution": dist,
                    "prediction": "calibration " + args.calibration if cal else "stored in each record"})
        return 0
    from rich.table import Table

    con = make_console()
    t = Table(title="predicted vs measured" + (f" (re-predicted with {args.calibration})" if cal else
                                               " (predictions stored in the records)"))
    for col in ("run", "device", "pred s/step", "meas s/step", "error", "trainer-model GiB", "meas GiB", "mem error"):
        t.add_column(col, justify="left" if col in ("run", "device") else "right")
    for c in comps:
        me = c.memory_error("trainer")
        t.add_row(c.label, c.device, _f(c.predicted_step_s, "{:.4f}"), _f(c.measured_step_s, "{:.4f}"),
                  _f(c.step_error, "{:+.1%}"), _f(None if c.trainer_memory_bytes is None else c.trainer_memory_bytes / GiB,
                                                 "{:.2f}"),
                  _f(None if c.measured_memory_bytes is None else c.measured_memory_bytes / GiB, "{:.2f}")
                  + ("" if c.device_memory else " RSS"), _f(me, "{:+.1%}"))
    con.print(t)
    for what, d in dist.items():
        if d["n"]:
            con.print(f"{what.replace('_', ' ')} |error| over {d['n']} runs: median {d['median']:.1%}, "
                      f"p90 {d['p90']:.1%}, max {d['max']:.1%}")
    return 0


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else fmt.format(x)


# ---- hooks for other commands ---------------------------------------------------------------------
def attach_trace(plan, cluster):
    """`estimate --trace`: trace one rank of every stage of ``plan`` (bench.trace) and return its
    estimate with ``traced_memory_bytes`` (the stage with the largest traced peak) and a note."""
    import dataclasses

    from exatrain.plan import MemoryBreakdown
    from exatrain.planner.accounting.trainer_memory import trainer_memory_by_stage

    try:
        from exatrain.bench.trace import trace_plan
    except ModuleNotFoundError as exc:  # pragma: no cover - torch missing
        raise UserError(f"--trace needs torch ({exc}); install exatrain[train]") from None
    on_cpu = cluster.device.name == "cpu"
    try:
        traced = trace_plan(plan, accelerator=not on_cpu)
    except Exception as exc:
        raise UserError(f"--trace failed for this plan ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
    worst = max(traced, key=lambda t: t.total)
    model = trainer_memory_by_stage(plan, on_cpu=on_cpu)
    est = plan.estimate
    note = ("traced (the trainer's model per stage under FakeTensorMode, one step, no allocation; 16-bit "
            "weight copies count as activations): " + ", ".join(f"{t.total / GiB:.2f}" for t in traced)
            + " GiB; trainer memory model: " + ", ".join(f"{m.total / GiB:.2f}" for m in model) + " GiB")
    return dataclasses.replace(est, traced_memory_bytes=MemoryBreakdown(
        weights=worst.weights, gradients=worst.gradients, optimizer=worst.optimizer,
        activations=worst.activations, other=worst.other), notes=tuple(est.notes) + (note,))


def print_run_comparison(metrics_file: str | None, quiet: bool = False) -> None:
    """End of `exatrain train`: the run's RunRecord (last in the metrics file) beside its prediction."""
    if quiet or not metrics_file or os.environ.get("RANK", "0") != "0" or os.environ.get("SLURM_PROCID", "0") != "0":
        return
    from exatrain.plan import read_run_records
    from exatrain.planner.compare import compare, summary_lines

    try:
        records = read_run_records(metrics_file)
    except UserError:
        return
    if not records:
        return
    con = make_console()
    for line in summary_lines(compare(records[-1])):
        con.print(line)


__all__ = ["attach_trace", "print_run_comparison", "register"]
