"""A Hugging Face ``config.json`` as a ModelSpec.

Reads the configuration files of the catalog's architectures and their relatives — ``model_type``
llama (Llama 2, 3, 3.1), mistral, mixtral, qwen2 (Qwen2, Qwen2.5), qwen2_moe, qwen3, qwen3_moe,
deepseek_v2, deepseek_v3, gpt_oss, gpt2 and gpt_neox — with the field names and defaults of the
transformers configuration classes (``transformers/models/<type>/configuration_<type>.py``). A file
is taken for one when it has ``model_type`` or ``architectures``, neither of which is a ModelSpec field.

What the checkpoint holds that a ModelSpec cannot say is listed in ``HFModel.unmodelled`` with its
parameter count, so the plan's count plus those equals the checkpoint's (tests/catalog/test_hf_config.py
checks it against each model card):

* qwen2 / qwen2_moe: q, k and v biases without an output-projection bias (ModelSpec's ``linear_bias``
  is all of a block's linear layers); qwen2_moe: the shared expert's sigmoid gate (one hidden-wide row);
* gpt_neox: rotary positions; the gpt family counts a learned table of seq_len x hidden instead
  (negative: the plan counts more), and its parallel residual changes no count;
* llama with only one of ``attention_bias`` / ``mlp_bias``.

The sequence length is not in a config.json: ``max_position_embeddings`` is the longest context the
model takes, not what it was trained at. The caller's ``seq_len`` wins; without one the plan is made at
``DEFAULT_SEQ_LEN`` tokens, or at the model's limit where that is shorter, and a note says so.

``load_model_file`` reads a user's model file of either kind (a ModelSpec table or a config.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from exatrain.catalog.models import ModelSpec, _load_table_file
from exatrain.errors import UserError

# The training sequence a config.json plans at when none is given: the pre-training length of Llama 2,
# DeepSeek-V3 (arXiv 2412.19437 Sec. 4.2), GPT-OSS (its initial_context_length) and the main stages of
# Qwen2.5 and Qwen3 (their technical reports), capped at the model's own limit (GPT-2 1,024, GPT-NeoX 2,048).
DEFAULT_SEQ_LEN = 4096

# architectures[0] -> model_type, for files that name only the class
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
}
MODEL_TYPES = tuple(sorted(set(ARCHITECTURES.values())))

# The transformers configuration classes' defaults for what a file may leave out (tie_word_embeddings,
# the norm epsilon, rope_theta); checked against configuration_<type>.py of transformers 4.57.
_TIED = {"gpt2": True}
_EPS = {"mixtral": 1e-5, "gpt_oss": 1e-5, "gpt2": 1e-5, "gpt_neox": 1e-5}
_THETA = {"mixtral": 1e6, "gpt_oss": 150000.0}


@dataclass(frozen=True)
class HFModel:
    """A config.json read: the spec, what the reader decided for the user (``notes``, one line each), and
    the checkpoint's parameters the spec does not count (``unmodelled``: (what, parameters); a negative
    number is counted by the plan but absent from the checkpoint)."""

    spec: ModelSpec
    model_type: str
    notes: tuple[str, ...] = ()
    unmodelled: tuple[tuple[str, int], ...] = ()

    @property
    def unmodelled_params(self) -> int:
        return sum(n for _, n in self.unmodelled)


def is_hf_config(data: Mapping[str, Any]) -> bool:
    """A Hugging Face config.json rather than exatrain's own model file: it names a model_type or architectures."""
    return "model_type" in data or "architectures" in data


def model_type_of(data: Mapping[str, Any], source: str) -> str:
    """The file's model_type (or the one its architectures[0] implies), if exatrain reads it; else one line."""
    kind = data.get("model_type")
    archs = data.get("architectures")
    if kind is None and isinstance(archs, list) and archs:
        kind = ARCHITECTURES.get(archs[0], archs[0])
    if kind not in MODEL_TYPES:
        what = f"model_type {kind!r}" if "model_type" in data else f"architectures {archs!r}"
        raise UserError(
            f"{source}: {what} is not one exatrain reads (it reads model_type {', '.join(MODEL_TYPES)}); "
            "describe the model with exatrain's own fields instead (see docs/planning.md)"
        )
    return kind


class _Fields:
    """The config's values, each read once; a missing required one is one line naming it."""

    def __init__(self, data: Mapping[str, Any], kind: str, source: str) -> None:
        self.data, self.kind, self.source = data, kind, source

    def need(self, key: str) -> Any:
        value = self.data.get(key)
        if value is None:
            raise UserError(f"{self.source}: a {self.kind} config.json needs {key}, and this one has none")
        return value

    def get(self, key: str, default: Any) -> Any:
        value = self.data.get(key)
        return default if value is None else value


def read_hf_config(data: Mapping[str, Any], *, name: str, source: str, seq_len: int | None = None) -> HFModel:
    """``data`` (a parsed config.json) as an HFModel; ``seq_len`` the training sequence (None: the module doc's
    default, said in a note). An unknown model_type, a missing field or a feature no ModelSpec can hold is a
    UserError naming it."""
    kind = model_type_of(data, source)
    f = _Fields(data, kind, source)
    if kind in ("gpt2", "gpt_neox"):
        fields, unmodelled, limit = _gpt_family(f)
    else:
        fields, unmodelled, limit = _llama_family(f)
    notes = []
    if seq_len is None:
        seq_len = min(DEFAULT_SEQ_LEN, limit) if limit else DEFAULT_SEQ_LEN
        where = "max_position_embeddings" if kind != "gpt2" else "n_positions"
        if limit and limit <= DEFAULT_SEQ_LEN:
            notes.append(
                f"{name}: planned at seq_len {seq_len}, the longest context the model takes ({where}): a "
                "config.json states no training sequence; pass --seq-len to change it"
            )
        else:
            notes.append(
                f"{name}: planned at seq_len {seq_len}, the default training sequence: a config.json states "
                f"none ({where} {limit or '(absent)'} is the longest context the model takes); pass --seq-len "
                "to change it"
            )
    if kind == "gpt_neox":  # the gpt family's position table stands in for rotary positions
        unmodelled.append(
            ("rotary positions, counted as the gpt family's learned position table", -seq_len * fields["hidden"])
        )
    archs = data.get("architectures")
    label = f"{kind}" + (f" ({archs[0]})" if isinstance(archs, list) and archs else "")
    spec = ModelSpec.from_dict(
        {"name": name, "seq_len": seq_len, "description": f"read from config.json: {label}", **fields}, source=source
    )
    if unmodelled:
        listed = "; ".join(f"{what}: {n:+,} parameters" for what, n in unmodelled)
        notes.append(f"{name}: not modelled ({listed})")
    return HFModel(spec, kind, tuple(notes), tuple(unmodelled))


def _gpt_family(f: _Fields) -> tuple[dict[str, Any], list[tuple[str, int]], int]:
    """GPT-2 and GPT-NeoX as the gpt family: LayerNorm with biases, biases on every linear layer, a GELU MLP."""
    if f.kind == "gpt2":
        hidden = f.need("n_embd")
        fields = {
            "arch": "gpt",
            "layers": f.need("n_layer"),
            "hidden": hidden,
            "heads": f.need("n_head"),
            "vocab": f.need("vocab_size"),
            "ffn_hidden": f.get("n_inner", 4 * hidden if isinstance(hidden, int) else 0),
            "norm_eps": float(f.get("layer_norm_epsilon", 1e-5)),
            "tied_embeddings": bool(f.get("tie_word_embeddings", True)),
            "dropout": float(f.get("resid_pdrop", 0.1)),
        }
        return fields, [], f.get("n_positions", 0)
    fields = {
        "arch": "gpt",
        "layers": f.need("num_hidden_layers"),
        "hidden": f.need("hidden_size"),
        "heads": f.need("num_attention_heads"),
        "vocab": f.need("vocab_size"),
        "ffn_hidden": f.need("intermediate_size"),
        "norm_eps": float(f.get("layer_norm_eps", 1e-5)),
        "tied_embeddings": bool(f.get("tie_word_embeddings", False)),
        "dropout": float(f.get("hidden_dropout", f.get("hidden_dropout_prob", 0.0))),
    }
    if not f.get("attention_bias", True):
        raise UserError(
            f"{f.source}: a gpt_neox model without attention biases (attention_bias false) is not "
            "modelled: exatrain's gpt family has biases on every linear layer"
        )
    return fields, [], f.get("max_position_embeddings", 0)


def _llama_family(f: _Fields) -> tuple[dict[str, Any], list[tuple[str, int]], int]:
    """Llama, Mistral, Mixtral, Qwen2/2.5/3 (and their MoE), DeepSeek-V2/V3 and GPT-OSS as the llama family."""
    kind = f.kind
    hidden, heads, layers = f.need("hidden_size"), f.need("num_attention_heads"), f.need("num_hidden_layers")
    kv_heads = f.get("num_key_value_heads", heads)
    fields: dict[str, Any] = {
        "arch": "llama",
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "vocab": f.need("vocab_size"),
        "ffn_hidden": f.need("intermediate_size"),
        "rope_theta": float(f.get("rope_theta", _THETA.get(kind, 10000.0))),
        "norm_eps": float(f.get("rms_norm_eps", _EPS.get(kind, 1e-6))),
        "tied_embeddings": bool(f.get("tie_word_embeddings", _TIED.get(kind, False))),
        "dropout": float(f.get("attention_dropout", 0.0)),
    }
    unmodelled: list[tuple[str, int]] = []
    _check_ints(f, hidden=hidden, heads=heads, layers=layers, kv_heads=kv_heads)
    head_dim = f.need("head_dim") if kind in ("qwen3", "qwen3_moe", "gpt_oss") else f.get("head_dim", hidden // heads)
    if kind.startswith("deepseek") and f.get("kv_lora_rank", 0):
        head_dim = _latent_attention(f, fields)
    elif head_dim != hidden // heads or hidden % heads:
        fields["kv_channels"] = head_dim
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    if kind in ("qwen3", "qwen3_moe"):
        fields["qk_norm"] = True  # q_norm / k_norm per head (modeling_qwen3.py)
    if kind in ("qwen2", "qwen2_moe"):  # q, k, v biases (modeling_qwen2.py: bias=True on q/k/v, not o)
        unmodelled.append(("q, k and v biases", layers * (q_width + 2 * kv_width)))
    if kind == "gpt_oss":  # biases on q, k, v, o, the router and every expert; a learned sink per head
        fields.update(linear_bias=True, attention_sinks=True)
    if kind == "llama":
        attn_bias, mlp_bias = bool(f.get("attention_bias", False)), bool(f.get("mlp_bias", False))
        if attn_bias and mlp_bias:
            fields["linear_bias"] = True
        elif attn_bias:
            unmodelled.append(("attention biases", layers * (q_width + 2 * kv_width + hidden)))
        elif mlp_bias:
            unmodelled.append(("MLP biases", layers * (2 * fields["ffn_hidden"] + hidden)))
    _experts(f, fields, unmodelled)
    _windows(f, fields)
    if kind.startswith("deepseek") and f.get("num_nextn_predict_layers", 0):
        # not part of the published totals either (DeepSeek-V3's 671B excludes its 14B MTP module)
        unmodelled.append(
            (
                f"the multi-token-prediction module ({f.get('num_nextn_predict_layers', 0)} layer), "
                "outside the model's published total too",
                0,
            )
        )
    return fields, [(w, n) for w, n in unmodelled if n], f.get("max_position_embeddings", 0)


def _check_ints(f: _Fields, **values: Any) -> None:
    for what, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise UserError(f"{f.source}: {what} must be a positive integer, got {value!r}")


def _latent_attention(f: _Fields, fields: dict[str, Any]) -> int:
    """DeepSeek's multi-head latent attention (configuration_deepseek_v3.py): the non-rotary query/key width
    and the value width are one ModelSpec head_dim, so they must agree."""
    nope, v = f.need("qk_nope_head_dim"), f.need("v_head_dim")
    if nope != v:
        raise UserError(
            f"{f.source}: latent attention with qk_nope_head_dim {nope} != v_head_dim {v} is not "
            "modelled (exatrain's head_dim is both)"
        )
    fields.update(
        kv_channels=nope,
        kv_lora_rank=f.need("kv_lora_rank"),
        q_lora_rank=f.get("q_lora_rank", 0),
        rope_head_dim=f.need("qk_rope_head_dim"),
    )
    return nope


def _experts(f: _Fields, fields: dict[str, Any], unmodelled: list[tuple[str, int]]) -> None:
    """The mixture-of-experts fields, and which layers are MoE layers as (dense_layers, moe_every)."""
    kind, layers = f.kind, fields["layers"]
    if kind in ("mixtral", "gpt_oss"):
        experts = f.need("num_local_experts")
        top_k = f.data.get("num_experts_per_tok") or f.data.get("experts_per_token") or f.need("num_experts_per_tok")
        fields.update(experts=experts, top_k=top_k)
        if kind == "gpt_oss":  # intermediate_size is the experts' width (it has no dense MLP), as the presets say
            fields["expert_ffn_hidden"] = fields["ffn_hidden"]
        return
    if kind in ("qwen2_moe", "qwen3_moe"):
        experts = f.need("num_experts")
        width = f.need("moe_intermediate_size")
        step, only_dense = f.get("decoder_sparse_step", 1), set(f.get("mlp_only_layers", []))
        moe = [i not in only_dense and (i + 1) % step == 0 for i in range(layers)]
        fields.update(experts=experts, top_k=f.need("num_experts_per_tok"), expert_ffn_hidden=width)
        if kind == "qwen2_moe":
            shared = f.get("shared_expert_intermediate_size", 0)
            if shared % width:
                raise UserError(
                    f"{f.source}: shared_expert_intermediate_size {shared} is not a whole number of "
                    f"experts of moe_intermediate_size {width}; not modelled"
                )
            fields["shared_experts"] = shared // width
            if shared:
                unmodelled.append(("the shared expert's gate", sum(moe) * fields["hidden"]))
        _moe_layers(f, fields, moe)
        return
    if kind.startswith("deepseek") and f.get("n_routed_experts", 0):
        first, freq = f.get("first_k_dense_replace", 0), f.get("moe_layer_freq", 1)
        moe = [i >= first and i % freq == 0 for i in range(layers)]
        score = f.get("scoring_func", "softmax")
        if score not in ("softmax", "sigmoid"):
            raise UserError(f"{f.source}: scoring_func {score!r} is not modelled (softmax or sigmoid)")
        fields.update(
            experts=f.need("n_routed_experts"),
            top_k=f.need("num_experts_per_tok"),
            shared_experts=f.get("n_shared_experts", 0),
            expert_ffn_hidden=f.need("moe_intermediate_size"),
            router=score,
            router_bias=f.get("topk_method", "") == "noaux_tc",
        )
        _moe_layers(f, fields, moe)


def moe_layout(moe: list[bool]) -> tuple[int, int] | None:
    """(dense_layers, moe_every) that make exactly the layers marked in ``moe`` MoE layers (ModelSpec.layer_is_moe),
    or None when no pair does (or no layer is MoE)."""
    if not any(moe):
        return None
    first = moe.index(True)
    for every in range(1, len(moe) + 1):
        dense = first - (every - 1)
        if dense < 0:
            return None
        if all((i >= dense and (i - dense + 1) % every == 0) == m for i, m in enumerate(moe)):
            return dense, every
    return None


def window_layout(windowed: list[bool]) -> int | None:
    """full_attention_every that windows exactly the layers marked in ``windowed`` (ModelSpec.layer_is_windowed;
    0: all of them), or None when none does (or no layer is windowed)."""
    if not any(windowed):
        return None
    if all(windowed):
        return 0
    every = windowed.index(False) + 1
    return every if all(w == ((i + 1) % every != 0) for i, w in enumerate(windowed)) else None


def _moe_layers(f: _Fields, fields: dict[str, Any], moe: list[bool]) -> None:
    """moe_layout of ``moe`` into ``fields``, or one line saying the pattern is not one a ModelSpec holds."""
    if not any(moe):
        raise UserError(f"{f.source}: a {f.kind} config.json whose settings leave no layer a MoE layer")
    layout = moe_layout(moe)
    if layout is None:
        raise UserError(
            f"{f.source}: MoE layers {[i for i, m in enumerate(moe) if m]} are not a leading run of dense "
            "layers followed by every n-th layer MoE; not modelled"
        )
    fields.update(dense_layers=layout[0], moe_every=layout[1])


def _windows(f: _Fields, fields: dict[str, Any]) -> None:
    """Sliding-window attention: which layers attend through the window, as full_attention_every."""
    layers, kind = fields["layers"], f.kind
    window = f.get("sliding_window", 0) or 0
    types = f.data.get("layer_types")
    if isinstance(types, list):  # transformers >= 4.53 spells it out per layer
        if len(types) != layers:
            raise UserError(f"{f.source}: layer_types has {len(types)} entries for {layers} layers")
        windowed = [t == "sliding_attention" for t in types]
    elif kind in ("mistral", "mixtral"):
        windowed = [bool(window)] * layers
    elif kind.startswith("qwen"):  # layers from max_window_layers on use the window (configuration_qwen2.py)
        start = f.get("max_window_layers", layers)
        windowed = [bool(f.get("use_sliding_window", False)) and i >= start for i in range(layers)]
    else:
        windowed = [False] * layers
    if not any(windowed):
        return
    if not window:
        raise UserError(f"{f.source}: sliding-window layers but no sliding_window size")
    every = window_layout(windowed)
    if every is None:
        raise UserError(
            f"{f.source}: sliding-window layers {[i for i, w in enumerate(windowed) if w]} are not every "
            "layer but each n-th; not modelled"
        )
    fields.update(sliding_window=window, **({"full_attention_every": every} if every else {}))


def load_model_file(path: str | Path, *, seq_len: int | None = None, notes: list[str] | None = None) -> ModelSpec:
    """A user's model file: TOML or JSON holding the ModelSpec fields (flat, or under [model]), or a Hugging
    Face config.json (it has model_type or architectures), named after the Hub id it was
    saved from (``_name_or_path``, its last part) or else its folder.
    ``seq_len``: the training sequence of a config.json (which states none; None: DEFAULT_SEQ_LEN
    or the model's limit); ``notes``: where the lines go that say what the reader chose for a config.json."""
    path = Path(path)
    data = _load_table_file(path)
    if is_hf_config(data):
        hub = data.get("_name_or_path")
        name = (
            hub.rstrip("/").rsplit("/", 1)[-1]
            if isinstance(hub, str) and hub.strip("/ ")
            else path.parent.name
            if path.name == "config.json" and path.parent.name
            else path.stem
        )
        read = read_hf_config(data, name=name, source=str(path), seq_len=seq_len)
        if notes is not None:
            notes.extend(read.notes)
        return read.spec
    if "model" in data and isinstance(data["model"], dict):
        data = data["model"]
    data = {"name": path.stem, **data}
    return ModelSpec.from_dict(data, source=str(path))


__all__ = [
    "ARCHITECTURES",
    "DEFAULT_SEQ_LEN",
    "HFModel",
    "MODEL_TYPES",
    "is_hf_config",
    "load_model_file",
    "model_type_of",
    "moe_layout",
    "read_hf_config",
    "window_layout",
]
