"""A GEMM runs no faster than it can read its operands and write its output (``compute.gemm_time_s``'s
traffic bound, the roofline): exact closed forms on the A100 and H100 priors, the bytes an FP8 GEMM's
1-byte operands move, and the layers that reach the bound (a math attention's scores, an FP8 layer's
linear GEMMs).

Broken on purpose and seen to fail here: the traffic term dropped from ``gemm_time_s`` (the scores test),
``in_bytes`` ignored, operands always read at 2 bytes (the FP8 operand test), the FP8 layer's GEMMs priced
with 16-bit operands in ``cost_layer.layer_times`` (the FP8 layer test), the arithmetic term dropped (the
square GEMM test)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exatrain.accounting.engines import Resolved
from exatrain.accounting.flops import Gemm, layer_gemms
from exatrain.catalog import get_cluster, get_model
from exatrain.planner.cost import compute
from exatrain.planner.cost import fp8 as cost_fp8
from exatrain.planner.cost import layer as cost_layer
from exatrain.planner.cost.coefficients import default_params


def _device(cluster: str, dtype: str = "bfloat16") -> compute.Device:
    cl = get_cluster(cluster)
    return compute.device_for(cl, dtype, default_params(cl.device.name))


def test_math_attention_scores_are_priced_by_their_traffic() -> None:
    # 32 heads' q k^T at s = 2048, head_dim 64, bf16: 2*2048*2048*64 FLOPs each against a 2048 x 2048
    # output written at 2 bytes: 64 FLOPs per output byte, far below the A100's ridge point
    dev = _device("dgx-a100")
    g = Gemm("attn_scores", m=2048, n=2048, k=64, count=32)
    p = dev.params
    traffic = 32 * (2048 * 64 * 2 + 64 * 2048 * 2 + 2048 * 2048 * 2) / (dev.mem_bytes_per_s * p.mem_eff)
    arithmetic = g.flops / (dev.peak_flops * p.gemm_eff * (2048 / (2048 + 32)) ** 2 * 64 / (64 + 32))
    assert traffic > arithmetic  # the case is the bound's, not the FLOPs'
    assert compute.gemm_time_s(g, dev, in_bytes=2, out_bytes=2) == pytest.approx(traffic + p.gemm_overhead_s, rel=1e-12)
    assert compute.gemm_time_s(g, dev, calls=2, in_bytes=2, out_bytes=2) == pytest.approx(
        2 * (traffic + p.gemm_overhead_s), rel=1e-12
    )


def test_a_large_square_gemm_is_priced_by_its_arithmetic() -> None:
    dev = _device("dgx-h100")
    p = dev.params
    g = Gemm("fc1", m=8192, n=8192, k=8192)
    expected = g.flops / (dev.peak_flops * p.gemm_eff * (8192 / (8192 + p.gemm_dim_half)) ** 3) + p.gemm_overhead_s
    assert compute.gemm_time_s(g, dev) == pytest.approx(expected, rel=1e-12)


def test_fp8_operands_move_one_byte_per_element() -> None:
    # a thin shard (k = 512) of 16,384 tokens: output-dominated traffic, operands half of it at 2 bytes
    dev = _device("dgx-h100")
    dev = dataclasses.replace(dev, peak_flops=dev.peak_flops * 1e3)  # arithmetic far below the traffic
    g = Gemm("fc2", m=16384, n=4096, k=512)
    bw = dev.mem_bytes_per_s * dev.params.mem_eff
    over = dev.params.gemm_overhead_s
    operands, output = 16384 * 512 + 512 * 4096, 16384 * 4096
    assert compute.gemm_time_s(g, dev, in_bytes=1, out_bytes=2) == pytest.approx(
        (operands + 2 * output) / bw + over, rel=1e-12
    )
    assert compute.gemm_time_s(g, dev, in_bytes=2, out_bytes=2) == pytest.approx(
        (2 * operands + 2 * output) / bw + over, rel=1e-12
    )


def test_an_fp8_layer_prices_its_linear_gemms_with_one_byte_operands() -> None:
    # Llama 3 8B at tp 8, 512 tokens a micro-batch, under FP8: every linear GEMM at FP8's rate and 1-byte
    # operands, the rest 16-bit
    m, cluster = get_model("llama3-8b").replace(seq_len=512), get_cluster("dgx-h100")
    params = default_params(cluster.device.name)
    dev = compute.device_for(cluster, "bfloat16", params)
    speed = cost_fp8.fp8_speedup(cluster, "bfloat16", params)
    fast = dataclasses.replace(dev, peak_flops=dev.peak_flops * speed)
    t = cost_layer.layer_times(
        m, 1, 8, moe=False, ep=1, cp=1, sequence_parallel=True, dev=dev, run=Resolved(fp8="current"), speedup=speed
    )
    gemms = [g for g in layer_gemms(m, 1, 8, sequence_parallel=True) if not g.name.startswith("attn_")]
    expected = sum(compute.gemm_time_s(g, fast, in_bytes=1, out_bytes=2) for g in gemms)
    assert float(np.asarray(t.dense_gemm_fwd)) == pytest.approx(float(expected), rel=1e-12)
    # 16-bit operands would put the thin weight shards past the ridge point: the bound tells them apart
    as_bf16 = sum(compute.gemm_time_s(g, fast, in_bytes=2, out_bytes=2) for g in gemms)
    assert float(as_bf16) > float(expected)
