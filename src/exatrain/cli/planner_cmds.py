"""`exatrain estimate`, `exatrain search`, `exatrain scaling`: the planner's commands."""

from __future__ import annotations

import argparse

from exatrain import api
from exatrain.api.planning import DEFAULT_CLUSTER, RANK_BY, RANK_BY_HELP, RUN_FLAGS, STRICT_MEMORY_HELP
from exatrain.api.plans import FROM_HELP
from exatrain.cli.common import (
    add_cluster_args,
    add_layout_args,
    add_model_args,
    add_progress_arg,
    add_engine_args,
    call,
    flag,
    int_list,
    progress,
    request_group,
    show,
)
from exatrain.api.requests import Budget, PlanOptions


def _planner_parser(sub, name: str, help: str, description: str, example: str, gpus: bool = True):
    p = sub.add_parser(name, help=help, description=description, epilog=f"example: {example}")
    add_model_args(p)
    add_cluster_args(p, DEFAULT_CLUSTER, gpus=gpus)
    add_layout_args(p, extensions=True)
    add_engine_args(p, "exatrain is the runtime `train` and `tune` run, so its plan is one this project runs")
    b = request_group(p, "budget", Budget, "the run at a token budget")
    for flag_name, (metavar, flag_help) in RUN_FLAGS.items():  # the whole run at a token budget
        b.add_argument(flag_name, metavar=metavar, help=flag_help)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    g = request_group(p, "options", PlanOptions, "options")
    if name in ("estimate", "search"):
        g.add_argument(
            "--from",
            dest="from_file",
            metavar="FILE",
            help=FROM_HELP + ("" if name == "estimate" else "; search pins what it states"),
        )
    return p, g


def register(sub: argparse._SubParsersAction) -> None:
    p, g = _planner_parser(
        sub,
        "estimate",
        "memory per stage and step time of one layout",
        "Predict per-rank memory of every pipeline stage and the step time of one layout.",
        "exatrain estimate --model gpt-1t --cluster frontier --gpus 3072 --tp 8 --pp 64 "
        "--micro-batch 1 --global-batch 1536 --zero 1 --recompute full",
    )
    g.add_argument("--out", metavar="PATH", help="also write the plan (with its estimate) as JSON")
    g.add_argument(
        "--trace",
        nargs="?",
        const="fast",
        choices=("fast", "full"),
        help="also trace the trainer's "
        "own model (FakeTensorMode, no allocation) and add traced_memory_bytes: fast (the default) traces "
        "one rank per distinct stage shape over a short op order and replays every stage's own order "
        "from it; full traces every stage over the whole step (minutes of CPU per stage at 175B scale)",
    )
    add_progress_arg(p)

    p, g = _planner_parser(
        sub,
        "search",
        "rank every legal layout by predicted throughput",
        "Enumerate every legal layout (tp, pp, dp, micro-batch, ZeRO, recompute, sequence parallel, "
        "schedule), drop those that do not fit in memory, rank the rest by predicted throughput; a "
        "tight one (capacity inside its memory band) is kept, marked. Layout flags pin one (--tp 8).",
        "exatrain search --model gpt-1t --cluster frontier --gpus 3072 --global-batch 1536 --top 10",
    )
    flag(g, PlanOptions, "--top", "how many layouts to show", type=int)
    p.add_argument("--explain", action="store_true", help="say why the winner beats the runners-up")
    flag(g, PlanOptions, "--rank-by", RANK_BY_HELP, choices=RANK_BY)
    g.add_argument("--out", metavar="PATH", help="write the best plan (with its estimate) as JSON")
    g.add_argument("--strict-memory", action="store_true", default=None, help=STRICT_MEMORY_HELP)

    p, g = _planner_parser(
        sub,
        "scaling",
        "predicted weak or strong scaling over GPU counts",
        "Weak scaling (global batch grows with the GPU count) or strong scaling (fixed global batch): "
        "each point is the best layout search finds, or the layout pinned with --tp/--pp.",
        "exatrain scaling --model gpt-175b --cluster frontier --gpus 128,256,512,1024 "
        "--global-batch 640 --mode weak --tp 4 --pp 16",
        gpus=False,
    )
    c = next(a for a in p._action_groups if a.title == "cluster")
    c.add_argument("--gpus", required=True, type=int_list, metavar="N,N,...", help="GPU counts, smallest first")
    flag(
        g,
        PlanOptions,
        "--mode",
        "weak: global batch grows with the GPU count; strong: fixed",
        choices=("weak", "strong"),
    )
    g.add_argument("--strict-memory", action="store_true", default=None, help=STRICT_MEMORY_HELP)


def cmd_estimate(args: argparse.Namespace) -> int:
    with progress(args, "trace") as say:
        plan = call(api.estimate, args, progress=say)
    return show(args, lambda: api.estimate_json(plan), lambda: api.render_estimate(plan))


def cmd_search(args: argparse.Namespace) -> int:
    result = call(api.search, args)
    lines = api.explain(result.ranked) if args.explain else None
    return show(
        args,
        lambda: api.search_json(result, lines),
        lambda: api.render_search(result, lines, args.gpus, args.global_batch),
    )


def cmd_scaling(args: argparse.Namespace) -> int:
    result = call(api.scaling, args)
    return show(args, result.to_dict, lambda: api.render_scaling(result))
