"""What every command shares: the parser, flag groups named as the API's keyword arguments (so a
command passes its flags to its API call by name: ``call``), and output helpers."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import re
import sys
import textwrap
from typing import Any, Callable

from exatrain.settings import BY_NAME, DTYPES, FLAG_SETTINGS, RECOMPUTE, SCHEDULES
from exatrain.api.requests import ClusterQuery, Engine, Layout, ModelQuery
from exatrain.api import make_console, opt, progress_lines, table  # noqa: F401 (the commands' output helpers)
from exatrain.jsonio import versioned
from exatrain.limits import MAX_COUNT


_NEGATIVE = re.compile(r"-\.?\d")  # what a negative value looks like (-3T, -1e5, -.5), never a flag


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2 (no usage dump)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        kw.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)  # epilogs keep their lines
        if kw.get("description"):
            kw["description"] = textwrap.fill(kw["description"], 100)
        super().__init__(*a, **kw)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """argparse takes a value such as ``-3T`` after a flag for another flag ("expected one argument"); joined to
        its flag (``--tokens=-3T``), it reaches the flag's own check, which says what is wrong with the value."""
        args = list(sys.argv[1:] if args is None else args)
        for i in range(len(args) - 2, -1, -1):
            action = self._option_string_actions.get(args[i])
            if action is not None and action.nargs is None and _NEGATIVE.match(args[i + 1]):
                args[i : i + 2] = [f"{args[i]}={args[i + 1]}"]
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def _number(kind: str, cast: Callable[[str], Any], ok: Callable[[Any], bool]) -> Callable[[str], Any]:
    """A flag's parser: ``cast`` of the text where ``ok`` holds, else one line ("expected a {kind}")."""

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected a {kind}, got {text!r}")
        if cast is int and value > MAX_COUNT:  # exatrain.limits: beyond it the planner's int64 arithmetic overflows
            raise argparse.ArgumentTypeError(f"expected a {kind} of at most {MAX_COUNT:,}, got {text!r}")
        return value

    return parse


positive_int = _number("positive integer", int, lambda v: v > 0)
nonneg_int = _number("non-negative integer", int, lambda v: v >= 0)
nonneg_float = _number("non-negative number", float, lambda v: 0 <= v < float("inf"))
positive_float = _number("positive number", float, lambda v: 0 < v < float("inf"))
finite_float = _number("finite number", float, math.isfinite)  # its range is the API's to check, in one line


def positive_int_or_auto(text: str) -> int | str:
    """A positive integer, or "auto" (the search picks one per candidate)."""
    return "auto" if text == "auto" else positive_int(text)


def int_list(text: str) -> tuple[int, ...]:
    """'3,4,4,3' -> (3, 4, 4, 3); every entry a positive integer."""
    try:
        values = tuple(int(x) for x in text.split(","))  # an empty entry ("128,") is refused too
    except ValueError:
        values = ()
    if not values or any(v <= 0 or v > MAX_COUNT for v in values):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers of at most {MAX_COUNT:,}, got {text!r}"
        )
    return values


def default(fn: Callable | type, name: str) -> Any:
    """The default of ``fn``'s keyword argument ``name``, or of the field ``name`` of the request ``fn`` (a
    dataclass of ``api.requests``): what runs when the flag is not given."""
    if dataclasses.is_dataclass(fn):
        return next(f.default for f in dataclasses.fields(fn) if f.name == name)
    return inspect.signature(fn).parameters[name].default


def flag(group: Any, fn: Callable | type, name: str, help: str, **kw: Any) -> None:
    """A flag for ``fn``'s keyword argument (or its request's field) of the same name: its default is the API's,
    and --help says it (unless the help already names its default)."""
    value = default(fn, name[2:].replace("-", "_"))
    if value is not None and "default" not in help:
        help += f" (default {value:g})" if isinstance(value, float) else f" (default {value})"
    group.add_argument(name, default=value, help=help, **kw)


REQUESTS = "requests_"  # the parser default naming each request group: {key: (request class or None, group)}


def request_group(p: argparse.ArgumentParser, key: str, cls: type | None, title: str) -> Any:
    """An argument group whose flags are the fields of the request ``cls`` (``api.requests``; None: the run
    settings, a mapping by name) that the command's API call takes as ``key``: ``call`` builds it from them."""
    g = p.add_argument_group(title)
    p.set_defaults(**{REQUESTS: {**(p.get_default(REQUESTS) or {}), key: (cls, g)}})
    return g


def requests_of(args: argparse.Namespace) -> dict[str, Any]:
    """The requests a command's flags make: one per request group (``request_group``), of the flags given."""
    out: dict[str, Any] = {}
    for key, (cls, g) in (getattr(args, REQUESTS, None) or {}).items():
        given = {a.dest: getattr(args, a.dest) for a in g._group_actions if getattr(args, a.dest, None) is not None}
        out[key] = given if cls is None else cls(**given)
    return out


def call(fn: Callable, args: argparse.Namespace, **extra: Any) -> Any:
    """``fn`` with its requests built from the command's flag groups (``requests_of``) and every other flag named
    as one of its keyword arguments; a flag not given (None) leaves the API's default. ``extra``: keywords the
    call also takes (a request's field by name, e.g. progress)."""
    names = inspect.signature(fn).parameters
    built = requests_of(args)
    kw = {k: v for k, v in vars(args).items() if k in names and v is not None and k not in built}
    return fn(**{**kw, **built, **extra})


def add_model_args(p: argparse.ArgumentParser, default_model: str | None = None) -> None:
    g = request_group(p, "model", ModelQuery, "model (a preset, a file, or flags; flags override)")
    g.add_argument(
        "--model",
        metavar="NAME",
        help="preset name (`exatrain models` lists them)" + (f"; default {default_model}" if default_model else ""),
    )
    g.add_argument("--model-file", metavar="PATH", help="TOML/JSON file of model fields")
    g.add_argument("--arch", choices=("gpt", "llama"), help="architecture family")
    for flag in ("--layers", "--hidden", "--heads", "--kv-heads", "--ffn-hidden", "--seq-len", "--vocab"):
        g.add_argument(
            flag,
            type=positive_int,
            help={"--kv-heads": "key/value heads (GQA, llama only)", "--ffn-hidden": "MLP width"}.get(flag),
        )


def add_cluster_args(
    p: argparse.ArgumentParser, default_cluster: str | None, gpus: bool = True, request: bool = True
) -> Any:
    """The cluster flags: a ClusterQuery's (``request``; else plain flags of the call's own names)."""
    g = request_group(p, "cluster", ClusterQuery, "cluster") if request else p.add_argument_group("cluster")
    g.add_argument(
        "--cluster",
        metavar="NAME",
        help="catalog cluster (`exatrain hardware`)" + (f"; default {default_cluster}" if default_cluster else ""),
    )
    g.add_argument("--cluster-file", metavar="PATH", help="TOML/JSON cluster description")
    if gpus:
        g.add_argument("--gpus", type=positive_int, help="number of devices (ranks)")
    return g


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
    (
        "--interleave",
        positive_int,
        None,
        "virtual stages per rank (default 2 for interleaved, zero_bubble, zbv, dualpipev; else 1)",
    ),
    ("--stage-layers", int_list, None, "layers per virtual stage, e.g. 3,5,5,3 (default: balanced)"),
    ("--dtype", None, DTYPES, "training precision (default bfloat16; train on the CPU: float32)"),
    ("--flash-attention", _BOOL, None, "fused attention that stores no s*s scores (default on)"),
)


EXTENSION_FLAGS = (  # the expert- and context-parallel degrees (the planner's commands and train)
    (
        "--ep",
        positive_int,
        None,
        "expert-parallel degree of a mixture-of-experts model, inside dp (default 1; search: explored)",
    ),
    (
        "--cp",
        positive_int,
        None,
        "context-parallel degree, adds ranks: gpus = tp*cp*pp*dp, seq_len divisible by "
        "2*cp (default 1; search: explored from 8k-token sequences)",
    ),
)
# The run settings' flags come from their registry (settings.SETTINGS: flag, choices, help), read as each says
_PARSE = {
    "choice": None,
    "switch": _BOOL,
    "number": nonneg_float,
    "count": positive_int,
    "count_or_auto": positive_int_or_auto,
    "list": None,
}
_METAVARS = {s.flag: s.metavar for s in FLAG_SETTINGS if s.metavar}  # a setting's own word for its value


def add_layout_args(p: argparse.ArgumentParser, extensions: bool = False, settings: tuple[str, ...] = ()) -> None:
    """The layout flags; ``extensions``: also ep and cp (EXTENSION_FLAGS) and the run settings' flags (settings.
    FLAG_SETTINGS: all of them, the planner's commands, or those named in ``settings``)."""
    g = request_group(p, "layout", Layout, "layout (not given: the plan's, else the default shown)")
    runs = tuple(
        (s.flag, _PARSE[s.arg], s.choices if s.arg == "choice" else None, s.help)
        for s in FLAG_SETTINGS
        if not settings or s.name in settings
    )
    _add_flags(g, LAYOUT_FLAGS + (EXTENSION_FLAGS if extensions else ()))
    if extensions:
        _add_flags(request_group(p, "settings", None, "run settings (not given: the runtime's own)"), runs)


def _add_flags(g: Any, flags: tuple) -> None:
    for name, kind, choices, help in flags:
        kw: dict[str, Any] = {"action": kind} if kind is _BOOL else {"type": kind, "choices": choices}
        metavar = _METAVARS.get(name) or {int_list: "N,N,..."}.get(kind)
        g.add_argument(name, help=help, **({**kw, "metavar": metavar} if metavar else kw))


def add_engine_args(p: argparse.ArgumentParser, why: str = "", overlap: bool = True) -> Any:
    """The Engine request's flags: --runtime (checked by the API: an unknown name is one line), --overlap (where
    ``overlap``) and --calibration."""
    g = request_group(p, "engine", Engine, "engine")
    flag(
        g,
        Engine,
        "--runtime",
        BY_NAME["runtime"].help + (f"; {why}" if why else ""),
        metavar=BY_NAME["runtime"].metavar,
    )
    g.add_argument("--calibration", metavar="PATH", help="cost-model parameters from `exatrain bench` or `calibrate`")
    if overlap:
        flag(
            g,
            Engine,
            "--overlap",
            "which of the runtime's overlaps of communication with compute are on: all (its "
            "switches assumed on), default (the engine's defaults), none, or a comma list of tp, dp_grad_reduce, "
            "dp_param_gather, pp_p2p, ep_a2a; not given: the engine's defaults, said in the notes, with the band's "
            "low end reaching every overlap on",
            metavar="WHICH",
        )
    return g


def add_progress_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--progress",
        action="store_true",
        help="show progress on stderr even when it is not a terminal (a terminal always gets it)",
    )


def progress(args: argparse.Namespace, title: str, always: bool = False):
    """Progress lines on stderr (``report.text.progress_lines``): on a terminal, or with --progress or ``always`` (a
    command that would otherwise say nothing for minutes: tune)."""
    return progress_lines(title, getattr(args, "progress", False) or always)


def warn_line(command: str) -> Callable[[str], None]:
    """One line on stderr per warning."""
    return lambda message: sys.stderr.write(f"exatrain {command}: warning: {message}\n")


def show(args: argparse.Namespace, data: Callable[[], Any], render: Callable[[], Any]) -> int:
    """A command's result: its JSON object (``data()``, with ``format_version`` first: docs/json.md) with --json,
    else as ``render()`` prints it; exit status 0."""
    if args.json:
        sys.stdout.write(json.dumps(versioned(data()), indent=2) + "\n")
    else:
        render()
    return 0
