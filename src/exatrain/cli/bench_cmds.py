"""`exatrain bench`, `exatrain calibrate`, `exatrain validate`: closing the loop between the cost
model and this machine's measurements."""

from __future__ import annotations

import argparse

from exatrain import api
from exatrain.cli.common import add_progress_arg, call, make_console, opt, positive_int, print_json, progress, table
from exatrain.api import size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="measure this machine: GEMMs, attention, bandwidth, collectives -> calibration file",
        description="Micro-benchmarks of this machine over the shapes the catalog's models use (GEMMs, fused "
                    "attention, element-wise bandwidth and per-kernel overhead, collectives and the trainer's "
                    "framework overheads over local ranks), fitted to the cost model's parameters and written as a "
                    "calibration file that `estimate/search/scaling/train --calibration` read.",
        epilog="example: exatrain bench --out calib.json && exatrain estimate --model gpt-small --cluster "
               "local-cpu --gpus 2 --calibration calib.json")
    p.add_argument("--out", required=True, metavar="PATH", help="calibration file to write (JSON)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="what to measure (default cpu)")
    p.add_argument("--ranks", type=positive_int, help="local ranks for the collectives (default: 2 on the CPU, "
                   "every GPU on CUDA)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"),
                   help="GEMM/attention dtype (default: float32 on the CPU, bfloat16 on GPUs, as `train`)")
    p.add_argument("--quick", action="store_true", help="fewer shapes and sizes (tests)")
    p.add_argument("--json", action="store_true", help="print the fitted parameters as JSON")
    add_progress_arg(p)
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


def cmd_bench(args: argparse.Namespace) -> int:
    with progress(args, "bench") as say:
        result = call(api.bench, args, progress=say)
    params, cal = result.params, result.calibration
    if args.json:
        print_json({"device": result.device, "params": params.to_dict(), "seconds": result.seconds, "out": args.out,
                    "tiers": {k: [t.__dict__ for t in v] for k, v in cal.cluster_tiers.items()}})
        return 0
    lines = result.summary_lines()
    make_console().print("\n".join([f"{lines[0]} -> {args.out}", *lines[1:]]), highlight=False)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    result = call(api.calibrate, args)
    if args.json:
        print_json({"out": args.out, "devices": {f.device: f.to_dict() for f in result.fits},
                    "skipped": result.skipped})
        return 0
    make_console().print("\n".join([*result.summary_lines(), f"-> {args.out}"]), highlight=False)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    result = call(api.compare, args)
    if args.json:
        print_json({"runs": [c.to_dict() for c in result.comparisons], "distribution": result.distribution,
                    "prediction": result.prediction})
        return 0
    con = make_console()
    source = "re-predicted with " + args.calibration if args.calibration else "predictions stored in the records"
    t = table(f"predicted vs measured ({source})",
              ("run", "device", "pred s/step", "meas s/step", "error", "trainer model", "measured", "mem error"),
              left=("run", "device"))
    for c in result.comparisons:
        t.add_row(c.label, c.device, opt(c.predicted_step_s, "{:.4f}"), opt(c.measured_step_s, "{:.4f}"),
                  opt(c.step_error, "{:+.1%}"), "-" if c.trainer_memory_bytes is None else size(c.trainer_memory_bytes),
                  ("-" if not c.measured_memory_bytes else size(c.measured_memory_bytes))
                  + ("" if c.device_memory else " RSS"), opt(c.memory_error("trainer"), "{:+.1%}"))
    con.print(t)
    for what, dist in result.distribution.items():
        if dist["n"]:
            con.print(f"{what.replace('_', ' ')} |error| over {dist['n']} runs: median {dist['median']:.1%}, "
                      f"p90 {dist['p90']:.1%}, max {dist['max']:.1%}")
    return 0
