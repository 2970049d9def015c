"""`exatrain train`: run a plan (or the embedded default) with PyTorch's distributed engine; `exatrain demo`:
the whole loop (bench --quick, search, train, predicted vs measured) on this machine."""

from __future__ import annotations

import argparse
import os

from exatrain import api
from exatrain.api.training import DEFAULT_MODEL, describe_default
from exatrain.errors import interrupt_on_signals
from exatrain.cli.common import (
    add_cluster_args,
    add_layout_args,
    add_model_args,
    call,
    finite_float,
    flag,
    make_console,
    nonneg_float,
    nonneg_int,
    positive_int,
    request_group,
    warn_line,
)
from exatrain.api.requests import TrainRun, TrainStore


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a plan (default: a small GPT on CPU ranks)",
        description="Train a plan with PyTorch's distributed engine (DeviceMesh, DTensor, pipelining, FSDP2/DDP). "
        f"With no flags: {describe_default()}. Under torchrun/srun each process is one rank; otherwise "
        "the ranks are started here.",
        epilog="examples:\n  exatrain train\n  exatrain train --plan plan.json --steps 200 --metrics-file runs.jsonl\n"
        "  exatrain train --model gpt-tiny --tp 2 --pp 2 --dp 2 --schedule interleaved --steps 50\n"
        "  exatrain train --model llama-tiny --tp 2 --cp 2 --steps 20",
    )
    p.add_argument(
        "--plan",
        metavar="PATH",
        help="a plan: `estimate/search --out`, `estimate --json`, or "
        "`search --json` (its first ranked plan, the best); flags override it, but its global batch "
        "stays unless --global-batch is given (a layout that cannot split it is refused)",
    )
    add_model_args(p, DEFAULT_MODEL)
    add_layout_args(p, extensions=True, settings=("fp8",))  # the trainer runs FP8 'current' (trainer/fp8.py)
    add_cluster_args(p, "the plan's, else local-cpu")
    _add_run_args(p)
    _add_store_args(p)
    register_demo(sub)


def _add_run_args(p: argparse.ArgumentParser) -> None:
    """The "training" group: TrainRun's flags."""
    g = request_group(p, "run", TrainRun, "training")
    for name, kind, help in (
        ("--steps", positive_int, "optimizer steps"),
        ("--seed", nonneg_int, "weights and data order"),
        ("--lr", finite_float, "peak learning rate"),
        ("--warmup", nonneg_int, "linear warm-up steps"),
        ("--min-lr-ratio", finite_float, "cosine decay floor, x lr"),
        ("--weight-decay", finite_float, "AdamW weight decay"),
        ("--grad-clip", finite_float, "max global grad norm, 0 = off"),
    ):
        flag(g, TrainRun, name, help, type=kind)
    g.add_argument(
        "--device", choices=("cpu", "cuda"), help="default: cuda for a plan made for a GPU cluster, else cpu"
    )
    g.add_argument("--metrics-file", metavar="PATH", help="append one JSON line per step and a RunRecord at the end")
    g.add_argument("--quiet", action="store_true", help="no progress output")
    flag(
        g,
        TrainRun,
        "--nan-policy",
        "a non-finite loss or gradient norm: stop with the step number, or skip that step's update and count it",
        choices=("stop", "skip"),
    )
    g.add_argument("--tensorboard", metavar="DIR", help="also write TensorBoard event files")
    g.add_argument(
        "--calibration",
        metavar="PATH",
        help="predict the step time with this calibration file "
        "(exatrain bench / calibrate); the prediction is shown beside the measurement when the file "
        "was measured on this machine",
    )
    g.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each transformer block and the loss (tp 1 only; the first steps compile)",
    )
    flag(
        g,
        TrainRun,
        "--watchdog",
        "seconds a rank's phase (forward, a collective, a save) may last before the "
        "rank counts as hung and the run ends with status 5 (default 0: max(300 s, 20 x the median step); setup "
        "and saves keep at least 300 s, a --compile run's first step 30 minutes)",
        type=nonneg_float,
        metavar="SECONDS",
    )
    g.add_argument(
        "--record-samples",
        action="store_true",
        help="list in each metrics line the global sample indices each data-parallel rank read",
    )


def _add_store_args(p: argparse.ArgumentParser) -> None:
    """The "data and checkpoints" group: TrainStore's flags."""
    g = request_group(p, "store", TrainStore, "data and checkpoints")
    g.add_argument(
        "--data",
        metavar="DIR",
        help="a dataset made by `exatrain prepare` (default: the built-in corpus, bytes: `exatrain prepare --builtin`)",
    )
    g.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="save checkpoints here (after the last step, and every "
        "--save-every steps); its filesystem needs room for one checkpoint (fp32 weights + AdamW moments)",
    )
    flag(
        g,
        TrainStore,
        "--save-every",
        "save every N steps (default 0: only after the last step)",
        type=nonneg_int,
        metavar="N",
    )
    flag(g, TrainStore, "--keep-last", "keep only the newest K (default 0: all)", type=nonneg_int, metavar="K")
    g.add_argument("--async-save", action="store_true", help="write checkpoints in the background")
    g.add_argument(
        "--resume",
        metavar="auto|PATH",
        help="auto: continue from the newest complete checkpoint in "
        "--checkpoint-dir (start fresh if there is none); PATH: from that checkpoint. Any layout may "
        "load it",
    )


def register_demo(sub: argparse._SubParsersAction) -> None:
    from exatrain.api.demo import DEMO_MODEL, MAX_RANKS

    p = sub.add_parser(
        "demo",
        help="the whole loop on this machine in minutes: bench --quick, search, train, predicted vs measured",
        description=f"Measure this machine (`bench --quick`), search the best layout of {DEMO_MODEL} for its CPU "
        "ranks with those measurements, train it, and print the predicted step time (with its band) "
        "beside the measured one. Everything goes into one folder: calib.json, plan.json, "
        "metrics.jsonl (one line per step, then the RunRecord; each rank's log in metrics.ranks/), "
        "summary.txt. `make run` runs this.",
        epilog="examples:\n  exatrain demo\n  exatrain demo --ranks 4 --steps 100 --out runs/demo4",
    )
    p.add_argument(
        "--out", metavar="DIR", help="a new or empty folder for what it writes (default: a new runs/demo-<time>)"
    )
    p.add_argument(
        "--ranks", type=positive_int, help=f"CPU ranks (default: one per core, a power of two from 2 to {MAX_RANKS})"
    )
    flag(p, api.demo, "--steps", "training steps", type=positive_int)
    p.add_argument("--quiet", action="store_true", help="no step lines while training")


def cmd_demo(args: argparse.Namespace) -> int:
    result = call(api.demo, args, warn=warn_line("demo"), progress=lambda line: print(f"demo: {line}", flush=True))
    print("\n".join(result.summary_lines()))  # plain: long lines stay whole, as summary.txt has them
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    quiet = args.quiet or os.environ.get("RANK", "0") != "0" or os.environ.get("SLURM_PROCID", "0") != "0"
    with interrupt_on_signals():
        result = call(api.train, args, warn=warn_line("train"), progress=None if quiet else print)
    if not quiet:
        make_console().print("\n".join(result.summary_lines()), highlight=False)
    return 0
