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
from exatrain.cli.common import Parser
from exatrain.errors import UserError

# Command modules, in the order their commands appear in `exatrain --help`.
COMMAND_MODULES = (
    "exatrain.cli.catalog_cmds",   # models, hardware
    "exatrain.cli.train_cmds",     # train
    "exatrain.cli.data_cmds",      # prepare, export
    "exatrain.cli.planner_cmds",   # estimate, search, scaling
    "exatrain.cli.launch_cmds",    # launch, export-config
    "exatrain.cli.tune_cmds",      # tune
    "exatrain.cli.report_cmds",    # report
    "exatrain.cli.bench_cmds",     # bench, calibrate, validate
)


def _warning_line(command: str):
    """``warnings.showwarning`` that prints an API's ExatrainWarning as one line on stderr (others as Python does)."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        if issubclass(category, ExatrainWarning):
            sys.stderr.write(f"exatrain {command}: warning: {message}\n")
        else:
            shown(message, category, filename, lineno, file, line)
    return show


def build_parser() -> Parser:
    from exatrain import __version__

    parser = Parser(prog="exatrain", description="Plan, predict and run 3D-parallel training of GPT-style "
                    "language models.", epilog="example: exatrain estimate --model gpt-175b --cluster frontier "
                    "--gpus 128 --tp 4 --pp 16 --global-batch 640 --zero 1 --recompute full")
    parser.add_argument("--version", action="version", version=f"exatrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
