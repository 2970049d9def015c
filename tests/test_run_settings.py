"""``RunSettings`` is written out by hand (run_settings.py) and held here to the registry (settings.SETTINGS): the
same fields in the same order, each with its record's type and default; ``SettingsView`` reads each setting as a
typed attribute; a Plan takes settings by name and reads them back.

Broken on purpose and seen to fail here: a RunSettings default changed (offload "optimizer"); a field dropped
from SettingsView (launch_blocking); a field's type written as another (moe_capacity_factor: int)."""

from __future__ import annotations

import dataclasses
import inspect

from exatrain.catalog import get_model
from exatrain.plan import Plan
from exatrain.run_settings import RunSettings, SettingsView
from exatrain.settings import SETTINGS


def test_the_fields_are_the_registry_s() -> None:
    fields = dataclasses.fields(RunSettings)
    assert [f.name for f in fields] == [s.name for s in SETTINGS]
    for f, s in zip(fields, SETTINGS):
        assert f.type == s.type.__name__, (f.name, f.type, s.type)
        assert f.default == s.default and type(f.default) is type(s.default), (f.name, f.default, s.default)


def test_every_setting_reads_as_a_typed_attribute() -> None:
    views = {n: p for n, p in vars(SettingsView).items() if isinstance(p, property)}
    assert list(views) == [s.name for s in SETTINGS]
    for s in SETTINGS:
        assert inspect.signature(views[s.name].fget).return_annotation == s.type.__name__, s.name
    plan = Plan(model=get_model("gpt-tiny"), runtime="torchtitan", fp8="current", offload="optimizer")
    assert plan.settings == RunSettings(runtime="torchtitan", fp8="current", offload="optimizer")
    assert (plan.runtime, plan.fp8, plan.offload, plan.recompute_layers) == ("torchtitan", "current", "optimizer", 0)
    assert plan.replace(fp8="").settings == RunSettings(runtime="torchtitan", offload="optimizer")


def test_json_and_keywords_round_trip() -> None:
    s = RunSettings.of({"fp8": "current", "recompute_modules": "layernorm,moe_act", "cp_comm": None})
    assert s == RunSettings(fp8="current", recompute_modules=("layernorm", "moe_act"))
    assert RunSettings.from_dict(s.to_dict()) == s
    assert s.to_dict() == {"fp8": "current", "recompute_modules": ["layernorm", "moe_act"]}
    assert RunSettings().to_dict() == {} and RunSettings().label == ""
    assert RunSettings(moe_dispatcher="deepep").label == ", deepep dispatcher"
