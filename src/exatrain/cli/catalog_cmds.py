"""`exatrain models` and `exatrain hardware`: what the catalog holds."""

from __future__ import annotations

import argparse

from exatrain.api import render_hardware, render_models, total_params
from exatrain.catalog import cluster_catalog, device_catalog, model_presets
from exatrain.cli.common import show


def register(sub: argparse._SubParsersAction) -> None:
    for name, help in (("models", "list model presets"), ("hardware", "list devices and clusters")):
        p = sub.add_parser(
            name,
            help=help,
            description=help.capitalize() + " in the catalog.",
            epilog=f"example: exatrain {name} --json",
        )
        p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_models(args: argparse.Namespace) -> int:
    presets = model_presets()
    return show(
        args,
        lambda: {"models": [{**m.to_dict(), "params": total_params(m)} for m in presets.values()]},
        lambda: render_models(presets),
    )


def cmd_hardware(args: argparse.Namespace) -> int:
    devices, clusters = device_catalog(), cluster_catalog()
    return show(
        args,
        lambda: {
            "devices": [d.__dict__ for d in devices.values()],
            "clusters": [c.to_dict() for c in clusters.values()],
        },
        lambda: render_hardware(devices, clusters),
    )
