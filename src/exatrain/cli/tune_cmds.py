"""`exatrain tune`: Bayesian optimisation of the layout over short real runs (exatrain.tuning)."""

from __future__ import annotations

import argparse
import sys

from exatrain import api
from exatrain.api.tuning import TUNE_CLUSTER
from exatrain.cli.common import (
    add_cluster_args,
    add_engine_args,
    add_layout_args,
    add_model_args,
    add_progress_arg,
    call,
    finite_float,
    flag,
    nonneg_int,
    positive_int,
    progress,
    request_group,
    show,
)
from exatrain.api.requests import TuneOptions


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="find the fastest layout by short real runs (Bayesian optimisation)",
        description="Tune the layout on the real machine: every memory-feasible layout `search` finds is a "
        "candidate; the cost model's best predictions run first and its ranking is the prior of "
        "a Bayesian optimiser (Optuna study in SQLite: it survives a crash and resumes). Each "
        "trial trains a few steps and measures tokens/s after warm-up; out-of-memory, hangs and "
        "crashes are failed trials, hopeless runs are stopped early. --trials is the study's "
        "total, so a rerun with a larger number adds trials.",
        epilog="examples:\n  exatrain tune --model gpt-tiny --gpus 4 --global-batch 8 --trials 12 --steps 6\n"
        "  exatrain tune --model gpt-1.4b --cluster frontier --gpus 32 --global-batch 320 --trials 20 "
        "--time-budget 2h --study sqlite:///tune.db --launcher 'srun -N4 --ntasks-per-node 8 {cmd}'",
    )
    add_model_args(p)
    add_cluster_args(p, TUNE_CLUSTER)
    add_layout_args(p)
    add_engine_args(p, "tune ranks the candidates for exatrain only, the trainer its trials run", overlap=False)
    g = request_group(p, "options", TuneOptions, "tuning")
    t = TuneOptions
    flag(g, t, "--trials", "finished runs the study holds in total", type=positive_int)
    g.add_argument("--time-budget", metavar="DURATION", help="start no trial after this long: 2h, 90m, 1h30m, 600 (s)")
    flag(g, t, "--study", "Optuna storage URL or a SQLite file path", metavar="URL")
    g.add_argument("--study-name", help="default: derived from the model, cluster, gpus, batch")
    g.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda for a GPU cluster, cpu for local-cpu")
    flag(g, t, "--steps", "optimizer steps per trial, at least 3: the first 2 are warm-up", type=positive_int)
    flag(g, t, "--seed", "the runs' seed", type=nonneg_int)
    flag(g, t, "--trial-timeout", "a run still going after this is a hang: killed, a failed trial", metavar="DURATION")
    g.add_argument(
        "--launcher",
        metavar="TEMPLATE",
        help="start each run through this command, {cmd} = `python -m "
        "exatrain.train ...`, e.g. 'srun -N4 --ntasks-per-node 8 {cmd}' (default: local ranks)",
    )
    flag(g, t, "--candidates", "tune over the N best predicted feasible layouts", type=positive_int)
    flag(
        g, t, "--seed-trials", "first trials: the best predicted layout of each of the N best tp x pp meshes", type=int
    )
    flag(g, t, "--prune-ratio", "stop a run below this x the best run after warm-up; 0 = never", type=finite_float)
    g.add_argument(
        "--out", metavar="PATH", help="the best plan as JSON (default: beside the study, e.g. tune.best.json)"
    )
    g.add_argument(
        "--runs-file",
        metavar="PATH",
        help="append a RunRecord per finished run (default: beside the study, e.g. tune.runs.jsonl)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_progress_arg(p)  # kept for scripts that pass it: tune prints a line per trial in any case


def cmd_tune(args: argparse.Namespace) -> int:
    with progress(args, "tune", always=True) as say:  # a trial takes minutes: one line each, terminal or not
        out = call(api.tune, args, progress=say)
    show(args, out.to_dict, lambda: api.render_tune(out))
    if out.best is None:
        sys.stderr.write(
            f"exatrain tune: no run succeeded ({out.finished} finished); see the trials' errors and {out.trials_dir}\n"
        )
        return 1
    return 0
