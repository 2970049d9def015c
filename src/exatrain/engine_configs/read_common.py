"""What the launch readers share (read_megatron.py, read_torchtitan.py): the ``LaunchRead`` they return, the model
shape ``settings.cp_comm_for`` reads, and the checks of a file's numbers; ``reading.read_launch`` picks the reader."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from exatrain.catalog.models import ModelSpec, model_presets
from exatrain.errors import UserError


@dataclass(frozen=True)
class LaunchRead:
    """What a launch file states. ``settings`` are make_plan keyword arguments; ``model_fields`` ModelSpec fields
    (``model_missing``: a field the file cannot give, with why); ``gpus`` the world size (``world``: where from, or
    why it is not known); ``overlap`` an ``--overlap`` value ("default": the engine's defaults); ``defaults``: what
    the file leaves to the engine (each "what (the default)"); ``unknown``: flags or keys the reader does not know;
    ``notes``: what it reads differently from the file."""

    source: str  # "Megatron-LM", "Megatron-DeepSpeed" or "torchtitan"
    runtime: str
    model_fields: Mapping[str, Any] = field(default_factory=dict)
    model_missing: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    gpus: int | None = None
    world: str = ""  # where the world size comes from, or why the file does not give it
    overlap: str | None = None
    defaults: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def model(self, name: str, *, source: str = "", **given: Any) -> ModelSpec:
        """The model the file (``source``) states, with ``given`` shape values filling or replacing its fields; named
        after the catalog preset it equals, else ``name``. A field neither gives is a UserError saying why."""
        source = source or name
        fields = {**self.model_fields, **{k: v for k, v in given.items() if v is not None}}
        missing = [f"{k} ({why})" for k, why in self.model_missing.items() if k not in fields]
        if missing:
            raise UserError(f"{source}: the launch does not give the model's {'; '.join(missing)}")
        spec = ModelSpec.from_dict(
            {"name": name, "description": f"read from a {self.source} launch", **fields},
            source=f"{source} ({self.source} launch)",
        )
        return preset_named(spec)


class AttentionShape:
    """What ``settings.cp_comm_for`` reads of a model (its sliding windows and sinks), from ModelSpec fields: a launch's
    context-parallel exchange is compared with the engine's default for the model before the model is built."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.sliding_window = fields.get("sliding_window", 0)
        self.attention_sinks = fields.get("attention_sinks", False)


def preset_named(spec: ModelSpec) -> ModelSpec:
    """``spec`` named as the catalog preset it equals in every field but its name and description, if one does."""
    for name, preset in model_presets().items():
        if spec.replace(name=name, description=preset.description) == preset:
            return preset
    return spec


def positive(value: Any, what: str, source: str) -> int:
    """``value`` (a word of the file) as a positive integer, or one line naming it."""
    text = str(value)
    if text.startswith("$") or "$(" in text or "`" in text:
        raise UserError(
            f"{source}: {what} is {text}, which the script does not assign; set it in the script or "
            "pass the value as a flag"
        )
    try:
        number = int(text)
    except ValueError:
        raise UserError(f"{source}: {what} must be a positive integer, got {text!r}") from None
    if number <= 0:
        raise UserError(f"{source}: {what} must be a positive integer, got {text!r}")
    return number


def number(value: Any, what: str, source: str) -> float:
    text = str(value)
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{source}: {what} must be a number, got {text!r}") from None


__all__ = ["AttentionShape", "LaunchRead", "number", "positive", "preset_named"]
