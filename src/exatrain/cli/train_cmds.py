"""`exatrain train`: run a plan (or the embedded default) with PyTorch's distributed engine."""

from __future__ import annotations

import argparse
import os

from exatrain import api
from exatrain.api.training import DEFAULT_MODEL, embedded_default
from exatrain.catalog import get_model
from exatrain.cli.common import (add_cluster_args, add_layout_args, add_model_args, call, default, make_console,
                                 nonneg_int, positive_int, warn_line)


def _no_flags() -> str:
    """What `exatrain train` runs with no flags, from the same function that makes it."""
    p = embedded_default(get_model(DEFAULT_MODEL))
    return (f"{DEFAULT_MODEL} over the standard library's source text (bytes), tp{p.tp} x pp{p.pp} x dp{p.dp} on "
            f"{p.gpus} CPU ranks: {p.schedule} over {p.num_microbatches} micro-batches of {p.micro_batch}, "
            f"global batch {p.global_batch}, {p.dtype}, {default(api.train, 'steps')} steps")


def register(sub: argparse._SubParsersAction) -> None:
    d = lambda name: default(api.train, name)  # noqa: E731 - the API's default is what --help shows
    p = sub.add_parser(
        "train", help=f"train a plan (default: {DEFAULT_MODEL} on 8 CPU ranks)",
        description="Train a plan with PyTorch's distributed engine (DeviceMesh, DTensor, pipelining, FSDP2/DDP). "
                    f"With no flags: {_no_flags()}. Under torchrun/srun each process is one rank; otherwise the "
                    "ranks are started here.",
        epilog="examples:\n  exatrain train\n  exatrain train --plan plan.json --steps 200 --metrics-file runs.jsonl\n"
               "  exatrain train --model gpt-tiny --tp 2 --pp 2 --dp 2 --schedule interleaved --steps 50")
    p.add_argument("--plan", metavar="PATH", help="a plan: `estimate/search --out`, `estimate --json`, or "
                   "`search --json` (its first ranked plan, the best); flags override it")
    add_model_args(p, DEFAULT_MODEL)
    add_layout_args(p)
    add_cluster_args(p, "the plan's, else local-cpu")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=positive_int, default=d("steps"), help=f"optimizer steps (default {d('steps')})")
    g.add_argument("--seed", type=nonneg_int, default=d("seed"), help=f"weights and data order (default {d('seed')})")
    g.add_argument("--lr", type=float, default=d("lr"), help=f"peak learning rate (default {d('lr'):g})")
    g.add_argument("--warmup", type=nonneg_int, default=d("warmup"), help=f"linear warm-up steps (default {d('warmup')})")
    g.add_argument("--min-lr-ratio", type=float, default=d("min_lr_ratio"),
                   help=f"cosine decay floor, x lr (default {d('min_lr_ratio')})")
    g.add_argument("--weight-decay", type=float, default=d("weight_decay"),
                   help=f"AdamW weight decay (default {d('weight_decay')})")
    g.add_argument("--grad-clip", type=float, default=d("grad_clip"),
                   help=f"max global grad norm, 0 = off (default {d('grad_clip'):g})")
    g.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda for a plan made for a GPU cluster, else cpu")
    g.add_argument("--metrics-file", metavar="PATH", help="append one JSON line per step and a RunRecord at the end")
    g.add_argument("--quiet", action="store_true", help="no progress output")
    g.add_argument("--nan-policy", choices=("stop", "skip"), default=d("nan_policy"),
                   help="a non-finite loss or gradient norm: stop with the step number (default), or skip that "
                        "step's update and count it")
    g.add_argument("--tensorboard", metavar="DIR", help="also write TensorBoard event files")
    g.add_argument("--calibration", metavar="PATH", help="predict the step time with this calibration file "
                   "(exatrain bench / calibrate); the prediction is shown beside the measurement when the file "
                   "was measured on this machine")
    g.add_argument("--compile", action="store_true",
                   help="torch.compile each transformer block and the loss (tp 1 only; the first steps compile)")
    g.add_argument("--record-samples", action="store_true",
                   help="list in each metrics line the global sample indices each data-parallel rank read")
    g = p.add_argument_group("data and checkpoints")
    g.add_argument("--data", metavar="DIR", help="a dataset made by `exatrain prepare` (default: the standard "
                   "library's source, bytes)")
    g.add_argument("--checkpoint-dir", metavar="DIR", help="save checkpoints here (after the last step, and every "
                   "--save-every steps); its filesystem needs room for one checkpoint (fp32 weights + AdamW moments)")
    g.add_argument("--save-every", type=nonneg_int, default=0, metavar="N", help="save every N steps (default: only "
                   "after the last step)")
    g.add_argument("--keep-last", type=nonneg_int, default=0, metavar="K", help="keep only the newest K (default: all)")
    g.add_argument("--async-save", action="store_true", help="write checkpoints in the background")
    g.add_argument("--resume", metavar="auto|PATH", help="auto: continue from the newest complete checkpoint in "
                   "--checkpoint-dir (start fresh if there is none); PATH: from that checkpoint. Any layout may load it")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    quiet = args.quiet or os.environ.get("RANK", "0") != "0" or os.environ.get("SLURM_PROCID", "0") != "0"
    result = call(api.train, args, warn=warn_line("train"), progress=None if quiet else print)
    if not quiet:
        con = make_console()
        for line in result.summary_lines():
            con.print(line, highlight=False)
    return 0
