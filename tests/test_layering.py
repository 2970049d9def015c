"""Keep the import directions of ARCHITECTURE true.

* planner, catalog, plan, launch, engine_configs, tune: never import torch (they run on any laptop, start fast);
* trainer: never imports the planner (plan.py and the catalog are its only contract);
* nothing but the api (exatrain.api, which the cli calls) wires planner and trainer together;
  importing it, or the cli, loads no torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "exatrain"
TORCH_FREE = ("planner", "catalog", "launch", "engine_configs", "tune", "data")


def _modules(sub: str) -> list[Path]:
    root = SRC / sub
    return sorted(root.rglob("*.py")) if root.is_dir() else [SRC / f"{sub}.py"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _dotted(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@pytest.mark.parametrize("sub", TORCH_FREE + ("plan", "errors"))
def test_no_torch_import_in_source(sub: str) -> None:
    for path in _modules(sub):
        bad = {n for n in _imports(path) if n == "torch" or n.startswith("torch.")}
        assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}"


def test_trainer_never_imports_planner() -> None:
    for path in _modules("trainer"):
        bad = {n for n in _imports(path) if n.startswith("exatrain.planner") or n.startswith("exatrain.cli")}
        assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}"


def test_planner_never_imports_trainer() -> None:
    for sub in TORCH_FREE + ("plan",):
        for path in _modules(sub):
            bad = {n for n in _imports(path) if n.startswith(("exatrain.trainer", "exatrain.cli"))}
            assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}"


def test_planner_modules_load_without_torch_at_runtime() -> None:
    """Importing every torch-free module (and the CLI entry) must not pull torch in transitively."""
    mods = [_dotted(p) for sub in TORCH_FREE + ("plan",) for p in _modules(sub)] + ["exatrain.cli", "exatrain.api"]
    code = ("import importlib, sys\n"
            f"for m in {mods!r}:\n"
            "    importlib.import_module(m)\n"
            "bad = sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.'))\n"
            "print(len(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0", out.stdout + out.stderr
