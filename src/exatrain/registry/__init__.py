"""The one registry of a plan's run settings: one ``Setting`` record per setting (``SETTINGS``), split by job.

``vocab`` holds the vocabularies and the engines that run each choice; ``problems`` each setting's rule;
``runtime`` the engine a plan gets when none is named; ``exports`` the trainer's refusals, the labels and the
notes an engine config's export carries; ``record`` the ``Setting`` type; ``compute_settings`` and
``step_settings`` the records themselves. ``settings`` makes ``RunSettings`` from them. Torch-free; it imports no
other layer of exatrain but the helpers.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping

from exatrain.errors import UserError
from exatrain.registry.compute_settings import COMPUTE_SETTINGS
from exatrain.registry.record import Own, Setting
from exatrain.registry.step_settings import STEP_SETTINGS

SETTINGS: tuple[Setting, ...] = COMPUTE_SETTINGS + STEP_SETTINGS
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
# The settings a planner command takes as flags (--runtime is each command's own: its default and help differ)
FLAG_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.arg != "engine")

# Export targets whose notes include another's: torchtitan 0.3 runs the settings v0.2.2 runs, less two switches
NOTES_ALSO = {"torchtitan-0.3": "torchtitan"}


def setting_notes(plan: Any, target: str) -> list[str]:
    """The notes an export for ``target`` carries for the plan's settings it cannot write (``Setting.notes``, and
    those of the target ``NOTES_ALSO`` names), in SETTINGS order."""
    targets = (NOTES_ALSO.get(target), target)
    out = (s.notes[t](plan) for s in SETTINGS for t in targets if t in s.notes)
    return [n for n in out if n]


def check_settings(
    values: Mapping[str, Any],
    *,
    runtime: str | None = None,
    model: Any = None,
    dtype: str | None = None,
    recompute: str | None = None,
) -> None:
    """A one-line UserError for the first setting among ``values`` (setting names; None: not given) that a search
    cannot take, checked once before it enumerates anything (``Setting.before_search``, in SETTINGS order).

    With ``runtime`` (and ``model``, ``dtype`` training): each such setting's rule as every candidate runs it, with
    the layout values the search tries for it (``Setting.searched_with``: recompute modules every candidate
    selective, recomputed layers full). Without: the settings a search's layout choice hangs on, against the
    ``recompute`` the user pinned (if any), each as the first runtime that runs it (``Setting.runtimes``)."""
    for s in SETTINGS:
        value = runtime if s.arg == "engine" else values.get(s.name)
        if not s.before_search or value is None or (runtime is None and not (s.searched_with and recompute)):
            continue
        if s.arg == "count_or_auto" and value == "auto":  # each candidate fits its own; one layer is its least
            if runtime is None:
                continue
            value = 1
        layout = {**s.searched_with, **({"recompute": recompute} if runtime is None else {})}
        run = runtime if runtime is not None else s.runtimes[0]
        plan = SimpleNamespace(runtime=run, model=model, dtype=dtype or "bfloat16", dims=SimpleNamespace(tp=None, cp=1))
        if problem := s.check(s.load(value), SimpleNamespace(**vars(plan), **layout)):
            raise UserError(problem)


__all__ = [
    "BY_NAME",
    "FLAG_SETTINGS",
    "NAMES",
    "NOTES_ALSO",
    "Own",
    "SETTINGS",
    "Setting",
    "check_settings",
    "setting_notes",
]
