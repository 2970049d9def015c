"""exatrain: plan, predict and run 3D-parallel training of GPT-style language models.

    import exatrain
    plan = exatrain.estimate("gpt-175b", "frontier", gpus=128, tp=4, pp=16, global_batch=640, zero=1,
                             recompute="full")
    best = exatrain.search("gpt-1t", exatrain.api.ClusterQuery(gpus=3072),
                           layout=exatrain.api.Layout(global_batch=1536)).ranked[0]

The calls (``exatrain.estimate``, ``search``, ``scaling``, ``train``, ``tune``, ``make_plan``,
``load_plan``, ``calibrate``, ``compare``, ``demo``; the rest in ``exatrain.api``) are loaded on first use,
so ``import exatrain`` stays fast and torch-free.

Layers (kept true by tests/test_layering.py):
  catalog  -> plan  -> planner (accounting, cost, search; never imports torch)
                    -> trainer (torch; never imports the planner)
  api wires planner and trainer together; cli parses argv, calls the api and prints.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Names served from exatrain.api. `train` is also a module (`python -m exatrain.train`, what launchers
# run); that module is callable and forwards to the API's function.
_API = ("estimate", "search", "scaling", "tune", "make_plan", "load_plan", "calibrate", "compare", "demo")
_CALLABLE_MODULES = ("train",)


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module("exatrain.api"), name)
    if name in _CALLABLE_MODULES:
        return importlib.import_module(f"exatrain.{name}")
    raise AttributeError(f"module 'exatrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API, *_CALLABLE_MODULES])
