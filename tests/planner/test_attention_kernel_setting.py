"""The attention kernel as a plan setting (``Plan.attention_kernel``, ``--attention-kernel``): it overrides the
runtime's own kernel (``ActivationRules.flash_kernel``) in the estimate, the stage times and the search, travels
through the plan file, reaches the exports, and is refused with one line where it cannot apply.

Broken on purpose and seen to fail here: ``planner.evaluate.evaluate`` ignoring its ``attention_kernel`` (the
estimate, search and CLI tests); ``planner.plan_cost.plan_stage_times`` using the runtime's kernel only (the stage-times
check); the kernel dropped from ``plan_at`` (the search test); the flash-attention refusal left out of
``rules.extension_problem`` (the CLI test); the Megatron export writing ``flash`` for every kernel (the export
test)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from exatrain import api
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.cli import main
from exatrain.engine_configs import export
from exatrain.errors import PlanError, UserError
from exatrain.plan import Plan
from exatrain.settings import ATTENTION_KERNELS
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.plan_cost import plan_stage_times
from exatrain.planner.search.search import search
from exatrain.planner.search.space import SpaceOptions
from tests.helpers.plan_fields import check_round_trip

H100 = get_cluster("dgx-h100")
DENSE = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, global_batch=8, zero=0, recompute="none")


def _compute_s(runtime: str, kernel: str | None = None) -> float:
    # element-wise ops fused in every runtime and torchtitan's loss uncompiled (priced as Megatron's, which
    # works in place), so that only the attention kernel differs
    return api.estimate(
        **DENSE,
        runtime=runtime,
        attention_kernel=kernel,
        elementwise="fused",
        cross_entropy="upcast" if runtime == "torchtitan" else None,
    ).estimate.time_s.compute


def test_one_list_of_kernels_and_the_plan_file_round_trip(tmp_path) -> None:
    assert ATTENTION_KERNELS == ("fused", "fa2", "sdpa", "triton", "fa2-varlen")
    path = check_round_trip(tmp_path, H100, "attention_kernel", "fa2")
    assert (
        make_plan("llama3-8b", H100, gpus=8, base=Plan.load(path), attention_kernel="fused").attention_kernel == "fused"
    )
    with pytest.raises(
        PlanError, match=r"^--attention-kernel must be one of fused, fa2, sdpa, triton, fa2-varlen, got 'xformers'$"
    ):
        make_plan("llama3-8b", H100, gpus=8, attention_kernel="xformers")
    with pytest.raises(PlanError, match="flash attention off"):
        make_plan("llama3-8b", H100, gpus=8, attention_kernel="fused", flash_attention=False)


def test_the_estimate_prices_the_plans_kernel() -> None:
    """torchtitan on an H100 (SDPA: cuDNN's rate) with fa2 gets Megatron-DeepSpeed's FlashAttention-2 compute
    time; sdpa is torchtitan's own; megatron-core's own fused kernel, named, changes nothing."""
    default, fa2 = _compute_s("torchtitan"), _compute_s("torchtitan", "fa2")
    assert fa2 > default * 1.05
    assert fa2 == pytest.approx(_compute_s("megatron-deepspeed"), rel=1e-12)
    assert _compute_s("torchtitan", "sdpa") == default
    assert _compute_s("megatron-core", "fused") == _compute_s("megatron-core")
    assert _compute_s("megatron-deepspeed", "fused") == pytest.approx(default, rel=1e-12)
    notes = api.estimate(**DENSE, runtime="torchtitan", attention_kernel="fa2").estimate.notes
    assert "attention kernel: fa2 (set by --attention-kernel; torchtitan's own: sdpa;" in " ".join(notes)
    # the stage times the timeline replays price it too
    plan = make_plan("llama3-8b", H100, gpus=8, global_batch=8, runtime="torchtitan")
    p = default_params("h100-sxm")
    slow, fast = (
        float(np.sum(plan_stage_times(q, H100, p).forward_s)) for q in (plan.replace(attention_kernel="fa2"), plan)
    )
    assert slow > fast


def test_the_search_prices_and_keeps_the_kernel() -> None:
    m = get_model("llama3-8b").replace(seq_len=8192)
    opts = dict(zero_stage=(1,), recompute=("none", "selective"))
    default = search(m, H100, 8, 16, top=3, runtime="megatron-core", options=SpaceOptions(**opts))
    fa2 = search(m, H100, 8, 16, top=3, runtime="megatron-core", options=SpaceOptions(**opts, attention_kernel="fa2"))
    assert default.ranked and fa2.ranked
    assert fa2.ranked[0].estimate.time_s.step > default.ranked[0].estimate.time_s.step
    assert all(p.attention_kernel == "fa2" for p in fa2.ranked)
    assert all(p.attention_kernel == "" for p in default.ranked)
    # through the API (space_options) too
    res = api.search(
        model="llama3-8b",
        cluster="dgx-h100",
        gpus=8,
        global_batch=8,
        zero=1,
        recompute="none",
        runtime="megatron-core",
        top=2,
        attention_kernel="fa2",
    )
    assert all(p.attention_kernel == "fa2" for p in res.ranked)


def test_bad_kernels_are_one_line_and_exit_2(capsys) -> None:
    argv = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8"]
    assert main([*argv, "--attention-kernel", "bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'bogus'" in err and "Traceback" not in err
    assert main([*argv, "--attention-kernel", "fa2", "--no-flash-attention"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "flash attention off" in err and "Traceback" not in err
    assert main([*argv, "--attention-kernel", "fa2", "--runtime", "torchtitan", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["attention_kernel"] == "fa2"
    from exatrain.trainer.config import TrainConfig

    plan = make_plan("gpt-tiny", get_cluster("local-cpu"), gpus=2, global_batch=2, dtype="float32")
    TrainConfig(plan=plan.replace(attention_kernel="sdpa")).check()
    with pytest.raises(UserError, match="exatrain trainer runs torch SDPA's own attention kernel choice"):
        TrainConfig(plan=plan.replace(attention_kernel="fa2")).check()


def test_the_exports_write_or_note_the_kernel() -> None:
    plan = make_plan("llama3-8b", H100, gpus=8, global_batch=8, zero=1, runtime="megatron-core")
    assert "--attention-backend flash" in export(plan.replace(attention_kernel="fa2"), "megatron").text
    fused = export(plan.replace(attention_kernel="fused"), "megatron")
    assert "--attention-backend fused" in fused.text and not any("attention kernel" in n for n in fused.notes)
    # no kernel named: the config runs the cuDNN kernel the Megatron-Core profile prices
    assert "--attention-backend fused" in export(plan, "megatron").text
    sdpa = export(plan.replace(attention_kernel="sdpa"), "megatron")
    assert "--attention-backend fused" in sdpa.text
    assert any("sdpa attention kernel; Megatron-Core has no switch for it" in n for n in sdpa.notes)
    assert export(plan, "megatron").notes == export(plan.replace(attention_kernel="fa2"), "megatron").notes
    ds = export(plan.replace(attention_kernel="fused"), "deepspeed")
    assert "--use-flash-attn-v2" in ds.text and any("Megatron-DeepSpeed has no switch for it" in n for n in ds.notes)
    assert not export(plan.replace(attention_kernel="fa2"), "deepspeed").notes
    titan = plan.replace(runtime="torchtitan", zero_stage=0)
    assert any(
        "torchtitan has no switch for it" in n
        for n in export(titan.replace(attention_kernel="fa2"), "torchtitan").notes
    )
    assert export(titan.replace(attention_kernel="sdpa"), "torchtitan").notes == export(titan, "torchtitan").notes
