"""What every engine probe shares: its arguments, the manifest scripts/check_exports.py wrote, one result per plan.

A probe runs inside an engine's own virtual environment (no exatrain there) and writes, per plan whose export
exatrain rendered for its target: ``accepted`` (the engine's parsers and validators took it), ``error`` (the first
line of what they, or the model's build after them, raised), ``params`` (the built model's parameters),
``bias_buffers`` (elements of its routers' per-expert balancing-bias buffers) and ``problems`` (a layout or batch
figure that differs from the plan's).
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path
from typing import Callable


def options(extra_source: bool = False) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--source", default="")
    return ap.parse_args()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


STATE: dict[str, bool] = {}


def accepted() -> None:
    """Called by a probe once the engine's parsers and validators took the export: a later error is the build's."""
    STATE["accepted"] = True


def run_all(args: argparse.Namespace, probe: Callable[[str, dict, dict], dict]) -> None:
    """Call ``probe(name, plan, export)`` for every plan whose export was rendered; write the results."""
    manifest = json.loads(Path(args.manifest).read_text())
    results: dict[str, dict] = {}
    for name, plan in manifest.items():
        export = plan["exports"][args.target]
        if "refused" in export:
            continue
        STATE.clear()
        try:
            results[name] = {"accepted": True, "problems": [], **probe(name, plan, export)}
        except BaseException as exc:  # noqa: BLE001 - every rejection is a result (SystemExit from argparse too)
            if isinstance(exc, KeyboardInterrupt):
                raise
            results[name] = {
                "accepted": STATE.get("accepted", False),
                "error": first_line(exc),
                "trace": traceback.format_exc()[-3000:],
            }
        print(f"{name}: {json.dumps({k: v for k, v in results[name].items() if k != 'trace'})}", flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    Path(args.out).write_text(json.dumps(results, indent=1))


def expect(problems: list[str], what: str, got, want) -> None:
    if got != want:
        problems.append(f"{what}: {got} (plan: {want})")


def count(model) -> tuple[int, int]:
    """(parameters, elements of every per-expert balancing-bias buffer) of a built model (Megatron-Core and
    torchtitan v0.2.2 call it expert_bias, torchtitan 0.3 expert_bias_E)."""
    params = sum(p.numel() for p in model.parameters())
    bias = sum(b.numel() for n, b in model.named_buffers() if n.split(".")[-1] in ("expert_bias", "expert_bias_E"))
    return params, bias
