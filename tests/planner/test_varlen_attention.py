"""The "fa2-varlen" attention kernel: FlashAttention-2 called on unpadded tokens, as llm-foundry's attn_impl "flash"
ran it to 2024-01 (flash_attn_fn: flash-attn's bert_padding.unpad_input on q, k and v, pad_input on the output, even
with no padding). The kernel's rate is FlashAttention-2's; each layer adds the gathers and scatters around the call
(``cost.layer.unpad_term``), forward and backward, priced as element-wise traffic and launches.

Broken on purpose and seen to fail here: ``unpad_term`` reading the query width for k and v (the GQA bytes test);
``layer_times`` adding the copies to "fa2" as well (the estimate test); ``with_attention_kernel`` leaving
"fa2-varlen" at the prior's cuDNN rate (the estimate test's attention-core check)."""

from __future__ import annotations

import numpy as np
import pytest

from exatrain import api
from exatrain.accounting.engines import Resolved
from exatrain.catalog import get_cluster, get_model
from exatrain.planner.cost import compute
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.cost.layer import UNPAD_BWD_OPS, UNPAD_FWD_OPS, unpad_term

H100 = get_cluster("dgx-h100")


def test_the_copies_of_q_k_v_and_the_output() -> None:
    """Llama 3 8B (32 query heads, 8 key/value heads of 128): per token, forward q, k, v gathered (read + write) and
    the output scattered into zeros (3 passes); backward, the output gradient gathered and q, k, v's scattered."""
    m = get_model("llama3-8b")
    dev = compute.device_for(H100, "bfloat16", default_params("h100-sxm"))
    tokens, tp = 4 * 8192.0, 2.0
    got = unpad_term(m, tokens, np.asarray(tp), Resolved(dtype="bfloat16"), dev)
    q, kv = 4096 / tp, 1024 / tp
    assert m.q_width == 4096 and m.kv_hidden == 1024
    op = dev.params.op_overhead_s
    fwd = compute.elementwise_time_s(tokens * 2 * (2 * (q + 2 * kv) + 3 * q), dev) + UNPAD_FWD_OPS * op
    bwd = compute.elementwise_time_s(tokens * 2 * (2 * q + 3 * (q + 2 * kv)), dev) + UNPAD_BWD_OPS * op
    assert float(got.fwd) == pytest.approx(fwd, rel=1e-12) and float(got.bwd) == pytest.approx(bwd, rel=1e-12)


def _estimate(kernel: str):
    return api.estimate(
        model="gpt3-1.3b",
        cluster="dgx-h100",
        gpus=8,
        micro_batch=4,
        global_batch=64,
        zero=2,
        recompute="none",
        runtime="llm-foundry",
        attention_kernel=kernel,
    ).estimate


def test_the_estimate_adds_the_copies_to_fa2_only() -> None:
    """The same plan with "fa2-varlen" and "fa2": the same attention core, and the compute apart by every layer's
    copies on every micro-batch."""
    varlen, fa2 = _estimate("fa2-varlen"), _estimate("fa2")
    m = get_model("gpt3-1.3b")
    dev = compute.device_for(H100, "bfloat16", default_params("h100-sxm"))
    pad = unpad_term(m, 4.0 * m.seq_len, np.asarray(1.0), Resolved(dtype="bfloat16"), dev)
    microbatches = 64 // (8 * 4)
    expected = microbatches * m.layers * (float(pad.fwd) + float(pad.bwd))
    assert varlen.time_s.compute - fa2.time_s.compute == pytest.approx(expected, rel=1e-6)
    cudnn = _estimate("fused")
    # the kernel runs at FlashAttention-2's rate, below the prior's cuDNN one, under either name
    assert fa2.time_s.compute > cudnn.time_s.compute
