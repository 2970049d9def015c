"""One name, one meaning; one vocabulary, one name. A public module-level constant of src/exatrain (an UPPER_CASE
name assigned at the top of a module) that two modules define holds the same value in both, so `DTYPES` or
`DEFAULT_CLUSTER` read the same wherever they are imported from; and no module renames another's constant
(`ENGINE_NAMES = RUNTIMES`): a vocabulary is imported under the name it has where it is written. An alias has its
source's value; values are compared as source text. A `_private` name is its module's own and is not compared.
Names kept on purpose with different meanings are listed in ALLOWED, with why.

Broken on purpose and seen to fail here: api/tuning.py's `TUNE_CLUSTER` renamed back to `DEFAULT_CLUSTER`
("local-cpu" beside planning's "frontier"); `ENGINE_NAMES = RUNTIMES` put back in accounting/engines.py.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "exatrain"

# name -> why two modules may give it different values.
ALLOWED: dict[str, str] = {}


def _dotted(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_constant(name: str) -> bool:
    return name.isupper() and not name.startswith("_")


@lru_cache(maxsize=1)
def _modules() -> dict[str, tuple[dict[str, ast.expr], dict[str, tuple[str, str | None]]]]:
    """module -> (its top-level constants' value expressions, its imported names -> (module, name or None))."""
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        dotted = _dotted(path)
        package = dotted.split(".") if path.name == "__init__.py" else dotted.split(".")[:-1]
        consts: dict[str, ast.expr] = {}
        imported: dict[str, tuple[str, str | None]] = {}
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target, value = node.targets[0].id, node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                target, value = node.target.id, node.value
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                for a in node.names:
                    imported[a.asname or a.name] = (base, a.name)
                continue
            elif isinstance(node, ast.Import):
                for a in node.names:
                    imported[a.asname or a.name.split(".")[0]] = (a.asname and a.name or a.name.split(".")[0], None)
                continue
            else:
                continue
            if _is_constant(target):
                consts[target] = value
        out[dotted] = (consts, imported)
    return out


def value_of(module: str, name: str, depth: int = 0) -> str:
    """The source text of what ``module.name`` holds, following aliases and imports to where it is written."""
    mods = _modules()
    if module not in mods or depth > 20:
        return f"{module}.{name}"
    consts, imported = mods[module]
    if name in consts:
        value = consts[name]
        if isinstance(value, ast.Name):
            return value_of(module, value.id, depth + 1)
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id in imported:
            source, attr = imported[value.value.id]
            return value_of(source if attr is None else f"{source}.{attr}", value.attr, depth + 1)
        return ast.unparse(value)
    if name in imported and imported[name][1] is not None:
        return value_of(imported[name][0], imported[name][1], depth + 1)
    return f"{module}.{name}"


def definitions() -> dict[str, dict[str, str]]:
    """constant name -> {module that writes it at its top level: its value}."""
    found: dict[str, dict[str, str]] = {}
    for module, (consts, _) in _modules().items():
        for name in consts:
            found.setdefault(name, {})[module] = value_of(module, name)
    return found


def test_no_constant_has_two_meanings() -> None:
    """A module-level constant defined in two modules of src has one value (ALLOWED: deliberate exceptions)."""
    bad = []
    for name, where in sorted(definitions().items()):
        if len(set(where.values())) > 1 and name not in ALLOWED:
            bad.append(f"{name}: " + "; ".join(f"{m} = {v[:80]}" for m, v in sorted(where.items())))
    assert not bad, "one name, several values:\n" + "\n".join(bad)


def _alias_of(module: str, value: ast.expr) -> tuple[str, str] | None:
    """(module, name) of the constant ``value`` merely names (`A`, `mod.A`), else None."""
    consts, imported = _modules()[module]
    if isinstance(value, ast.Name):
        if value.id in consts:
            return module, value.id
        if value.id in imported and imported[value.id][1] is not None:
            return imported[value.id][0], str(imported[value.id][1])
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id in imported:
        source, attr = imported[value.value.id]
        return (source if attr is None else f"{source}.{attr}"), value.attr
    return None


def renamed_constants() -> list[str]:
    """Every `NEW = OLD` at the top of a module where OLD is a constant under another name."""
    found = []
    for module, (consts, _) in sorted(_modules().items()):
        for name, value in consts.items():
            alias = _alias_of(module, value)
            if alias is not None and _is_constant(alias[1]) and alias[1] != name:
                found.append(f"{module}.{name} = {alias[0]}.{alias[1]}")
    return found


def test_no_vocabulary_under_two_names() -> None:
    """One constant per vocabulary: no module gives another module's constant a second name."""
    assert not renamed_constants(), "a constant under a second name:\n" + "\n".join(renamed_constants())


def test_the_checks_see_aliases_and_imports() -> None:
    """An alias has its source's value, through imports; private names are not compared; ALLOWED says why."""
    assert value_of("exatrain.accounting.engines", "RUNTIMES") == value_of("exatrain.settings", "RUNTIMES")
    assert value_of("exatrain.settings", "RUNTIMES").startswith("('megatron-core'")
    assert _is_constant("DTYPES") and not _is_constant("_STEPS") and not _is_constant("Plan")
    assert {"DTYPES", "RUNTIMES", "DEFAULT_CLUSTER"} <= set(definitions())
    assert all(why.strip() for why in ALLOWED.values())
