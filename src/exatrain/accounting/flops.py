"""FLOP counts: per iteration (model and hardware FLOPs) and per layer as GEMM shapes.

Conventions (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 6): a matrix multiply of (M x K) by (K x N) costs 2*M*N*K FLOPs; backward costs twice
the forward; causal attention is counted as if full (the convention every published MFU uses);
element-wise work is not counted. For the GPT family with ffn_hidden = 4h this reduces exactly to
Korthikanti Eq. 7, 72*B*s*L*h^2*(1 + s/(6h) + V/(12hL)).
"""

from __future__ import annotations

from dataclasses import dataclass

from exatrain.catalog.models import ModelSpec


def layer_forward_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs of one transformer layer for one token (whole layer, before TP)."""
    h, f, kvh, s = m.hidden, m.ffn_hidden, m.kv_hidden, m.seq_len
    qkv = 2 * h * (h + 2 * kvh)
    proj = 2 * h * h
    mlp = 2 * (3 if m.gated_mlp else 2) * h * f
    attention = 2 * 2 * s * h  # QK^T and attention-over-values: 2*s*d per head each (Korthikanti Sec. 6)
    return qkv + proj + mlp + attention


def attention_forward_flops_per_token(m: ModelSpec) -> float:
    """The s-dependent attention core (QK^T, softmax-weighted V) of one layer, one token."""
    return 4.0 * m.seq_len * m.hidden


def logits_forward_flops_per_token(m: ModelSpec) -> float:
    return 2.0 * m.hidden * m.vocab


def model_flops_per_step(m: ModelSpec, global_batch: int) -> float:
    """Model FLOPs of one optimizer step (forward + backward = 3x forward), no recomputation:
    Korthikanti et al. 2022 Eq. 7 generalised to GQA and SwiGLU."""
    tokens = global_batch * m.seq_len
    return 3.0 * tokens * (m.layers * layer_forward_flops_per_token(m) + logits_forward_flops_per_token(m))


def hardware_flops_per_step(m: ModelSpec, global_batch: int, recompute: str) -> float:
    """FLOPs the hardware executes, recomputation included.

    selective: Korthikanti et al. 2022 Eq. 8, which adds 3x the attention core's forward FLOPs
               (72*B*s*L*h^2*(1 + s/(3h) + V/(12hL)) for the GPT family) — the convention behind the
               HFU the paper reports, kept so our HFU is comparable with it.
    full:      one more forward of every layer, not of the logits: Narayanan et al. 2021 Eq. 3,
               96*B*s*L*h^2*(1 + s/(6h) + V/(16hL)) for the GPT family.
    """
    tokens = global_batch * m.seq_len
    base = model_flops_per_step(m, global_batch)
    if recompute == "selective":
        return base + 3.0 * tokens * m.layers * attention_forward_flops_per_token(m)
    if recompute == "full":
        return base + tokens * m.layers * layer_forward_flops_per_token(m)
    return base


@dataclass(frozen=True)
class Gemm:
    """One matrix multiply of one rank: (M x K) @ (K x N), repeated ``count`` times (batched)."""

    name: str
    m: int
    n: int
    k: int
    count: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


def layer_gemms(m: ModelSpec, micro_batch: int, tp: int) -> tuple[Gemm, ...]:
    """Forward GEMMs of one transformer layer on one tensor-parallel rank, one micro-batch.

    Shapes follow Megatron's sharding (Shoeybi et al. 2019): QKV and fc1 (gate/up) are
    column-parallel (N split), proj and fc2 are row-parallel (K split), heads are split over tp.
    """
    tokens = micro_batch * m.seq_len
    h, f, kvh, d = m.hidden, m.ffn_hidden, m.kv_hidden, m.head_dim
    heads = m.heads // tp
    gemms = [
        Gemm("qkv", tokens, (h + 2 * kvh) // tp, h),
        Gemm("attn_scores", m.seq_len, m.seq_len, d, count=micro_batch * heads),
        Gemm("attn_values", m.seq_len, d, m.seq_len, count=micro_batch * heads),
        Gemm("proj", tokens, h, h // tp),
        Gemm("fc1", tokens, (2 if m.gated_mlp else 1) * f // tp, h),
        Gemm("fc2", tokens, h, f // tp),
    ]
    return tuple(gemms)


def logits_gemm(m: ModelSpec, micro_batch: int, tp: int) -> Gemm:
    """The vocab-parallel output projection of the last stage."""
    return Gemm("logits", micro_batch * m.seq_len, m.vocab // tp, m.hidden)
