"""The model a Megatron-LM or Megatron-DeepSpeed command builds, as ModelSpec fields (read_megatron's first part):
sizes, family, heads, norms, dropout, vocabulary, experts and attention, with Megatron-LM's defaults where an
option is left out and a note where the command builds what exatrain does not model."""

from __future__ import annotations

import re
from typing import Any

from exatrain.catalog.hf_config import moe_layout, window_layout
from exatrain.engine_configs.read_common import number, positive
from exatrain.engine_configs.read_megatron_flags import _Flags
from exatrain.errors import UserError


def _model_sizes(f: _Flags, defaults: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(fields, missing): layers, hidden, heads, seq_len, the family (--swiglu: llama, else gpt) and the MLP width
    (Megatron-LM's default where it is left out)."""
    m: dict[str, Any] = {}
    missing: dict[str, str] = {}
    for field, flag in (
        ("layers", "--num-layers"),
        ("hidden", "--hidden-size"),
        ("heads", "--num-attention-heads"),
        ("seq_len", "--seq-length"),
    ):
        value = f.int(flag)
        if value is None:
            missing[field] = f"no {flag}"
        else:
            m[field] = value
    swiglu = f.has("--swiglu")
    m["arch"] = "llama" if swiglu else "gpt"
    hidden = m.get("hidden", 0)
    ffn = f.int("--ffn-hidden-size")
    if ffn is None and hidden:
        # megatron/training/arguments.py: 4h, or with --swiglu int(4h * 2/3 / 64) * 64
        ffn = int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden
        defaults.append(f"--ffn-hidden-size ({ffn})")
    if ffn:
        m["ffn_hidden"] = ffn
    return m, missing


def _model_form(f: _Flags, m: dict[str, Any], defaults: list[str], notes: list[str]) -> bool:
    """Positions, norm and biases, each planned as the family (``m["arch"]``) has them, with a note where the
    script's differ; whether the script's positions are a learned table."""
    swiglu = m["arch"] == "llama"
    rope = f.value("--position-embedding-type") == "rope" or f.has("--use-rotary-position-embeddings")
    no_positions = f.has("--no-position-embedding") or f.value("--position-embedding-type") == "none"
    if swiglu and not (rope or no_positions):
        notes.append(
            "learned positions with a SwiGLU MLP are not modelled: planned with rotary positions (no position table)"
        )
    if not swiglu and (rope or no_positions):
        notes.append(
            "rotary positions with a GELU MLP are not modelled: planned with the gpt family's learned "
            "position table (seq_len x hidden parameters more)"
        )
    norm = (f.value("--normalization") or "LayerNorm").lower()
    if (norm == "rmsnorm") != swiglu:
        notes.append(
            f"{norm} with a {'SwiGLU' if swiglu else 'GELU'} MLP is not modelled: planned with the "
            f"{'llama' if swiglu else 'gpt'} family's norm"
        )
    disable, add = f.has("--disable-bias-linear"), f.has("--add-bias-linear")
    bias = add or not disable
    if swiglu and bias:
        m["linear_bias"] = True
        if not add:
            defaults.append("biases on the linear layers (no --disable-bias-linear)")
    if not swiglu and not bias:
        notes.append("a GELU model without biases is not modelled: planned with the gpt family's biases")
    if f.has("--add-qkv-bias") and not bias:
        notes.append("q, k and v biases alone (--add-qkv-bias) are not modelled: planned without them")
    return not (rope or no_positions)


def _model_heads(f: _Flags, m: dict[str, Any]) -> None:
    """Key/value heads (Megatron-LM's query groups or Megatron-DeepSpeed's key-value heads), a head width of the
    model's own, and QK-norm."""
    hidden, heads = m.get("hidden", 0), m.get("heads", 0)
    if f.has("--group-query-attention"):
        m["kv_heads"] = f.int("--num-query-groups", default=1)
    elif f.int("--num-key-value-heads") is not None:  # Megatron-DeepSpeed
        m["kv_heads"] = f.int("--num-key-value-heads")
    kv_channels = f.int("--kv-channels")
    if kv_channels and heads and (kv_channels != hidden // heads or hidden % heads):
        m["kv_channels"] = kv_channels
    if f.has("--qk-layernorm") and not f.has("--multi-latent-attention"):  # under MLA: the latents' norms (below)
        m["qk_norm"] = True


def _model_numbers(
    f: _Flags, m: dict[str, Any], deepspeed: bool, source: str, defaults: list[str], notes: list[str]
) -> None:
    """Tying, norm epsilon, rotary base and dropout (one rate for attention and hidden; a note where they
    differ), in each engine's spelling."""
    m["tied_embeddings"] = not f.has("--untie-embeddings-and-output-weights")
    if m["tied_embeddings"]:
        defaults.append("embeddings tied to the output layer (no --untie-embeddings-and-output-weights)")
    eps = f.value("--layernorm-epsilon" if deepspeed else "--norm-epsilon")
    m["norm_eps"] = number(eps, "--norm-epsilon", source) if eps is not None else 1e-5
    theta = f.value("--rotary-position-embeddings-theta" if deepspeed else "--rotary-base")
    m["rope_theta"] = number(theta, "--rotary-base", source) if theta is not None else 10000.0
    hd, ad = f.value("--hidden-dropout"), f.value("--attention-dropout")
    if hd is None and ad is None:
        defaults.append("dropout (0.1)")
    hd_v = number(hd, "--hidden-dropout", source) if hd is not None else 0.1
    ad_v = number(ad, "--attention-dropout", source) if ad is not None else 0.1
    if hd_v != ad_v:
        notes.append(f"attention dropout {ad_v:g} and hidden dropout {hd_v:g} differ: planned with {hd_v:g} for both")
    m["dropout"] = hd_v


def _model(
    f: _Flags, tp: int, deepspeed: bool, source: str, defaults: list[str], notes: list[str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """ModelSpec fields from the network-size options (Megatron-LM's defaults where one is left out)."""
    m, missing = _model_sizes(f, defaults)
    learned_positions = _model_form(f, m, defaults, notes)
    _model_heads(f, m)
    _model_numbers(f, m, deepspeed, source, defaults, notes)
    vocab = _vocab(f, tp, defaults)
    if vocab is None:
        missing["vocab"] = "the tokenizer's size, which the script does not state: pass --vocab"
    else:
        m["vocab"] = vocab
    _model_moe(f, m, source, defaults, notes)
    _model_attention(f, m, source, notes)
    positions = f.int("--max-position-embeddings")
    if m["arch"] == "gpt" and learned_positions and positions and positions != m.get("seq_len"):
        notes.append(
            f"--max-position-embeddings {positions} rows of learned positions are planned as seq_len "
            f"{m.get('seq_len')} rows"
        )
    mtp = f.int("--mtp-num-layers")
    if mtp:
        notes.append(f"the {mtp} multi-token-prediction layer(s) (--mtp-num-layers) are not modelled")
    return m, missing


# megatron/training/tokenizer: the tokenizers whose size the script's flags fix
_TOKENIZER_SIZES = {"GPT2BPETokenizer": 50257}


def _vocab(f: _Flags, tp: int, defaults: list[str]) -> int | None:
    """The embedding rows Megatron allocates: the tokenizer's size padded to a multiple of
    --make-vocab-size-divisible-by (default 128) x tp (build_tokenizer.py vocab_size_with_padding). Without a size
    the script fixes, one padding unit (an export sets the unit to the plan's vocabulary: every tokenizer up to that
    size pads to it)."""
    divisor = f.int("--make-vocab-size-divisible-by")
    unit = (divisor or 128) * tp
    size = f.int("--vocab-size")
    kind = f.value("--tokenizer-type")
    if size is None and kind in _TOKENIZER_SIZES:
        size = _TOKENIZER_SIZES[kind]
    if size is not None:
        return -(-size // unit) * unit
    if divisor is None:
        return None
    defaults.append(
        f"the vocabulary ({unit} rows: one padding unit, --make-vocab-size-divisible-by x tp, which "
        "every tokenizer up to that size pads to)"
    )
    return unit


def _model_moe(f: _Flags, m: dict[str, Any], source: str, defaults: list[str], notes: list[str]) -> None:
    experts = f.int("--num-experts")
    if not experts:
        return
    m["experts"] = experts
    top_k = f.int("--moe-router-topk")
    if top_k is None:
        defaults.append("--moe-router-topk (2)")
    m["top_k"] = top_k or 2
    width = f.int("--moe-ffn-hidden-size")
    if width and width != m.get("ffn_hidden"):
        m["expert_ffn_hidden"] = width
    expert = width or m.get("ffn_hidden", 0)
    shared = f.int("--moe-shared-expert-intermediate-size")
    if shared:
        if expert and shared % expert:
            raise UserError(
                f"{source}: --moe-shared-expert-intermediate-size {shared} is not a whole number of "
                f"experts of width {expert}; not modelled"
            )
        m["shared_experts"] = shared // expert
    freq = f.value("--moe-layer-freq")
    layers = m.get("layers", 0)
    if freq is not None and layers:
        pattern = _layer_freq(freq, layers, source)
        layout = moe_layout(pattern)
        if layout is None:
            raise UserError(
                f"{source}: --moe-layer-freq {freq}: MoE layers {[i for i, x in enumerate(pattern) if x]} "
                "are not a leading run of dense layers then every n-th layer MoE; not modelled"
            )
        m["dense_layers"], m["moe_every"] = layout
    score = f.value("--moe-router-score-function")
    if score not in (None, "softmax", "sigmoid"):
        raise UserError(f"{source}: --moe-router-score-function {score} is not modelled (softmax or sigmoid)")
    if score == "sigmoid":
        m["router"] = "sigmoid"
    if f.has("--moe-router-enable-expert-bias"):
        m["router_bias"] = True
    etp = f.int("--expert-tensor-parallel-size")
    if etp not in (None, 1):
        notes.append(
            f"--expert-tensor-parallel-size {etp} is not modelled: experts priced whole on each rank "
            "(expert-tensor-parallel size 1)"
        )


def _layer_freq(text: str, layers: int, source: str) -> list[bool]:
    """--moe-layer-freq: an integer N (layer i is MoE when i % N == 0) or a Python list expression of 0/1 per layer
    such as ([0]*3+[1]*58) (megatron/core/transformer/transformer_config.py moe_layer_freq)."""
    text = text.strip()
    if text.isdigit() and int(text) > 0:
        return [i % int(text) == 0 for i in range(layers)]
    body = text.strip("()").replace(" ", "")
    pattern: list[bool] = []
    for part in body.split("+"):
        m = re.fullmatch(r"\[([01](?:,[01])*)\](?:\*(\d+))?", part)
        if not m:
            raise UserError(f"{source}: --moe-layer-freq {text!r} is not an integer or a list like ([0]*3+[1]*58)")
        pattern += [x == "1" for x in m.group(1).split(",")] * int(m.group(2) or 1)
    if len(pattern) != layers:
        raise UserError(f"{source}: --moe-layer-freq {text!r} gives {len(pattern)} layers, not {layers}")
    return pattern


def _model_attention(f: _Flags, m: dict[str, Any], source: str, notes: list[str]) -> None:
    """Latent attention, sliding windows and sinks."""
    if f.has("--multi-latent-attention"):
        qk, v = f.int("--qk-head-dim", default=128), f.int("--v-head-dim", default=128)
        if qk != v:
            raise UserError(f"{source}: --qk-head-dim {qk} != --v-head-dim {v} is not modelled (one head_dim)")
        q_lora = f.value("--q-lora-rank")
        m.update(
            kv_channels=qk,
            kv_lora_rank=f.int("--kv-lora-rank", default=32),
            q_lora_rank=positive(q_lora, "--q-lora-rank", source) if q_lora not in (None, "None") else 0,
            rope_head_dim=f.int("--qk-pos-emb-head-dim", default=64),
        )
        if not f.has("--qk-layernorm"):  # gpt_layer_specs.py: the latents' RMSNorms are built with it only
            notes.append(
                "latent attention without --qk-layernorm builds no RMSNorm on the query and key/value "
                "latents: planned with them (DeepSeek-V2/V3 have them)"
            )
    window = f.value("--window-size")
    if window is not None:
        sizes = [w for w in re.split(r"[(),\s]+", window) if w]
        left = positive(sizes[0], "--window-size", source) if sizes and sizes[0] not in ("-1", "None") else 0
        if left:
            m["sliding_window"] = left + 1  # (left, 0): a query sees itself and the left keys before it
            skip = f.int("--window-attn-skip-freq")
            if skip and m.get("layers"):
                windowed = [(i + 1) % skip != 0 for i in range(m["layers"])]
                every = window_layout(windowed)
                if every:
                    m["full_attention_every"] = every
    softmax = f.value("--softmax-type")
    if softmax == "learnable":
        m["attention_sinks"] = True
    elif softmax not in (None, "vanilla"):
        notes.append(f"--softmax-type {softmax} is not modelled: planned with the usual softmax")
