"""The run-settings registry (``settings.SETTINGS``) against everything made from it or checked against it: the
plan JSON's flat keys, the CLI's flags, the API's keyword arguments, ``SpaceOptions``, the one-line labels, the
exatrain trainer's refusals and what each engine config does with a setting (writes it, or notes that it cannot).

Broken on purpose and seen to fail here: a setting's flag given other choices than its record's (the flag test);
a flag's metavar written in the CLI instead of read from its record's ``metavar`` (the flag test);
a record without a sample plan (the sample test); the trainer's loop over the registry skipped (the refusal
test); a torchtitan export note dropped from the registry (the export test); a record's rule taken out (the capacity
factor with another dispatcher than alltoall in ``registry.problems.capacity_rule``, the kernel without
flash attention in ``kernel_rule``: test_each_records_rule_refuses_its_illegal_sample); llm-foundry left out of
the runtime's help (test_every_choice_a_setting_takes_is_in_its_help); ``engine_profile`` not copying a record's
value into a profile's part (``activations.flash_kernel``: test_each_engines_own_value_is_its_records)."""

from __future__ import annotations

import argparse
import re

import pytest

from exatrain import api
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster
from exatrain.engine_configs import TARGETS, export
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.planner.search.space import SpaceOptions
from exatrain.run_settings import RunSettings
from exatrain.settings import BY_NAME, FLAG_SETTINGS, NAMES, NOTES_ALSO, SETTINGS, setting_notes

H100 = get_cluster("dgx-h100")
_DENSE = dict(model="llama3-8b", gpus=8, tp=2, pp=2, global_batch=16)
_MOE = dict(model="moe-tiny", gpus=4, ep=2, global_batch=8, zero=0)
# For each setting: a value other than its default, and a plan it is legal in (the runtime that runs it).
SAMPLES = {
    "runtime": ("megatron-core", dict(_DENSE)),
    "fp8": ("current", dict(_DENSE, runtime="megatron-core", sequence_parallel=True)),
    "moe_dispatcher": ("deepep", dict(_MOE, runtime="megatron-core")),
    "moe_capacity_factor": (1.5, dict(_MOE, runtime="megatron-core")),
    "moe_force_balance": (True, dict(_MOE, runtime="megatron-core")),
    "fp8_param_gather": (True, dict(_DENSE, runtime="megatron-core", fp8="delayed", zero=1)),
    "attention_kernel": ("fa2", dict(_DENSE, runtime="megatron-core")),
    "elementwise": ("eager", dict(_DENSE, runtime="megatron-core")),
    "cross_entropy": ("fused", dict(_DENSE, runtime="torchtitan")),
    "grad_accum": ("bfloat16", dict(_DENSE, runtime="megatron-core")),
    "grad_accum_fusion": ("off", dict(_DENSE, runtime="megatron-core")),
    "adam_kernel": ("foreach", dict(_DENSE, runtime="torchtitan")),
    "cp_comm": ("a2a", dict(_DENSE, runtime="megatron-core", cp=2, gpus=16)),
    "recompute_modules": (("layernorm",), dict(_DENSE, runtime="megatron-core", recompute="selective")),
    "recompute_layers": (2, dict(_DENSE, runtime="megatron-core", recompute="full")),
    "recompute_every": (2, dict(_DENSE, runtime="torchtitan", recompute="full")),
    "distribute_saved_activations": (True, dict(_DENSE, runtime="megatron-core", recompute="full")),
    "launch_blocking": (True, dict(_DENSE, runtime="megatron-core")),
    "offload": ("optimizer", dict(_DENSE, runtime="megatron-deepspeed", zero=1)),
}
# Exports that neither write a setting's sample value nor note it: the engine's config says nothing and the engine
# runs its own (``Setting.exports`` / ``Setting.notes`` name every other pair). DeepSpeed's own gradient accumulation
# is the sample's bfloat16.
SILENT = {
    ("cross_entropy", "megatron"),
    ("cross_entropy", "deepspeed"),
    ("grad_accum", "deepspeed"),
    ("recompute_modules", "deepspeed"),
    ("recompute_modules", "torchtitan"),
    ("recompute_layers", "deepspeed"),
    ("recompute_layers", "torchtitan"),
    ("recompute_every", "megatron"),
    ("recompute_every", "deepspeed"),
}


def _sample(name: str) -> Plan:
    value, kw = SAMPLES[name]
    kw = dict(kw)
    return make_plan(kw.pop("model"), H100, **{**kw, name: value})


def test_every_setting_has_a_sample_and_its_plan_is_legal() -> None:
    assert set(SAMPLES) == set(NAMES)
    for s in SETTINGS:
        plan = _sample(s.name)
        assert getattr(plan, s.name) == SAMPLES[s.name][0] != s.default
        assert plan.validate(H100) is plan


def test_the_plan_json_keeps_its_flat_keys_and_old_files_still_load() -> None:
    plain = make_plan("llama3-8b", H100, gpus=8)
    assert not set(plain.to_dict()) & set(NAMES)  # defaults are not written
    for s in SETTINGS:
        plan = _sample(s.name)
        d = plan.to_dict()
        assert d[s.name] == s.dump(SAMPLES[s.name][0])  # the flat key, as plan files have always spelled it
        assert Plan.from_dict(d) == plan
    # a plan file written before a setting existed (no key) loads with the default
    d = _sample("adam_kernel").to_dict()
    del d["adam_kernel"]
    assert Plan.from_dict(d).settings == RunSettings(runtime="torchtitan")


def test_cli_flags_are_the_registry() -> None:
    from exatrain.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("estimate", "search", "scaling"):
        actions = {a.option_strings[0]: a for a in sub.choices[command]._actions if a.option_strings}
        for s in FLAG_SETTINGS:
            flag = actions[s.flag]
            assert flag.help == s.help, (command, s.name)
            assert tuple(flag.choices or ()) == (s.choices if s.arg == "choice" else ()), (command, s.name)
            if s.metavar:
                assert flag.metavar == s.metavar, (command, s.name)
        assert actions["--runtime"].help.startswith(BY_NAME["runtime"].help)
        assert actions["--runtime"].metavar == BY_NAME["runtime"].metavar == "ENGINE"


def test_api_keywords_are_the_registry() -> None:
    """Each setting is a keyword of the API's planner calls, routed into their run settings (the runtime into
    their Engine), and a field of the RunSettings they take; another name is a TypeError naming it."""
    from exatrain.api.requests import Engine, Layout, routed
    from exatrain.run_settings import RunSettings

    for s in SETTINGS:
        value = SAMPLES[s.name][0]
        got = routed("estimate", {s.name: value}, {"layout": Layout(), "engine": Engine()})
        assert (got["engine"].runtime if s.name == "runtime" else got["settings"]) == (
            value if s.name == "runtime" else {s.name: value}
        ), s.name
        assert getattr(RunSettings(**{s.name: value}), s.name) == value
    for fn in (api.estimate, api.search, api.scaling, api.make_plan):
        with pytest.raises(TypeError, match="unexpected keyword argument 'adam_kernal'"):
            fn("gpt-tiny", adam_kernal="fused")


def test_space_options_take_every_setting() -> None:
    for s in SETTINGS:
        value = SAMPLES[s.name][0]
        options = SpaceOptions(**{s.name: value})
        assert getattr(options, s.name) == value and getattr(options.settings, s.name) == value


def test_labels_come_from_the_registry() -> None:
    for s in SETTINGS:
        plan = _sample(s.name)
        text = s.label(SAMPLES[s.name][0], plan.settings)
        assert (f", {text}" in plan.settings_label) if text else True
    assert make_plan("llama3-8b", H100, gpus=8).settings_label == ""


def test_the_trainer_refuses_what_each_record_says() -> None:
    from exatrain.trainer.config import TrainConfig

    refused = 0
    for s in SETTINGS:
        value, kw = SAMPLES[s.name]
        line = s.trainer(value, False)
        if line is None:
            continue
        # the sample's settings (made for another runtime) on a plan the trainer runs on the CPU otherwise
        model = "moe-tiny" if kw["model"] == "moe-tiny" else "llama-tiny"
        keep = {k: kw[k] for k in ("recompute", "zero") if k in kw}
        if s.name == "distribute_saved_activations":  # its rule needs tensor parallelism to split over
            keep["tp"] = 2
        settings = _sample(s.name).settings
        plan = make_plan(
            model, get_cluster("local-cpu"), gpus=2, micro_batch=1, global_batch=2, dtype="bfloat16", **keep
        ).replace(settings=settings)
        with pytest.raises(UserError) as e:
            TrainConfig(plan=plan).check()
        assert str(e.value) == line, s.name
        refused += 1
    assert refused == 16  # every setting but the runtime, fp8 (trainer/fp8.py's own check) and its own default


def test_each_export_writes_or_notes_each_setting() -> None:
    for s in SETTINGS[1:]:  # the runtime is the export's target itself
        plan = _sample(s.name)
        for target in TARGETS:
            try:
                out = export(plan, target)
            except UserError:
                continue  # the engine cannot run the layout at all (e.g. DeepSpeed's MoE, cp or FP8)
            written = target in s.exports and s.exports[target] in out.text
            assert written or target not in s.exports, (s.name, target)
            # torchtitan 0.3 carries v0.2.2's notes too (settings.NOTES_ALSO)
            note = " ".join(s.notes[t](plan) for t in (NOTES_ALSO.get(target), target) if t in s.notes).strip()
            for n in (s.notes[t](plan) for t in (NOTES_ALSO.get(target), target) if t in s.notes):
                assert not n or (n in out.notes and f"# note: {n}" in out.text and n in setting_notes(plan, target))
            # torchtitan 0.3's command line has no float8 switch: the export notes it (its config functions decide)
            by_export = (
                target == "torchtitan-0.3"
                and s.name in ("fp8", "fp8_param_gather")
                and any("float8" in n for n in out.notes)
            )
            silent = (s.name, NOTES_ALSO.get(target, target)) in SILENT
            assert written or note or silent or by_export, (s.name, target)


_ONE = dict(model="llama3-8b", gpus=8, global_batch=16)
# For each setting: a value its own rule refuses, the plan (legal with the setting's default) it is refused in, and
# what the line says. Each is a rule of its record, not a choice list's: the record's ``problem`` (or, for a switch,
# its type check) is what refuses it.
ILLEGAL = {
    "runtime": ("llm-foundry", dict(_ONE, dtype="float16"), "--runtime llm-foundry is planned in bfloat16 or float32"),
    "fp8": ("current", dict(_DENSE, runtime="megatron-core", dtype="float32"), "inside bfloat16 training"),
    "moe_dispatcher": ("deepep", dict(_DENSE, runtime="megatron-core"), "llama3-8b has no experts"),
    "moe_capacity_factor": (
        1.5,
        dict(_MOE, runtime="megatron-core", moe_dispatcher="deepep"),
        "in the alltoall dispatcher only",
    ),
    "moe_force_balance": (True, dict(_DENSE, runtime="megatron-core"), "llama3-8b has no experts"),
    "fp8_param_gather": (
        True,
        dict(_DENSE, runtime="megatron-core", fp8="delayed", zero=0),
        "needs the distributed optimizer (ZeRO-1 or higher)",
    ),
    "attention_kernel": (
        "fa2",
        dict(_DENSE, runtime="megatron-core", flash_attention=False),
        "this plan has flash attention off",
    ),
    "elementwise": ("jit", dict(_DENSE, runtime="megatron-core"), "--elementwise must be one of"),
    "cross_entropy": ("inplace", dict(_DENSE, runtime="torchtitan"), "which torchtitan does not run"),
    "grad_accum": ("bfloat16", dict(_DENSE, runtime="megatron-core", dtype="float32"), "this one trains in float32"),
    "grad_accum_fusion": ("off", dict(_DENSE, runtime="torchtitan"), "is Megatron-Core's switch"),
    "adam_kernel": ("foreach", dict(_DENSE, runtime="megatron-core"), "is torchtitan's switch"),
    "cp_comm": ("a2a", dict(_DENSE, runtime="torchtitan", cp=2, gpus=16), "torchtitan"),
    "recompute_modules": (
        ("layernorm",),
        dict(_DENSE, runtime="megatron-core", recompute="full"),
        "use --recompute selective",
    ),
    "recompute_layers": (2, dict(_DENSE, runtime="megatron-core", recompute="selective"), "--recompute-layers"),
    "recompute_every": (2, dict(_DENSE, runtime="megatron-core", recompute="full"), "torchtitan's layer-level"),
    "distribute_saved_activations": (
        True,
        dict(_DENSE, runtime="megatron-core", recompute="selective"),
        "use --recompute full",
    ),
    "launch_blocking": ("yes", dict(_DENSE, runtime="megatron-core"), "launch_blocking must be true or false"),
    "offload": ("params", dict(_DENSE, runtime="megatron-core"), "--offload params is not run by megatron-core"),
}


@pytest.mark.parametrize("name", NAMES)
def test_each_records_rule_refuses_its_illegal_sample(name: str) -> None:
    """A plan legal with the setting's default, given the illegal value: the record's own check says why in one line,
    and validating the plan (what every command and the API do) refuses it with that line; the API refuses the value
    given as a keyword the same way."""
    from exatrain.errors import PlanError

    value, kw, needle = ILLEGAL[name]
    kw = dict(kw)
    model = kw.pop("model")
    legal = make_plan(model, H100, **kw)
    plan = legal.replace(settings=legal.settings.replace(**{name: value}))
    line = BY_NAME[name].check(value, plan)
    assert line and needle in line, (name, line)
    with pytest.raises(PlanError) as e:
        plan.validate(H100)
    assert str(e.value) == line  # (cp_comm's is also a vectorised rule of the search's, with the same line)
    if name != "launch_blocking":  # (the API's keyword is a switch: bool() of any value)
        with pytest.raises(UserError, match="^" + re.escape(line) + "$"):
            make_plan(model, H100, **{**kw, name: value})


def test_every_record_has_an_illegal_sample() -> None:
    assert set(ILLEGAL) == set(NAMES)


def test_every_choice_a_setting_takes_is_in_its_help() -> None:
    """Each runtime and each attention kernel the flags accept is named in their help (llm-foundry and triton
    were accepted and not named)."""
    from exatrain.settings import ATTENTION_KERNELS, RUNTIMES

    assert all(r in BY_NAME["runtime"].help for r in RUNTIMES)
    assert all(k in BY_NAME["attention_kernel"].help for k in ATTENTION_KERNELS)


def test_each_engines_own_value_is_its_records() -> None:
    """A record that states each engine's own value states it for every engine, with a source; the profile fields
    the accounting reads (``Setting.profile``) hold the record's value and source, and a plan that names none
    resolves to the engine's (where no ``own`` hook refines it by model)."""
    from exatrain.accounting.engines import get_engine, resolve_settings
    from exatrain.settings import RUNTIMES

    stated = [s for s in SETTINGS if s.engines]
    assert {s.name for s in stated} >= {"attention_kernel", "elementwise", "cross_entropy", "grad_accum", "adam_kernel"}
    for s in stated:
        assert set(s.engines) == set(RUNTIMES), s.name
        for runtime, own in s.engines.items():
            assert own.source, (s.name, runtime)
            profile = get_engine(runtime)
            for path, want in zip(s.profile, own):
                got = profile
                for part in path.split("."):
                    got = getattr(got, part)
                assert got == want, (s.name, runtime, path)
    for runtime in RUNTIMES:
        run = resolve_settings(RunSettings(runtime=runtime))
        assert run.elementwise == BY_NAME["elementwise"].engines[runtime].value
        assert run.attention_kernel == BY_NAME["attention_kernel"].engines[runtime].value
