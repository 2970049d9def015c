"""The `exatrain` command line: parse flags, make one call to ``exatrain.api``, print the result.

Each command group lives in its own module with a ``register(subparsers)`` function; flags are
named as the API's keyword arguments. A ``UserError`` from anywhere becomes one line on stderr and
its exit status (2 for bad input), with no traceback.
"""

from __future__ import annotations

import importlib
import sys
import warnings

from exatrain.api import ExatrainWarning
from exatrain.cli.common import Parser, warn_line
from exatrain.errors import UserError

# Command modules (exatrain.cli.<name>_cmds, each module's doc names its commands), in `exatrain --help`'s order.
COMMAND_MODULES = ("catalog", "train", "data", "planner", "launch", "tune", "report", "bench")


def _warning_line(command: str):
    """``warnings.showwarning`` that prints an API's ExatrainWarning as one line on stderr (others as Python does)."""
    shown, line = warnings.showwarning, warn_line(command)
    return lambda message, category, *a, **kw: (
        line(message) if issubclass(category, ExatrainWarning) else shown(message, category, *a, **kw)
    )


def build_parser() -> Parser:
    from exatrain import __version__

    parser = Parser(
        prog="exatrain",
        description="Plan, predict and run 3D-parallel training of GPT-style language models.",
        epilog="example: exatrain estimate --model gpt-175b --cluster frontier "
        "--gpus 128 --tp 4 --pp 16 --global-batch 640 --zero 1 --recompute full",
    )
    parser.add_argument("--version", action="version", version=f"exatrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"exatrain.cli.{name}_cmds")
        module.register(sub)
        for command, p in sub.choices.items():  # a command runs its module's cmd_<command> unless it says otherwise
            if p.get_default("func") is None:
                p.set_defaults(func=getattr(module, "cmd_" + command.replace("-", "_")))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help / --version (0) or a usage error (2, one line already printed)
        return int(exc.code or 0)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", ExatrainWarning)
            warnings.showwarning = _warning_line(args.command)
            return int(args.func(args) or 0)
    except UserError as exc:
        _error(f"exatrain {args.command}: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        _error("exatrain: interrupted\n")
        return 130
    except BrokenPipeError:  # e.g. `exatrain search ... | head`
        return 0


def _error(line: str) -> None:
    """The one line on stderr; none when stderr is gone (a closed terminal: the run ended on SIGHUP)."""
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except OSError:
        pass
