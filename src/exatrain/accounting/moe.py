"""Expert parallelism (ep): where the experts' states live, what a MoE layer keeps, what it moves.

Layout (Megatron-Core "MoE parallel folding": Megatron-Core MoE docs, "Parallelism", and Liu et al.
2025, arXiv 2504.14960, Sec. 3): within one pipeline stage the same tp*cp*dp ranks run the
attention as tp x cp x dp and the MoE MLP as etp x ep x edp. Routed experts are split over ep
(experts / ep whole experts per rank) and each over etp (expert tensor parallelism; 1 by default
here, as in torchtitan, where experts are never tensor-split), and replicated over
the expert-data-parallel group of edp = tp*cp*dp / (ep*etp) ranks, which reduces their gradients and
shards their optimizer states (the distributed optimizer / FSDP over edp), while everything else is
reduced and sharded over the dp*cp ranks that hold the same dense shard. ep*etp must divide
tp*cp*dp and ep must divide experts: legality rules for the plan checks, not enforced here.

Routing, per MoE layer and micro-batch (Megatron-Core's all-to-all token dispatcher,
megatron/core/transformer/moe/token_dispatcher.py): each rank routes the tokens it holds, T =
b*s/cp, divided by tp under sequence parallelism (Megatron-LM's megatron/training/arguments.py
requires sequence parallelism for MoE with tp > 1; without it every tp rank would route all T). Every token goes to
top_k experts, so a rank sends T*top_k token copies and, with balanced routing, receives as many; ``capacity_factor``
is the largest load over the mean (a token-dropping capacity factor, or the measured imbalance of
dropless routing: 1.0 = perfectly balanced). With etp > 1 the received copies are all-gathered over
the etp group, each rank computing 1/etp of every local expert's width.
"""

from __future__ import annotations

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.accounting.dtypes import COMPUTE_BYTES

ROUTER_SCORE_BYTES = 4  # router scores and probabilities in fp32 (Megatron-Core --moe-router-dtype fp32)
# The busiest expert rank's routed token copies over the mean under dropless routing: an assumption, not a
# measurement: 1.25x, the capacity factor Switch Transformer trains with (Fedus et al. 2022, JMLR, Sec. 2.2 and
# Table 1: 1.0-1.25 keep quality at the least padding).
LOAD_IMBALANCE = 1.25


def moe_load(capacity_factor: float = 0.0, force_balance: bool = False) -> float:
    """The busiest expert rank's routed token copies over the mean, as a plan's routing sets it (settings.py): the
    padded capacity factor C where one is set (Megatron-Core's alltoall dispatcher with --moe-expert-capacity-factor
    C --moe-pad-expert-input-to-capacity cuts or pads every local expert's input to C times the mean, moe_utils.py);
    1 under forced balance (--moe-router-force-load-balancing replaces the router's scores with random ones, a
    benchmarking switch: the busiest rank's excess over the mean is then a random fluctuation, about
    sqrt(2 ln(ep) / n) for n routed copies a rank, 2% for the 16,384 a rank of Qwen3-235B at tp 2, ep 32 receives per
    micro-batch); else ``LOAD_IMBALANCE`` (dropless). It scales the expert GEMMs, the all-to-all buffers and the
    dispatch buffers and expert activations in memory (``capacity_factor`` below)."""
    if capacity_factor:
        return float(capacity_factor)
    return 1.0 if force_balance else LOAD_IMBALANCE


def expert_dp(tp, dp, ep, etp=1, cp=1):
    """Expert-data-parallel degree: tp*cp*dp / (ep*etp) (module doc)."""
    return (np.asarray(tp, dtype=float) * cp * dp) / (np.asarray(ep, dtype=float) * etp)


def routed_tokens_per_rank(m: ModelSpec, micro_batch, tp, *, sequence_parallel: bool, cp=1):
    """Tokens one rank routes per MoE layer and micro-batch: b*s/cp, over tp under sequence parallelism."""
    return micro_batch * m.seq_len / np.asarray(cp, dtype=float) / (tp if sequence_parallel else 1)


def received_copies_per_rank(
    m: ModelSpec, micro_batch, tp, *, sequence_parallel: bool, cp=1, etp=1, capacity_factor=1.0
):
    """Token copies one rank's local experts process per MoE layer and micro-batch (module doc)."""
    routed = routed_tokens_per_rank(m, micro_batch, tp, sequence_parallel=sequence_parallel, cp=cp)
    return routed * m.top_k * capacity_factor * etp


def router_activation_bytes(m: ModelSpec, micro_batch, tp, *, sequence_parallel: bool, cp=1):
    """What the router keeps for backward per MoE layer and micro-batch: per routed token its scores
    over all experts (fp32, the softmax/sigmoid output its backward needs), the boolean routing map
    (one byte per expert) and the top_k probabilities (fp32). Its input is the MLP input, counted
    with the layer."""
    routed = routed_tokens_per_rank(m, micro_batch, tp, sequence_parallel=sequence_parallel, cp=cp)
    return routed * (m.experts * (ROUTER_SCORE_BYTES + 1) + m.top_k * ROUTER_SCORE_BYTES)


def expert_activation_bytes(
    m: ModelSpec,
    micro_batch,
    tp,
    *,
    sequence_parallel: bool,
    dtype: str = "bfloat16",
    cp=1,
    etp=1,
    capacity_factor=1.0,
    gemm_input_bytes: float | None = None,
    act_recompute: bool = False,
):
    """What the routed experts keep for backward per MoE layer and micro-batch on one rank: for every
    received token copy its fc1 input (h), the SwiGLU interior of 1/etp of the expert width (gate,
    silu(gate), up and the product that is fc2's input: 4*f/etp, as ``memory.layer_activation_bytes``
    counts a dense MLP) and its routing probability (fp32; Megatron-Core applies it inside the
    expert's activation, so the expert output is not kept). ``gemm_input_bytes``: bytes per element
    of the saved fc1 and fc2 inputs (fp8 training saves them in fp8; default the compute dtype).
    ``act_recompute``: the activation is recomputed in backward (Megatron-Core's "moe_act" module,
    output-discarding checkpointing): a copy keeps fc1's output (the activation's input: 2f gated, f not)
    and none of the activation's own tensors nor its output."""
    e = COMPUTE_BYTES[dtype]
    g = e if gemm_input_bytes is None else gemm_input_bytes
    f = m.expert_width / etp
    interior = (4 if m.gated_mlp else 2) * f
    if act_recompute:
        per_copy = m.hidden * g + (2 * f if m.gated_mlp else f) * e + ROUTER_SCORE_BYTES
    else:
        per_copy = m.hidden * g + (interior - f) * e + f * g + ROUTER_SCORE_BYTES
    copies = received_copies_per_rank(
        m, micro_batch, tp, sequence_parallel=sequence_parallel, cp=cp, etp=etp, capacity_factor=capacity_factor
    )
    return copies * per_copy


def shared_expert_interior_elements(m: ModelSpec) -> int:
    """Per token, the shared experts' interior (gate, silu(gate), up, product) before tp sharding."""
    return (4 if m.gated_mlp else 2) * m.shared_experts * m.expert_width


def dispatch_buffer_bytes(
    m: ModelSpec, micro_batch, tp, *, sequence_parallel: bool, dtype: str = "bfloat16", cp=1, etp=1, capacity_factor=1.0
):
    """Peak bytes of one all-to-all's buffers (the permuted tokens it sends and the copies it
    receives, hidden-wide): the working set of a MoE layer's dispatch (and, the same size, its
    combine) beyond what the layer keeps. With etp > 1 the received copies are the all-gathered ones."""
    e = COMPUTE_BYTES[dtype]
    routed = routed_tokens_per_rank(m, micro_batch, tp, sequence_parallel=sequence_parallel, cp=cp)
    received = received_copies_per_rank(
        m, micro_batch, tp, sequence_parallel=sequence_parallel, cp=cp, etp=etp, capacity_factor=capacity_factor
    )
    return (routed * m.top_k + received) * m.hidden * e


def a2a_message_bytes(
    m: ModelSpec, micro_batch, tp, *, sequence_parallel: bool, dtype: str = "bfloat16", cp=1, capacity_factor=1.0
):
    """One dispatch (or combine) all-to-all's buffer on one rank: T*top_k token copies of h elements
    (times the capacity factor: a padded or the busiest rank's buffer). (ep-1)/ep of it leaves the
    rank (``comms.Collective("all_to_all", ep, ...)``)."""
    routed = routed_tokens_per_rank(m, micro_batch, tp, sequence_parallel=sequence_parallel, cp=cp)
    return routed * m.top_k * capacity_factor * m.hidden * COMPUTE_BYTES[dtype]
