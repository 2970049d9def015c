"""Context parallelism (cp): the sequence split over cp ranks, its buffers and its traffic.

Megatron-Core's context parallelism (Megatron-Core docs, "Context parallelism"; Transformer Engine
``attention/dot_product_attention/context_parallel.py``) gives every rank s/cp tokens of each
sequence, so every activation of a layer is divided by cp; only attention needs the other ranks'
keys and values. For causal masks each sequence is cut into 2*cp chunks and rank r takes chunks r
and 2cp-1-r, so every rank does the same attention work (TE ``get_seq_chunk_ids_for_reordering``;
Llama 3 report, arXiv 2407.21783, Sec. 3.3.2). Two ways to bring the keys and values (TE
``cp_comm_type``):

* ``p2p`` (ring attention; Liu et al. 2023, arXiv 2310.01889): the K,V block of s/cp tokens goes
  round the ring. Forward: each rank sends cp-1 blocks, and TE's ``AttnFuncWithCPAndKVP2P`` keeps
  every received block (``p2p_comm_buffers``, one per step) and every per-step partial output until
  the layer's forward ends. Backward: K,V blocks and their gradients travel together; step 0 sends
  K,V only and the last step dK,dV only, so cp-1 K,V blocks and cp-1 dK,dV blocks leave each rank,
  through two double-buffered (K,V, dK,dV) pairs.
* ``all_gather`` (Llama 3's choice, ibid.; TE ``AttnFuncWithCPAndKVAllGather``): forward all-gathers
  K and V of the whole sequence; backward gathers them again and reduce-scatters dK, dV.

The keys and values are what TE moves: kv_heads * head_dim each for standard/grouped-query
attention; for latent attention the up-projected keys (heads * (head_dim + rope_head_dim)) and
values (heads * head_dim), as Megatron-Core's MLA with CP sends them.
"""

from __future__ import annotations

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.accounting.dtypes import COMPUTE_BYTES

CP_COMMS = ("p2p", "all_gather")


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
    """
    _check_comm(comm)
    cp = np.asarray(cp, dtype=float)
    kv = kv_block_bytes(m, micro_batch, tp, cp, dtype)
    if comm == "p2p":
        tokens = micro_batch * m.seq_len / cp
        out = tokens * (m.attn_out_width / tp * COMPUTE_BYTES[dtype] + 4.0 * m.heads / tp)
        need = np.maximum(cp * kv + cp * out, 4 * kv)
    else:
        need = 2 * cp * kv
    return np.where(cp > 1, need, 0.0)


def cp_sends_per_layer(cp, *, comm: str = "p2p", recompute: str = "none"):
    """(forward, backward) K,V-block-sized messages one rank sends per layer and micro-batch: the
    ring's cp-1 K,V blocks forward, cp-1 K,V + cp-1 dK,dV blocks backward; all-gather's
    (cp-1)/cp of the whole K,V (cp-1 blocks) forward, again backward plus the dK,dV reduce-scatter.
    Full recomputation repeats the forward's in the backward."""
    _check_comm(comm)
    cp = np.asarray(cp, dtype=float)
    fwd = cp - 1
    bwd = 2 * (cp - 1) + (fwd if recompute == "full" else 0.0)
    return fwd, bwd


def cp_bytes_per_layer(m: ModelSpec, micro_batch, tp, cp, *, dtype: str = "bfloat16", comm: str = "p2p",
                       recompute: str = "none"):
    """Bytes one rank sends for one layer's attention, one micro-batch, forward + backward."""
    fwd, bwd = cp_sends_per_layer(cp, comm=comm, recompute=recompute)
    return (fwd + bwd) * kv_block_bytes(m, micro_batch, tp, cp, dtype)


def _check_comm(comm: str) -> None:
    if comm not in CP_COMMS:
        raise ValueError(f"unknown context-parallel communication {comm!r}; use one of {', '.join(CP_COMMS)}")
