"""Biases on a llama-family model's linear layers and router (``ModelSpec.linear_bias``) and attention sinks'
parameters (``attention_sinks``): each counted by hand, split over tp and ep where Megatron-Core splits them, and
the GPT-OSS presets against the model card's parameter counts.

Broken on purpose and seen to fail here:
- the experts' biases left out (``e_col + e_row`` dropped in layer_params): test_a_gpt_oss_moe_layer_by_hand and
  test_the_gpt_oss_presets_match_the_model_card;
- the sinks not counted (``sinks`` 0 in attention_params): test_a_gpt_oss_moe_layer_by_hand;
- the output projection's bias split over tp with the columns (put in ``sharded``): test_tp_splits_what_megatron_splits;
- a dense layer's MLP biases left out (``mlp_bias_params`` ignored on the dense path): test_a_dense_layer_with_biases.
"""

from __future__ import annotations

import pytest

from exatrain.accounting.params import layer_params, total_params
from exatrain.catalog import get_model
from exatrain.catalog.models import ModelSpec
from exatrain.errors import UserError

OSS = get_model("gpt-oss-120b")  # h 2880, 64 heads of 64, 8 K,V heads, 128 experts of 2880, top-4


def test_a_gpt_oss_moe_layer_by_hand() -> None:
    h, q, kv, e, f = 2880, 64 * 64, 8 * 64, 128, 2880
    lp = layer_params(OSS, moe=True)
    # q, k, v and the output projection, the sinks (one a head), q, k, v's biases
    assert lp.sharded == h * (q + 2 * kv) + q * h + 64 + (q + 2 * kv)
    # the output projection's bias, two RMSNorms, the router and its bias
    assert lp.replicated == h + 2 * h + e * h + e
    # each expert: gate, up, down and their biases (2f for gate and up, h for down)
    assert lp.experts == e * (3 * h * f + 2 * f + h)


def test_tp_splits_what_megatron_splits() -> None:
    h, q, kv, e, f = 2880, 64 * 64, 8 * 64, 128, 2880
    lp = layer_params(OSS, moe=True)
    # column-parallel weights, their biases and the sinks split over tp; the output projection's bias, the norms
    # and the router whole on every tp rank; the experts split over ep
    split = (h * (q + 2 * kv) + q * h + 64 + (q + 2 * kv)) // 2
    assert lp.per_rank(2, 8) == split + (h + 2 * h + e * h + e) + e * (3 * h * f + 2 * f + h) // 8
    assert lp.per_rank(1, 1) == lp.total


def test_a_dense_layer_with_biases() -> None:
    m = get_model("llama3-8b").replace(linear_bias=True)
    h, f, kv = m.hidden, m.ffn_hidden, m.kv_hidden
    plain = layer_params(get_model("llama3-8b"))
    lp = layer_params(m)
    assert lp.sharded - plain.sharded == (h + 2 * kv) + 2 * f  # q, k, v; gate and up
    assert lp.replicated - plain.replicated == h + h  # the output projection's and down's


def test_the_gpt_oss_presets_match_the_model_card() -> None:
    # openai gpt-oss model card: 116.83B and 20.91B parameters
    assert total_params(OSS) / 1e9 == pytest.approx(116.83, abs=0.005)
    assert total_params(get_model("gpt-oss-20b")) / 1e9 == pytest.approx(20.91, abs=0.005)
    assert OSS.linear_bias and "biases on a llama-family model's linear layers" in OSS.unbuilt_by_trainer
    assert ModelSpec.from_dict(OSS.to_dict()) == OSS
    assert "linear_bias" not in get_model("llama3-8b").to_dict()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"linear_bias": "yes"}, "linear_bias must be true or false, got 'yes'"),
        (
            {"linear_bias": True, "kv_lora_rank": 512, "rope_head_dim": 64, "kv_heads": 16},
            "linear_bias is not modelled together with multi-head latent attention",
        ),
        ({"linear_bias": True, "arch": "gpt", "kv_heads": 16}, "linear_bias describe llama-family models"),
    ],
)
def test_bad_fields_are_one_line(fields: dict, message: str) -> None:
    base = dict(
        name="b", arch="llama", layers=6, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816, seq_len=4096, vocab=32000
    )
    with pytest.raises(UserError, match=message) as err:
        ModelSpec(**{**base, **fields})
    assert "\n" not in str(err.value)
