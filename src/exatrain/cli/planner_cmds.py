"""`exatrain estimate`, `exatrain search`, `exatrain scaling`: the planner's commands."""

from __future__ import annotations

import argparse

from exatrain import api
from exatrain.api.planning import DEFAULT_CLUSTER
from exatrain.cli.common import (add_cluster_args, add_layout_args, add_model_args, add_progress_arg,
                                 add_runtime_arg, call, flag, int_list, make_console, opt, print_json, progress, table)
from exatrain.plan import Plan
from exatrain.api import estimate_json, explain, search_json

GiB = 1024**3
CALIBRATION_HELP = "cost-model parameters measured by `exatrain bench` or fitted by `exatrain calibrate`"


RUNTIME_WHY = "default exatrain, the runtime `train` and `tune` run, so a predicted plan is one this project runs"


def _planner_parser(sub, name: str, help: str, description: str, example: str, gpus: bool = True):
    p = sub.add_parser(name, help=help, description=description, epilog=f"example: {example}")
    add_model_args(p)
    add_cluster_args(p, DEFAULT_CLUSTER, gpus=gpus)
    add_layout_args(p, extensions=True)
    add_runtime_arg(p, getattr(api, name), RUNTIME_WHY)
    p.add_argument("--calibration", metavar="PATH", help=CALIBRATION_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def register(sub: argparse._SubParsersAction) -> None:
    p = _planner_parser(sub, "estimate", "memory per stage and step time of one layout",
                        "Predict per-rank memory of every pipeline stage and the step time of one layout.",
                        "exatrain estimate --model gpt-1t --cluster frontier --gpus 3072 --tp 8 --pp 64 "
                        "--micro-batch 1 --global-batch 1536 --zero 1 --recompute full")
    p.add_argument("--out", metavar="PATH", help="also write the plan (with its estimate) as JSON")
    p.add_argument("--trace", action="store_true", help="also trace the trainer's own model per stage "
                   "(FakeTensorMode, no allocation; seconds to minutes of CPU per stage) and add traced_memory_bytes")
    add_progress_arg(p)
    p.set_defaults(func=cmd_estimate)

    p = _planner_parser(sub, "search", "rank every legal layout by predicted throughput",
                        "Enumerate every legal layout (tp, pp, dp, micro-batch, ZeRO, recompute, sequence parallel, "
                        "schedule), drop those that do not fit in memory, rank the rest by predicted throughput. "
                        "Layout flags pin a dimension (e.g. --tp 8).",
                        "exatrain search --model gpt-1t --cluster frontier --gpus 3072 --global-batch 1536 --top 10")
    flag(p, api.search, "--top", "how many layouts to show", type=int)
    p.add_argument("--explain", action="store_true", help="say why the winner beats the runners-up")
    p.add_argument("--out", metavar="PATH", help="write the best plan (with its estimate) as JSON")
    p.set_defaults(func=cmd_search)

    p = _planner_parser(sub, "scaling", "predicted weak or strong scaling over GPU counts",
                        "Weak scaling (global batch grows with the GPU count) or strong scaling (fixed global batch): "
                        "each point is the best layout search finds, or the layout pinned with --tp/--pp.",
                        "exatrain scaling --model gpt-175b --cluster frontier --gpus 128,256,512,1024 "
                        "--global-batch 640 --mode weak --tp 4 --pp 16", gpus=False)
    p.add_argument("--gpus", required=True, type=int_list, metavar="N,N,...", help="GPU counts, smallest first")
    flag(p, api.scaling, "--mode", "weak: global batch grows with the GPU count; strong: fixed",
         choices=("weak", "strong"))
    p.set_defaults(func=cmd_scaling)


def cmd_estimate(args: argparse.Namespace) -> int:
    with progress(args, "trace") as say:
        plan = call(api.estimate, args, progress=say)
    if args.json:
        print_json(estimate_json(plan))
    else:
        print_estimate(plan)
    return 0


def _gib(x: float) -> str:
    return f"{x / GiB:,.2f}"


def print_estimate(plan: Plan) -> None:
    est = plan.estimate
    assert est is not None
    con = make_console()
    con.print(f"[bold]{plan.model.name}[/] ({est.params / 1e9:,.2f}B params) on {plan.gpus} x {plan.cluster}: "
              f"tp {plan.tp} · pp {plan.pp} · dp {plan.dp}"
              + "".join(f" · {k} {n}" for k, n in (("cp", plan.cp), ("ep", plan.ep)) if n != 1)
              + f", micro-batch {plan.micro_batch}, "
              f"global batch {plan.global_batch} ({plan.num_microbatches} micro-batches), ZeRO-{plan.zero_stage}, "
              f"recompute {plan.recompute}, SP {'on' if plan.sequence_parallel else 'off'}, schedule {plan.schedule}"
              + (f" x{plan.interleave}" if plan.interleave > 1 else "") + f", {plan.dtype}, runtime {plan.runtime}"
              + (f", FP8 GEMMs ({plan.fp8} scaling)" if plan.fp8 else ""))
    t = table(f"memory per rank, GiB (capacity {_gib(est.capacity_bytes)})", ("stage", "layers", "params", "weights",
              "gradients", "optimizer", "activations", "other", "total", "of capacity"))
    layers = plan.layers_per_stage()
    for r, mb in enumerate(est.memory_by_stage):
        share = mb.total / est.capacity_bytes
        style = "red" if share > 1 else ("yellow" if share > 0.9 else "")
        t.add_row(str(r), str(sum(layers[v] for v in plan.stages_of_rank(r))), f"{est.params_by_stage[r] / 1e9:,.3f}B",
                  *(_gib(x) for x in (mb.weights, mb.gradients, mb.optimizer, mb.activations, mb.other, mb.total)),
                  f"[{style}]{share:.0%}[/]" if style else f"{share:.0%}")
    con.print(t)
    verdict = "[green]fits[/]" if est.fits else "[red]does not fit[/]"
    con.print(f"worst stage: {_gib(est.memory_bytes.total)} GiB of {_gib(est.capacity_bytes)} GiB — {verdict} "
              f"(as {plan.runtime} runs it)")
    if est.trainer_memory_bytes is not None and plan.runtime != "exatrain":
        tv = "[green]fits[/]" if est.trainer_fits else "[red]does not fit[/]"
        con.print(f"with exatrain's own trainer as it runs today: {_gib(est.trainer_memory_bytes.total)} GiB — {tv}")
    con.print(f"FLOPs per step: model {est.model_flops_per_step:.3e}, hardware {est.hardware_flops_per_step:.3e}; "
              "bytes sent per rank per step: " + ", ".join(f"{k} {v / 1e9:,.2f} GB" for k, v in est.comm_bytes.items()))
    if est.time_s is not None:
        ts = est.time_s
        cols = ("step", "compute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer", "other")
        cols += tuple(c for c, on in (("ep_comm", plan.model.is_moe), ("cp_comm", plan.cp > 1)) if on)
        tt = table("step time, seconds", tuple(c.replace("_", " ") for c in cols))
        tt.add_row(*(f"{getattr(ts, c):.3f}" for c in cols))
        con.print(tt)
        if est.step_range_s is not None:  # the out-of-sample band (planner/band.py)
            con.print(f"step {ts.step:,.3g} s ({est.step_range_s[0]:,.3g}–{est.step_range_s[1]:,.3g} s, "
                      f"{(est.band or {}).get('text', '')})")
        line = f"{est.tokens_per_s:,.0f} tokens/s, {est.model_tflops_per_gpu:.1f} model TFLOPS per GPU"
        con.print(line + (f" (MFU {est.mfu:.1%}, HFU {est.hfu:.1%}"
                          + (f", against the {plan.dtype} peak" if plan.fp8 else "") + ")" if est.mfu is not None else ""))
    for note in est.notes:
        con.print(f"[dim]· {note}[/]")


def cmd_search(args: argparse.Namespace) -> int:
    result = call(api.search, args)
    lines = explain(result.ranked) if args.explain else None
    if args.json:
        print_json(search_json(result, lines))
        return 0
    first = result.ranked[0]
    con = make_console()
    t = table(f"{first.model.name} on {args.gpus} × {first.cluster}, global batch {args.global_batch}, "
              f"runtime {first.runtime}",
              ("#", "layout", "mb", "ZeRO", "recompute", "SP", "schedule", "step s", "tokens/s", "TFLOPS/GPU", "MFU",
               "memory GiB"), left=("layout", "recompute", "schedule"))
    for i, p in enumerate(result.ranked, 1):
        e = p.estimate
        mem = e.memory_bytes
        t.add_row(str(i), p.label, str(p.micro_batch), str(p.zero_stage), p.recompute,
                  "on" if p.sequence_parallel else "off", p.schedule_label, f"{e.time_s.step:.2f}",
                  f"{e.tokens_per_s:,.0f}", f"{e.model_tflops_per_gpu:.1f}", opt(e.mfu, "{:.1%}"),
                  f"{mem.total / GiB:.1f}/{e.capacity_bytes / GiB:.0f}")
    con.print(t)
    if first.fp8:
        con.print(f"FP8 GEMMs ({first.fp8} scaling); MFU against the {first.dtype} peak")
    con.print(f"memory and overlaps: {first.runtime}" + (" (exatrain's own trainer as it runs today)"
                                                         if first.runtime == "exatrain" else ""))
    rej = ", ".join(f"{k}: {v:,}" for k, v in result.rejected.items() if v)
    con.print(f"{result.examined:,} candidates examined, {result.collapsed:,} equivalent spellings collapsed, "
              f"{result.legal:,} legal, {result.feasible:,} fit in memory. Rejected — {rej}.")
    for line in lines or ():
        con.print(f"· {line}")
    return 0


def cmd_scaling(args: argparse.Namespace) -> int:
    result = call(api.scaling, args)
    if args.json:
        print_json(result.to_dict())
        return 0
    con = make_console()
    t = table(f"{result.mode} scaling of {result.model.name} on {result.cluster.name}, runtime "
              f"{result.points[0].plan.runtime}",
              ("GPUs", "global batch", "layout", "mb", "ZeRO", "recompute", "schedule", "step s", "TFLOPS/GPU",
               "MFU", "efficiency"), left=("layout", "recompute", "schedule"))
    for pt in result.points:
        p, e = pt.plan, pt.plan.estimate
        t.add_row(str(pt.gpus), str(pt.global_batch), p.label, str(p.micro_batch), str(p.zero_stage),
                  p.recompute, p.schedule_label, f"{e.time_s.step:.2f}", f"{e.model_tflops_per_gpu:.1f}",
                  opt(e.mfu, "{:.1%}"), f"{pt.efficiency:.1%}")
    con.print(t)
    if result.points and result.points[0].plan.fp8:
        p = result.points[0].plan
        con.print(f"FP8 GEMMs ({p.fp8} scaling); MFU against the {p.dtype} peak")
    if result.measured:
        con.print(f"{result.measured[0].source} measured: " + ", ".join(
            f"{m.mode} {m.efficiency:.0%}" + (f" to {m.gpus:,} GPUs" if m.range_stated else "") for m in result.measured))
    return 0
