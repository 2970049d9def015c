"""Flags shared by several commands, and the one place they are turned into typed config.

Every command that takes a model, a cluster or a layout uses these helpers, so `estimate`,
`search`, `train` and `tune` spell their flags the same way and resolve them identically.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from exatrain.catalog import ClusterSpec, ModelSpec, get_cluster, get_model, load_cluster_file, load_model_file
from exatrain.errors import PlanError, UserError
from exatrain.plan import DTYPES, RECOMPUTE, SCHEDULES, ParallelDims, Plan, TrainShape


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """'3,4,4,3' -> (3, 4, 4, 3); every entry a positive integer."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


# ---- model -------------------------------------------------------------------------------------
_MODEL_FLAGS = {  # flag dest -> ModelSpec field
    "layers": "layers", "hidden": "hidden", "heads": "heads", "kv_heads": "kv_heads",
    "ffn_hidden": "ffn_hidden", "seq_len": "seq_len", "vocab": "vocab", "arch": "arch",
}


def add_model_args(p: argparse.ArgumentParser, default: str | None = None) -> None:
    g = p.add_argument_group("model (a preset, a file, or flags; flags override)")
    g.add_argument("--model", default=None, metavar="NAME",
                   help=f"preset name (`exatrain models` lists them){f'; default {default}' if default else ''}")
    g.add_argument("--model-file", default=None, metavar="PATH", help="TOML/JSON file of model fields")
    g.add_argument("--arch", choices=("gpt", "llama"), default=None, help="architecture family")
    g.add_argument("--layers", type=positive_int, default=None)
    g.add_argument("--hidden", type=positive_int, default=None)
    g.add_argument("--heads", type=positive_int, default=None)
    g.add_argument("--kv-heads", type=positive_int, default=None, help="key/value heads (GQA, llama only)")
    g.add_argument("--ffn-hidden", type=positive_int, default=None, help="MLP width")
    g.add_argument("--seq-len", type=positive_int, default=None)
    g.add_argument("--vocab", type=positive_int, default=None)
    p.set_defaults(_model_default=default)


def resolve_model(args: argparse.Namespace) -> ModelSpec:
    """Preset or file, then flag overrides; a model from flags alone is named 'custom'."""
    if args.model and args.model_file:
        raise UserError("give either --model or --model-file, not both")
    overrides = {field: getattr(args, dest) for dest, field in _MODEL_FLAGS.items()
                 if getattr(args, dest, None) is not None}
    if args.model_file:
        base: ModelSpec | None = load_model_file(args.model_file)
    elif args.model:
        base = get_model(args.model)
    elif {"layers", "hidden", "heads", "seq_len", "vocab"} <= set(overrides):
        fields = {"name": "custom", "arch": "gpt", **overrides}
        return ModelSpec.from_dict(fields, source="model flags")
    elif getattr(args, "_model_default", None):
        base = get_model(args._model_default)
    else:
        raise UserError("no model: pass --model NAME, --model-file PATH, or all of "
                        "--layers --hidden --heads --seq-len --vocab")
    if not overrides:
        return base
    # A changed shape is a different model: drop family defaults that depended on the old one.
    fields = base.to_dict()
    if "hidden" in overrides and "ffn_hidden" not in overrides and base.arch == "gpt":
        fields["ffn_hidden"] = 0
    if "heads" in overrides and "kv_heads" not in overrides and base.kv_heads == base.heads:
        fields["kv_heads"] = 0
    if "arch" in overrides and overrides["arch"] != base.arch:
        fields["tied_embeddings"] = None
    fields.update(overrides)
    fields["name"] = f"{base.name}*"  # marks a preset with overridden fields
    return ModelSpec.from_dict(fields, source="model flags")


# ---- cluster -----------------------------------------------------------------------------------
def add_cluster_args(p: argparse.ArgumentParser, default: str = "frontier", gpus: bool = True) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--cluster", default=None, metavar="NAME",
                   help=f"catalog cluster (`exatrain hardware`); default {default}")
    g.add_argument("--cluster-file", default=None, metavar="PATH", help="TOML/JSON cluster description")
    if gpus:
        g.add_argument("--gpus", type=positive_int, default=None, help="number of devices (ranks)")
    p.set_defaults(_cluster_default=default)


def resolve_cluster(args: argparse.Namespace) -> ClusterSpec:
    if args.cluster and args.cluster_file:
        raise UserError("give either --cluster or --cluster-file, not both")
    if args.cluster_file:
        return load_cluster_file(args.cluster_file)
    return get_cluster(args.cluster or args._cluster_default)


# ---- layout ------------------------------------------------------------------------------------
def add_layout_args(p: argparse.ArgumentParser, *, required_degrees: bool = False) -> None:
    g = p.add_argument_group("layout")
    g.add_argument("--tp", type=positive_int, default=None, help="tensor-parallel degree (default 1)")
    g.add_argument("--pp", type=positive_int, default=None, help="pipeline-parallel degree (default 1)")
    g.add_argument("--dp", type=positive_int, default=None,
                   help="data-parallel degree (default: --gpus / (tp*pp))")
    g.add_argument("--micro-batch", type=positive_int, default=None, help="sequences per micro-batch (default 1)")
    g.add_argument("--global-batch", type=positive_int, default=None,
                   help="sequences per optimizer step (default: micro-batch*dp*(4*pp if pp>1 else 1))")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None,
                   help="0: DDP; 1: shard optimizer states; 2: + gradients; 3: + weights (FSDP)")
    g.add_argument("--recompute", choices=RECOMPUTE, default=None, help="activation recomputation")
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="shard norms/dropout activations over the tp group")
    g.add_argument("--schedule", choices=SCHEDULES, default=None, help="pipeline schedule (default 1f1b)")
    g.add_argument("--interleave", type=positive_int, default=None,
                   help="virtual pipeline stages per rank (interleaved / zero_bubble)")
    g.add_argument("--stage-layers", type=int_list, default=None, metavar="N,N,...",
                   help="layers per virtual stage, e.g. 3,5,5,3 (default: balanced)")
    g.add_argument("--dtype", choices=DTYPES, default=None, help="training precision (default bfloat16)")
    g.add_argument("--flash-attention", action=argparse.BooleanOptionalAction, default=None,
                   help="fused attention that stores no s*s scores (default on)")


def resolve_plan(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec | None,
                 *, base: Plan | None = None, default_dtype: str = "bfloat16") -> Plan:
    """Layout flags (over an optional base plan) -> a validated Plan. dp is derived from --gpus."""
    b = base
    tp = _pick(args.tp, b and b.tp, 1)
    pp = _pick(args.pp, b and b.pp, 1)
    gpus = getattr(args, "gpus", None)
    if args.dp is not None:
        dp = args.dp
        if gpus is not None and gpus != tp * pp * dp:
            raise PlanError(f"--gpus {gpus} != tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp}; "
                            "drop --dp to derive it")
    elif gpus is not None:
        if gpus % (tp * pp):
            raise PlanError(f"--gpus {gpus} is not divisible by tp*pp = {tp}*{pp} = {tp * pp}")
        dp = gpus // (tp * pp)
    else:
        dp = b.dp if b else 1
    micro = _pick(args.micro_batch, b and b.micro_batch, 1)
    if args.global_batch is not None:
        global_batch = args.global_batch
    elif b is not None and b.dp == dp and b.micro_batch == micro:
        global_batch = b.global_batch
    else:
        global_batch = micro * dp * (4 * pp if pp > 1 else 1)
    schedule = _pick(args.schedule, b and b.schedule, "1f1b")
    interleave = _pick(args.interleave, b and b.interleave,
                       2 if schedule in ("interleaved", "zero_bubble") and pp > 1 else 1)
    stage_layers = args.stage_layers if args.stage_layers is not None else (
        b.stage_layers if b and b.pp == pp and b.interleave == interleave and b.model == model else ())
    plan = Plan(
        model=model,
        dims=ParallelDims(tp=tp, pp=pp, dp=dp),
        shape=TrainShape(micro_batch=micro, global_batch=global_batch),
        zero_stage=_pick(args.zero, b and b.zero_stage, 0),
        recompute=_pick(args.recompute, b and b.recompute, "none"),
        sequence_parallel=bool(_pick(args.sequence_parallel, b and b.sequence_parallel, False)),
        schedule=schedule,
        interleave=interleave,
        stage_layers=tuple(stage_layers),
        dtype=_pick(args.dtype, b and b.dtype, default_dtype),
        flash_attention=bool(_pick(args.flash_attention, b and b.flash_attention, True)),
        cluster=cluster.name if cluster is not None else (b.cluster if b else ""),
    )
    return plan.validate(cluster)


def _pick(flag: Any, from_base: Any, default: Any) -> Any:
    """A flag given on the command line wins, then the base plan's value, then the default."""
    if flag is not None:
        return flag
    return default if from_base is None else from_base


# ---- output --------------------------------------------------------------------------------------
def make_console(stderr: bool = False) -> Any:
    """A rich Console; when output is not a terminal, wide enough that tables are not squeezed."""
    import os

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", "160"))
    return Console(file=stream, width=width)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
