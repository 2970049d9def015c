"""What every command shares: the parser, flag groups named as the API's keyword arguments (so a
command passes its flags to its API call by name: ``call``), and output helpers."""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import sys
import textwrap
from typing import Any, Callable, Iterator

from exatrain.plan import (ADAM_KERNELS, ATTENTION_KERNELS, CP_COMMS, CROSS_ENTROPY, DTYPES, ELEMENTWISE, FP8_RECIPES,
                           GRAD_ACCUM, GRAD_ACCUM_FUSION, MOE_DISPATCHERS, RECOMPUTE, SCHEDULES)
from exatrain.api import make_console, opt, table  # noqa: F401 (the commands' output helpers)
from exatrain.limits import MAX_COUNT


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2 (no usage dump)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        kw.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)  # epilogs keep their lines
        if kw.get("description"):
            kw["description"] = textwrap.fill(kw["description"], 100)
        super().__init__(*a, **kw)

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def _typed(kind: str, ok: Callable[[int], bool]) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected a {kind} integer, got {text!r}")
        if value > MAX_COUNT:  # exatrain.limits: beyond it the planner's int64 arithmetic overflows
            raise argparse.ArgumentTypeError(f"expected a {kind} integer of at most {MAX_COUNT:,}, got {text!r}")
        return value
    return parse


positive_int = _typed("positive", lambda v: v > 0)


def positive_int_or_auto(text: str) -> int | str:
    """A positive integer, or "auto" (the search picks one per candidate)."""
    return "auto" if text == "auto" else _typed("positive", lambda v: v > 0)(text)
nonneg_int = _typed("non-negative", lambda v: v >= 0)


def nonneg_float(text: str) -> float:
    """'1.25' -> 1.25; a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """'3,4,4,3' -> (3, 4, 4, 3); every entry a positive integer."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(v <= 0 or v > MAX_COUNT for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers of at most {MAX_COUNT:,}, "
                                         f"got {text!r}")
    return values


def finite_float(text: str) -> float:
    """'3e-4' -> 0.0003; a finite number (its range is the API's to check, in one line)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def default(fn: Callable, name: str) -> Any:
    """The default of ``fn``'s keyword argument ``name`` (what runs when the flag is not given)."""
    return inspect.signature(fn).parameters[name].default


def flag(group: Any, fn: Callable, name: str, help: str, **kw: Any) -> None:
    """A flag for ``fn``'s keyword argument of the same name: its default is the API's, and --help
    says it (unless the help already names its default)."""
    value = default(fn, name[2:].replace("-", "_"))
    if value is not None and "default" not in help:
        help += f" (default {value:g})" if isinstance(value, float) else f" (default {value})"
    group.add_argument(name, default=value, help=help, **kw)


def call(fn: Callable, args: argparse.Namespace, **extra: Any) -> Any:
    """``fn`` with every flag named as one of its keyword arguments; a flag not given (None) leaves
    the API's default."""
    names = inspect.signature(fn).parameters
    kw = {k: v for k, v in vars(args).items() if k in names and v is not None}
    return fn(**{**kw, **extra})


def add_model_args(p: argparse.ArgumentParser, default_model: str | None = None) -> None:
    g = p.add_argument_group("model (a preset, a file, or flags; flags override)")
    g.add_argument("--model", metavar="NAME", help="preset name (`exatrain models` lists them)"
                   + (f"; default {default_model}" if default_model else ""))
    g.add_argument("--model-file", metavar="PATH", help="TOML/JSON file of model fields")
    g.add_argument("--arch", choices=("gpt", "llama"), help="architecture family")
    for flag in ("--layers", "--hidden", "--heads", "--kv-heads", "--ffn-hidden", "--seq-len", "--vocab"):
        g.add_argument(flag, type=positive_int, help={"--kv-heads": "key/value heads (GQA, llama only)",
                                                      "--ffn-hidden": "MLP width"}.get(flag))


def add_cluster_args(p: argparse.ArgumentParser, default_cluster: str | None, gpus: bool = True) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--cluster", metavar="NAME", help="catalog cluster (`exatrain hardware`)"
                   + (f"; default {default_cluster}" if default_cluster else ""))
    g.add_argument("--cluster-file", metavar="PATH", help="TOML/JSON cluster description")
    if gpus:
        g.add_argument("--gpus", type=positive_int, help="number of devices (ranks)")


_BOOL = argparse.BooleanOptionalAction
LAYOUT_FLAGS = (  # the defaults named here are make_plan's (exatrain.api.plans)
    ("--tp", positive_int, None, "tensor-parallel degree (default 1)"),
    ("--pp", positive_int, None, "pipeline-parallel degree (default 1)"),
    ("--dp", positive_int, None, "data-parallel degree (default: --gpus / (tp*pp))"),
    ("--micro-batch", positive_int, None, "sequences per micro-batch (default 1)"),
    ("--global-batch", positive_int, None, "sequences per step (default: micro-batch*dp*(4*pp if pp>1 else 1))"),
    ("--zero", int, (0, 1, 2, 3), "0: DDP (default); 1: shard optimizer states; 2: + gradients; 3: + weights (FSDP)"),
    ("--recompute", None, RECOMPUTE, "activation recomputation (default none)"),
    ("--sequence-parallel", _BOOL, None, "shard norms/dropout activations over the tp group (default off)"),
    ("--schedule", None, SCHEDULES, "pipeline schedule (default 1f1b)"),
    ("--interleave", positive_int, None, "virtual stages per rank (default 2 for interleaved / zero_bubble, else 1)"),
    ("--stage-layers", int_list, None, "layers per virtual stage, e.g. 3,5,5,3 (default: balanced)"),
    ("--dtype", None, DTYPES, "training precision (default bfloat16; train on the CPU: float32)"),
    ("--flash-attention", _BOOL, None, "fused attention that stores no s*s scores (default on)"),
)


EXTENSION_FLAGS = (  # the planner's (estimate, search, scaling); exatrain's trainer does not run them
    ("--ep", positive_int, None, "expert-parallel degree, inside dp (MoE models; default 1; search: explored)"),
    ("--cp", positive_int, None, "context-parallel degree, adds ranks: gpus = tp*cp*pp*dp (default 1; search: "
     "explored from 8k-token sequences)"),
    ("--fp8", None, FP8_RECIPES, "run the linear layers' GEMMs in FP8 with this "
     "scaling recipe (default: none)"),
    ("--moe-dispatcher", None, MOE_DISPATCHERS, "how MoE tokens reach their experts: alltoall "
     "(every routed copy; default) or Megatron-Core's flex dispatcher with DeepEP / HybridEP (once per "
     "destination rank and node)"),
    ("--moe-capacity-factor", nonneg_float, None, "drop a MoE layer's tokens beyond C times an expert's mean "
     "load and pad every expert's input to it (Megatron-Core --moe-expert-capacity-factor C "
     "--moe-pad-expert-input-to-capacity; alltoall dispatcher); default 0: dropless, the busiest expert rank "
     "taking 1.25x the mean"),
    ("--moe-force-balance", _BOOL, None, "route MoE tokens evenly whatever the router says (Megatron-Core "
     "--moe-router-force-load-balancing, a benchmarking switch): the busiest expert rank takes the mean; "
     "default off"),
    ("--fp8-param-gather", _BOOL, None, "gather the FP8 GEMMs' weights in FP8 over the data-parallel group and "
     "keep no 16-bit copy of them (Megatron-Core --fp8-param-gather, with the distributed optimizer: ZeRO-1+; "
     "torchtitan enable_fsdp_float8_all_gather, with FSDP: ZeRO-2/3 and --fp8 current); needs --fp8; default off"),
    ("--attention-kernel", None, ATTENTION_KERNELS, "which kernel the run's flash attention is: fused (cuDNN / "
     "Transformer Engine), fa2 (FlashAttention-2: Megatron-DeepSpeed, and torch SDPA on Hopper before torch 2.11), "
     "sdpa (torch SDPA's own choice); default: the runtime's"),
    ("--elementwise", None, ELEMENTWISE, "how the layers' element-wise ops run: fused (torch.compile, "
     "Megatron's fused kernels), eager (a kernel per PyTorch op), eager-composite (also each RMSNorm as its "
     "composite ops: a hand-written norm, or torch before 2.9); default: the runtime's "
     "(Megatron fused; torchtitan and exatrain eager)"),
    ("--cross-entropy", None, CROSS_ENTROPY, "how the loss runs over the logits: upcast (torch's "
     "cross_entropy(logits.float()): 12 bytes a logit at its peak; torchtitan, exatrain), inplace (Megatron's "
     "vocab-parallel loss, one fp32 copy worked in place: e + 4 bytes) or fused (one compiled kernel over the 16-bit "
     "logits, 2e bytes: torchtitan's compiled loss, [compile] components \"loss\"); default: the runtime's "
     "(Megatron inplace; torchtitan fused when its element-wise ops are, else upcast; exatrain upcast)"),
    ("--grad-accum", None, GRAD_ACCUM, "the dtype bfloat16 training accumulates and reduces its gradients in: "
     "float32 (Megatron-Core's default; DeepSpeed's BF16_Optimizer, data_types.grad_accum_dtype fp32, ZeRO-1: "
     "26 bytes a parameter every micro-batch to accumulate them, all-reduced in fp32) or bfloat16 (DeepSpeed's "
     "default; Megatron-Core --grad-reduce-in-bf16); default: the runtime's (torchtitan and exatrain: float32 only)"),
    ("--grad-accum-fusion", None, GRAD_ACCUM_FUSION, "whether each micro-batch's weight gradients are added to the "
     "accumulated ones inside the weight-gradient GEMMs (on: Megatron-Core's default) or by a pass over the stage's "
     "gradients after each backward (off: Megatron-Core's --no-gradient-accumulation-fusion, 10 bytes a parameter "
     "every micro-batch into fp32 main gradients); Megatron-Core only"),
    ("--adam-kernel", None, ADAM_KERNELS, "the kernel the optimizer step runs Adam with: fused (one kernel, 28 bytes "
     "a parameter; torchtitan's default since 2025-02) or foreach (torch's chain of multi-tensor kernels, 84 bytes a "
     "parameter; torchtitan's --optimizer.implementation foreach, its default before); torchtitan only"),
    ("--cp-comm", None, CP_COMMS, "how attention's operands travel under --cp: p2p (a ring of K,V blocks, each "
     "behind a block's attention), all_gather (K,V gathered; exposed in Transformer Engine and exatrain, behind the "
     "local block in torchtitan) or a2a (all-to-all of Q,K,V and the output: DeepSpeed-Ulysses, Megatron-Core "
     "--cp-comm-type a2a; cp must divide the heads a rank holds); default: the runtime's (Megatron-Core p2p, a2a for "
     "sliding-window models; Megatron-DeepSpeed a2a; torchtitan and exatrain all_gather)"),
    ("--recompute-modules", None, None, "what --recompute selective reruns, Megatron-Core's modules, comma-separated: "
     "core_attn (its default), layernorm, moe_act, mla_up_proj, mlp (a dense layer's), shared_experts, moe; "
     "--runtime megatron-core only (its --recompute-modules); a search with it tries selective recomputation only"),
    ("--recompute-layers", positive_int_or_auto, None, "with --recompute full: recompute only the first N layers of "
     "each (virtual) pipeline stage, the others keeping all they keep without recomputation (Megatron-Core "
     "--recompute-method block --recompute-num-layers N); --runtime megatron-core only; default: every layer; a "
     "search with a number tries full recomputation only, with 'auto' (search and scaling) each full-recomputation "
     "layout recomputes the fewest layers a stage with which it fits"),
    ("--recompute-every", positive_int, None, "with --recompute full: recompute one layer in N of each rank (counted "
     "over its stages in order), the others keeping all they keep without recomputation (torchtitan's layer-level "
     "selective checkpointing: activation_checkpoint.mode selective, selective_ac_option N); --runtime torchtitan "
     "only; default: every layer; a search with it tries full recomputation only"),
)


def add_layout_args(p: argparse.ArgumentParser, extensions: bool = False) -> None:
    """The layout flags; ``extensions``: also the EXTENSION_FLAGS (the planner's commands)."""
    g = p.add_argument_group("layout (not given: the plan's, else the default shown)")
    for name, kind, choices, help in LAYOUT_FLAGS + (EXTENSION_FLAGS if extensions else ()):
        kw: dict[str, Any] = {"action": kind} if kind is _BOOL else {"type": kind, "choices": choices}
        metavar = {int_list: "N,N,...", nonneg_float: "C"}.get(kind)
        g.add_argument(name, help=help, **({**kw, "metavar": metavar} if metavar else kw))


RUNTIME_HELP = ("the engine that runs the plan: megatron-core, megatron-deepspeed, torchtitan or exatrain (this "
                "project's trainer); its memory decides what fits and its overlaps and collectives the step time; "
                "default exatrain, or megatron-core for a model exatrain's trainer does not build (said in the "
                "output)")


def add_runtime_arg(p: argparse.ArgumentParser, fn: Callable, why: str = "") -> None:
    """--runtime, for ``fn``'s keyword ``runtime`` (checked by the API: an unknown name is one line)."""
    flag(p, fn, "--runtime", RUNTIME_HELP + (f"; {why}" if why else ""), metavar="ENGINE")
    if "overlap" in inspect.signature(fn).parameters:
        flag(p, fn, "--overlap", "which of the runtime's overlaps of communication with compute are on: all (its "
             "switches assumed on), default (the engine's defaults), none, or a comma list of tp, dp_grad_reduce, "
             "dp_param_gather, pp_p2p, ep_a2a; default all", metavar="WHICH")


def add_progress_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action="store_true",
                   help="show progress on stderr even when it is not a terminal (a terminal always gets it)")


@contextlib.contextmanager
def progress(args: argparse.Namespace, title: str, always: bool = False) -> Iterator[Callable[[str], None] | None]:
    """A callback printing progress lines (and a spinner on a terminal) to stderr, or None when
    stderr is not a terminal and neither --progress nor ``always`` (a command that would otherwise say
    nothing for minutes: tune) asks for them. Off a terminal each message is one plain line, flushed."""
    if not sys.stderr.isatty():
        def plain(message: str) -> None:
            sys.stderr.write(f"{title}: {' '.join(message.split())}\n")
            sys.stderr.flush()

        yield plain if getattr(args, "progress", False) or always else None
        return
    from rich.markup import escape

    con = make_console(stderr=True)

    def line(message: str) -> None:
        con.print(f"[dim]{escape(f'{title}: {message}')}[/]", highlight=False)

    with con.status(title) as status:
        def update(message: str) -> None:
            line(message)
            status.update(f"{title}: {message}")
        yield update


def warn_line(command: str) -> Callable[[str], None]:
    """One line on stderr per warning."""
    return lambda message: sys.stderr.write(f"exatrain {command}: warning: {message}\n")


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
