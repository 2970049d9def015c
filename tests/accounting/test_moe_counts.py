"""Mixture-of-experts accounting: published parameter counts, hand-derived closed forms on moe-tiny,
expert parallelism's memory and traffic, and dense models left exactly as they were."""

from __future__ import annotations

import numpy as np
import pytest

from exatrain.catalog import get_model
from exatrain.catalog.models import ModelSpec
from exatrain.errors import UserError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.accounting import comms, flops, memory, moe, params
from tests.helpers.memory import rank_memory

# ---- published counts ---------------------------------------------------------------------------
# Totals: the checkpoints' safetensors index "total_size" (bf16, 2 bytes a parameter) where the
# checkpoint is bf16, else the report's figure. Our counts are tensor by tensor from config.json, so
# the bf16 totals match exactly; DeepSeek-V3 publishes "671B" (3 digits; its checkpoint is fp8 with
# scale tensors, so no byte total to divide).
EXACT_TOTALS = {
    "mixtral-8x7b": 93_405_585_408 // 2,  # mistralai/Mixtral-8x7B-v0.1 model.safetensors.index.json
    "qwen3-30b-a3b": 61_064_245_248 // 2,  # Qwen/Qwen3-30B-A3B model.safetensors.index.json
}


@pytest.mark.parametrize("name, total", sorted(EXACT_TOTALS.items()))
def test_total_params_equal_checkpoint_sizes(name: str, total: int) -> None:
    assert params.total_params(get_model(name)) == total


def test_deepseek_v3_total_is_671b() -> None:
    # 671B (DeepSeek-V3 report, abstract): MLA is counted exactly (q/kv LoRA ranks, latent norms,
    # decoupled RoPE keys), so the 3-digit figure is met to well within its rounding.
    assert params.total_params(get_model("deepseek-v3")) == pytest.approx(671e9, rel=5e-4)


# Activated parameters are published to 2-3 digits and not all the same way: Mistral (12.9B) and
# Qwen (3.3B: our 3.35B, truncated) count the input embedding; DeepSeek's checkpoint notes give 36.6B
# "including 0.9B for the output head" and no input embedding, the report rounds to 37B. Tolerance
# 2%: the published rounding, not our counting (the totals above are exact).
@pytest.mark.parametrize(
    "name, embedding, published",
    [
        ("mixtral-8x7b", True, 12.9e9),
        ("qwen3-30b-a3b", True, 3.3e9),
        ("deepseek-v3", False, 36.6e9),
        ("deepseek-v3", False, 37e9),
    ],
)
def test_active_params_match_published(name: str, embedding: bool, published: float) -> None:
    assert params.active_params(get_model(name), embedding=embedding) == pytest.approx(published, rel=0.02)


def test_deepseek_head_and_active_split() -> None:
    m = get_model("deepseek-v3")
    assert params.head_params(m) == pytest.approx(0.9e9, rel=0.04)  # "0.9B for the output head"
    # what the two conventions differ by is exactly the input embedding table
    assert params.active_params(m) - params.active_params(m, embedding=False) == params.embedding_params(m)


# ---- moe-tiny by hand ---------------------------------------------------------------------------
def _tiny() -> ModelSpec:
    # L4, h64, 4 heads (d16), 2 kv heads, ffn 176, 1 dense layer, E4 top-2, 1 shared, fe 64
    return get_model("moe-tiny")


def test_moe_tiny_layer_params_by_hand() -> None:
    m = _tiny()
    h, kvh, f, fe, E = 64, 32, 176, 64, 4
    attn = h * (h + 2 * kvh) + h * h
    expert = 3 * h * fe
    dense = params.layer_params(m, moe=False)
    assert (dense.sharded, dense.replicated, dense.experts) == (attn + 3 * h * f, 2 * h, 0)
    lp = params.layer_params(m, moe=True)
    assert (lp.sharded, lp.replicated, lp.experts) == (attn + expert, 2 * h + E * h, E * expert)
    assert params.layer_params(m) == lp  # default: the model's MoE layer
    assert m.moe_layers == 3 and params.layer_kinds(m) == (False, True, True, True)
    V = 256
    total = dense.total + 3 * lp.total + 2 * V * h + h  # untied head, final RMSNorm
    assert params.total_params(m) == total
    active = dense.total + 3 * (attn + expert + 2 * h + E * h + 2 * expert) + 2 * V * h + h
    assert params.active_params(m) == active
    assert params.expert_params(m) == 3 * E * expert


def test_moe_layer_pattern_rules() -> None:
    # Llama 4-style interleaving: layers 1, 3, 5 ... are MoE (transformers' Llama4 moe_layers).
    m = ModelSpec(
        name="x",
        arch="llama",
        layers=6,
        hidden=64,
        heads=4,
        seq_len=8,
        vocab=10,
        ffn_hidden=128,
        experts=4,
        top_k=1,
        moe_every=2,
    )
    assert params.layer_kinds(m) == (False, True, False, True, False, True)
    m2 = m.replace(dense_layers=2, moe_every=1)
    assert params.layer_kinds(m2) == (False, False, True, True, True, True)


def test_stage_params_split_with_expert_parallelism() -> None:
    m = _tiny()
    lp_d, lp_m = params.layer_params(m, moe=False), params.layer_params(m, moe=True)
    V, h = 256, 64
    for ep in (1, 2, 4):
        split = params.stage_params_split(m, tp=1, pp=2, interleave=1, layers_per_stage=(2, 2), ep=ep)
        # stage 0: embedding + dense layer + 1 MoE layer; stage 1: 2 MoE layers + norm + head
        assert split[0] == (V * h + lp_d.total + lp_m.sharded + lp_m.replicated, lp_m.experts // ep)
        assert split[1] == (2 * (lp_m.sharded + lp_m.replicated) + h + V * h, 2 * lp_m.experts // ep)
    assert params.stage_layer_kinds(m, pp=2, interleave=1, layers_per_stage=(2, 2)) == ((1, 1), (0, 2))
    # interleaved: virtual stages 0, 2 on rank 0 hold layers 0 and 2
    assert params.stage_layer_kinds(m, pp=2, interleave=2, layers_per_stage=(1, 1, 1, 1)) == ((1, 1), (0, 2))
    # a Plan (no ep) holds every expert; the split sums to stage_params
    plan = Plan(model=m, dims=ParallelDims(2, 2, 1), shape=TrainShape(1, 8)).validate()
    split = params.stage_params_split(m, tp=2, pp=2, interleave=1, layers_per_stage=plan.layers_per_stage())
    assert params.stage_params(plan) == tuple(a + b for a, b in split)
    assert sum(params.stage_params(_plan_tp1(m))) == params.total_params(m)


def _plan_tp1(m: ModelSpec) -> Plan:
    return Plan(model=m, dims=ParallelDims(1, 2, 1), shape=TrainShape(1, 8)).validate()


def test_moe_flops_by_hand() -> None:
    m = _tiny()
    h, kvh, f, fe, E, k, s, V = 64, 32, 176, 64, 4, 2, 64, 256
    attn = 2 * (h * (h + 2 * kvh) + h * h) + 4 * s * h
    dense = attn + 2 * 3 * h * f
    moe_layer = attn + 2 * (1 + k) * 3 * h * fe + 2 * h * E  # shared + top-2 experts + router GEMM
    assert flops.layer_forward_flops_per_token(m, moe=False) == dense
    assert flops.layer_forward_flops_per_token(m, moe=True) == moe_layer
    B = 8
    expected = 3 * B * s * (dense + 3 * moe_layer + 2 * h * V)
    assert flops.model_flops_per_step(m, B) == pytest.approx(expected, rel=1e-15)
    assert flops.hardware_flops_per_step(m, B, "full") == pytest.approx(
        expected + B * s * (dense + 3 * moe_layer), rel=1e-15
    )
    # MFU counts the active parameters: 6 FLOPs per active GEMM weight (no input embedding, no norm
    # weights) and token, plus the attention core of each of the 4 layers
    per_token = flops.model_flops_per_token(m)
    assert per_token == pytest.approx(expected / (B * s))
    norms = 4 * 2 * h + h
    assert per_token == 6 * (params.active_params(m, embedding=False) - norms) + 3 * 4 * (4 * s * h)


@pytest.mark.parametrize("name", ["moe-tiny", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"])
def test_layer_gemms_sum_to_layer_flops(name: str) -> None:
    m = get_model(name)
    for kind in (False, True):
        g = flops.layer_gemms(m, 2, 1, moe=kind)
        assert sum(x.flops for x in g) == pytest.approx(
            2 * m.seq_len * flops.layer_forward_flops_per_token(m, kind), rel=1e-12
        )


def test_expert_gemms_per_rank_under_expert_parallelism() -> None:
    """With balanced routing each rank's experts do the work of its own tokens' top-k copies, whatever ep."""
    m = get_model("mixtral-8x7b")

    def expert_flops(**kw):
        return sum(g.flops for g in flops.layer_gemms(m, 1, 1, moe=True, **kw) if g.name.startswith("expert_"))

    base = expert_flops()
    assert expert_flops(ep=8) == pytest.approx(base)
    assert expert_flops(ep=4, capacity_factor=1.25) == pytest.approx(1.25 * base)
    g = {x.name: x for x in flops.layer_gemms(m, 1, 1, moe=True, ep=4, etp=2)}
    assert g["expert_fc1"].count == 2 and g["expert_fc1"].n == 2 * 14336 // 2


# ---- expert-parallel memory ------------------------------------------------------------------------
def test_expert_dp_is_megatron_folding() -> None:
    assert moe.expert_dp(tp=2, dp=8, ep=8) == 2
    assert moe.expert_dp(tp=4, dp=4, ep=4, etp=2, cp=2) == 4
    np.testing.assert_array_equal(moe.expert_dp(np.array([1, 2]), np.array([8, 4]), np.array([8, 2])), [1.0, 4.0])


def _rank(m, **kw):
    base = dict(
        dtype="bfloat16",
        zero_stage=1,
        recompute="none",
        sequence_parallel=True,
        flash=True,
        tp=1,
        dp=8,
        micro_batch=1,
        pp=1,
        interleave=1,
        layers_here=m.layers,
        inflight_mb=1,
        is_last=True,
    )
    base.update(kw)
    return rank_memory(m, **base)


def test_expert_states_sharded_over_expert_dp_by_hand() -> None:
    m = _tiny()
    dense, experts = params.stage_params_split(m, tp=1, pp=1, interleave=1, layers_per_stage=(4,), ep=4)[0]
    w, g, o, _, _ = _rank(m, ep=4, params_here=dense, expert_params_here=experts, moe_layers_here=3)
    # ZeRO-1, dp 8: dense optimizer over 8 ranks, experts' over tp*dp/ep = 2 (module doc of memory.py)
    assert w == pytest.approx(6.0 * (dense + experts))
    assert g == pytest.approx(4.0 * (dense + experts))
    assert o == pytest.approx(8.0 * dense / 8 + 8.0 * experts / 2)


def test_more_expert_parallelism_fewer_expert_bytes_per_rank() -> None:
    m = get_model("mixtral-8x7b")
    totals = []
    for ep in (1, 2, 4, 8):
        dense, experts = params.stage_params_split(m, tp=1, pp=1, interleave=1, layers_per_stage=(32,), ep=ep)[0]
        w, g, o, a, other = _rank(
            m,
            ep=ep,
            dp=8,
            params_here=dense,
            expert_params_here=experts,
            moe_layers_here=32,
            micro_batch=1,
            zero_stage=1,
        )
        totals.append(w + g + o)
    assert all(a > b for a, b in zip(totals, totals[1:]))


def test_moe_layer_activation_bytes_by_hand() -> None:
    m = _tiny()
    h, kvh, fe, E, k, heads, s, e = 64, 32, 64, 4, 2, 4, 64, 2
    for tp, sp, cp, etp, c in ((1, False, 1, 1, 1.0), (2, True, 1, 1, 1.0), (2, True, 2, 2, 1.25)):
        b = 2
        t = b * s / cp
        routed = t / (tp if sp else 1)
        sp_div = tp if sp else 1
        per_token = 4 * h * e / sp_div + (h + 2 * kvh + h + 4 * fe) * e / tp + 4.0 * heads / tp
        router = routed * (E * 5 + k * 4)
        copies = routed * k * c * etp
        experts = copies * (h * e + 4 * (fe / etp) * e + 4)
        expected = t * per_token + router + experts
        got = memory.layer_activation_bytes(
            m, b, tp, sequence_parallel=sp, recompute="none", flash=True, cp=cp, moe=True, etp=etp, capacity_factor=c
        )
        assert got == pytest.approx(expected, rel=1e-12)
        assert moe.dispatch_buffer_bytes(
            m, b, tp, sequence_parallel=sp, cp=cp, etp=etp, capacity_factor=c
        ) == pytest.approx((routed * k + copies) * h * e)


def test_rank_memory_moe_activations_and_buffers() -> None:
    m = _tiny()
    dense, experts = params.stage_params_split(m, tp=2, pp=1, interleave=1, layers_per_stage=(4,), ep=2)[0]
    kw = dict(tp=2, ep=2, dp=2, micro_batch=2, params_here=dense, expert_params_here=experts, moe_layers_here=3)
    w, g, o, acts, other = _rank(m, **kw)
    la = dict(sequence_parallel=True, recompute="none", flash=True)
    layer = memory.layer_activation_bytes(m, 2, 2, moe=False, **la)
    moe_layer = memory.layer_activation_bytes(m, 2, 2, moe=True, **la)
    tokens = 2 * m.seq_len
    # the final norm's input (a sequence shard), the head's (all-gathered over tp, as the trainer's DTensor head
    # keeps it) and the upcast loss on a vocabulary shard (four fp32)
    logits = 2 * tokens * m.hidden / 2 + 2 * tokens * m.hidden + tokens * m.vocab / 2 * (4 + 4 + 4 + 4)
    assert acts == pytest.approx(layer + 3 * moe_layer + logits)
    a2a = moe.dispatch_buffer_bytes(m, 2, 2, sequence_parallel=True)
    assert other == pytest.approx(a2a + memory.FRAGMENTATION_ALLOWANCE * (w + g + o + acts + a2a))


# ---- expert-parallel traffic -----------------------------------------------------------------------
def test_all_to_all_bytes_by_hand() -> None:
    m = get_model("mixtral-8x7b")
    b, tp, ep, mb, layers = 1, 2, 8, 4, 16
    T = b * m.seq_len / tp  # sequence parallel: each tp rank routes its 1/tp of the tokens
    buf = T * m.top_k * m.hidden * 2
    cs = comms.moe_collectives_for(
        m, micro_batch=b, tp=tp, ep=ep, sequence_parallel=True, dtype="bfloat16", moe_layers=layers, num_microbatches=mb
    )
    assert [c.kind for c in cs] == ["all_to_all"]
    # dispatch + combine, forward and backward: 4 per layer and micro-batch, (ep-1)/ep leaves the rank
    assert float(cs[0].bytes_per_rank) == pytest.approx(4 * layers * mb * buf * (ep - 1) / ep)
    one = comms.moe_collectives_for(
        m, micro_batch=b, tp=tp, ep=1, sequence_parallel=True, dtype="bfloat16", moe_layers=layers, num_microbatches=mb
    )
    assert float(one[0].bytes_per_rank) == 0.0
    full = comms.moe_collectives_for(
        m,
        micro_batch=b,
        tp=tp,
        ep=ep,
        sequence_parallel=True,
        dtype="bfloat16",
        moe_layers=layers,
        num_microbatches=mb,
        recompute="full",
    )
    assert float(full[0].bytes_per_rank) == pytest.approx(1.5 * float(cs[0].bytes_per_rank))
    etp = comms.moe_collectives_for(
        m,
        micro_batch=b,
        tp=tp,
        ep=ep,
        etp=2,
        sequence_parallel=True,
        dtype="bfloat16",
        moe_layers=layers,
        num_microbatches=mb,
    )
    assert [c.kind for c in etp] == ["all_to_all", "all_gather", "reduce_scatter"]
    assert float(etp[1].bytes_per_rank) == pytest.approx(2 * layers * mb * buf * 2 / 2)


def test_expert_gradients_reduce_over_expert_dp() -> None:
    m = _tiny()
    cs = comms.dp_collectives_for(
        m,
        tp=2,
        pp=1,
        dp=4,
        ep=4,
        zero_stage=1,
        num_microbatches=1,
        dtype="bfloat16",
        params_here=1000,
        expert_params_here=600,
        pipeline_end=False,
    )
    by_axis = {(c.kind, c.axis): c for c in cs}
    assert by_axis[("all_reduce", "dp")].group == 4 and by_axis[("all_reduce", "edp")].group == 2
    assert float(by_axis[("all_reduce", "edp")].bytes_per_rank) == pytest.approx(2 * 1 / 2 * 600 * 4)


def test_tp_collectives_per_moe_layer() -> None:
    m, mix = _tiny(), get_model("mixtral-8x7b")
    assert comms.tp_collectives_per_layer(mix, moe=False, sequence_parallel=True) == 4
    assert comms.tp_collectives_per_layer(mix, moe=True, sequence_parallel=True) == 2
    assert comms.tp_collectives_per_layer(m, moe=True, sequence_parallel=True, recompute="full") == 6


# ---- validation -----------------------------------------------------------------------------------
_BASE = dict(name="x", arch="llama", layers=4, hidden=64, heads=4, seq_len=8, vocab=10, ffn_hidden=128)


@pytest.mark.parametrize(
    "extra, message",
    [
        (dict(experts=4, top_k=5), "top_k 5 exceeds experts 4"),
        (dict(experts=4), "needs top_k >= 1"),
        (dict(top_k=2), "top_k apply to mixture-of-experts models only; set experts > 0"),
        (dict(experts=4, top_k=2, dense_layers=4), "leave no MoE layer"),
        (dict(experts=4, top_k=2, router="relu"), "unknown router 'relu'"),
        (dict(experts=4, top_k=2, moe_every=0), "moe_every must be a positive integer"),
        (dict(experts=-1), "experts must be a non-negative integer"),
        (dict(arch="gpt", ffn_hidden=0, kv_heads=4, experts=4, top_k=2), "describe llama-family models"),
        (dict(kv_lora_rank=32, rope_head_dim=8), "kv_heads must equal heads"),
        (dict(kv_heads=4, kv_lora_rank=32, rope_head_dim=7), "even rope_head_dim"),
        (dict(rope_head_dim=8), "set kv_lora_rank too"),
    ],
)
def test_bad_moe_fields_are_one_line_user_errors(extra, message) -> None:
    fields = {**_BASE, "kv_heads": 2, **extra}
    with pytest.raises(UserError, match=message) as info:
        ModelSpec(**fields)
    assert "\n" not in str(info.value)


def test_moe_model_round_trips_and_dense_dict_is_unchanged() -> None:
    m = get_model("deepseek-v3")
    assert ModelSpec.from_dict(m.to_dict()) == m
    old_fields = {
        "name",
        "arch",
        "layers",
        "hidden",
        "heads",
        "seq_len",
        "vocab",
        "kv_heads",
        "ffn_hidden",
        "tied_embeddings",
        "rope_theta",
        "norm_eps",
        "dropout",
        "description",
    }
    assert set(get_model("llama3-70b").to_dict()) == old_fields
    assert set(get_model("gpt-175b").to_dict()) == old_fields


# ---- dense models: the extended code paths give the dense results ----------------------------------
def test_explicit_default_head_width_takes_the_general_path_to_the_same_numbers() -> None:
    """kv_channels = hidden/heads routes params, FLOPs, GEMMs and activations through the general
    (MoE/MLA-aware) code; a dense llama must come out the same to the last bit."""
    m = get_model("llama3-8b")
    x = m.replace(kv_channels=m.hidden // m.heads)
    assert params.layer_params(x) == params.layer_params(m)
    assert params.total_params(x) == params.total_params(m)
    assert flops.layer_forward_flops_per_token(x) == flops.layer_forward_flops_per_token(m)
    assert flops.attention_forward_flops_per_token(x) == flops.attention_forward_flops_per_token(m)
    assert flops.model_flops_per_step(x, 16) == flops.model_flops_per_step(m, 16)
    assert [(g.m, g.n, g.k, g.count) for g in flops.layer_gemms(x, 2, 4)] == [
        (g.m, g.n, g.k, g.count) for g in flops.layer_gemms(m, 2, 4)
    ]
    for rec in ("none", "selective", "full"):
        for sp in (False, True):
            for fl in (False, True):
                kw = dict(sequence_parallel=sp, recompute=rec, flash=fl)
                assert memory.layer_activation_bytes(x, 2, 4, **kw) == memory.layer_activation_bytes(m, 2, 4, **kw)


def test_extension_defaults_leave_dense_memory_unchanged() -> None:
    m = get_model("llama3-70b")
    arrays = dict(
        tp=np.array([1, 2, 8]),
        dp=np.array([8, 4, 1]),
        micro_batch=np.array([1, 2, 1]),
        pp=np.array([1, 2, 8]),
        interleave=np.array([1, 1, 2]),
        params_here=np.array([7e10, 2e10, 1e9]),
        layers_here=np.array([80, 40, 10]),
        inflight_mb=np.array([1, 2, 8.5]),
        is_last=np.array([True, False, True]),
    )
    for zero in (0, 1, 2, 3):
        for rec in ("none", "selective", "full"):
            plain = rank_memory(
                m, dtype="bfloat16", zero_stage=zero, recompute=rec, sequence_parallel=True, flash=True, **arrays
            )
            ext = rank_memory(
                m,
                dtype="bfloat16",
                zero_stage=zero,
                recompute=rec,
                sequence_parallel=True,
                flash=True,
                cp=1,
                ep=1,
                etp=1,
                expert_params_here=0,
                moe_layers_here=0,
                capacity_factor=1.0,
                fp8=None,
                **arrays,
            )
            for a, b in zip(plain, ext):
                np.testing.assert_array_equal(a, b)
