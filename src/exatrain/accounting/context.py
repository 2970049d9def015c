"""Context parallelism (cp): the sequence split over cp ranks, its buffers and its traffic.

Megatron-Core's context parallelism (Megatron-Core docs, "Context parallelism"; Transformer Engine
``attention/dot_product_attention/context_parallel.py``) gives every rank s/cp tokens of each
sequence, so every activation of a layer is divided by cp; only attention needs the other ranks'
keys and values. For causal masks each sequence is cut into 2*cp chunks and rank r takes chunks r
and 2cp-1-r, so every rank does the same attention work (TE ``get_seq_chunk_ids_for_reordering``;
Llama 3 report, arXiv 2407.21783, Sec. 3.3.2). Three ways to bring the keys and values (TE
``cp_comm_type``):

* ``p2p`` (ring attention; Liu et al. 2023, arXiv 2310.01889): the K,V block of s/cp tokens goes
  round the ring. Forward: each rank sends cp-1 blocks, and TE's ``AttnFuncWithCPAndKVP2P`` keeps
  every received block (``p2p_comm_buffers``, one per step) and every per-step partial output until
  the layer's forward ends. Backward: K,V blocks and their gradients travel together; step 0 sends
  K,V only and the last step dK,dV only, so cp-1 K,V blocks and cp-1 dK,dV blocks leave each rank,
  through two double-buffered (K,V, dK,dV) pairs.
* ``all_gather`` (Llama 3's choice, ibid.; TE ``AttnFuncWithCPAndKVAllGather``): forward all-gathers
  K and V of the whole sequence; backward gathers them again and reduce-scatters dK, dV.
* ``a2a`` (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv 2309.14509; TE ``AttnFuncWithCPAndQKVOA2A``):
  no K,V exchange; an all-to-all before attention trades the rank's s/cp tokens of every head for all
  s tokens of heads/cp of them (Q, K and V), one after it trades the output back; the backward runs
  the same two on the gradients. Every rank then attends over the whole sequence for its heads, so the
  heads on a rank (and the K,V heads) must divide by cp.

How each engine runs them, and which it offers (``CpExchange``, ``accounting.engines``), decides what
the step time exposes (``cost.context.cp_exposed_s``).

The keys and values are what TE moves: kv_heads * head_dim each for standard/grouped-query
attention; for latent attention the up-projected keys (heads * (head_dim + rope_head_dim)) and
values (heads * head_dim), as Megatron-Core's MLA with CP sends them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.settings import CP_COMMS
from exatrain.accounting.dtypes import COMPUTE_BYTES

# How many attention kernel calls a layer's core takes under cp (``cost.compute.flash_attention_s(calls=)``):
# "ring" one per K,V block (cp calls of s/cp keys), "chunks" one per local chunk over the gathered keys
# (2 calls of s/2), "one" a single call over all s keys.
KERNEL_CALLS = ("ring", "chunks", "one")


@dataclass(frozen=True)
class CpExchange:
    """How an engine moves attention's operands under context parallelism with ``comm`` (CP_COMMS).

    ``switch``: the engine's setting that selects it; ``calls``: how its attention kernel runs
    (KERNEL_CALLS); ``overlapped``: p2p, each block's send runs behind the previous block's attention;
    all_gather, the gather runs behind the local block's attention (torch's rotater issues it before that
    block); False: it is exposed (TE's all-gather and all-to-all, exatrain's gather); ``regather``
    (all_gather): the backward gathers K,V again rather than keeping the gathered copy; ``dkv_ring``
    (all_gather): dK,dV return block by block round the ring, each behind the next block's backward, rather
    than in one reduce-scatter. Which exchanges an engine offers, and which of them run sliding-window attention,
    are settings.CP_COMM_RUNTIMES and settings.CP_COMMS_WITHOUT_WINDOWS (the rules read them there)."""

    comm: str
    switch: str
    source: str
    calls: str = "ring"
    overlapped: bool = False
    regather: bool = True
    dkv_ring: bool = False

    def kernel_calls(self, cp: int) -> int:
        """Attention kernel calls per layer and micro-batch (``calls``)."""
        return {"ring": int(cp), "chunks": 2, "one": 1}[self.calls] if cp > 1 else 1


def kv_width(m: ModelSpec) -> int:
    """K plus V elements per token (whole layer, before tp)."""
    if m.mla:
        return m.q_width + m.attn_out_width
    return 2 * m.kv_hidden


def kv_block_bytes(m: ModelSpec, micro_batch, tp, cp, dtype: str = "bfloat16"):
    """One rank's K,V block: s/cp tokens of kv_width/tp elements (heads split over tp)."""
    return micro_batch * (m.seq_len / np.asarray(cp, dtype=float)) * kv_width(m) / tp * COMPUTE_BYTES[dtype]


def cp_buffer_bytes(m: ModelSpec, micro_batch, tp, cp, *, dtype: str = "bfloat16", comm: str = "p2p"):
    """Peak bytes of the communication working set of one layer's attention under CP (0 when cp is 1),
    the larger of its forward and backward (module doc):

    p2p:        forward cp K,V blocks + cp partial outputs (each the local output, heads*head_dim/tp
                wide, and its fp32 log-sum-exp per head); backward 2 x (K,V block + dK,dV block).
    all_gather: forward the gathered K,V (cp blocks); backward the gathered K,V and the whole dK,dV.
    a2a:        the received Q, K, V (all s tokens of heads/cp: as many elements as the rank's own) and
                the output before it goes back; the backward's gradients are as large.
    """
    _check_comm(comm)
    cp = np.asarray(cp, dtype=float)
    kv = kv_block_bytes(m, micro_batch, tp, cp, dtype)
    if comm == "p2p":
        tokens = micro_batch * m.seq_len / cp
        out = tokens * (m.attn_out_width / tp * COMPUTE_BYTES[dtype] + 4.0 * m.heads / tp)
        need = np.maximum(cp * kv + cp * out, 4 * kv)
    elif comm == "a2a":
        need = sum(a2a_tensor_bytes(m, micro_batch, tp, cp, dtype))
    else:
        need = 2 * cp * kv
    return np.where(cp > 1, need, 0.0)


def a2a_tensor_bytes(m: ModelSpec, micro_batch, tp, cp, dtype: str = "bfloat16"):
    """(Q,K,V, output) bytes of one rank's s/cp tokens, heads split over tp: what the all-to-all before
    attention and the one after it each trade (``a2a``; all but 1/cp of it leaves the rank)."""
    tokens = micro_batch * (m.seq_len / np.asarray(cp, dtype=float)) / np.asarray(tp, dtype=float)
    e = COMPUTE_BYTES[dtype]
    return tokens * (m.q_width + kv_width(m)) * e, tokens * m.attn_out_width * e


def cp_sends_per_layer(cp, *, comm: str = "p2p", recompute: str = "none"):
    """(forward, backward) K,V-block-sized messages one rank sends per layer and micro-batch: the
    ring's cp-1 K,V blocks forward, cp-1 K,V + cp-1 dK,dV blocks backward; all-gather's
    (cp-1)/cp of the whole K,V (cp-1 blocks) forward, again backward plus the dK,dV reduce-scatter.
    Full recomputation repeats the forward's in the backward. (a2a moves no K,V blocks:
    ``a2a_tensor_bytes``.)"""
    _check_comm(comm)
    if comm == "a2a":
        raise ValueError("a2a context parallelism sends no K,V blocks; see a2a_tensor_bytes")
    cp = np.asarray(cp, dtype=float)
    fwd = cp - 1
    bwd = 2 * (cp - 1) + (fwd if recompute == "full" else 0.0)
    return fwd, bwd


def cp_bytes_per_layer(
    m: ModelSpec, micro_batch, tp, cp, *, dtype: str = "bfloat16", comm: str = "p2p", recompute: str = "none"
):
    """Bytes one rank sends for one layer's attention, one micro-batch, forward + backward: a2a sends
    (cp-1)/cp of Q,K,V and of the output, forward and (as gradients) backward, the forward's again
    under full recomputation."""
    if comm == "a2a":
        cp = np.asarray(cp, dtype=float)
        qkv, out = a2a_tensor_bytes(m, micro_batch, tp, cp, dtype)
        return (2 + (1 if recompute == "full" else 0)) * (cp - 1) / cp * (qkv + out)
    fwd, bwd = cp_sends_per_layer(cp, comm=comm, recompute=recompute)
    return (fwd + bwd) * kv_block_bytes(m, micro_batch, tp, cp, dtype)


def _check_comm(comm: str) -> None:
    if comm not in CP_COMMS:
        raise ValueError(f"unknown context-parallel communication {comm!r}; use one of {', '.join(CP_COMMS)}")
