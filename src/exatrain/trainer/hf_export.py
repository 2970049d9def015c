"""``exatrain export --format hf``: a checkpoint of any layout -> safetensors + config.json that
``transformers`` loads (GPT2LMHeadModel for the gpt family, LlamaForCausalLM for llama,
MixtralForCausalLM for a mixture-of-experts model).

One process, no process group: the checkpoint's chunks are assembled into whole tensors by name
(storage.read_full), then renamed and reshaped into Hugging Face's layout:

* gpt: GPT-2's ``Conv1D`` stores weights as [in, out], the transpose of ``nn.Linear``; q, k and v
  are one ``c_attn`` matrix (q | k | v along the output); learned positions are ``wpe``; the head is
  tied to ``wte`` (not stored), or stored as ``lm_head.weight`` when the model is untied;
  GELU with the tanh approximation is ``gelu_new``.
* llama: the trainer rotates *interleaved* channel pairs (2i, 2i+1) by angle i (RoFormer, Meta's
  Llama); transformers' ``rotate_half`` rotates pairs (i, i + d/2). Permuting each head's q and k
  output rows to [0, 2, 4, ..., 1, 3, 5, ...] makes the two equal (the inverse of the permutation
  transformers' convert_llama_weights_to_hf applies to Meta's checkpoints); q.k is unchanged because
  q and k are permuted alike, and v, o are untouched.
* mixtral: named as Mistral AI published Mixtral-8x7B (the Hub's safetensors, which ``transformers``
  loads directly in 4.x and through its weight-conversion mapping into fused expert tensors in 5.x): per
  layer ``block_sparse_moe.gate.weight`` [N, h] (the router) and, for expert j,
  ``block_sparse_moe.experts.j.w1|w3|w2.weight`` (gate, up, down: the slices of our stacked [N, f, h] /
  [N, h, f] tensors); attention and norms as llama's. Mixtral's block computes exactly our MoE layer when
  the spec says what Mixtral can say: a llama model whose every layer is a MoE layer (no dense-first or
  interleaved dense layers), a softmax router without balancing bias, top-k weights renormalised
  (Mixtral's gate; ours), no shared experts, and the standard head width. Any other spec is refused with
  one line; nothing is written.

The tokenizer the data was prepared with goes along (tokenizer.json + tokenizer_config.json), with its
separator as the bos/eos token.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from exatrain.catalog.models import ModelSpec
from exatrain.errors import UserError
from exatrain.paths import check_output_dir
from exatrain.trainer.checkpoint import files
from exatrain.trainer.checkpoint.storage import read_full

FORMATS = ("hf",)


def rotate_half_rows(w: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Reorder each head's rows of a q/k projection from interleaved pairs to rotate_half halves."""
    order = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
    return w.view(heads, head_dim, *w.shape[1:])[:, order].reshape(w.shape)


def gpt2_weights(sd: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    out = {
        "transformer.wte.weight": sd["embed.tok.weight"],
        "transformer.wpe.weight": sd["embed.pos.weight"],
        "transformer.ln_f.weight": sd["norm.weight"],
        "transformer.ln_f.bias": sd["norm.bias"],
    }
    for i in range(spec.layers):
        p, h = f"layers.{i}.", f"transformer.h.{i}."
        out[h + "ln_1.weight"], out[h + "ln_1.bias"] = sd[p + "attn_norm.weight"], sd[p + "attn_norm.bias"]
        out[h + "ln_2.weight"], out[h + "ln_2.bias"] = sd[p + "mlp_norm.weight"], sd[p + "mlp_norm.bias"]
        qkv = [p + f"attn.{w}" for w in ("wq", "wk", "wv")]
        out[h + "attn.c_attn.weight"] = torch.cat([sd[n + ".weight"] for n in qkv], dim=0).t()  # Conv1D: [in, out]
        out[h + "attn.c_attn.bias"] = torch.cat([sd[n + ".bias"] for n in qkv], dim=0)
        out[h + "attn.c_proj.weight"] = sd[p + "attn.wo.weight"].t()
        out[h + "attn.c_proj.bias"] = sd[p + "attn.wo.bias"]
        out[h + "mlp.c_fc.weight"], out[h + "mlp.c_fc.bias"] = sd[p + "mlp.fc1.weight"].t(), sd[p + "mlp.fc1.bias"]
        out[h + "mlp.c_proj.weight"], out[h + "mlp.c_proj.bias"] = sd[p + "mlp.fc2.weight"].t(), sd[p + "mlp.fc2.bias"]
    if not spec.tied_embeddings:
        out["lm_head.weight"] = sd["head.weight"]
    return out


def gpt2_config(spec: ModelSpec, bos_eos: int | None) -> dict[str, Any]:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": spec.vocab,
        "n_positions": spec.seq_len,
        "n_embd": spec.hidden,
        "n_layer": spec.layers,
        "n_head": spec.heads,
        "n_inner": spec.ffn_hidden,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": spec.norm_eps,
        "resid_pdrop": spec.dropout,
        "attn_pdrop": spec.dropout,
        "embd_pdrop": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "use_cache": True,
        "tie_word_embeddings": bool(spec.tied_embeddings),
        "bos_token_id": bos_eos,
        "eos_token_id": bos_eos,
        "dtype": "float32",
    }


def llama_layer_weights(sd: dict[str, torch.Tensor], spec: ModelSpec, i: int) -> dict[str, torch.Tensor]:
    """Layer i's norms and attention in the Llama family's names (Llama, Mixtral): everything but the MLP."""
    d, p, h = spec.head_dim, f"layers.{i}.", f"model.layers.{i}."
    return {
        h + "input_layernorm.weight": sd[p + "attn_norm.weight"],
        h + "post_attention_layernorm.weight": sd[p + "mlp_norm.weight"],
        h + "self_attn.q_proj.weight": rotate_half_rows(sd[p + "attn.wq.weight"], spec.heads, d),
        h + "self_attn.k_proj.weight": rotate_half_rows(sd[p + "attn.wk.weight"], spec.kv_heads, d),
        h + "self_attn.v_proj.weight": sd[p + "attn.wv.weight"],
        h + "self_attn.o_proj.weight": sd[p + "attn.wo.weight"],
    }


def llama_weights(sd: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    out = {"model.embed_tokens.weight": sd["embed.tok.weight"], "model.norm.weight": sd["norm.weight"]}
    for i in range(spec.layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        out.update(llama_layer_weights(sd, spec, i))
        out[h + "mlp.gate_proj.weight"] = sd[p + "mlp.w1.weight"]
        out[h + "mlp.up_proj.weight"] = sd[p + "mlp.w3.weight"]
        out[h + "mlp.down_proj.weight"] = sd[p + "mlp.w2.weight"]
    if not spec.tied_embeddings:
        out["lm_head.weight"] = sd["head.weight"]
    return out


def llama_config(spec: ModelSpec, bos_eos: int | None) -> dict[str, Any]:
    rope = {"rope_type": "default", "rope_theta": spec.rope_theta}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn_hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.seq_len,
        "rms_norm_eps": spec.norm_eps,
        "hidden_act": "silu",
        "rope_theta": spec.rope_theta,
        "rope_parameters": rope,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": spec.dropout,
        "tie_word_embeddings": bool(spec.tied_embeddings),
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos_eos,
        "eos_token_id": bos_eos,
        "dtype": "float32",
    }


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
    return {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.expert_width,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.seq_len,
        "rms_norm_eps": spec.norm_eps,
        "hidden_act": "silu",
        "rope_theta": spec.rope_theta,
        "rope_parameters": rope,
        "rope_scaling": None,
        "sliding_window": None,
        "num_local_experts": spec.experts,
        "num_experts_per_tok": spec.top_k,
        "output_router_logits": False,
        "router_aux_loss_coef": aux_loss_coef,
        "router_jitter_noise": 0.0,
        "attention_dropout": spec.dropout,
        "tie_word_embeddings": bool(spec.tied_embeddings),
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos_eos,
        "eos_token_id": bos_eos,
        "dtype": "float32",
    }


def mixtral_export(
    sd: dict[str, torch.Tensor], spec: ModelSpec, bos_eos: int | None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(weights, config) of a MoE model in Mixtral's format; UserError if it has no such form."""
    check_mixtral(spec)
    return mixtral_weights(sd, spec), mixtral_config(spec, bos_eos)


def export_hf(
    checkpoint: str | Path, out: str | Path, step: int | None = None, warn: Callable[[str], None] | None = None
) -> Path:
    """Write ``out``/model.safetensors, config.json, generation_config.json and the tokenizer.
    Returns the checkpoint directory exported.

    Under a checkpoint root, an unusable newest checkpoint is reported through ``warn`` (one line:
    which and why) and the previous one exported. Everything is written into a temporary directory
    beside ``out`` and renamed into place at the end: an interrupted export leaves nothing behind."""
    from safetensors.torch import save_file

    out = check_output_dir(out, "--out")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not an empty directory")
    manifest = files.select(checkpoint, step, warn=warn)
    spec = manifest.plan.model
    sd = read_full(manifest.path, prefix="model.")
    sep = manifest.trainer["separator_id"]
    if spec.is_moe:  # MixtralForCausalLM
        weights, config = mixtral_export(sd, spec, sep)
    elif spec.arch == "gpt":
        weights, config = gpt2_weights(sd, spec), gpt2_config(spec, sep)
    else:
        weights, config = llama_weights(sd, spec), llama_config(spec, sep)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    try:
        save_file(
            {k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"}
        )
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", {"bos_token_id": sep, "eos_token_id": sep})
        tok = manifest.path / files.TOKENIZER
        if tok.is_file():
            shutil.copyfile(tok, tmp / "tokenizer.json")
            separator = manifest.trainer["separator"]
            _write_json(
                tmp / "tokenizer_config.json",
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "model_max_length": spec.seq_len,
                    "bos_token": separator,
                    "eos_token": separator,
                },
            )
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp made it private
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest.path


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


__all__ = [
    "FORMATS",
    "check_mixtral",
    "export_hf",
    "gpt2_config",
    "gpt2_weights",
    "llama_config",
    "llama_layer_weights",
    "llama_weights",
    "mixtral_config",
    "mixtral_export",
    "mixtral_weights",
    "rotate_half_rows",
]
