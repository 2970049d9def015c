"""The report side stays light: no torch anywhere in it, matplotlib only when a picture is drawn."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "exatrain"
REPORT_FILES = sorted((SRC / "report").rglob("*.py")) + [SRC / "cli" / "report_cmds.py"]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_report_sources_import_neither_torch_nor_the_trainer() -> None:
    assert len(REPORT_FILES) >= 9
    for path in REPORT_FILES:
        bad = {n for n in _imports(path) if n.split(".")[0] == "torch" or n.startswith("exatrain.trainer")}
        assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}"


def test_report_modules_load_without_torch_and_the_cli_without_matplotlib() -> None:
    mods = [".".join(p.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__") for p in REPORT_FILES]
    code = (
        "import importlib, sys\n"
        "from exatrain.cli import build_parser\n"
        "build_parser()\n"
        "print(int(any(k.split('.')[0] == 'matplotlib' for k in sys.modules)))\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "print(sum(k.split('.')[0] == 'torch' for k in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "0"], out.stdout + out.stderr
