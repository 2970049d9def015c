"""Exact parameter counts, for the whole model and for one rank of each pipeline stage.

The counts follow the two architectures of ``exatrain.catalog.models`` tensor by tensor, so they
equal ``sum(p.numel())`` of the trainer's model. For the GPT family with ffn_hidden = 4h they reduce
to Narayanan et al. 2021 Eq. 2: 12*L*h^2*(1 + 13/(12h)) + (V + s)*h (plus the final LayerNorm's 2h).

Mixture-of-experts and latent-attention models (the catalog's llama-family extensions) are counted
the same way, tensor by tensor as the published checkpoints hold them (Mixtral, Qwen3-MoE and
DeepSeek-V3 reproduce their ``config.json`` + safetensors totals): routed experts are split over
expert parallelism (``ep`` whole experts, ``etp`` within an expert), the rest of a layer over tensor
parallelism as in Megatron-Core's MoE layer (routed experts in ``experts``, shared experts
tensor-parallel like a dense MLP, the router replicated; megatron/core/transformer/moe/).
``active_params`` counts what one token goes through (its top-k experts instead of all of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.plan import Plan


@dataclass(frozen=True)
class LayerParams:
    """One transformer layer's parameters, split by how tensor and expert parallelism treat them."""

    sharded: int  # column/row-parallel weights and column-parallel biases: divided by tp
    replicated: int  # norms and row-parallel output biases: every tp rank holds them whole
    experts: int = 0  # routed experts' weights: split over ep (whole experts) and etp (within one)

    def per_rank(self, tp: int, ep: int = 1, etp: int = 1) -> int:
        return self.sharded // tp + self.replicated + self.experts // (ep * etp)

    @property
    def total(self) -> int:
        return self.sharded + self.replicated + self.experts


def attention_params(m: ModelSpec) -> LayerParams:
    """The attention block's weights (no norm before it; biases only where the model has ``linear_bias``).

    Standard/grouped-query: Q (h x heads*d), K and V (h x kv_heads*d each, column-parallel), output
    projection (heads*d x h, row-parallel); ``qk_norm`` adds one d-wide RMSNorm weight for queries
    and one for keys (replicated); ``linear_bias`` the projections' biases (Q, K, V's split, the output's
    whole); ``attention_sinks`` one logit per head (split with the heads). Multi-head latent attention
    (DeepSeek-V2, arXiv 2405.04434, Eqs. 9-10 and 12-14; Megatron-Core's MLASelfAttention): the
    down-projections h x q_lora and h x (kv_lora + rope) and their latent RMSNorms are replicated over tp;
    the up-projections q_lora x heads*(d + rope) and kv_lora x heads*2d and the output projection are split.
    """
    h = m.hidden
    sinks = m.heads if m.attention_sinks else 0  # one learned logit per head, split over tp with the heads
    if not m.mla:
        q, kvh = m.q_width, m.kv_hidden
        bias = m.linear_bias  # q, k, v biases split with their columns; the output projection's whole
        return LayerParams(
            sharded=h * (q + 2 * kvh) + m.attn_out_width * h + sinks + (q + 2 * kvh) * bias,
            replicated=(2 * m.head_dim if m.qk_norm else 0) + h * bias,
        )
    up_q = (m.q_lora_rank or h) * m.q_width
    down_q = h * m.q_lora_rank + m.q_lora_rank if m.q_lora_rank else 0  # projection + its RMSNorm
    down_kv = h * (m.kv_lora_rank + m.rope_head_dim) + m.kv_lora_rank
    up_kv = m.kv_lora_rank * m.heads * 2 * m.head_dim  # non-rotary keys and values
    return LayerParams(sharded=up_q + up_kv + m.attn_out_width * h + sinks, replicated=down_q + down_kv)


def mlp_weight_params(m: ModelSpec, width: int) -> int:
    """Weights of one MLP (or one expert) of ``width``: SwiGLU gate, up, down; GELU fc1, fc2."""
    return (3 if m.gated_mlp else 2) * m.hidden * width


def mlp_bias_params(m: ModelSpec, width: int) -> tuple[int, int]:
    """(column-parallel, row-parallel) biases of one MLP (or one expert) of ``width`` where the model has
    ``linear_bias``: fc1's (gate and up: 2 x width, SwiGLU) and fc2's (hidden); (0, 0) otherwise."""
    if not m.linear_bias:
        return 0, 0
    return (2 if m.gated_mlp else 1) * width, m.hidden


def router_params(m: ModelSpec) -> int:
    """The MoE gate: an experts x h matrix, plus the per-expert balancing bias where the model has one, and its
    learned bias where every linear layer has one (``linear_bias``)."""
    return m.experts * m.hidden + (m.experts if m.router_bias else 0) + (m.experts if m.linear_bias else 0)


def layer_params(m: ModelSpec, moe: bool | None = None) -> LayerParams:
    """Parameters of one transformer layer (Megatron-style TP sharding, Shoeybi et al. 2019 Sec. 3).

    ``moe``: the MoE layer (True) or a dense-MLP layer (False) of a MoE model; None means the
    model's largest kind (its MoE layer if it has any). A dense model has only the dense kind.
    """
    h, f, kvh = m.hidden, m.ffn_hidden, m.kv_hidden
    if moe is None:
        moe = m.is_moe
    if moe and m.is_moe:
        attn = attention_params(m)
        norms = 2 * h  # two RMSNorms
        e_col, e_row = mlp_bias_params(m, m.expert_width)
        s_col, s_row = mlp_bias_params(m, m.shared_experts * m.expert_width) if m.shared_experts else (0, 0)
        return LayerParams(
            sharded=attn.sharded + m.shared_experts * mlp_weight_params(m, m.expert_width) + s_col,
            replicated=attn.replicated + norms + router_params(m) + s_row,
            experts=m.experts * (mlp_weight_params(m, m.expert_width) + e_col + e_row),
        )
    if m.kv_channels or m.qk_norm or m.mla or m.linear_bias or m.attention_sinks:
        attn = attention_params(m)
        col, row = mlp_bias_params(m, f)
        return LayerParams(
            sharded=attn.sharded + mlp_weight_params(m, f) + col, replicated=attn.replicated + 2 * h + row
        )
    attn_w = h * (h + 2 * kvh) + h * h  # fused QKV (column-parallel) + output projection (row-parallel)
    mlp_w = (3 if m.gated_mlp else 2) * h * f  # SwiGLU: gate, up, down; GELU MLP: fc1, fc2
    if m.has_bias:
        sharded_bias = (h + 2 * kvh) + f  # QKV and fc1 biases are split with their columns
        replicated_bias = h + h  # proj and fc2 biases are added after the all-reduce
        norms = 2 * (2 * h)  # two LayerNorms, weight + bias
    else:
        sharded_bias = replicated_bias = 0
        norms = 2 * h  # two RMSNorms, weight only
    return LayerParams(sharded=attn_w + mlp_w + sharded_bias, replicated=replicated_bias + norms)


def layer_kinds(m: ModelSpec) -> tuple[bool, ...]:
    """Per layer (model order): True for a MoE layer."""
    return tuple(m.layer_is_moe(i) for i in range(m.layers))


def embedding_params(m: ModelSpec) -> int:
    """Token embedding (vocab-parallel over tp) — without the position table."""
    return m.vocab * m.hidden


def position_params(m: ModelSpec) -> int:
    """Learned position table (GPT); rotary embeddings have none."""
    return m.seq_len * m.hidden if m.learned_positions else 0


def final_norm_params(m: ModelSpec) -> int:
    return 2 * m.hidden if m.has_bias else m.hidden


def head_params(m: ModelSpec) -> int:
    """Separate output head; zero when tied to the token embedding."""
    return 0 if m.tied_embeddings else m.vocab * m.hidden


def total_params(m: ModelSpec) -> int:
    """Unique parameters of the whole model (a tied head counted once)."""
    if m.is_moe:
        n_moe = m.moe_layers
        layers = (m.layers - n_moe) * layer_params(m, moe=False).total + n_moe * layer_params(m, moe=True).total
        return layers + embedding_params(m) + position_params(m) + final_norm_params(m) + head_params(m)
    lp = layer_params(m)
    return (
        m.layers * (lp.sharded + lp.replicated)
        + embedding_params(m)
        + position_params(m)
        + final_norm_params(m)
        + head_params(m)
    )


def active_layer_params(m: ModelSpec, moe: bool) -> int:
    """Parameters one token goes through in one layer: a MoE layer's top_k routed experts instead of
    all of them (the router and shared experts always)."""
    lp = layer_params(m, moe=moe)
    if not (moe and m.is_moe):
        return lp.total
    return lp.sharded + lp.replicated + m.top_k * mlp_weight_params(m, m.expert_width)


def active_params(m: ModelSpec, *, embedding: bool = True) -> int:
    """Parameters used for one token ("activated parameters"): every layer's attention, router and
    shared experts, its top_k routed experts, the final norm and the output head; ``embedding``
    also counts the input embedding table. Publishers differ on that last one: Mistral's 12.9B for
    Mixtral 8x7B and Qwen's 3.3B for Qwen3-30B-A3B include it, DeepSeek's 36.6B for DeepSeek-V3
    (README_WEIGHTS.md of the checkpoint; "37B" in the report) does not. Equals ``total_params``
    for a dense model with ``embedding=True``."""
    n_moe = m.moe_layers
    layers = (m.layers - n_moe) * active_layer_params(m, False) + n_moe * active_layer_params(m, True)
    head = head_params(m) if not m.tied_embeddings else (0 if embedding else embedding_params(m))
    emb = embedding_params(m) + position_params(m) if embedding else 0
    return layers + emb + final_norm_params(m) + head


def expert_params(m: ModelSpec) -> int:
    """Routed-expert weights of the whole model (what expert parallelism splits)."""
    return m.moe_layers * layer_params(m, moe=True).experts if m.is_moe else 0


def stage_params(plan: Plan) -> tuple[int, ...]:
    """Parameters held by one rank of each pipeline stage (pp entries), after TP sharding.

    Rank 0 of the pipeline holds the embeddings; the last holds the final norm and the head. With
    a tied head and pp > 1 the last stage keeps its own copy of the word embedding (kept equal by
    an all-reduce of its gradient, as Megatron-LM does), so it is counted on both ends.
    """
    placed = tuple(plan.stages_of_rank(r) for r in range(plan.pp))
    return _stage_params(plan.model, plan.tp, plan.pp, plan.interleave, plan.layers_per_stage(), placed)


@lru_cache(maxsize=4096)
def _stage_params(
    m: ModelSpec, tp: int, pp: int, interleave: int, layers: tuple[int, ...], placed: tuple[tuple[int, ...], ...] = ()
) -> tuple[int, ...]:
    """``placed``: each rank's stages (default looped); the head goes with the last stage (rank 0 under a V)."""
    if m.is_moe:
        split = stage_params_split(
            m,
            tp=tp,
            pp=pp,
            interleave=interleave,
            layers_per_stage=layers,
            v_shape=bool(placed) and placed[0] == (0, pp * interleave - 1) and pp > 1,
        )
        return tuple(dense + experts for dense, experts in split)
    lp = layer_params(m).per_rank(tp)
    placed = placed or tuple(tuple(range(r, pp * interleave, pp)) for r in range(pp))
    counts = []
    for rank in range(pp):
        n = sum(layers[v] for v in placed[rank]) * lp
        if rank == 0:
            n += embedding_params(m) // tp + position_params(m)
        if pp * interleave - 1 in placed[rank]:
            n += final_norm_params(m)
            if not m.tied_embeddings:
                n += head_params(m) // tp
            elif pp > 1:
                n += embedding_params(m) // tp
        counts.append(n)
    return tuple(counts)


def stage_layer_kinds(
    m: ModelSpec, *, pp: int, interleave: int, layers_per_stage: tuple[int, ...], v_shape: bool = False
) -> tuple[tuple[int, int], ...]:
    """(dense layers, MoE layers) on each pipeline rank: virtual stage k holds the next
    layers_per_stage[k] layers in model order and sits on rank k % pp, or under a V (``v_shape``) rank r
    holds stages r and 2 pp - 1 - r (``Plan.stages_of_rank``)."""
    kinds = layer_kinds(m)
    starts = [sum(layers_per_stage[:k]) for k in range(len(layers_per_stage))]
    out = []
    for rank in range(pp):
        moe = dense = 0
        for k in (rank, 2 * pp - 1 - rank) if v_shape else range(rank, pp * interleave, pp):
            for i in range(starts[k], starts[k] + layers_per_stage[k]):
                moe += kinds[i]
                dense += not kinds[i]
        out.append((dense, moe))
    return tuple(out)


@lru_cache(maxsize=4096)
def stage_params_split(
    m: ModelSpec,
    *,
    tp: int,
    pp: int,
    interleave: int,
    layers_per_stage: tuple[int, ...],
    ep: int = 1,
    etp: int = 1,
    v_shape: bool = False,
) -> tuple[tuple[int, int], ...]:
    """(parameters outside the routed experts, routed-expert parameters) on one rank of each
    pipeline stage: the first feeds ZeRO/FSDP sharding over the data-parallel group, the second over
    the expert-data-parallel group (``accounting.moe.expert_dp``). Embedding, head and tied-copy
    rules are those of ``stage_params`` (under a V, ``v_shape``, rank 0 holds the head too); ``ep`` and
    ``etp`` must divide ``experts`` and the expert width (a later legality check's job), else the integer
    division rounds down."""
    dense_lp = layer_params(m, moe=False).per_rank(tp)
    moe_lp = layer_params(m, moe=True) if m.is_moe else None
    out = []
    for rank, (n_dense, n_moe) in enumerate(
        stage_layer_kinds(m, pp=pp, interleave=interleave, layers_per_stage=layers_per_stage, v_shape=v_shape)
    ):
        dense = n_dense * dense_lp
        experts = 0
        if n_moe:
            dense += n_moe * (moe_lp.sharded // tp + moe_lp.replicated)
            experts = n_moe * (moe_lp.experts // (ep * etp))
        if rank == 0:
            dense += embedding_params(m) // tp + position_params(m)
        if rank == (0 if v_shape else pp - 1):
            dense += final_norm_params(m)
            if not m.tied_embeddings:
                dense += head_params(m) // tp
            elif pp > 1:
                dense += embedding_params(m) // tp
        out.append((dense, experts))
    return tuple(out)


def rank_params(m: ModelSpec, tp, pp, layers_on_rank, pp_rank, last_rank=None):
    """``stage_params`` on numpy arrays (one entry per candidate and rank): the parameters one rank
    of pipeline rank ``pp_rank`` holds when it runs ``layers_on_rank`` transformer layers. The head sits on
    ``last_rank`` (default pp - 1; 0 under a V schedule, whose rank 0 holds the first and the last stage)."""
    tp = np.asarray(tp, dtype=np.int64)
    pp = np.asarray(pp, dtype=np.int64)
    pp_rank = np.asarray(pp_rank, dtype=np.int64)
    lp = layer_params(m)
    n = np.asarray(layers_on_rank, dtype=np.int64) * (lp.sharded // tp + lp.replicated)
    n = n + np.where(pp_rank == 0, embedding_params(m) // tp + position_params(m), 0)
    if m.tied_embeddings:  # the last stage's own copy of the word embedding (pp > 1)
        head = np.where(pp > 1, embedding_params(m) // tp, 0)
    else:
        head = head_params(m) // tp
    return n + np.where(pp_rank == (pp - 1 if last_rank is None else last_rank), final_norm_params(m) + head, 0)
