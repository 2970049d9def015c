"""Whether each micro-batch's weight gradients are added to the accumulated ones inside the weight-gradient
GEMMs (``--grad-accum-fusion``, ``Plan.grad_accum_fusion``; Megatron-Core's ``--no-gradient-accumulation-fusion``):
the bytes of the pass a plan without the fusion pays, its step time and timeline, the exports, the refusals.

Broken on purpose and seen to fail here: the accumulator counted read only, not read and written (the closed-form
test), the pass divided by a step's 4 micro-batches, as if paid once a step (the step test), ``evaluate``
dropping the switch on its way to ``step_times`` (the step test), ``engines.resolve`` ignoring it (the step test's
notes), the rule offering it to torchtitan (the closed-form test), the Megatron export without the flag (the
export test), the trainer's refusal dropped (the trainer test)."""

from __future__ import annotations

import numpy as np
import pytest

from exatrain.accounting.engines import get_engine, resolve_settings
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.engine_configs import export
from exatrain.engine_configs.megatron import render_megatron
from exatrain.errors import UserError
from exatrain.run_settings import RunSettings
from exatrain.settings import GRAD_ACCUM_FUSION_RUNTIMES, RUNTIMES
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.estimate import estimate_plan
from tests.helpers.cli import refused_by_planner, saved_plan
from tests.helpers.passes import pass_seconds
from tests.helpers.plan_fields import check_round_trip, trainer_refuses

A100 = get_cluster("dgx-a100")


def _plan(fusion: str = "", runtime: str = "megatron-core", **kw):
    args = dict(gpus=16, tp=1, pp=1, micro_batch=1, global_batch=64, zero=1, recompute="full", runtime=runtime)
    args.update(kw)
    return make_plan("llama3-8b", A100, grad_accum_fusion=fusion or None, **args)


def engine_variant(runtime: str, grad_accum: str = "", fusion: str = ""):
    """The runtime's profile as a plan with these settings runs it (``engines.resolve``)."""
    return resolve_settings(RunSettings(runtime=runtime, grad_accum=grad_accum, grad_accum_fusion=fusion)).engine


def test_the_pass_reads_the_fresh_gradient_and_reads_and_writes_the_accumulator() -> None:
    # bf16 training into fp32 main grads: 2 + 2 x 4; into 16-bit ones (--grad-reduce-in-bf16): 2 + 2 x 2;
    # fp32 training: 4 + 2 x 4
    off = engine_variant("megatron-core", "", "off")
    assert off.accum_pass("bfloat16") == 10.0 and off.accum_pass("float32") == 12.0
    assert engine_variant("megatron-core", "bfloat16", "off").accum_pass("bfloat16") == 6.0
    # fused (Megatron-Core's own, or said): no pass
    for fusion in ("", "on"):
        assert engine_variant("megatron-core", "", fusion).accum_pass("bfloat16") == 0.0
    # only Megatron-Core offers the switch, and the rule says the same runtimes
    offers = {name for name in RUNTIMES if get_engine(name).accum_fusion_switch}
    assert offers == set(GRAD_ACCUM_FUSION_RUNTIMES) == {"megatron-core"}
    with pytest.raises(UserError, match="offers no choice of gradient-accumulation fusion"):
        engine_variant("torchtitan", "", "off")


def test_the_plan_file_round_trip(tmp_path) -> None:
    check_round_trip(tmp_path, A100, "grad_accum_fusion", "off", runtime="megatron-core")


def test_the_step_pays_the_pass_every_micro_batch() -> None:
    # pp 1, tp 1: the rank holds every parameter; 4 micro-batches a step; the pass is the only compute change
    plan = _plan("off")
    params = default_params(A100.device.name)
    off, on = (estimate_plan(p, A100, params) for p in (plan, plan.replace(grad_accum_fusion="on")))
    one = float(pass_seconds(plan, A100, 10.0)[0, 0])
    assert plan.num_microbatches == 4
    assert off.time_s.compute - on.time_s.compute == pytest.approx(plan.num_microbatches * one, rel=1e-9)
    # the runtime's own is the fused one, and memory does not change
    assert estimate_plan(_plan(), A100, params).time_s.step == pytest.approx(on.time_s.step, rel=1e-12)
    assert off.memory_bytes.total == on.memory_bytes.total
    assert any("10 bytes a parameter every micro-batch outside the GEMMs" in n for n in off.notes)
    assert any("inside the weight-gradient GEMMs" in n for n in on.notes)


def test_the_timeline_replays_the_same_pass() -> None:
    from exatrain.planner.plan_cost import plan_stage_times

    plan = _plan("off", pp=2)
    params = default_params(A100.device.name)
    extra = (
        plan_stage_times(plan, A100, params).bwd
        - plan_stage_times(plan.replace(grad_accum_fusion=""), A100, params).bwd
    )
    assert np.allclose(extra[0], pass_seconds(plan, A100, 10.0)[0], rtol=1e-9)


def test_the_search_carries_it() -> None:
    from exatrain.planner.search.search import search
    from exatrain.planner.search.space import SpaceOptions

    model = get_model("llama3-8b")
    kw = dict(top=3, runtime="megatron-core")
    off = search(model, A100, 16, 64, options=SpaceOptions(grad_accum_fusion="off", tp=(2,), pp=(1,)), **kw)
    on = search(model, A100, 16, 64, options=SpaceOptions(tp=(2,), pp=(1,)), **kw)
    assert off.ranked and all(p.grad_accum_fusion == "off" for p in off.ranked)
    assert off.ranked[0].estimate.time_s.step > on.ranked[0].estimate.time_s.step


def test_the_megatron_export_sets_the_flag_and_the_others_say_they_cannot() -> None:
    assert "--no-gradient-accumulation-fusion" in render_megatron(_plan("off")).text
    for fusion in ("", "on"):
        assert "--no-gradient-accumulation-fusion" not in render_megatron(_plan(fusion)).text
    for target in ("deepspeed", "torchtitan"):
        assert any("accumulates them its own way" in n for n in export(_plan("off"), target).notes), target
        assert not any("accumulates them its own way" in n for n in export(_plan(), target).notes), target


def test_refusals_are_one_line() -> None:
    with pytest.raises(UserError, match="Megatron-Core's switch .* torchtitan accumulates its gradients its own way"):
        _plan("off", runtime="torchtitan", zero=2)
    with pytest.raises(UserError, match="must be one of on, off, got 'maybe'"):
        _plan("maybe")


def test_the_cli_refuses_with_exit_2(capsys) -> None:
    refused_by_planner(
        capsys,
        "--grad-accum-fusion is Megatron-Core's switch",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-a100",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--runtime",
        "exatrain",
        "--grad-accum-fusion",
        "off",
    )


def test_a_saved_plan_keeps_it_and_the_trainer_refuses_it(tmp_path, capsys) -> None:
    saved = saved_plan(
        capsys,
        tmp_path / "p.json",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-a100",
        "--gpus",
        "16",
        "--zero",
        "1",
        "--runtime",
        "megatron-core",
        "--grad-accum-fusion",
        "off",
    )
    assert saved["grad_accum_fusion"] == "off"
    trainer_refuses(
        "--grad-accum-fusion off is Megatron-Core's switch", runtime="megatron-core", grad_accum_fusion="off"
    )
