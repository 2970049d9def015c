"""``RunSettings``: a plan's run settings, one typed field per record of the registry (``settings.SETTINGS``),
written out so an editor and a type checker see each (``plan.fp8``, ``RunSettings(fp8="current")``).

The registry stays the one place a setting's meaning lives (help, choices, rules, labels, exports);
``tests/test_run_settings.py`` holds these fields to it: the same names in the same order, the same types and
defaults. ``SettingsView`` gives a class holding a ``settings: RunSettings`` each setting as a typed, read-only
attribute; ``holds_settings`` also lets its constructor take them by name.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Mapping

from exatrain.settings import BY_NAME, NAMES, SETTINGS, recompute_modules_of


@dataclass(frozen=True)
class RunSettings:
    """A plan's run settings (``settings.SETTINGS``: one field per record, each its default unless set; most
    defaults mean "the runtime's own")."""

    runtime: str = "exatrain"
    fp8: str = ""
    moe_dispatcher: str = "alltoall"
    moe_capacity_factor: float = 0.0
    moe_force_balance: bool = False
    fp8_param_gather: bool = False
    attention_kernel: str = ""
    elementwise: str = ""
    cross_entropy: str = ""
    grad_accum: str = ""
    grad_accum_fusion: str = ""
    adam_kernel: str = ""
    cp_comm: str = ""
    recompute_modules: tuple = ()
    recompute_layers: int = 0
    recompute_every: int = 0
    distribute_saved_activations: bool = False
    offload: str = "none"
    launch_blocking: bool = False

    def replace(self, **changes: Any) -> "RunSettings":
        """The same settings with ``changes`` (setting names)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The settings that are not their defaults, as plan JSON writes them (its flat keys, SETTINGS order)."""
        return {s.name: s.dump(getattr(self, s.name)) for s in SETTINGS if getattr(self, s.name) != s.default}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RunSettings":
        """The settings among plan-JSON keys ``d`` (a key not there: the default)."""
        return cls(**{s.name: s.load(d[s.name]) for s in SETTINGS if s.name in d})

    @classmethod
    def of(cls, values: Mapping[str, Any], base: "RunSettings | None" = None) -> "RunSettings":
        """Settings from keyword values (the API's and the CLI's): a value given (not None) wins, then
        ``base``'s (a plan's settings), then the default. recompute_modules may be "a,b" or a list."""
        out = base if base is not None else cls()
        given = {k: v for k, v in values.items() if k in BY_NAME and v is not None}
        if "recompute_modules" in given:
            given["recompute_modules"] = recompute_modules_of(given["recompute_modules"])
        return dataclasses.replace(out, **given)

    @property
    def label(self) -> str:
        """The settings that are not the defaults, as the one-line descriptions append them
        (", deepep dispatcher, force-balanced routing, attention fa2"); "" when all are defaults."""
        parts = (s.label(getattr(self, s.name), self) for s in SETTINGS if getattr(self, s.name) != s.default)
        return "".join(f", {text}" for text in parts if text)


class SettingsView:
    """Each run setting of a class that holds ``settings: RunSettings`` (a Plan), as a read-only attribute:
    ``plan.fp8`` is ``plan.settings.fp8``."""

    settings: RunSettings

    @property
    def runtime(self) -> str:
        return self.settings.runtime

    @property
    def fp8(self) -> str:
        return self.settings.fp8

    @property
    def moe_dispatcher(self) -> str:
        return self.settings.moe_dispatcher

    @property
    def moe_capacity_factor(self) -> float:
        return self.settings.moe_capacity_factor

    @property
    def moe_force_balance(self) -> bool:
        return self.settings.moe_force_balance

    @property
    def fp8_param_gather(self) -> bool:
        return self.settings.fp8_param_gather

    @property
    def attention_kernel(self) -> str:
        return self.settings.attention_kernel

    @property
    def elementwise(self) -> str:
        return self.settings.elementwise

    @property
    def cross_entropy(self) -> str:
        return self.settings.cross_entropy

    @property
    def grad_accum(self) -> str:
        return self.settings.grad_accum

    @property
    def grad_accum_fusion(self) -> str:
        return self.settings.grad_accum_fusion

    @property
    def adam_kernel(self) -> str:
        return self.settings.adam_kernel

    @property
    def cp_comm(self) -> str:
        return self.settings.cp_comm

    @property
    def recompute_modules(self) -> tuple:
        return self.settings.recompute_modules

    @property
    def recompute_layers(self) -> int:
        return self.settings.recompute_layers

    @property
    def recompute_every(self) -> int:
        return self.settings.recompute_every

    @property
    def distribute_saved_activations(self) -> bool:
        return self.settings.distribute_saved_activations

    @property
    def offload(self) -> str:
        return self.settings.offload

    @property
    def launch_blocking(self) -> bool:
        return self.settings.launch_blocking


def holds_settings(cls):
    """Decorate a frozen dataclass with a ``settings: RunSettings`` field so its constructor (and
    ``dataclasses.replace``) takes settings by name, folded into ``settings`` (``Plan(model=m,
    runtime="torchtitan")``); a class that is no SettingsView also gets each setting as an attribute."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args: Any, **kw: Any) -> None:
        named = {k: kw.pop(k) for k in NAMES if k in kw}
        if named:
            kw["settings"] = kw.get("settings", RunSettings()).replace(**named)
        init(self, *args, **kw)

    cls.__init__ = __init__
    if not issubclass(cls, SettingsView):
        for s in SETTINGS:
            setattr(cls, s.name, property(lambda self, n=s.name: getattr(self.settings, n), doc=s.help))
    return cls


__all__ = ["RunSettings", "SettingsView", "holds_settings"]
