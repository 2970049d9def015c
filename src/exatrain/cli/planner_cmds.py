"""`exatrain estimate`, `exatrain search`, `exatrain scaling`: the planner's commands."""

from __future__ import annotations

import argparse
from typing import Any

from exatrain.cli.common import (add_cluster_args, add_layout_args, add_model_args, make_console,
                                 print_json, resolve_cluster, resolve_model, resolve_plan)
from exatrain.plan import Plan, StepEstimate

GiB = 1024**3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate", help="memory per stage and step time of one layout",
        description="Predict per-rank memory of every pipeline stage and the step time of one layout.",
        epilog="example: exatrain estimate --model gpt-1t --cluster frontier --gpus 3072 --tp 8 --pp 64 "
               "--micro-batch 1 --global-batch 1536 --zero 1 --recompute full")
    add_model_args(p)
    add_cluster_args(p)
    add_layout_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--out", metavar="PATH", help="also write the plan (with its estimate) as JSON")
    p.set_defaults(func=cmd_estimate)


def cmd_estimate(args: argparse.Namespace) -> int:
    from exatrain.planner.estimate import estimate_plan

    model = resolve_model(args)
    cluster = resolve_cluster(args)
    plan = resolve_plan(args, model, cluster)
    est = estimate_plan(plan, cluster)
    plan = plan.with_estimate(est)
    if args.out:
        plan.save(args.out)
    if args.json:
        print_json(estimate_json(plan))
    else:
        print_estimate(plan, cluster.name)
    return 0


def estimate_json(plan: Plan) -> dict[str, Any]:
    """The `estimate --json` object: the estimate's fields at top level, plus the resolved plan."""
    assert plan.estimate is not None
    plan_d = plan.to_dict()
    plan_d.pop("estimate")
    return {**plan.estimate.to_dict(), "plan": plan_d}


def _gib(x: float) -> str:
    return f"{x / GiB:,.2f}"


def print_estimate(plan: Plan, cluster_name: str) -> None:
    from rich.table import Table

    est: StepEstimate = plan.estimate  # type: ignore[assignment]
    con = make_console()
    m = plan.model
    con.print(f"[bold]{m.name}[/] ({est.params / 1e9:,.2f}B params) on {plan.gpus} x {cluster_name}: "
              f"tp {plan.tp} · pp {plan.pp} · dp {plan.dp}, micro-batch {plan.micro_batch}, "
              f"global batch {plan.global_batch} ({plan.num_microbatches} micro-batches), "
              f"ZeRO-{plan.zero_stage}, recompute {plan.recompute}, "
              f"SP {'on' if plan.sequence_parallel else 'off'}, schedule {plan.schedule}"
              + (f" x{plan.interleave}" if plan.interleave > 1 else "") + f", {plan.dtype}")
    t = Table(title=f"memory per rank, GiB (capacity {_gib(est.capacity_bytes)})")
    for col in ("stage", "layers", "params", "weights", "gradients", "optimizer", "activations", "other",
                "total", "of capacity"):
        t.add_column(col, justify="right")
    layers = plan.layers_per_stage()
    for r, mb in enumerate(est.memory_by_stage):
        n_layers = sum(layers[v] for v in plan.stages_of_rank(r))
        share = mb.total / est.capacity_bytes
        style = "red" if share > 1 else ("yellow" if share > 0.9 else "")
        t.add_row(str(r), str(n_layers), f"{est.params_by_stage[r] / 1e9:,.3f}B", _gib(mb.weights),
                  _gib(mb.gradients), _gib(mb.optimizer), _gib(mb.activations), _gib(mb.other),
                  _gib(mb.total), f"[{style}]{share:.0%}[/]" if style else f"{share:.0%}")
    con.print(t)
    verdict = "[green]fits[/]" if est.fits else "[red]does not fit[/]"
    con.print(f"worst stage: {_gib(est.memory_bytes.total)} GiB of {_gib(est.capacity_bytes)} GiB — {verdict}")
    con.print(f"FLOPs per step: model {est.model_flops_per_step:.3e}, hardware "
              f"{est.hardware_flops_per_step:.3e}; bytes sent per rank per step: "
              + ", ".join(f"{k} {v / 1e9:,.2f} GB" for k, v in est.comm_bytes.items()))
    if est.time_s is not None:
        ts = est.time_s
        tt = Table(title="step time, seconds")
        for col in ("step", "compute", "bubble", "tp comm", "pp comm", "dp comm", "optimizer", "other"):
            tt.add_column(col, justify="right")
        tt.add_row(*(f"{x:.3f}" for x in (ts.step, ts.compute, ts.bubble, ts.tp_comm, ts.pp_comm,
                                          ts.dp_comm, ts.optimizer, ts.other)))
        con.print(tt)
        line = f"{est.tokens_per_s:,.0f} tokens/s, {est.model_tflops_per_gpu:.1f} model TFLOPS per GPU"
        if est.mfu is not None:
            line += f" (MFU {est.mfu:.1%}, HFU {est.hfu:.1%})"
        con.print(line)
    for note in est.notes:
        con.print(f"[dim]· {note}[/]")

