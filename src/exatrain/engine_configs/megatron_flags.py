"""Megatron-LM's flags for a model's attention, precision, FP8 and mixture of experts (the option names checked
against the sources engine_configs.megatron names), each group read from the plan alone."""

from __future__ import annotations

from exatrain.catalog.models import ModelSpec
from exatrain.engine_configs.common import Flag
from exatrain.plan import Plan


def attention_shape_flags(m: ModelSpec) -> list[Flag]:
    """A llama-family model's attention as Megatron-LM builds it (megatron/core/transformer/transformer_config.py,
    MLATransformerConfig; megatron/training/arguments.py _add_network_size_args and _add_mla_args):

    * latent attention: --multi-latent-attention with the query latent (--q-lora-rank; absent: queries projected
      directly), the key/value latent (--kv-lora-rank), the per-head query/key width (--qk-head-dim), its rotary
      part (--qk-pos-emb-head-dim) and the value width (--v-head-dim), both head_dim in exatrain's spec, and
      --qk-layernorm, which under latent attention builds the latents' RMSNorms (megatron/core/models/gpt/
      gpt_layer_specs.py: q_layernorm / kv_layernorm; without it they are identities);
    * otherwise grouped queries (--group-query-attention --num-query-groups), the head width when the model
      names one (--kv-channels; Megatron's default is hidden/heads), and QK-norm (--qk-layernorm: the model's
      normalization over each query and key head);
    * sliding windows: --window-size "left,0" (a query sees itself and left keys before it: the window less one)
      and --window-attn-skip-freq N (every N-th layer, 1-based, attends in full: exatrain's full_attention_every);
    * attention sinks: --softmax-type learnable (one learned logit per head, TE's softmax_type)."""
    out: list[Flag] = []
    if m.mla:
        out.append(Flag("--multi-latent-attention"))
        if m.q_lora_rank:
            out.append(Flag("--q-lora-rank", str(m.q_lora_rank)))
        out += [
            Flag("--kv-lora-rank", str(m.kv_lora_rank)),
            Flag("--qk-head-dim", str(m.head_dim)),
            Flag("--qk-pos-emb-head-dim", str(m.rope_head_dim)),
            Flag("--v-head-dim", str(m.head_dim)),
            # under latent attention the RMSNorms of the query and key/value latents (gpt_layer_specs.py)
            Flag("--qk-layernorm"),
        ]
    else:
        if m.kv_heads != m.heads:
            out += [Flag("--group-query-attention"), Flag("--num-query-groups", str(m.kv_heads))]
        if m.kv_channels:
            out.append(Flag("--kv-channels", str(m.kv_channels)))
        if m.qk_norm:
            out.append(Flag("--qk-layernorm"))
    if m.sliding_window:
        out.append(Flag("--window-size", f"{m.sliding_window - 1},0"))
        if m.full_attention_every:
            out.append(Flag("--window-attn-skip-freq", str(m.full_attention_every)))
    if m.attention_sinks:
        out.append(Flag("--softmax-type", "learnable"))
    return out


def precision_flags(plan: Plan) -> list[Flag]:
    """--bf16, or --fp16 (dynamic loss scaling: Megatron-LM's and Megatron-DeepSpeed's default without
    --loss-scale), or none for float32."""
    return {"bfloat16": [Flag("--bf16")], "float16": [Flag("--fp16")]}.get(plan.dtype, [])


def attention_backend(plan: Plan) -> str:
    """Megatron-LM's --attention-backend: megatron/core/transformer/enums.py AttnBackend
    (flash, fused, unfused, local, auto). Without flash attention "unfused"; with it the plan's
    --attention-kernel: "fa2" is Transformer Engine's FlashAttention backend (the flash-attn package),
    "fused" its cuDNN FusedAttention, which is also what a plan naming no kernel gets: the kernel the
    Megatron-Core profile prices (``ActivationRules.flash_kernel``), so the config runs what was priced.
    Megatron-Core has no torch-SDPA backend: "sdpa" runs "fused" too, with a note (the attention_kernel setting's,
    ``settings.SETTINGS``)."""
    if not plan.flash_attention:
        return "unfused"
    return "flash" if plan.attention_kernel == "fa2" else "fused"


# exatrain's FP8 scaling -> Megatron-LM's --fp8-recipe: per-tensor current scaling is "tensorwise",
# DeepSeek-V3's 1x128 / 128x128 blocks are "blockwise".
MEGATRON_FP8_RECIPES = {"delayed": "delayed", "current": "tensorwise", "block": "blockwise", "mxfp8": "mxfp8"}


def fp8_flags(plan: Plan) -> list[Flag]:
    """Transformer Engine FP8: hybrid (E4M3 forward, E5M2 gradients) for per-tensor scaling, E4M3
    throughout for the block recipes (DeepSeek-V3 Sec. 3.3.2; OCP MX); delayed scaling with
    exatrain's amax history (TE's DelayedScaling default; Megatron-LM's own default is 1)."""
    if not plan.fp8:
        return []
    from exatrain.accounting.fp8 import Fp8Recipe

    fmt = "hybrid" if plan.fp8 in ("delayed", "current") else "e4m3"
    out = [Flag("--fp8-format", fmt), Flag("--fp8-recipe", MEGATRON_FP8_RECIPES[plan.fp8])]
    if plan.fp8 == "delayed":
        out.append(Flag("--fp8-amax-history-len", str(Fp8Recipe().amax_history_len)))
    if plan.fp8_param_gather:  # FP8 weights gathered by the distributed optimizer (Plan.fp8_param_gather)
        out.append(Flag("--fp8-param-gather", None))
    return out


def moe_layer_freq(plan: Plan) -> str | None:
    """--moe-layer-freq as a run-length list expression, e.g. ([0]*3+[1]*58); None when every layer is MoE."""
    kinds = [int(plan.model.layer_is_moe(i)) for i in range(plan.model.layers)]
    if all(kinds):
        return None
    runs: list[list[int]] = []
    for k in kinds:
        if runs and runs[-1][0] == k:
            runs[-1][1] += 1
        else:
            runs.append([k, 1])
    return "(" + "+".join(f"[{k}]*{n}" for k, n in runs) + ")"


def moe_flags(plan: Plan) -> list[Flag]:
    """The MoE layer's shape and expert parallelism, with the dispatcher the planner priced: alltoall, or
    the flex dispatcher with the plan's DeepEP / HybridEP backend (megatron/training/arguments.py
    --moe-token-dispatcher-type, --moe-flex-dispatcher-backend).
    The expert-tensor-parallel size is 1, as priced (experts are not split over tp; Megatron-Core's
    default would be the tp size): the ep groups then fold over the tp*cp*dp ranks of a stage, so an
    ep wider than dp is expressed as it is (Megatron-Core MoE README, "MoE Parallel Folding")."""
    m = plan.model
    if not m.is_moe:
        return []
    out = [
        Flag("--num-experts", str(m.experts)),
        Flag("--moe-router-topk", str(m.top_k)),
        Flag("--moe-ffn-hidden-size", str(m.expert_width)),
    ]
    if m.router != "softmax":  # the gate's score function (Megatron's default: softmax)
        out.append(Flag("--moe-router-score-function", m.router))
    if m.router_bias:  # the per-expert balancing bias of auxiliary-loss-free routing (DeepSeek-V3)
        out.append(Flag("--moe-router-enable-expert-bias"))
    if m.shared_experts:
        out.append(Flag("--moe-shared-expert-intermediate-size", str(m.shared_experts * m.expert_width)))
    freq = moe_layer_freq(plan)
    if freq:
        out.append(Flag("--moe-layer-freq", freq))
    out += [
        Flag("--expert-model-parallel-size", str(plan.ep)),
        Flag("--expert-tensor-parallel-size", "1"),
        *(
            (Flag("--moe-token-dispatcher-type", "alltoall"),)
            if plan.moe_dispatcher == "alltoall"
            else (
                Flag("--moe-token-dispatcher-type", "flex"),
                Flag("--moe-flex-dispatcher-backend", plan.moe_dispatcher),
            )
        ),
        Flag("--moe-grouped-gemm"),
    ]
    if plan.moe_capacity_factor:
        out += [
            Flag("--moe-expert-capacity-factor", repr(float(plan.moe_capacity_factor))),
            Flag("--moe-pad-expert-input-to-capacity"),
        ]
    if plan.moe_force_balance:
        out.append(Flag("--moe-router-force-load-balancing"))
    return out


__all__ = [
    "MEGATRON_FP8_RECIPES",
    "attention_backend",
    "attention_shape_flags",
    "fp8_flags",
    "moe_flags",
    "moe_layer_freq",
    "precision_flags",
]
