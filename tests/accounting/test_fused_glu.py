"""What a dense SwiGLU keeps for its backward, by engine: Megatron-Core's fused bias_swiglu saves only its input.

Megatron-Core runs a gated MLP's activation as one autograd function (megatron/core/fusions/fused_bias_swiglu.py
SwiGLUFunction: ``ctx.save_for_backward(input)``, silu recomputed in its backward), so per token a layer keeps the
fc1 output (gate and up, 2f) and fc2's input (f) — 3f — where eager PyTorch keeps gate, silu(gate), up and their
product, 4f. Broken on purpose: counting 4f for Megatron-Core (ActivationRules.glu "eager") fails the first test;
counting 3f for every engine fails the second.
"""

from __future__ import annotations

import pytest

from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.accounting.engines import get_engine
from exatrain.accounting.fp8 import Fp8Recipe
from exatrain.accounting.memory import EngineSaves, engine_layer_activation_bytes, layer_activation_bytes
from exatrain.catalog import get_model

KW = dict(sequence_parallel=True, recompute="none", flash=True, dtype="bfloat16")


@pytest.mark.parametrize("model, tp", [("llama3-8b", 1), ("llama3-70b", 4), ("llama3-405b", 8)])
@pytest.mark.parametrize("fp8", [None, Fp8Recipe("current")])
def test_megatron_core_keeps_one_interior_width_less(model: str, tp: int, fp8) -> None:
    m = get_model(model)
    eager = layer_activation_bytes(m, 1, tp, fp8=fp8, **KW)
    fused = engine_layer_activation_bytes(get_engine("megatron-core"), m, 1, tp, fp8=fp8, **KW)
    # silu(gate), f elements a token of the compute dtype, sharded over tp (fc2's input keeps its FP8 bytes)
    assert eager - fused == pytest.approx(m.seq_len * m.ffn_hidden * COMPUTE_BYTES["bfloat16"] / tp, rel=1e-12)


def test_other_engines_and_gelu_keep_what_they_kept() -> None:
    m = get_model("llama3-8b")
    for engine in ("megatron-deepspeed", "torchtitan", "exatrain"):
        rules = get_engine(engine).activations
        assert rules.glu == "eager"
        plain = layer_activation_bytes(
            m,
            2,
            2,
            dropout=rules.dropout_masks and m.dropout > 0,
            saves=EngineSaves(get_engine(engine).sp_gathered_layer_inputs),
            **KW,
        )
        if rules.selective != "per_op" or KW["recompute"] != "selective":
            assert engine_layer_activation_bytes(get_engine(engine), m, 2, 2, **KW) == pytest.approx(plain)
    gpt = get_model("gpt-22b")  # a GELU MLP keeps fc1's output and fc2's input either way
    glu = EngineSaves(glu_saves_input=True)
    assert layer_activation_bytes(gpt, 1, 8, saves=glu, **KW) == layer_activation_bytes(gpt, 1, 8, **KW)
