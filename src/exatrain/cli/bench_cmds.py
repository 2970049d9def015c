"""`exatrain bench`, `exatrain record`, `exatrain calibrate`, `exatrain validate`: closing the loop between the
cost model and measurements, of this machine or of runs made anywhere."""

from __future__ import annotations

import argparse

from exatrain import api
from exatrain.cli.common import (
    add_cluster_args,
    add_progress_arg,
    call,
    make_console,
    nonneg_int,
    positive_float,
    positive_int,
    progress,
    request_group,
    show,
)
from exatrain.api.requests import RecordedRun


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure this machine: GEMMs, attention, bandwidth, collectives -> calibration file",
        description="Micro-benchmarks of this machine over the shapes the catalog's models use (GEMMs, fused "
        "attention, element-wise bandwidth and per-kernel overhead, collectives and the trainer's "
        "framework overheads over local ranks), fitted to the cost model's parameters and written as a "
        "calibration file that `estimate/search/scaling/train --calibration` read.",
        epilog="example: exatrain bench --out calib.json && exatrain estimate --model gpt-small --cluster "
        "local-cpu --gpus 2 --calibration calib.json",
    )
    p.add_argument("--out", required=True, metavar="PATH", help="calibration file to write (JSON)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="what to measure (default cpu)")
    p.add_argument(
        "--ranks", type=positive_int, help="local ranks for the collectives (default: 2 on the CPU, every GPU on CUDA)"
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help="GEMM/attention dtype (default: float32 on the CPU, bfloat16 on GPUs, as `train`)",
    )
    p.add_argument("--quick", action="store_true", help="fewer shapes and sizes (tests)")
    p.add_argument("--json", action="store_true", help="print the fitted parameters as JSON")
    add_progress_arg(p)
    _register_record(sub)
    _register_calibrate(sub)


def _register_record(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "record",
        help="append a run measured anywhere (a plan and its step time, or a launch and its log) to a runs file",
        description="Append a RunRecord to a runs file (created if needed) for a run made with any engine: a plan "
        "(`estimate/search --out`) and the step time it ran at, or the run's launch (read as `estimate "
        "--from` reads it) and the engine's own log (Megatron-LM / Megatron-DeepSpeed, NeMo / "
        "Megatron-Bridge, torchtitan, DeepSpeed), whose median step time after warm-up and peak memory "
        "are read. The record holds the prediction beside the measurement; `exatrain calibrate` fits "
        "the cluster and engine's factors to such records.",
        epilog="example: exatrain record --from pretrain_llama.sh --log train.log --cluster dgx-h100 --out runs.jsonl",
    )
    r.add_argument("--out", required=True, metavar="RUNS", help="runs file (JSON lines) to append to")
    r.add_argument("--plan", metavar="PLAN", help="the plan that ran (`estimate/search --out`, `estimate --json`)")
    m = request_group(r, "run", RecordedRun, "the run measured")
    m.add_argument("--step-time", type=positive_float, metavar="SECONDS", help="its measured step time (with --plan)")
    m.add_argument(
        "--peak-memory-gib", type=positive_float, metavar="G", help="its measured peak memory per GPU (with --plan)"
    )
    m.add_argument(
        "--from",
        dest="from_file",
        metavar="LAUNCH",
        help="the run's launch: a Megatron-LM / Megatron-DeepSpeed script or a torchtitan TOML (as `estimate --from`)",
    )
    m.add_argument("--log", metavar="LOG", help="the engine's training log of that run (with --from)")
    m.add_argument(
        "--warmup",
        type=nonneg_int,
        metavar="N",
        help="logged steps up to N are warm-up, beside the first logged line (default 2)",
    )
    m.add_argument(
        "--overlap",
        metavar="WHICH",
        help="the overlaps the run had on, as `estimate --overlap` names them (default: the launch's, else estimate's)",
    )
    m.add_argument(
        "--vocab",
        type=positive_int,
        help="the model's vocabulary where the launch leaves it to its tokenizer (with --from)",
    )
    add_cluster_args(r, None)
    r.add_argument("--json", action="store_true", help="print the record as JSON")


def _register_calibrate(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "calibrate",
        help="fit the cost model's shared factors to measured runs",
        description="Fit a few cost-model factors, shared by all runs of a cluster and engine (never one per "
        "run), to the RunRecords of real runs (`train --metrics-file`, `record`) by minimising the "
        "log-error of step time: one run fits the one term of the cost model (GEMM, attention, element-wise, "
        "communication, overheads) that its own breakdown makes the most uncertain, shrunk to the prior, two runs "
        "two; three and more the cost model's efficiencies, about one per two runs; from four runs the band "
        "estimates carry is measured on the runs, each predicted from the others. Print the error before and after and "
        "write a calibration file that `estimate/search/scaling --calibration` read.",
        epilog="example: exatrain calibrate runs.jsonl --out calib.json --calibration bench.json",
    )
    c.add_argument("--out", required=True, metavar="PATH", help="calibration file to write")

    v = sub.add_parser(
        "validate",
        help="predicted vs measured step time and memory of recorded runs",
        description="Compare each run's prediction (the one stored in its RunRecord, or a new one from "
        "--calibration) with what it measured, and the distribution of the errors.",
        epilog="example: exatrain validate runs.jsonl --calibration calib.json",
    )
    for q, calibration in (
        (c, "start from this calibration (e.g. `exatrain bench`'s)"),
        (v, "re-predict with this calibration file"),
    ):
        q.add_argument("runs", metavar="RUNS", help="JSON-lines file with RunRecords (`train --metrics-file`)")
        q.add_argument("--calibration", metavar="PATH", help=calibration)
        q.add_argument("--cluster", metavar="NAME", help="cluster of runs whose plan names none")
        q.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_bench(args: argparse.Namespace) -> int:
    with progress(args, "bench") as say:
        result = call(api.bench, args, progress=say)
    lines = result.summary_lines()
    return show(
        args,
        lambda: {**result.to_dict(), "out": args.out},
        lambda: make_console().print("\n".join([f"{lines[0]} -> {args.out}", *lines[1:]]), highlight=False),
    )


def cmd_record(args: argparse.Namespace) -> int:
    result = call(api.record, args)
    return show(args, result.to_dict, lambda: make_console().print("\n".join(result.summary_lines()), highlight=False))


def cmd_calibrate(args: argparse.Namespace) -> int:
    result = call(api.calibrate, args)
    return show(
        args,
        lambda: {"out": args.out, "fits": {f.key: f.to_dict() for f in result.fits}, "skipped": result.skipped},
        lambda: make_console().print("\n".join([*result.summary_lines(), f"-> {args.out}"]), highlight=False),
    )


def cmd_validate(args: argparse.Namespace) -> int:
    result = call(api.compare, args)
    return show(args, result.to_dict, lambda: api.render_comparisons(result, args.calibration))
