"""FP8 accounting: scaling-state and weight-copy bytes, fp8-saved GEMM inputs against hand-derived
closed forms, and the fp8 GEMM peak from the device catalog."""

from __future__ import annotations

import pytest

from exatrain.catalog import device_catalog, get_device, get_model
from exatrain.errors import UserError
from exatrain.accounting import flops, fp8, memory, moe, params
from exatrain.accounting.fp8 import Fp8Recipe
from tests.helpers.memory import rank_memory


def test_recipe_validation() -> None:
    with pytest.raises(UserError, match="unknown fp8 scaling 'tensorwise'"):
        Fp8Recipe(scaling="tensorwise")
    with pytest.raises(UserError, match="amax_history_len must be a positive integer"):
        Fp8Recipe(amax_history_len=0)


def test_scaling_state_bytes() -> None:
    # TE delayed scaling: per GEMM 3 forward + 2 backward fp8 tensors, each an fp32 amax history of
    # amax_history_len entries plus an fp32 scale and inverse scale
    assert Fp8Recipe().meta_bytes(1) == 5 * (1024 + 2) * 4
    assert Fp8Recipe(amax_history_len=1).meta_bytes(10) == 10 * 5 * 3 * 4
    for scaling in ("current", "block", "mxfp8"):
        assert Fp8Recipe(scaling=scaling).meta_bytes(10) == 0.0


@pytest.mark.parametrize(
    "recipe, per_weight, per_input",
    [
        (Fp8Recipe(), 2.0, 1.0),  # fp8 copy + transpose, 1 byte inputs
        (Fp8Recipe(transpose_cache=False), 1.0, 1.0),
        (Fp8Recipe(fp8_params=True), 0.0, 1.0),  # fp8 weight and transpose replace the bf16 copy
        (Fp8Recipe(scaling="block"), 2 * (1 + 4 / 128**2), 1 + 4 / 128),
        (Fp8Recipe(scaling="mxfp8"), 2 * (1 + 1 / 32), 1 + 1 / 32),
    ],
)
def test_weight_and_input_bytes(recipe: Fp8Recipe, per_weight: float, per_input: float) -> None:
    assert recipe.weight_bytes_per_param("bfloat16") == pytest.approx(per_weight)
    assert recipe.saved_input_bytes == pytest.approx(per_input)


def test_gemm_weights_and_modules_by_hand() -> None:
    m = get_model("moe-tiny")  # h 64, kv 32, ffn 176, E 4, fe 64, 1 shared
    h = 64
    attn = h * (h + 2 * 32) + h * h
    assert fp8.gemm_weights(m, False) == attn + 3 * h * 176
    assert fp8.gemm_weights(m, True, tp=2, ep=2) == attn / 2 + 3 * h * 64 / 2 + 4 * 3 * h * 64 / 2
    assert fp8.gemms_per_layer(m, False) == 4
    assert fp8.gemms_per_layer(m, True, ep=2) == 2 + 2 + 2 * 2
    ds = get_model("deepseek-v3")  # MLA: q down/up, kv down/up, output projection
    assert fp8.gemms_per_layer(ds, False) == 5 + 2


@pytest.mark.parametrize("sp, tp", [(False, 1), (True, 4)])
def test_dense_saved_inputs_in_fp8_by_hand(sp: bool, tp: int) -> None:
    m = get_model("llama3-8b")
    h, f, s, b, e = m.hidden, m.ffn_hidden, m.seq_len, 2, 2
    for recipe in (Fp8Recipe(), Fp8Recipe(scaling="mxfp8")):
        g = recipe.saved_input_bytes
        kw = dict(sequence_parallel=sp, recompute="selective", flash=True)
        bf16 = memory.layer_activation_bytes(m, b, tp, **kw)
        f8 = memory.layer_activation_bytes(m, b, tp, fp8=recipe, **kw)
        # attention input and MLP input (replicated), projection input and fc2 input (sharded)
        saved = s * b * (e - g) * (2 * h / (tp if sp else 1) + (h + f) / tp)
        assert bf16 - f8 == pytest.approx(saved, rel=1e-12)
    # full recomputation keeps only the layer input, in the compute dtype
    full = dict(sequence_parallel=sp, recompute="full", flash=True)
    assert memory.layer_activation_bytes(m, b, tp, fp8=Fp8Recipe(), **full) == memory.layer_activation_bytes(
        m, b, tp, **full
    )


def test_moe_saved_inputs_in_fp8_by_hand() -> None:
    m = get_model("moe-tiny")
    h, fe, s, b, tp, etp, e, g = 64, 64, 64, 2, 2, 2, 2, 1.0
    kw = dict(sequence_parallel=True, recompute="none", flash=True, moe=True, etp=etp)
    delta = memory.layer_activation_bytes(m, b, tp, **kw) - memory.layer_activation_bytes(
        m, b, tp, fp8=Fp8Recipe(), **kw
    )
    t = b * s
    copies = moe.received_copies_per_rank(m, b, tp, sequence_parallel=True, etp=etp)
    # the attention input goes to fp8, the MLP input stays (the router's backward needs it); the
    # projection input and the shared expert's fc2 input; every routed copy's fc1 and fc2 inputs
    expected = t * (e - g) * (h / tp + (h + fe) / tp) + copies * (e - g) * (h + fe / etp)
    assert delta == pytest.approx(expected, rel=1e-12)


def test_rank_memory_with_fp8_by_hand() -> None:
    m = get_model("llama3-70b")
    kw = dict(
        dtype="bfloat16",
        zero_stage=1,
        recompute="selective",
        sequence_parallel=True,
        flash=True,
        tp=8,
        dp=8,
        micro_batch=1,
        pp=4,
        interleave=1,
        params_here=2e9,
        layers_here=20,
        inflight_mb=4,
        is_last=False,
    )
    w0, g0, o0, a0, other0 = rank_memory(m, **kw)
    recipe = Fp8Recipe()
    w, g, o, a, other = rank_memory(m, fp8=recipe, **kw)
    gemm_w = 20 * fp8.gemm_weights(m, False, tp=8)
    assert w - w0 == pytest.approx(2.0 * gemm_w)  # fp8 copy and its transpose
    assert (g, o) == (g0, o0)
    assert a < a0
    meta = recipe.meta_bytes(20 * 4)
    p2p = 2 * 2 * m.seq_len * m.hidden / 8
    assert other == pytest.approx(p2p + meta + memory.FRAGMENTATION_ALLOWANCE * (w + g + o + a + p2p + meta))
    wp, *_ = rank_memory(m, fp8=Fp8Recipe(fp8_params=True), **kw)
    assert wp == pytest.approx(w0)  # fp8 weight + transpose in place of the bf16 copy


def test_fp8_peaks_from_the_catalog() -> None:
    h100 = get_device("h100-sxm")
    assert fp8.gemm_peak_flops(h100, "bfloat16", Fp8Recipe()) == pytest.approx(1978.9e12)
    assert fp8.gemm_peak_flops(h100, "bfloat16", None) == pytest.approx(989.4e12)
    assert fp8.gemm_peak_flops(get_device("a100-80gb"), "bfloat16", Fp8Recipe()) is None
    # every data sheet in the catalog gives dense fp8 at twice dense bf16
    for d in device_catalog().values():
        if d.peak_tflops_fp8 is not None:
            assert d.peak_tflops_fp8 / d.peak_tflops == pytest.approx(2.0, rel=1e-3)


def test_fp8_share_of_model_flops() -> None:
    m = get_model("llama3-8b")
    linear = 2 * (params.layer_params(m).total - 2 * m.hidden)  # every layer weight but the two norms
    expected = m.layers * linear / (flops.layers_forward_flops_per_token(m) + flops.logits_forward_flops_per_token(m))
    assert fp8.fp8_flops_fraction(m) == pytest.approx(expected)
    mix = get_model("mixtral-8x7b")  # the top-2 experts' GEMMs count, the router's does not
    h, kvh, fe = mix.hidden, mix.kv_hidden, mix.expert_width
    linear = 2 * (h * (h + 2 * kvh) + h * h + 2 * 3 * h * fe)
    total = flops.layers_forward_flops_per_token(mix) + flops.logits_forward_flops_per_token(mix)
    assert fp8.fp8_flops_fraction(mix) == pytest.approx(mix.layers * linear / total)
