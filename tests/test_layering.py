"""The import rules of docs/architecture.md, read from its §2 table and checked against src/exatrain/.

What is checked is what docs/architecture.md §4 lists: every module belongs to one row of the table;
every import in its source names a layer its row allows (§2); importing a layer's modules loads no
module outside what its row allows, followed through the rows it may import (§2); a "never" layer has
no `import torch` in its source, and no "never" or "on call" layer loads torch when imported (§2, §3).
A layer with no modules is not checked; the cli row is checked once an api exists (§4). And no module of
src/exatrain imports itself back through others (§4): the graph of every `from exatrain... import` and
`import exatrain...`, at the top or inside a function, has no cycle; a function-local import that only
keeps torch or matplotlib from loading with its module is not counted.

Broken on purpose and seen to fail here: a function-local import that closes a cycle, reintroduced
(catalog.models importing catalog.hf_config inside load_model_file).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "exatrain"
DOC = ROOT / "docs" / "architecture.md"
TORCH_WORDS = ("never", "on call", "yes")
# Accounting's earlier home inside the planner: importing it counts as importing `accounting` (§4).
EARLIER_ACCOUNTING = "exatrain.planner.accounting"


@dataclass(frozen=True)
class Row:
    layer: str
    packages: tuple[str, ...]  # "catalog/" -> "catalog"
    files: tuple[str, ...]  # "plan.py" -> "plan"; "__init__.py" is the package root
    catch_all: bool  # "any other top-level module"
    may_import: frozenset[str]
    torch: str


def _ticks(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


@lru_cache(maxsize=1)
def rules() -> dict[str, Row]:
    """The table under "## 2." of docs/architecture.md, one Row per layer."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## 2.", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, Row] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"docs/architecture.md §2: a row needs 4 cells: {line}"
        layer = _ticks(cells[0])[0]
        where = _ticks(cells[1])
        rows[layer] = Row(
            layer=layer,
            packages=tuple(w.rstrip("/") for w in where if w.endswith("/")),
            files=tuple(w.removesuffix(".py") for w in where if w.endswith(".py")),
            catch_all="any other" in cells[1],
            may_import=frozenset(_ticks(cells[2])),
            torch=cells[3],
        )
    return rows


def test_the_table_reads_as_rules() -> None:
    """§2's table names known layers only, one catch-all row, and one of three torch words per row."""
    table = rules()
    assert {"helpers", "catalog", "plan", "planner", "trainer", "cli"} <= set(table)
    for row in table.values():
        assert row.may_import <= set(table), f"{row.layer} may import unknown layers {row.may_import - set(table)}"
        assert row.layer not in row.may_import
        assert row.torch in TORCH_WORDS, f"{row.layer}: torch cell {row.torch!r}"
        assert row.packages or row.files or row.catch_all, f"{row.layer} has no Where"
    assert sum(r.catch_all for r in table.values()) == 1


# ------------------------------------------------------------------ modules and layers


def _dotted(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _file_layer(path: Path) -> str | None:
    """The row a source file belongs to, by where it lives (a file under planner/ is the planner's)."""
    rel = path.relative_to(SRC)
    table = rules().values()
    if len(rel.parts) > 1:
        return next((r.layer for r in table if rel.parts[0] in r.packages), None)
    named = next((r.layer for r in table if rel.stem in r.files), None)
    return named or next((r.layer for r in table if r.catch_all), None)


def _name_layer(name: str) -> str | None:
    """The row an imported module name belongs to (None: not exatrain's)."""
    if name == "exatrain":
        return "root"
    if not name.startswith("exatrain."):
        return None
    if name == EARLIER_ACCOUNTING or name.startswith(EARLIER_ACCOUNTING + "."):
        return "accounting"
    head = name.split(".")[1]
    if (SRC / head).is_dir():
        return _file_layer(SRC / head / "__init__.py")
    return _file_layer(SRC / f"{head}.py")


@lru_cache(maxsize=1)
def _sources() -> tuple[dict[str, list[Path]], list[str]]:
    by_layer: dict[str, list[Path]] = {}
    strays = []
    for path in sorted(SRC.rglob("*.py")):
        layer = _file_layer(path)
        if layer is None:
            strays.append(str(path.relative_to(SRC)))
        else:
            by_layer.setdefault(layer, []).append(path)
    return by_layer, strays


def modules() -> dict[str, list[Path]]:
    """Every source file of src/exatrain by layer (layers without files are absent)."""
    return _sources()[0]


def _active(layer: str) -> bool:
    """A layer's rule applies when it has modules; the cli's once an api exists too (§4)."""
    present = modules()
    return layer in present and (layer != "cli" or "api" in present)


def _allowed(layer: str) -> set[str]:
    row = rules()[layer]
    return {layer, "helpers"} | set(row.may_import)


def _closure(layer: str) -> set[str] | None:
    """Every layer importing `layer`'s modules may load: its rows, followed (None: no limit known)."""
    seen, todo = set(), [layer]
    while todo:
        cur = todo.pop()
        if cur in seen:
            continue
        seen.add(cur)
        if cur in modules() and not _active(cur):
            return None
        todo.extend(_allowed(cur) - seen)
    return seen


def test_every_module_belongs_to_one_row() -> None:
    """docs/architecture.md §4: a module outside every row (a new package) needs a row first."""
    assert not _sources()[1], f"modules in no row of docs/architecture.md §2: {_sources()[1]}"
    present = modules()
    assert {"catalog", "plan", "planner", "trainer", "cli", "helpers"} <= set(present), sorted(present)
    assert _file_layer(SRC / "errors.py") == "helpers" and _file_layer(SRC / "__init__.py") == "root"


# ------------------------------------------------------------------ static: what the source names


def _imports(path: Path) -> set[str]:
    return _imports_of(path.read_text(encoding="utf-8"), _dotted(path), path.name == "__init__.py")


def _imports_of(source: str, dotted: str, is_package: bool) -> set[str]:
    """Every module name a source imports, anywhere in it; relative imports resolved, and
    `from pkg import mod` counted as `pkg.mod` when that is a module of exatrain."""
    here = dotted.split(".")
    package = here if is_package else here[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names.add(mod)
            for a in node.names:
                sub = f"{mod}.{a.name}"
                rel = Path(*sub.split(".")[1:]) if sub.startswith("exatrain.") else None
                if rel and ((SRC / rel).is_dir() or (SRC / f"{rel}.py").is_file()):
                    names.add(sub)
    return names


def test_each_layer_imports_only_what_its_row_allows() -> None:
    """docs/architecture.md §2: the May import column, for every import statement in the source."""
    bad = []
    for layer, paths in modules().items():
        if not _active(layer):
            continue
        allowed = _allowed(layer)
        for path in paths:
            for name in sorted(_imports(path)):
                target = _name_layer(name)
                # The bare package is every module's parent; what it re-exports is root's row.
                if target is not None and name != "exatrain" and target not in allowed:
                    bad.append(f"{path.relative_to(SRC)} ({layer}) imports {name} ({target})")
    assert not bad, "\n".join(bad)


def test_torch_free_layers_never_name_torch() -> None:
    """docs/architecture.md §2: a layer whose torch cell says "never" has no `import torch` at all."""
    bad = []
    for layer, paths in modules().items():
        if rules()[layer].torch != "never" or not _active(layer):
            continue
        for path in paths:
            hits = sorted(n for n in _imports(path) if n.split(".")[0] == "torch")
            if hits:
                bad.append(f"{path.relative_to(SRC)} ({layer}) imports {hits}")
    assert not bad, "\n".join(bad)


def test_the_rules_see_every_kind_of_import() -> None:
    """The checks above see function-level, relative and `from pkg import mod` imports."""
    source = "def f():\n    from ..planner import cost\n    from exatrain import cli\n    import torch.nn\n"
    names = _imports_of(source, "exatrain.trainer.probe", is_package=False)
    assert {"exatrain.planner", "exatrain.planner.cost", "exatrain.cli", "torch.nn"} <= names
    assert {_name_layer(n) for n in names} >= {"planner", "cli"}
    assert "planner" not in _allowed("trainer") and "cli" not in _allowed("trainer")
    assert _name_layer("exatrain.planner.accounting.flops") == "accounting"


# ------------------------------------------------------------------ at run time: what importing loads

_LOADER = r"""
import importlib, json, sys
mods = json.loads(sys.argv[1])
for m in mods:
    importlib.import_module(m)
print(json.dumps({"loaded": sorted(k for k in sys.modules if k == "exatrain" or k.startswith("exatrain.")),
                  "torch": any(k == "torch" or k.startswith("torch.") for k in sys.modules)}))
"""


def _load(mods: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _LOADER, json.dumps(mods)], capture_output=True, text=True, timeout=600, env=_child_env()
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child_env() -> dict[str, str]:

    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(SRC.parent) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _importable(paths: list[Path]) -> list[str]:
    # A __main__ module runs its program when imported; its imports are checked statically.
    return [_dotted(p) for p in paths if p.stem != "__main__"]


def _parents(names: list[str]) -> set[str]:
    return {".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 1)}


@pytest.mark.parametrize("group", ["torch-free", "torch"])
def test_importing_a_layer_loads_only_what_its_rows_allow(group: str) -> None:
    """docs/architecture.md §2 and §4: importing each layer's modules (each layer in a fresh process)
    loads no module outside the layers its rows reach, and a "never"/"on call" layer loads no torch."""
    bad = []
    checked = []
    for layer, paths in sorted(modules().items()):
        with_torch = rules()[layer].torch == "yes"
        if with_torch != (group == "torch"):
            continue
        mods = _importable(paths)
        if not mods:
            continue
        checked.append(layer)
        got = _load(mods)
        if got["torch"] and not with_torch:
            bad.append(f"importing {layer} loads torch")
        reach = _closure(layer)
        if reach is None:
            continue
        # Parent packages of what a layer may load are loaded by Python itself, not by the layer.
        allowed_names = [n for n in got["loaded"] if _name_layer(n) in reach]
        excused = _parents(allowed_names) | set(mods) | _parents(mods)
        for name in got["loaded"]:
            if name not in excused and _name_layer(name) not in reach:
                bad.append(f"importing {layer} loads {name} ({_name_layer(name)})")
    assert checked, f"no {group} layer was imported"
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------ no import circles

HEAVY = ("torch", "matplotlib")


def _import_nodes(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement that runs, with whether it runs inside a function (`if TYPE_CHECKING:` never runs)."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.orelse:
                    visit(sub, local)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, local))
            visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


@lru_cache(maxsize=1)
def import_graph() -> dict[str, dict[str, bool]]:
    """module -> {exatrain module it imports: True when every such import is inside a function}. A name is
    resolved to the longest exatrain module it names (`from exatrain.x import f` is an edge to exatrain.x)."""
    paths = {_dotted(p): p for p in sorted(SRC.rglob("*.py"))}
    graph: dict[str, dict[str, bool]] = {}
    for dotted, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges: dict[str, bool] = {}
        for node, local in _import_nodes(tree):
            for name in _imports_of(ast.unparse(node), dotted, path.name == "__init__.py"):
                while name and name not in paths:
                    name = name.rpartition(".")[0]
                if name and name != dotted:
                    edges[name] = edges.get(name, True) and local
        graph[dotted] = edges
    return graph


@lru_cache(maxsize=1)
def _heavy_at_import() -> frozenset[str]:
    """The modules whose own top-level imports load torch or matplotlib, directly or through exatrain's."""
    graph = import_graph()
    heavy = set()
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, local in _import_nodes(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if not local and any(n.split(".")[0] in HEAVY for n in names):
                heavy.add(_dotted(path))
    grew = True
    while grew:
        grew = False
        for mod, edges in graph.items():
            if mod not in heavy and any(not local and target in heavy for target, local in edges.items()):
                heavy.add(mod)
                grew = True
    return frozenset(heavy)


def _cycles(graph: dict[str, dict[str, bool]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    parts: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                parts.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return parts


def runtime_graph() -> dict[str, dict[str, bool]]:
    """import_graph() less the function-local imports that keep torch or matplotlib from loading with a module
    (the target loads one at import, the importing module does not)."""
    heavy = _heavy_at_import()
    return {
        mod: {t: local for t, local in edges.items() if not (local and t in heavy and mod not in heavy)}
        for mod, edges in import_graph().items()
    }


def test_no_import_circles() -> None:
    """docs/architecture.md §4: no module imports itself back through others, at the top or inside a function."""
    graph = runtime_graph()
    found = []
    for part in _cycles(graph):
        edges = [
            f"{a} -> {b}" + (" (inside a function)" if graph[a][b] else "")
            for a in part
            for b in sorted(graph[a])
            if b in part
        ]
        found.append("; ".join(edges))
    assert not found, "import circles:\n" + "\n".join(found)


def test_the_circle_check_sees_a_function_local_circle() -> None:
    """The check finds a cycle closed only inside a function, and lets a lazy torch import pass."""
    graph = {"a": {"b": False}, "b": {"a": True}, "c": {}}
    assert _cycles(graph) == [["a", "b"]]
    assert _cycles({"a": {"b": False}, "b": {}}) == []
    assert "exatrain.trainer.checkpoint.compat" in _heavy_at_import()
    assert "exatrain.trainer.checkpoint.files" not in _heavy_at_import()
    assert import_graph()["exatrain.trainer.checkpoint.files"]["exatrain.trainer.checkpoint.compat"] is True
    assert "exatrain.trainer.checkpoint.compat" not in runtime_graph()["exatrain.trainer.checkpoint.files"]
