"""How a layer's element-wise ops run (--elementwise fused|eager|eager-composite, plan.ELEMENTWISE):
the bytes an eager op chain moves beyond the fused kernels (cost.compute.unfused_extra) against the
closed form its docstring derives, each engine's default, the plan field end to end, and the
matmuls torchtitan's per-op selective recomputation reruns (cost.compute.per_op_rerun_s).

Deliberate bugs these tests were seen to catch:
* the SwiGLU product's extra read + write dropped from ``unfused_extra`` (the closed-form test);
* the composite RMSNorm's bytes charged under plain "eager" too (the closed-form test);
* torchtitan's default left at "fused" (the engine-default test: eager == default fails);
* ``per_op_rerun_s`` rerunning every matmul rather than every second (the per-op test).
"""

from __future__ import annotations

import numpy as np
import pytest

from exatrain import api
from exatrain.accounting.engines import ENGINES
from exatrain.accounting.flops import layer_gemms
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.cli import main
from exatrain.errors import PlanError, UserError
from exatrain.settings import ELEMENTWISE
from exatrain.planner.cost import compute
from tests.helpers.plan_fields import check_round_trip

H100 = get_cluster("dgx-h100")
DENSE = dict(
    model="llama3-8b", cluster="dgx-h100", gpus=8, global_batch=16, micro_batch=2, zero=3, recompute="selective"
)


def _compute_s(runtime: str, elementwise: str | None = None) -> float:
    return api.estimate(**DENSE, runtime=runtime, elementwise=elementwise).estimate.time_s.compute


def test_unfused_bytes_match_the_closed_form() -> None:
    m = get_model("llama3-8b")
    e, tokens, tp = 2.0, 8192.0, 2
    act = tokens * m.ffn_hidden / tp
    assert compute.unfused_extra(m, tokens, tp, sequence_parallel=False, e=e, mode="fused", act_elems=act) == (0.0, 0)
    eager, ops = compute.unfused_extra(m, tokens, tp, sequence_parallel=False, e=e, mode="eager", act_elems=act)
    # SwiGLU: silu's output written and read again (2e per element); rotary: 16 bytes per q/k element
    swiglu = 2 * e * tokens * m.ffn_hidden / tp
    rotary = 16.0 * tokens * (m.hidden + m.kv_hidden) / tp
    assert float(eager) == pytest.approx(swiglu + rotary, rel=1e-12) and ops == 5
    comp, ops = compute.unfused_extra(m, tokens, tp, sequence_parallel=True, e=e, mode="eager-composite", act_elems=act)
    # two RMSNorms of h elements, sharded by tp under SP: (4e + 28) - 2e bytes each beyond the fused kernel
    norms = (2 * e + 28.0) * tokens * 2 * m.hidden / tp
    assert float(comp) == pytest.approx(swiglu + rotary + norms, rel=1e-12) and ops == 15
    # a GPT model (LayerNorm, GELU, learned positions): eager runs it as the fused counts do
    gpt = get_model("gpt-1.3b")
    assert compute.unfused_extra(
        gpt, tokens, 1, sequence_parallel=False, e=e, mode="eager-composite", act_elems=tokens * gpt.ffn_hidden
    ) == (0.0, 0)
    with pytest.raises(UserError, match="unknown element-wise mode 'jit'"):
        compute.unfused_extra(m, tokens, tp, sequence_parallel=False, e=e, mode="jit")


def test_each_engine_default_and_the_estimate_orders_the_modes() -> None:
    assert ELEMENTWISE == ("fused", "eager", "eager-composite")
    assert {n: p.elementwise() for n, p in ENGINES.items()} == {
        "megatron-core": "fused",
        "megatron-deepspeed": "fused",
        "torchtitan": "eager",
        "exatrain": "eager",
        "llm-foundry": "eager",
    }
    assert all(p.elementwise_source for p in ENGINES.values())
    fused, eager, comp = (_compute_s("torchtitan", mode) for mode in ELEMENTWISE)
    assert fused < eager < comp
    assert _compute_s("torchtitan") == eager
    assert _compute_s("megatron-core") == _compute_s("megatron-core", "fused")
    notes = " ".join(api.estimate(**DENSE, runtime="torchtitan").estimate.notes)
    assert "element-wise ops: eager (torch.compile is off" in notes
    notes = " ".join(api.estimate(**DENSE, runtime="torchtitan", elementwise="fused").estimate.notes)
    assert "element-wise ops: fused (set by --elementwise; torchtitan's own: eager;" in notes


def test_the_plan_carries_it_and_bad_values_are_one_line(tmp_path, capsys) -> None:
    check_round_trip(tmp_path, H100, "elementwise", "fused")
    with pytest.raises(PlanError, match=r"^--elementwise must be one of fused, eager, eager-composite, got 'jit'$"):
        make_plan("llama3-8b", H100, gpus=8, elementwise="jit")
    assert main(["estimate", "--model", "llama3-8b", "--elementwise", "jit"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'jit'" in err and "Traceback" not in err
    # search prices every candidate with it
    best = {
        mode: api.search(
            model="llama3-8b",
            cluster="dgx-h100",
            gpus=8,
            global_batch=16,
            runtime="torchtitan",
            tp=1,
            pp=1,
            zero=3,
            elementwise=mode,
            top=1,
        ).ranked[0]
        for mode in ("fused", "eager")
    }
    assert best["fused"].elementwise == "fused"
    assert best["fused"].estimate.time_s.step < best["eager"].estimate.time_s.step


def test_per_op_recompute_reruns_every_second_matmul() -> None:
    """torchtitan's op policy saves the 1st, 3rd, 5th and 7th matmul of a block (wq, wv, w1, w2) and reruns
    wk, wo and w3: with seconds proportional to FLOPs that is their share of the dense FLOPs."""
    m = get_model("llama3-8b")
    gemms = [g for g in layer_gemms(m, 1, 1) if not g.name.startswith("attn_")]
    flops = [float(g.flops) for g in gemms]
    h, kv, f = m.hidden, m.kv_hidden, m.ffn_hidden
    rerun = (h * kv + h * h + h * f) / (2 * h * h + 2 * h * kv + 3 * h * f)
    assert compute.per_op_rerun_s(m, gemms, flops) == pytest.approx(rerun * sum(flops), rel=1e-9)
    assert rerun == pytest.approx(0.365, abs=1e-3)
    # the estimate's recompute term uses it: selective costs less than half the dense GEMMs again
    sel = api.estimate(**DENSE, runtime="torchtitan").estimate.time_s.compute
    none = api.estimate(**{**DENSE, "recompute": "none"}, runtime="torchtitan").estimate.time_s.compute
    assert none < sel
    assert np.isfinite(sel)


def test_the_exports_say_how_the_plan_was_priced() -> None:
    """torchtitan's job config compiles exactly when the plan was priced fused; a Megatron config of an
    eager-priced plan says Megatron fuses them."""
    from exatrain.engine_configs.megatron import render_megatron
    from exatrain.engine_configs.torchtitan import render_torchtitan

    def titan(mode: str) -> str:
        return render_torchtitan(
            make_plan("llama3-8b", H100, gpus=8, global_batch=8, runtime="torchtitan", elementwise=mode)
        ).text

    assert '[compile]\nenable = true\ncomponents = ["model", "loss"]' in titan("fused")
    assert "[compile]\nenable = false" in titan("") and "[compile]\nenable = false" in titan("eager")
    assert "composite ops" in titan("eager-composite")
    notes = render_megatron(
        make_plan("llama3-8b", H100, gpus=8, global_batch=8, runtime="megatron-core", elementwise="eager")
    ).notes
    assert any("priced with eager element-wise ops; Megatron-Core runs its fused kernels" in n for n in notes)
    own = render_megatron(make_plan("llama3-8b", H100, gpus=8, global_batch=8, runtime="megatron-core")).notes
    assert not any("element-wise" in n for n in own)
