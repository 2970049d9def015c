"""FLOP counts: per iteration (model and hardware FLOPs) and per layer as GEMM shapes.

Conventions (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 6): a matrix multiply of (M x K) by (K x N) costs 2*M*N*K FLOPs; backward costs twice
the forward; causal attention is counted as if full (the convention every published MFU uses);
element-wise work is not counted. For the GPT family with ffn_hidden = 4h this reduces exactly to
Korthikanti Eq. 7, 72*B*s*L*h^2*(1 + s/(6h) + V/(12hL)).

Mixture-of-experts layers count what a token goes through, the active parameters (the convention
of model FLOPs for MoE, as Megatron-LM's num_floating_point_operations in
megatron/training/training.py counts them: top_k routed experts plus the shared ones): attention,
the router GEMM (2*h*experts), the shared experts and top_k routed experts; the MFU of a MoE run is
computed on these. Latent attention counts every projection as a GEMM (no weight absorption in training)
and its attention core with query/key heads of width head_dim + rope_head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass

from exatrain.catalog.models import ModelSpec
from exatrain.accounting.params import attention_params, mlp_weight_params


def layer_forward_flops_per_token(m: ModelSpec, moe: bool | None = None) -> float:
    """Forward FLOPs of one transformer layer for one token (whole layer, before TP).

    ``moe`` picks the layer kind of a MoE model as ``params.layer_params`` does (None: its MoE
    layer); a MoE layer's MLP is the router, the shared experts and top_k routed experts."""
    h, f, kvh = m.hidden, m.ffn_hidden, m.kv_hidden
    if moe is None:
        moe = m.is_moe
    if moe and m.is_moe:
        experts = m.shared_experts + m.top_k
        mlp = 2 * experts * mlp_weight_params(m, m.expert_width) + 2 * h * m.experts  # + the router GEMM
        return _attention_projection_flops(m) + mlp + _attention_core_flops(m)
    if m.kv_channels or m.qk_norm or m.mla:
        return _attention_projection_flops(m) + 2 * mlp_weight_params(m, f) + _attention_core_flops(m)
    qkv = 2 * h * (h + 2 * kvh)
    proj = 2 * h * h
    mlp = 2 * (3 if m.gated_mlp else 2) * h * f
    # QK^T and attention-over-values: 2*s*d per head each (Korthikanti Sec. 6), s the keys a query reads
    attention = 2 * 2 * m.attention_keys * h
    return qkv + proj + mlp + attention


def _attention_projection_flops(m: ModelSpec) -> int:
    """2 FLOPs per weight of every attention projection (norm weights excluded)."""
    a = attention_params(m)
    weights = a.sharded + a.replicated
    if m.qk_norm:
        weights -= 2 * m.head_dim
    if m.mla:
        weights -= m.kv_lora_rank + (m.q_lora_rank if m.q_lora_rank else 0)  # the latent RMSNorms
    return 2 * weights


def _attention_core_flops(m: ModelSpec) -> float:
    """QK^T (query/key heads of width head_dim + rope_head_dim) and the softmax-weighted values
    (head_dim) over all s keys, per head: Korthikanti Sec. 6's 4*s*h when heads * head_dim = h; under
    sliding windows over the mean layer's keys (ModelSpec.attention_keys)."""
    return 2 * m.attention_keys * m.heads * (2 * m.head_dim + m.rope_head_dim)


def attention_forward_flops_per_token(m: ModelSpec) -> float:
    """The s-dependent attention core (QK^T, softmax-weighted V) of one layer, one token."""
    if m.kv_channels or m.mla:
        return float(_attention_core_flops(m))
    return 4.0 * m.attention_keys * m.hidden


def layers_forward_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs of all transformer layers for one token (dense and MoE layers each counted)."""
    if not m.is_moe:
        return m.layers * layer_forward_flops_per_token(m)
    n_moe = m.moe_layers
    return (m.layers - n_moe) * layer_forward_flops_per_token(m, moe=False) + n_moe * layer_forward_flops_per_token(
        m, moe=True
    )


def model_flops_per_token(m: ModelSpec) -> float:
    """Training model FLOPs per token (forward + backward = 3x forward, no recomputation), counted on
    the active parameters: the per-token figure of 6 * N_active + attention."""
    return 3.0 * (layers_forward_flops_per_token(m) + logits_forward_flops_per_token(m))


def logits_forward_flops_per_token(m: ModelSpec) -> float:
    return 2.0 * m.hidden * m.vocab


def model_flops_per_step(m: ModelSpec, global_batch: int) -> float:
    """Model FLOPs of one optimizer step (forward + backward = 3x forward), no recomputation:
    Korthikanti et al. 2022 Eq. 7 generalised to GQA and SwiGLU."""
    tokens = global_batch * m.seq_len
    return 3.0 * tokens * (layers_forward_flops_per_token(m) + logits_forward_flops_per_token(m))


# The forward GEMMs each of Megatron-Core's recompute modules reruns (settings.RECOMPUTE_MODULES; "core_attn" is the
# attention core, counted apart)
MODULE_GEMMS = {
    "mla_up_proj": ("q_up", "kv_up"),
    "mlp": ("fc1", "fc2"),
    "shared_experts": ("shared_fc1", "shared_fc2"),
    "moe": ("router", "shared_fc1", "shared_fc2", "expert_fc1", "expert_fc2"),
}


def module_forward_flops_per_token(m: ModelSpec, modules, *, moe: bool) -> float:
    """Forward GEMM FLOPs per token of one layer (a MoE layer if ``moe``) that recomputing ``modules`` reruns,
    at an even routing: "mlp" a dense layer's fc1 and fc2 (not a MoE layer's), "mla_up_proj" latent attention's
    up-projections, "shared_experts" and "moe" their GEMMs (``MODULE_GEMMS``); the norms and activations run no
    GEMM."""
    moe = bool(moe and m.is_moe)
    names = {n for mod in modules if mod in MODULE_GEMMS and not (mod == "mlp" and moe) for n in MODULE_GEMMS[mod]}
    gemms = layer_gemms(m, 1, 1, moe=moe) if names else ()
    return sum(2.0 * g.m * g.n * g.k * g.count for g in gemms if g.name in names) / m.seq_len


def hardware_flops_per_step(
    m: ModelSpec, global_batch: int, recompute: str, modules=(), rerun_share: float = 1.0
) -> float:
    """FLOPs the hardware executes, recomputation included.

    selective: Korthikanti et al. 2022 Eq. 8, which adds 3x the attention core's forward FLOPs
               (72*B*s*L*h^2*(1 + s/(3h) + V/(12hL)) for the GPT family) — the convention behind the
               HFU the paper reports, kept so our HFU is comparable with it.
    full:      one more forward of every layer, not of the logits: Narayanan et al. 2021 Eq. 3,
               96*B*s*L*h^2*(1 + s/(6h) + V/(16hL)) for the GPT family.
    ``modules`` (selective; Plan.recompute_modules): the attention core as above where "core_attn" is one of
    them, plus one more forward of the GEMMs the others rerun (``module_forward_flops_per_token``).
    ``rerun_share`` (full): the share of the layers recomputed (Plan.recompute_layers: the first N of each stage).
    """
    tokens = global_batch * m.seq_len
    base = model_flops_per_step(m, global_batch)
    if recompute == "selective" and modules:
        core = 3.0 * m.layers * attention_forward_flops_per_token(m) if "core_attn" in modules else 0.0
        n_moe = m.moe_layers if m.is_moe else 0
        gemms = (m.layers - n_moe) * module_forward_flops_per_token(
            m, modules, moe=False
        ) + n_moe * module_forward_flops_per_token(m, modules, moe=True)
        return base + tokens * (core + gemms)
    if recompute == "selective":
        return base + 3.0 * tokens * m.layers * attention_forward_flops_per_token(m)
    if recompute == "full":
        if m.is_moe:
            return base + rerun_share * tokens * layers_forward_flops_per_token(m)
        return base + rerun_share * tokens * m.layers * layer_forward_flops_per_token(m)
    return base


@dataclass(frozen=True)
class Gemm:
    """One matrix multiply of one rank: (M x K) @ (K x N), repeated ``count`` times (batched)."""

    name: str
    m: int
    n: int
    k: int
    count: float = 1  # fractional for a sliding-window model's share of the attention heads

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


def layer_gemms(
    m: ModelSpec,
    micro_batch: int,
    tp: int,
    *,
    moe: bool | None = None,
    ep: int = 1,
    etp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    capacity_factor: float = 1.0,
) -> tuple[Gemm, ...]:
    """Forward GEMMs of one transformer layer on one tensor-parallel rank, one micro-batch.

    Shapes follow Megatron's sharding (Shoeybi et al. 2019): QKV and fc1 (gate/up) are
    column-parallel (N split), proj and fc2 are row-parallel (K split), heads are split over tp.

    Extended models (``moe``, ``ep``, ``etp``, ``cp`` and ``capacity_factor`` as in
    ``accounting.moe`` and ``accounting.context``): with context parallelism a rank's queries are
    s/cp of the sequence and attend to all s keys (causal counted as full, the MFU convention);
    latent attention's down-projections are replicated over tp (computed on every tp rank); a MoE
    layer adds the router, the tensor-parallel shared experts and one grouped GEMM per local expert
    (experts / ep of them), each taking ``moe_tokens_per_rank`` * top_k * capacity_factor * etp /
    (experts / ep) token copies (balanced routing) at 1/etp of the expert width.
    """
    extended = m.kv_channels or m.qk_norm or m.mla or m.is_moe or m.sliding_window or cp != 1
    if not extended:
        tokens = micro_batch * m.seq_len
        h, f, kvh = m.hidden, m.ffn_hidden, m.kv_hidden
        gemms = [
            Gemm("qkv", tokens, (h + 2 * kvh) // tp, h),
            *attention_core_gemms(m, micro_batch, m.heads // tp, m.seq_len),
            Gemm("proj", tokens, h, h // tp),
            Gemm("fc1", tokens, (2 if m.gated_mlp else 1) * f // tp, h),
            Gemm("fc2", tokens, h, f // tp),
        ]
        return tuple(gemms)
    return _extended_layer_gemms(
        m,
        micro_batch,
        tp,
        moe=m.is_moe if moe is None else moe,
        ep=ep,
        etp=etp,
        cp=cp,
        sequence_parallel=sequence_parallel,
        capacity_factor=capacity_factor,
    )


def attention_core_gemms(m: ModelSpec, b: int, heads: int, queries: float) -> list[Gemm]:
    """The mean layer's attention core on one rank: ``queries`` per sequence (s/cp) of ``b`` sequences
    attend to all s keys (causal counted as full) through ``heads`` heads; with sliding windows the
    windowed layers' share of the heads (a fractional ``count``) reads ``window_keys`` keys instead."""
    d, qk = m.head_dim, m.head_dim + m.rope_head_dim
    if not m.sliding_window:
        shares = [(m.seq_len, b * heads)]
    else:
        windowed = m.windowed_layers / m.layers
        shares = [(keys, b * heads * f) for keys, f in ((m.seq_len, 1.0 - windowed), (m.window_keys, windowed)) if f]
    return [
        g
        for keys, count in shares
        for g in (
            Gemm("attn_scores", queries, keys, qk, count=count),
            Gemm("attn_values", queries, d, keys, count=count),
        )
    ]


def _extended_layer_gemms(
    m: ModelSpec,
    b: int,
    tp: int,
    *,
    moe: bool,
    ep: int,
    etp: int,
    cp: int,
    sequence_parallel: bool,
    capacity_factor: float,
) -> tuple[Gemm, ...]:
    s_local = m.seq_len / cp
    tokens = b * s_local
    h, d, heads = m.hidden, m.head_dim, m.heads // tp
    if m.mla:
        gemms = []
        if m.q_lora_rank:
            gemms += [Gemm("q_down", tokens, m.q_lora_rank, h), Gemm("q_up", tokens, m.q_width // tp, m.q_lora_rank)]
        else:
            gemms.append(Gemm("q", tokens, m.q_width // tp, h))
        gemms += [
            Gemm("kv_down", tokens, m.kv_lora_rank + m.rope_head_dim, h),
            Gemm("kv_up", tokens, m.heads * 2 * d // tp, m.kv_lora_rank),
        ]
    else:
        gemms = [Gemm("qkv", tokens, (m.q_width + 2 * m.kv_hidden) // tp, h)]
    gemms += attention_core_gemms(m, b, heads, s_local)
    gemms.append(Gemm("proj", tokens, h, m.attn_out_width // tp))
    gated = 2 if m.gated_mlp else 1
    if not (moe and m.is_moe):
        f = m.ffn_hidden
        return tuple(gemms + [Gemm("fc1", tokens, gated * f // tp, h), Gemm("fc2", tokens, h, f // tp)])
    fe = m.expert_width
    routed_in = tokens / (tp if sequence_parallel else 1)  # tokens this rank routes
    gemms.append(Gemm("router", routed_in, m.experts, h))
    if m.shared_experts:
        fs = m.shared_experts * fe
        gemms += [Gemm("shared_fc1", tokens, gated * fs // tp, h), Gemm("shared_fc2", tokens, h, fs // tp)]
    local = m.experts // ep
    per_expert = routed_in * m.top_k * capacity_factor * etp / local
    gemms += [
        Gemm("expert_fc1", per_expert, gated * fe // etp, h, count=local),
        Gemm("expert_fc2", per_expert, h, fe // etp, count=local),
    ]
    return tuple(gemms)


def logits_gemm(m: ModelSpec, micro_batch: int, tp: int) -> Gemm:
    """The vocab-parallel output projection of the last stage."""
    return Gemm("logits", micro_batch * m.seq_len, m.vocab // tp, m.hidden)
