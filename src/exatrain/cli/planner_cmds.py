"""`exatrain estimate`, `exatrain search`, `exatrain scaling`: the planner's commands."""

from __future__ import annotations

import argparse
from typing import Any

from exatrain.cli.common import (add_cluster_args, add_layout_args, add_model_args, make_console,
                                 print_json, resolve_cluster, resolve_model, resolve_plan)
from exatrain.errors import UserError
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
    p.add_argument("--calibration", metavar="PATH", help="cost-model parameters measured by `exatrain bench` "
                   "or fitted by `exatrain calibrate`")
    p.add_argument("--trace", action="store_true", help="also trace the trainer's own model per stage "
                   "(FakeTensorMode, no allocation) and add traced_memory_bytes")
    p.set_defaults(func=cmd_estimate)
    _register_search(sub)
    _register_scaling(sub)


def cmd_estimate(args: argparse.Namespace) -> int:
    from exatrain.planner.estimate import estimate_plan

    model = resolve_model(args)
    cluster, params = calibrated(args, resolve_cluster(args))
    plan = resolve_plan(args, model, cluster)
    est = estimate_plan(plan, cluster, params)
    plan = plan.with_estimate(est)
    if args.trace:
        from exatrain.cli.bench_cmds import attach_trace

        plan = plan.with_estimate(attach_trace(plan, cluster))
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
    con.print(f"worst stage: {_gib(est.memory_bytes.total)} GiB of {_gib(est.capacity_bytes)} GiB — {verdict} "
              "(lean reference: Megatron-LM's tensors)")
    if est.trainer_memory_bytes is not None:
        tv = "[green]fits[/]" if est.trainer_fits else "[red]does not fit[/]"
        con.print(f"with exatrain's own trainer as it runs today: {_gib(est.trainer_memory_bytes.total)} GiB — {tv}")
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



# ---- search ------------------------------------------------------------------------------------
def _register_search(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "search", help="rank every legal layout by predicted throughput",
        description="Enumerate every legal layout (tp, pp, dp, micro-batch, ZeRO, recompute, sequence "
                    "parallel, schedule), drop those that do not fit in memory, rank the rest by predicted "
                    "throughput. Layout flags pin a dimension (e.g. --tp 8).",
        epilog="example: exatrain search --model gpt-1t --cluster frontier --gpus 3072 --global-batch 1536 --top 10")
    add_model_args(p)
    add_cluster_args(p)
    add_layout_args(p)
    p.add_argument("--top", type=int, default=10, help="how many layouts to show (default 10)")
    p.add_argument("--runtime", choices=("megatron", "exatrain"), default="megatron",
                   help="whose memory decides what fits: megatron = the lean reference (Megatron-LM's "
                        "tensors, default); exatrain = exatrain's own trainer as it runs today")
    p.add_argument("--calibration", metavar="PATH", help="cost-model parameters (see estimate --help)")
    p.add_argument("--explain", action="store_true", help="say why the winner beats the runners-up")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--out", metavar="PATH", help="write the best plan (with its estimate) as JSON")
    p.set_defaults(func=cmd_search)


def _space_options(args: argparse.Namespace):
    from exatrain.planner.search.space import SCHEDULE_VARIANTS, SpaceOptions

    if args.stage_layers is not None or args.dp is not None:
        raise UserError("search chooses dp and the stage split itself; drop --dp / --stage-layers "
                        "(pin --tp / --pp instead)")
    variants = SCHEDULE_VARIANTS
    if args.schedule is not None:
        variants = tuple(v for v in variants if v[0] == args.schedule)
    if args.interleave is not None:
        variants = tuple((s, args.interleave) for s in dict.fromkeys(s for s, _ in variants)
                         if (args.interleave == 1) == (s in ("gpipe", "1f1b")))
        if not variants:
            raise UserError(f"--interleave {args.interleave} does not go with --schedule {args.schedule}")
    return SpaceOptions(
        tp=(args.tp,) if args.tp else None,
        pp=(args.pp,) if args.pp else None,
        micro_batch=(args.micro_batch,) if args.micro_batch else None,
        zero_stage=(args.zero,) if args.zero is not None else (0, 1, 2, 3),
        recompute=(args.recompute,) if args.recompute else ("none", "selective", "full"),
        sequence_parallel=(args.sequence_parallel,) if args.sequence_parallel is not None else (False, True),
        schedules=variants,
    )


def _run_search(args: argparse.Namespace, gpus: int, global_batch: int, top: int):
    from exatrain.planner.search.search import search

    model = resolve_model(args)
    cluster, params = calibrated(args, resolve_cluster(args))
    return search(model, cluster, gpus, global_batch, top=top, options=_space_options(args),
                  params=params, dtype=args.dtype or "bfloat16", runtime=getattr(args, "runtime", "megatron"),
                  flash=True if args.flash_attention is None else args.flash_attention), model, cluster


def calibrated(args: argparse.Namespace, cluster):
    """(cluster with measured tiers, cost parameters) from --calibration, or (cluster, None)."""
    path = getattr(args, "calibration", None)
    if not path:
        return cluster, None
    from exatrain.planner.cost.coefficients import load_calibration

    cal = load_calibration(path)
    params = cal.params_for(cluster.device.name)
    if params is None:
        raise UserError(f"{path} has no parameters for device {cluster.device.name!r} "
                        f"(it has: {', '.join(sorted(cal.devices)) or 'none'})")
    return cal.apply(cluster), params


def _no_feasible(result, gpus: int, cluster) -> UserError:
    return UserError(f"no feasible layout on {gpus} devices: {result.why_empty(cluster.device.hbm_bytes)}; "
                     "try more devices, another global batch, or fewer pinned flags")


def cmd_search(args: argparse.Namespace) -> int:
    if args.gpus is None or args.global_batch is None:
        raise UserError("search needs --gpus and --global-batch")
    if args.top < 1:
        raise UserError("--top must be at least 1")
    result, model, cluster = _run_search(args, args.gpus, args.global_batch, args.top)
    if not result.ranked:
        raise _no_feasible(result, args.gpus, cluster)
    if args.out:
        result.ranked[0].save(args.out)
    if args.json:
        print_json({"ranked": [estimate_json(p) for p in result.ranked], "examined": result.examined,
                    "legal": result.legal, "feasible": result.feasible, "rejected": result.rejected,
                    "collapsed": result.collapsed,
                    **({"explain": explain(result.ranked)} if args.explain else {})})
        return 0
    print_search(result, model, cluster, args.gpus, args.global_batch, runtime=args.runtime)
    if args.explain:
        con = make_console()
        for line in explain(result.ranked):
            con.print(f"· {line}")
    return 0


def _layout(p: Plan) -> str:
    s = f"tp{p.tp}·pp{p.pp}·dp{p.dp}"
    return s


def _schedule_label(p: Plan) -> str:
    if p.pp == 1:
        return "-"
    return p.schedule + (f"×{p.interleave}" if p.interleave > 1 else "")


def print_search(result, model, cluster, gpus: int, global_batch: int, runtime: str = "megatron") -> None:
    from rich.table import Table

    con = make_console()
    t = Table(title=f"{model.name} on {gpus} × {cluster.name} ({cluster.device.name}), global batch {global_batch}")
    for col in ("#", "layout", "mb", "ZeRO", "recompute", "SP", "schedule", "step s", "tokens/s",
                "TFLOPS/GPU", "MFU", "memory GiB"):
        t.add_column(col, justify="right" if col not in ("layout", "recompute", "schedule") else "left")
    for i, p in enumerate(result.ranked, 1):
        e = p.estimate
        t.add_row(str(i), _layout(p), str(p.micro_batch), str(p.zero_stage), p.recompute,
                  "on" if p.sequence_parallel else "off", _schedule_label(p), f"{e.time_s.step:.2f}",
                  f"{e.tokens_per_s:,.0f}", f"{e.model_tflops_per_gpu:.1f}",
                  "-" if e.mfu is None else f"{e.mfu:.1%}",
                  f"{_memory_for(e, runtime) / GiB:.1f}/{e.capacity_bytes / GiB:.0f}")
    con.print(t)
    con.print("memory: " + ("exatrain's own trainer as it runs today" if runtime == "exatrain"
                            else "the lean reference (Megatron-LM's tensors); --runtime exatrain for this trainer"))
    rej = ", ".join(f"{k}: {v:,}" for k, v in result.rejected.items() if v)
    con.print(f"{result.examined:,} candidates examined, {result.collapsed:,} equivalent spellings collapsed, "
              f"{result.legal:,} legal, {result.feasible:,} fit in memory. Rejected — {rej}.")


def _memory_for(e: StepEstimate, runtime: str) -> float:
    return e.trainer_memory_bytes.total if runtime == "exatrain" and e.trainer_memory_bytes else e.memory_bytes.total


_TERMS = ("compute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer")


def explain(ranked: list[Plan], runners_up: int = 3) -> list[str]:
    """Why the winner beats each runner-up: the step-time terms that differ most."""
    if not ranked:
        return []
    win = ranked[0]
    lines = [f"winner {_describe(win)}: {win.estimate.time_s.step:.3f} s/step, "
             + ", ".join(f"{k} {getattr(win.estimate.time_s, k):.3f}" for k in _TERMS)]
    for i, other in enumerate(ranked[1:1 + runners_up], 2):
        a, b = win.estimate.time_s, other.estimate.time_s
        diffs = sorted(((getattr(b, k) - getattr(a, k), k) for k in _TERMS), key=lambda x: -abs(x[0]))
        gain = b.step / a.step - 1
        parts = [f"{k} {'+' if d > 0 else '−'}{abs(d):.3f} s" for d, k in diffs[:2] if abs(d) > 1e-9]
        lines.append(f"#{i} {_describe(other)} is {gain:.1%} slower: " + (", ".join(parts) or "same terms")
                     + (f"; it would need {other.estimate.memory_bytes.total / GiB:.1f} GiB"))
    return lines


def _describe(p: Plan) -> str:
    return (f"{_layout(p)} mb{p.micro_batch} ZeRO-{p.zero_stage} {p.recompute}"
            f"{' SP' if p.sequence_parallel else ''} {_schedule_label(p)}")


# ---- scaling -------------------------------------------------------------------------------------
def _register_scaling(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scaling", help="predicted weak or strong scaling over GPU counts",
        description="Weak scaling (global batch grows with the GPU count) or strong scaling (fixed global "
                    "batch): each point is the best layout search finds, or the layout pinned with --tp/--pp.",
        epilog="example: exatrain scaling --model gpt-175b --cluster frontier --gpus 128,256,512,1024 "
               "--global-batch 640 --mode weak --tp 4 --pp 16")
    add_model_args(p)
    add_cluster_args(p, gpus=False)
    add_layout_args(p)
    p.add_argument("--gpus", required=True, metavar="N,N,...", help="GPU counts, smallest first")
    p.add_argument("--mode", choices=("weak", "strong"), default="weak")
    p.add_argument("--calibration", metavar="PATH", help="cost-model parameters (see estimate --help)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_scaling)


def cmd_scaling(args: argparse.Namespace) -> int:
    from exatrain.cli.common import int_list

    try:
        counts = int_list(args.gpus)
    except argparse.ArgumentTypeError as exc:
        raise UserError(f"--gpus: {exc}") from None
    if list(counts) != sorted(set(counts)):
        raise UserError("--gpus: give increasing GPU counts, e.g. 128,256,512")
    if args.global_batch is None:
        raise UserError("scaling needs --global-batch (the batch at the first GPU count)")
    points = []
    for n in counts:
        gb = args.global_batch * n // counts[0] if args.mode == "weak" else args.global_batch
        if args.mode == "weak" and (args.global_batch * n) % counts[0]:
            raise UserError(f"weak scaling: {n} GPUs do not scale global batch {args.global_batch} evenly")
        result, model, cluster = _run_search(args, n, gb, 1)
        if not result.ranked:
            raise _no_feasible(result, n, cluster)
        points.append((n, gb, result.ranked[0]))
    base_n, _, base = points[0]
    rows = []
    for n, gb, plan in points:
        e = plan.estimate
        if args.mode == "weak":
            eff = (e.tokens_per_s / n) / (base.estimate.tokens_per_s / base_n)
        else:
            eff = (e.tokens_per_s / base.estimate.tokens_per_s) / (n / base_n)
        rows.append({"gpus": n, "global_batch": gb, "efficiency": eff, **estimate_json(plan)})
    if args.json:
        print_json({"mode": args.mode, "points": rows})
        return 0
    from rich.table import Table

    con = make_console()
    t = Table(title=f"{args.mode} scaling of {model.name} on {cluster.name}")
    for col in ("GPUs", "global batch", "layout", "mb", "ZeRO", "recompute", "schedule", "step s",
                "TFLOPS/GPU", "MFU", "efficiency"):
        t.add_column(col, justify="right" if col not in ("layout", "recompute", "schedule") else "left")
    for r, (n, gb, plan) in zip(rows, points):
        e = plan.estimate
        t.add_row(str(n), str(gb), _layout(plan), str(plan.micro_batch), str(plan.zero_stage), plan.recompute,
                  _schedule_label(plan), f"{e.time_s.step:.2f}", f"{e.model_tflops_per_gpu:.1f}",
                  "-" if e.mfu is None else f"{e.mfu:.1%}", f"{r['efficiency']:.1%}")
    con.print(t)
    study = {("gpt-175b", "frontier"): "weak 100% to 1,024 GCDs, strong 89%",
             ("gpt-1t", "frontier"): "weak 100% to 3,072 GCDs, strong 87%"}.get((model.name, cluster.name))
    if study:
        con.print(f"the Frontier study measured: {study}")
    return 0
