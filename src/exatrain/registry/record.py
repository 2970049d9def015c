"""The type of one run setting's record (``Setting``) and of an engine's own value for it (``Own``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple


class Own(NamedTuple):
    """An engine's own value of a setting (what it runs where a plan names none) and where that is read."""

    value: Any
    source: str


@dataclass(frozen=True)
class Setting:
    """One run setting. ``name``: the Plan / RunSettings attribute, the plan-JSON key and (dashed) the CLI flag;
    ``default``: the value that means "not set" (for most, the runtime's own); ``arg``: how the CLI reads it
    ("choice" among ``choices``, "switch" on/off, "number" >= 0, "count" > 0, "count_or_auto", "list" of
    ``choices``, "engine"); ``metavar``: the word the CLI shows for its value (None: argparse's);
    ``problem(value, plan)``: the one line a plan with this value breaks beyond its type (``check``, which
    ``rules.extension_problem`` runs in SETTINGS order), or None; ``before_search``: whether ``check_settings``
    also runs it once before a search enumerates anything (against the runtime, model and dtype, with the layout
    values ``searched_with`` a search that names the setting tries, and, before the runtime is known, as
    ``runtimes[0]`` runs it); ``trainer(value, compile)``: the exatrain trainer's refusal (``TrainConfig.check``),
    or None; ``label(value, settings)``: the plan's one-line description's part ("" none; only asked for a value
    other than the default); ``exports``: per engine config (``engine_configs``), the option that writes the
    setting there, and ``notes``: per engine config, the note its export carries where it cannot write the value
    (``setting_notes``); ``note(facts)``: the line an estimate's notes carry for it ("" none; ``facts`` is
    ``planner.estimate_notes.NoteFacts``: the plan, its ``Resolved`` run and what the estimate measured);
    ``engines``: each engine's own value with its source (``Own``); ``profile``: the EngineProfile fields
    (value, source; dotted into a part) its ``engines`` fill, where the accounting reads them there;
    ``own(engine, settings, model)``: the runtime's own value where a plan names none (default: ``engines``'
    value for the engine where no ``profile`` field carries it, else the value is what it is), read by
    ``engines.resolve``."""

    name: str
    type: Any
    default: Any
    help: str
    arg: str = "choice"
    choices: tuple = ()
    metavar: str | None = None
    problem: Callable[[Any, Any], str | None] = lambda v, p: None
    before_search: bool = False
    searched_with: Mapping[str, Any] = field(default_factory=dict)
    runtimes: tuple[str, ...] = ()
    trainer: Callable[[Any, bool], str | None] = lambda v, compile: None
    label: Callable[[Any, Any], str] = lambda v, s: ""
    exports: Mapping[str, str] = field(default_factory=dict)
    notes: Mapping[str, Callable[[Any], str]] = field(default_factory=dict)
    note: Callable[[Any], str] | None = None
    engines: Mapping[str, Own] = field(default_factory=dict)
    profile: tuple[str, str] = ()
    own: Callable[[Any, Any, Any], Any] | None = None
    load: Callable[[Any], Any] = lambda v: v  # plan JSON -> value
    dump: Callable[[Any], Any] = lambda v: v  # value -> plan JSON

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value, plan) -> str | None:
        """The one line a plan with ``value`` breaks: a switch that is not true or false, else ``problem``'s."""
        if self.type is bool and not isinstance(value, bool):
            return f"{self.name} must be true or false, got {value!r}"
        return self.problem(value, plan)

    def own_value(self, engine, settings, model) -> Any:
        """The runtime's own value (``own``, else ``engines``' for ``engine`` unless a ``profile`` field carries
        it, its variants there); None: the value is what it is."""
        if self.own is not None:
            return self.own(engine, settings, model)
        if engine.name in self.engines and not self.profile:
            return self.engines[engine.name].value
        return None


def own_line(what: str, flag: str, chosen: str, runtime: str, own: Own, priced_by: str) -> str:
    """An estimate's note for a setting that defaults to the runtime's own: the value, and who set it."""
    source = f"set by {flag}; {runtime}'s own: {own.value}" if chosen else own.source
    return f"{what}: {chosen or own.value} ({source}; {priced_by})"


__all__ = ["Own", "Setting", "own_line"]
