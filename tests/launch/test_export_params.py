"""Every export of the plan matrix builds the planned model: each export is read back into a ModelSpec with its
engine's meaning and defaults for every flag (tests/helpers/export_readback.py) and counted by exatrain's own
accounting, which must give the plan's parameter count. The engines themselves run the same exports in
scripts/check_exports.py (benchmarks/RESULTS.md); this is its engine-free half, in the normal suite.

Broken on purpose (each failed here): --kv-channels left out of the Megatron export (Qwen3-30B-A3B counted
30.08B with 64-wide heads; GPT-OSS's 45-wide heads refused); --qk-layernorm left out under latent attention
(DeepSeek-V3 refused: no latent norms); --disable-bias-linear written for GPT-OSS; every torchtitan export
named llama3 (Mixtral read as a dense 7.2B).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers.export_readback import (
    bash_array,
    deepspeed_model,
    megatron_model,
    options,
    torchtitan_03_model,
    torchtitan_model,
)

from exatrain.accounting.params import total_params
from exatrain.engine_configs import export
from exatrain.engine_configs.matrix import PLANS
from exatrain.engine_configs.torchtitan import FLAVORS, architecture
from exatrain.errors import UserError

ARRAYS = {"megatron": "MEGATRON_ARGS", "deepspeed": "MEGATRON_DEEPSPEED_ARGS", "torchtitan-0.3": "TORCHTITAN_ARGS"}


def exported_model(plan, target: str, tmp_path: Path):
    """The model ``target``'s export of ``plan`` builds, or None when exatrain refuses the export."""
    try:
        text = export(plan, target).text
    except UserError:
        return None
    if target == "torchtitan":
        return torchtitan_model(text)
    argv = bash_array(text, ARRAYS[target], tmp_path)
    if target == "megatron":
        return megatron_model(argv, plan.model.vocab)
    if target == "deepspeed":
        return deepspeed_model(argv, plan.model.vocab)
    return torchtitan_03_model(argv)


# What exatrain refuses, and where: the matrix's refusals are part of its result (RESULTS.md), so they are pinned.
REFUSED = {
    "deepspeed": {
        "llama3.1-405b-cp4",
        "llama3.1-8b-cp2-fsdp",
        "llama3-8b-fp8-fsdp",
        "llama3-70b-fp8-delayed",
        "mixtral-8x7b-ep8",
        "qwen3-30b-a3b-ep8",
        "qwen3-235b-a22b-ep16",
        "deepseek-v3-ep64",
        "gpt-oss-20b-ep8",
        "gpt-oss-120b-ep16",
        "qwen3-0.6b-dp8",
    },
    "torchtitan": {"gpt-175b-tp4-pp16", "gpt3-1.3b-dp8-selective"},
    "torchtitan-0.3": {
        "gpt-175b-tp4-pp16",
        "gpt3-1.3b-dp8-selective",
        "custom-3b-dp8",
        "mixtral-8x7b-ep8",
        "qwen3-235b-a22b-ep16",
    },
    "megatron": set(),
}


@pytest.mark.parametrize("target", sorted(REFUSED))
def test_refusals_are_one_line(target: str) -> None:
    refused = set()
    for name, build in PLANS.items():
        try:
            export(build(), target)
        except UserError as exc:
            assert "\n" not in str(exc) and str(exc)
            refused.add(name)
    assert refused == REFUSED[target]


@pytest.mark.parametrize(
    "name,target",
    [
        (n, t)
        for t in ("megatron", "deepspeed", "torchtitan", "torchtitan-0.3")
        for n in sorted(PLANS)
        if n not in REFUSED[t]
    ],
)
def test_export_builds_the_planned_parameter_count(name: str, target: str, tmp_path: Path) -> None:
    plan = PLANS[name]()
    model = exported_model(plan, target, tmp_path)
    assert model is not None, f"{target} refused {name}"
    assert total_params(model) == total_params(plan.model), (name, target)
    assert architecture(model) == architecture(plan.model)


def _drop(argv: list[str], flag: str) -> list[str]:
    o = options(argv)
    return [w for k, v in o.items() if k != flag for w in (k, *v)]


def test_a_missing_head_width_or_latent_norm_changes_the_count(tmp_path: Path) -> None:
    """The readback is strict enough to fail the test above: without --kv-channels Megatron builds Qwen3 with
    hidden/heads = 64-wide heads; without --qk-layernorm latent attention has no latent norms; with
    --disable-bias-linear GPT-OSS loses its biases; a flavor line without head_dim is another model."""
    qwen = PLANS["qwen3-30b-a3b-ep8"]()
    argv = bash_array(export(qwen, "megatron").text, "MEGATRON_ARGS", tmp_path)
    assert total_params(megatron_model(argv, qwen.model.vocab)) == 30_532_122_624
    assert total_params(megatron_model(_drop(argv, "--kv-channels"), qwen.model.vocab)) == 30_079_131_648

    dsv3 = PLANS["deepseek-v3-ep64"]()
    argv = bash_array(export(dsv3, "megatron").text, "MEGATRON_ARGS", tmp_path)
    with pytest.raises(ValueError, match="latent RMSNorms"):
        megatron_model(_drop(argv, "--qk-layernorm"), dsv3.model.vocab)

    oss = PLANS["gpt-oss-20b-ep8"]()
    argv = bash_array(export(oss, "megatron").text, "MEGATRON_ARGS", tmp_path)
    assert total_params(megatron_model(argv + ["--disable-bias-linear"], oss.model.vocab)) < total_params(oss.model)

    custom = PLANS["custom-3b-dp8"]()
    text = export(custom.replace(model=custom.model.replace(kv_channels=256)), "torchtitan").text
    assert "head_dim=256" in text and "Qwen3ModelArgs" in text  # a head width of its own: the qwen3 family
    assert total_params(torchtitan_model(text.replace("head_dim=256", "head_dim=128"))) != total_params(
        custom.model.replace(kv_channels=256)
    )


def test_moe_plans_name_torchtitans_moe_models() -> None:
    """Mixtral was exported as a dense llama3 flavor (7.2B built for 46.7B planned): each MoE family now goes to
    the torchtitan model that has its layers, a built-in flavor where one is the same network."""
    models = {
        name: __import__("tomllib").loads(export(PLANS[name](), "torchtitan").text)["model"]
        for name in (
            "mixtral-8x7b-ep8",
            "qwen3-30b-a3b-ep8",
            "deepseek-v3-ep64",
            "gpt-oss-120b-ep16",
            "llama3-70b-interleaved",
            "custom-3b-dp8",
        )
    }
    assert models["mixtral-8x7b-ep8"] == {"name": "qwen3", "flavor": "mixtral-8x7b"}  # registered, see header
    assert models["qwen3-30b-a3b-ep8"] == {"name": "qwen3", "flavor": "30B-A3B"}
    assert models["deepseek-v3-ep64"] == {"name": "deepseek_v3", "flavor": "671B"}
    assert models["gpt-oss-120b-ep16"] == {"name": "gpt_oss", "flavor": "120b"}
    assert models["llama3-70b-interleaved"] == {"name": "llama3", "flavor": "70B"}
    assert models["custom-3b-dp8"] == {"name": "llama3", "flavor": "custom-3b"}


def test_recorded_flavors_are_models_exatrain_can_count() -> None:
    """Each recorded torchtitan flavor is a valid ModelSpec whose count is the published one where the catalog
    has the model (the engines' own count of them is scripts/check_exports.py's)."""
    from exatrain.catalog import get_model

    same = {
        ("llama3", "8B"): "llama3-8b",
        ("llama3", "70B"): "llama3-70b",
        ("llama3", "405B"): "llama3-405b",
        ("qwen3", "30B-A3B"): "qwen3-30b-a3b",
        ("qwen3", "235B-A22B"): "qwen3-235b-a22b",
        ("deepseek_v3", "671B"): "deepseek-v3",
        ("gpt_oss", "20b"): "gpt-oss-20b",
        ("gpt_oss", "120b"): "gpt-oss-120b",
    }
    for f in FLAVORS:
        if (f.family, f.name) in same:
            assert architecture(f.model) == architecture(get_model(same[f.family, f.name])), f.name
    assert total_params(next(f.model for f in FLAVORS if f.name == "8B" and f.family == "qwen3")) == 8_190_735_360
