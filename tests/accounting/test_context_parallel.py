"""Context-parallel accounting: activations per rank divided by cp, K,V buffers and traffic against
hand-derived closed forms, and the long-context presets."""

from __future__ import annotations

import numpy as np
import pytest

from exatrain.catalog import get_model
from exatrain.accounting import comms, context, memory
from tests.helpers.memory import rank_memory


@pytest.mark.parametrize("name", ["llama3-70b", "gpt-175b", "moe-tiny", "deepseek-v3"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("flash", [True, False])
def test_layer_activations_divide_by_cp(name: str, recompute: str, flash: bool) -> None:
    m = get_model(name)
    kw = dict(sequence_parallel=True, recompute=recompute, flash=flash)
    one = memory.layer_activation_bytes(m, 2, 4, **kw)
    for cp in (2, 4, 8):
        assert memory.layer_activation_bytes(m, 2, 4, cp=cp, **kw) == pytest.approx(one / cp, rel=1e-12)


def test_128k_over_16_context_ranks_holds_what_8k_holds() -> None:
    long, short = get_model("llama3.1-405b-128k"), get_model("llama3.1-405b-8k")
    assert long.seq_len == 16 * short.seq_len
    kw = dict(sequence_parallel=True, recompute="selective", flash=True)
    assert memory.layer_activation_bytes(long, 1, 8, cp=16, **kw) == memory.layer_activation_bytes(short, 1, 8, **kw)


def test_kv_block_and_buffers_by_hand() -> None:
    m = get_model("llama3.1-70b-128k")  # 8 kv heads of 128: K and V 2 x 1024 wide
    b, tp, cp, e = 1, 8, 8, 2
    block = b * (m.seq_len / cp) * 2 * 1024 / tp * e
    assert context.kv_block_bytes(m, b, tp, cp) == pytest.approx(block)
    out = b * m.seq_len / cp * (m.heads * 128 / tp * e + 4.0 * m.heads / tp)  # partial output + fp32 LSE
    assert context.cp_buffer_bytes(m, b, tp, cp, comm="p2p") == pytest.approx(max(cp * block + cp * out, 4 * block))
    assert context.cp_buffer_bytes(m, b, tp, cp, comm="all_gather") == pytest.approx(2 * cp * block)
    assert context.cp_buffer_bytes(m, b, tp, 1) == 0.0
    np.testing.assert_allclose(
        context.cp_buffer_bytes(m, b, tp, np.array([1, 2])), [0.0, context.cp_buffer_bytes(m, b, tp, 2)]
    )


def test_latent_attention_moves_up_projected_keys_and_values() -> None:
    m = get_model("deepseek-v3")  # 128 heads: K 128 x (128 + 64), V 128 x 128
    assert context.kv_width(m) == 128 * 192 + 128 * 128


@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
def test_cp_traffic_by_hand(comm: str) -> None:
    m = get_model("llama3.1-8b-128k")
    b, tp, cp, layers, mb = 1, 2, 4, 32, 3
    block = context.kv_block_bytes(m, b, tp, cp)
    cs = comms.cp_collectives_for(
        m, micro_batch=b, tp=tp, cp=cp, dtype="bfloat16", layers=layers, num_microbatches=mb, comm=comm
    )
    sent = sum(float(c.bytes_per_rank) for c in cs)
    # ring: cp-1 K,V blocks forward, cp-1 K,V + cp-1 dK,dV blocks backward; all-gather: (cp-1)/cp of the
    # whole K,V forward and again backward, plus the dK,dV reduce-scatter — the same 3(cp-1) blocks
    assert sent == pytest.approx(3 * (cp - 1) * block * layers * mb)
    assert context.cp_bytes_per_layer(m, b, tp, cp, comm=comm) == pytest.approx(3 * (cp - 1) * block)
    full = comms.cp_collectives_for(
        m,
        micro_batch=b,
        tp=tp,
        cp=cp,
        dtype="bfloat16",
        layers=layers,
        num_microbatches=mb,
        comm=comm,
        recompute="full",
    )
    assert sum(float(c.bytes_per_rank) for c in full) == pytest.approx(4 * (cp - 1) * block * layers * mb)
    none = comms.cp_collectives_for(
        m, micro_batch=b, tp=tp, cp=1, dtype="bfloat16", layers=layers, num_microbatches=mb, comm=comm
    )
    assert sum(float(c.bytes_per_rank) for c in none) == 0.0


def test_unknown_cp_comm_is_rejected() -> None:
    with pytest.raises(ValueError, match="p2p, all_gather, a2a"):
        context.cp_buffer_bytes(get_model("llama3-8b"), 1, 1, 2, comm="ring")
    with pytest.raises(ValueError, match="no K,V blocks"):
        context.cp_sends_per_layer(2, comm="a2a")


def _rank(m, **kw):
    base = dict(
        dtype="bfloat16",
        zero_stage=1,
        recompute="selective",
        sequence_parallel=True,
        flash=True,
        tp=8,
        dp=4,
        micro_batch=1,
        pp=2,
        interleave=1,
        params_here=4e9,
        layers_here=40,
        inflight_mb=2,
        is_last=True,
    )
    base.update(kw)
    return rank_memory(m, **base)


def test_rank_memory_under_cp_by_hand() -> None:
    m = get_model("llama3.1-70b-128k")
    cp = 4
    w, g, o, acts, other = _rank(m, cp=cp)
    # model states: the distributed optimizer shards over dp*cp = 16 ranks (ZeRO-1: optimizer only)
    w16, g16, o16, _, _ = _rank(m, dp=16)
    assert (w, g, o) == pytest.approx((w16, g16, o16))
    # activations: per layer / cp, and the last stage's logits and head inputs over cp too
    la = dict(sequence_parallel=True, flash=True)
    keep = memory.layer_activation_bytes(m, 1, 8, recompute="selective", cp=cp, **la)
    full = memory.layer_activation_bytes(m, 1, 8, recompute="none", cp=cp, **la)
    tokens = m.seq_len / cp
    # (two micro-batches in flight) the final norm's input, a sequence shard, and the head's, all-gathered over
    # tp; the upcast loss on a vocabulary shard: four fp32
    last = (2 * tokens * m.hidden / 8 + 2 * tokens * m.hidden) * 2 + tokens * m.vocab / 8 * (4 + 4 + 4 + 4)
    assert acts == pytest.approx(keep * 40 * 2 + full - keep + last)
    p2p = 2 * 2 * tokens * m.hidden / 8
    work = context.cp_buffer_bytes(m, 1, 8, cp)
    assert other == pytest.approx(p2p + work + memory.FRAGMENTATION_ALLOWANCE * (w + g + o + acts + p2p + work))


def test_more_context_parallelism_less_memory_per_rank() -> None:
    m = get_model("llama3.1-8b-128k")
    totals = [
        sum(_rank(m, cp=cp, tp=1, dp=1, pp=1, params_here=8e9, layers_here=32, inflight_mb=1))
        for cp in (1, 2, 4, 8, 16)
    ]
    assert all(a > b for a, b in zip(totals, totals[1:]))
