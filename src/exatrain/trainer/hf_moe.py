"""Hugging Face export of a mixture-of-experts model in Mixtral's format (MixtralForCausalLM).

The tensors are named as Mistral AI published Mixtral-8x7B (the Hub's safetensors, which
``transformers`` loads directly in 4.x and through its weight-conversion mapping into fused expert
tensors in 5.x): per layer ``block_sparse_moe.gate.weight`` [N, h] (the router) and, for expert j,
``block_sparse_moe.experts.j.w1|w3|w2.weight`` (gate, up, down: the slices of our stacked
[N, f, h] / [N, h, f] tensors); attention and norms as Llama's, the query and key rows permuted from
interleaved rotary pairs to rotate_half halves (see export.py's module doc for why).

Mixtral's block computes exactly our MoE layer when the spec says what Mixtral can say: a llama
model whose every layer is a MoE layer (no dense-first or interleaved dense layers), a softmax
router without balancing bias, top-k weights renormalised (Mixtral's gate; ours), no shared
experts, and the standard head width. Any other spec is refused with one line; nothing is written.
"""

from __future__ import annotations

from typing import Any

import torch

from exatrain.catalog.models import ModelSpec
from exatrain.errors import UserError
from exatrain.trainer.hf_export import llama_layer_weights


def check_mixtral(spec: ModelSpec) -> None:
    """UserError naming the first thing Mixtral's format cannot hold."""
    why = None
    if spec.arch != "llama":
        why = f"arch {spec.arch!r} (Mixtral is llama-style)"
    elif spec.shared_experts:
        why = f"{spec.shared_experts} shared expert(s)"
    elif spec.moe_layers != spec.layers:
        why = f"{spec.layers - spec.moe_layers} dense layer(s) (dense_layers / moe_every)"
    elif spec.router != "softmax" or spec.router_bias:
        why = f"the {spec.router} router{' with a balancing bias' if spec.router_bias else ''}"
    elif spec.kv_channels or spec.qk_norm or spec.mla:
        why = "a non-standard attention (kv_channels, qk_norm or latent attention)"
    if why is not None:
        raise UserError(f"{spec.name} cannot be exported in Mixtral's format: it has {why}")


def mixtral_weights(sd: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """Our whole state dict (canonical names) -> Mixtral's tensor names and layouts."""
    out = {"model.embed_tokens.weight": sd["embed.tok.weight"], "model.norm.weight": sd["norm.weight"]}
    for i in range(spec.layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        out.update(llama_layer_weights(sd, spec, i))
        out[h + "block_sparse_moe.gate.weight"] = sd[p + "mlp.router.weight"]
        for j in range(spec.experts):
            for w in ("w1", "w2", "w3"):
                out[h + f"block_sparse_moe.experts.{j}.{w}.weight"] = sd[p + f"mlp.experts.{w}"][j]
    if not spec.tied_embeddings:
        out["lm_head.weight"] = sd["head.weight"]
    return out


def mixtral_config(spec: ModelSpec, bos_eos: int | None, aux_loss_coef: float = 0.01) -> dict[str, Any]:
    """config.json for MixtralForCausalLM (its keys as transformers' MixtralConfig names them)."""
    rope = {"rope_type": "default", "rope_theta": spec.rope_theta}
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": spec.vocab,
            "hidden_size": spec.hidden, "intermediate_size": spec.expert_width, "num_hidden_layers": spec.layers,
            "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim,
            "max_position_embeddings": spec.seq_len, "rms_norm_eps": spec.norm_eps, "hidden_act": "silu",
            "rope_theta": spec.rope_theta, "rope_parameters": rope, "rope_scaling": None, "sliding_window": None,
            "num_local_experts": spec.experts, "num_experts_per_tok": spec.top_k, "output_router_logits": False,
            "router_aux_loss_coef": aux_loss_coef, "router_jitter_noise": 0.0, "attention_dropout": spec.dropout,
            "tie_word_embeddings": bool(spec.tied_embeddings), "initializer_range": 0.02, "use_cache": True,
            "bos_token_id": bos_eos, "eos_token_id": bos_eos, "dtype": "float32"}


def mixtral_export(sd: dict[str, torch.Tensor], spec: ModelSpec,
                   bos_eos: int | None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(weights, config) of a MoE model in Mixtral's format; UserError if it has no such form."""
    check_mixtral(spec)
    return mixtral_weights(sd, spec), mixtral_config(spec, bos_eos)


__all__ = ["check_mixtral", "mixtral_config", "mixtral_export", "mixtral_weights"]
