"""`exatrain report`: pictures and an index.html from plans, searches, scaling studies and runs."""

from __future__ import annotations

import argparse

from exatrain import api
from exatrain.cli.common import call, flag


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="pictures and an index.html from plans, searches, scaling studies and runs",
        description="Draw the JSON the other commands print: memory per pipeline stage, step-time breakdown "
        "and the pipeline timeline of a plan; the landscape of a search; scaling curves beside "
        "the ideal and the Frontier study; predicted against measured and loss curves of runs. "
        "Writes PNGs and an index.html into --out. Each flag may be repeated.",
        epilog="example: exatrain estimate --model gpt-1t --cluster frontier --gpus 3072 --tp 8 --pp 64 "
        "--micro-batch 1 --global-batch 1536 --zero 1 --recompute full --out plan.json && "
        "exatrain report --plan plan.json --out report/",
    )
    for name, help in (
        ("--plan", "a plan file (estimate/search --out) or `exatrain estimate --json` output"),
        ("--search", "`exatrain search --json` output"),
        ("--scaling", "`exatrain scaling --json` output"),
        ("--runs", "a runs file: JSON lines of run records and per-step metrics"),
    ):
        p.add_argument(name, action="append", default=[], metavar="PATH", help=help)
    flag(p, api.report, "--out", "folder for the PNGs and index.html", metavar="DIR")
    p.add_argument(
        "--calibration",
        metavar="PATH",
        help="cost-model parameters for the pipeline timeline (the file given to `exatrain estimate --calibration`)",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cluster", metavar="NAME", help="catalog cluster for plans that name none")
    g.add_argument(
        "--cluster-file",
        metavar="PATH",
        help="cluster description for plans whose cluster the catalog lacks (matched by name) or that name none",
    )


def cmd_report(args: argparse.Namespace) -> int:
    index, sections = call(api.report, args)
    n = sum(len(s.figures) for s in sections)
    print(f"wrote {index} ({n} picture{'s' if n != 1 else ''})")
    for s in sections:
        for note in s.notes:
            print(f"  note ({s.title}): {note}")
    return 0
