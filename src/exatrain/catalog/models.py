"""Model architectures: a typed spec, the preset catalog, and user-supplied model files.

Two architecture families are described, and the trainer builds exactly these:

* ``gpt``   — GPT-2/GPT-3/Megatron style: learned position embeddings, LayerNorm (weight + bias),
              biases on every linear layer, GELU MLP of width ``ffn_hidden`` (default 4h), the output
              head tied to the token embedding.
* ``llama`` — Llama style: rotary positions (no position table), RMSNorm (weight only), no biases,
              SwiGLU MLP (three matrices of width ``ffn_hidden``), grouped-query attention with
              ``kv_heads`` key/value heads, an untied output head.

``vocab`` is the number of embedding rows actually allocated (already padded, e.g. GPT-2's 50,257
tokens padded to 50,304 or 51,200 as Megatron does), so counts and the real model agree exactly.

Llama-family extensions, each off by default so dense files load unchanged (the planner's accounting
models them; the trainer builds the mixture-of-experts fields, trainer/moe.py, not yet the others):

* ``kv_channels`` — the attention head width when it is not hidden/heads (Qwen3's 128 at hidden
  2048 with 32 heads; Megatron-LM's ``--kv-channels``); ``qk_norm`` — RMSNorm over each query and
  key head (Qwen3's ``q_norm``/``k_norm``).
* mixture of experts (Megatron-Core's MoE layer; Fedus et al. 2022): ``experts`` routed SwiGLU
  experts of width ``expert_ffn_hidden`` (0: ``ffn_hidden``), ``top_k`` of them per token, plus
  ``shared_experts`` always-on experts of the same width (DeepSeekMoE, Dai et al. 2024). The first
  ``dense_layers`` layers keep a dense MLP of width ``ffn_hidden`` (DeepSeek-V3's
  ``first_k_dense_replace``); after them every ``moe_every``-th layer is a MoE layer (layer i is MoE
  when (i - dense_layers + 1) is a multiple of ``moe_every``; 1 = all of them, 2 = Llama 4's
  interleaving). ``router`` is the gate's score function (``softmax`` or ``sigmoid``, Megatron-Core's
  ``--moe-router-score-function``); ``router_bias`` the per-expert balancing bias of DeepSeek-V3's
  auxiliary-loss-free routing (DeepSeek-V3 report, arXiv 2412.19437, Sec. 2.1.2).
* sliding-window attention (Mistral 7B, arXiv 2310.06825; GPT-OSS; Gemma 2/3): ``sliding_window`` > 0
  has each query of a windowed layer attend to itself and the ``sliding_window`` - 1 keys before it;
  ``full_attention_every`` N > 0 keeps every N-th layer (layer i with (i + 1) a multiple of N) in full
  causal attention (GPT-OSS alternates: N = 2; Gemma 3: N = 6), 0 windows every layer. The planner
  prices a windowed layer's attention core by the keys it reads (``window_keys``); the trainer does not
  build it.
* ``attention_sinks`` — a learned logit per head that joins every query's softmax as one more key with no
  value (GPT-OSS; Transformer Engine's ``softmax_type="learnable"``). It changes no GEMM's shape; its parameters,
  one per head and layer, are counted (split over tp with the heads); it matters where an engine's attention
  kernel or context parallelism does not run it (settings.CP_COMMS_WITHOUT_SINKS). The trainer does not build it.
* ``linear_bias`` — a bias on every linear layer of the blocks and on the router (GPT-OSS: q, k, v and the
  output projection, the router, each expert's gate/up and down; Megatron-Core ``--add-bias-linear`` with a
  llama-family model). Counted as parameters (``accounting.params``: column-parallel biases split over tp,
  row-parallel ones whole on every tp rank, an expert's with its expert); no GEMM changes. Not with latent
  attention. The trainer does not build it.
* multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1): ``kv_lora_rank`` > 0
  compresses keys and values through a latent of that width, ``q_lora_rank`` (0: none) the queries;
  ``rope_head_dim`` is the decoupled rotary part of each query/key head. Per-head query/key
  (non-rotary) and value widths both equal ``head_dim`` (``kv_channels``), as in DeepSeek-V2/V3
  (128 each).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from exatrain.errors import UserError
from exatrain.limits import MAX_COUNT

ARCHS = ("gpt", "llama")
ROUTERS = ("softmax", "sigmoid")
# Fields added for MoE / MLA / head width, with their "off" values: to_dict omits them at these
# values so a dense model (and every plan file written for one) serialises exactly as before.
EXTENDED_DEFAULTS: dict[str, Any] = {
    "kv_channels": 0,
    "qk_norm": False,
    "experts": 0,
    "top_k": 0,
    "shared_experts": 0,
    "expert_ffn_hidden": 0,
    "dense_layers": 0,
    "moe_every": 1,
    "router": "softmax",
    "router_bias": False,
    "q_lora_rank": 0,
    "kv_lora_rank": 0,
    "rope_head_dim": 0,
    "sliding_window": 0,
    "full_attention_every": 0,
    "attention_sinks": False,
    "linear_bias": False,
}


@dataclass(frozen=True)
class ModelSpec:
    """One decoder-only transformer; every size the planner and the trainer need."""

    name: str
    arch: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    kv_heads: int = 0  # 0 means "same as heads" (multi-head attention)
    ffn_hidden: int = 0  # 0 means the family's default: 4*hidden for gpt; required for llama
    tied_embeddings: bool | None = None  # None means the family's default (gpt: tied, llama: untied)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dropout: float = 0.0  # on attention probabilities and on both residual branches (GPT-2/Megatron)
    description: str = ""
    # ---- llama-family extensions (module doc); the defaults describe a dense model -------------
    kv_channels: int = 0  # attention head width; 0 means hidden // heads
    qk_norm: bool = False  # RMSNorm on every query and key head (Qwen3)
    experts: int = 0  # routed experts per MoE layer; 0 means a dense model
    top_k: int = 0  # routed experts each token is sent to
    shared_experts: int = 0  # experts every token goes through, besides its top_k
    expert_ffn_hidden: int = 0  # SwiGLU width of one (routed or shared) expert; 0 means ffn_hidden
    dense_layers: int = 0  # leading layers that keep a dense MLP of width ffn_hidden
    moe_every: int = 1  # after the dense layers, every moe_every-th layer is a MoE layer
    router: str = "softmax"  # router score function: softmax | sigmoid
    router_bias: bool = False  # per-expert balancing bias on the router scores (DeepSeek-V3)
    q_lora_rank: int = 0  # MLA query latent width; 0 means queries are projected directly
    kv_lora_rank: int = 0  # MLA key/value latent width; > 0 turns multi-head latent attention on
    rope_head_dim: int = 0  # MLA decoupled rotary width of each query/key head
    sliding_window: int = 0  # keys a query of a windowed layer attends to (itself included); 0: full attention
    full_attention_every: int = 0  # with sliding_window: every N-th layer attends in full; 0: none does
    attention_sinks: bool = False  # a learned softmax logit per head (GPT-OSS; TE softmax_type "learnable")
    linear_bias: bool = False  # biases on the blocks' linear layers and the router (GPT-OSS)

    def __post_init__(self) -> None:
        # Fill family defaults so every consumer sees resolved numbers.
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden == 0 and self.arch == "gpt":
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.tied_embeddings is None:
            object.__setattr__(self, "tied_embeddings", self.arch == "gpt")
        self.check()

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden // self.heads

    @property
    def q_width(self) -> int:
        """Width of the query projection's output (and of the attention output): heads * head_dim
        (plus the rotary part of each head under MLA)."""
        return self.heads * (self.head_dim + self.rope_head_dim)

    @property
    def attn_out_width(self) -> int:
        """Width of the attention output, the output projection's input: heads * value head width."""
        return self.heads * self.head_dim

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def expert_width(self) -> int:
        """SwiGLU width of one expert (routed or shared)."""
        return self.expert_ffn_hidden or self.ffn_hidden

    def layer_is_moe(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) has a MoE MLP (see the module doc for the rule)."""
        return self.experts > 0 and index >= self.dense_layers and (index - self.dense_layers + 1) % self.moe_every == 0

    @property
    def moe_layers(self) -> int:
        """Number of MoE layers (0 for a dense model)."""
        return sum(self.layer_is_moe(i) for i in range(self.layers))

    def layer_is_windowed(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) attends through a sliding window (module doc)."""
        n = self.full_attention_every
        return self.sliding_window > 0 and not (n and (index + 1) % n == 0)

    @property
    def windowed_layers(self) -> int:
        return sum(self.layer_is_windowed(i) for i in range(self.layers))

    @property
    def window_keys(self) -> float:
        """Keys per query of a windowed layer, counted as causal attention is (the whole prefix as if full,
        the MFU convention, twice the pairs a causal kernel computes): query i reads min(i + 1, w) keys, so
        the pairs are w*s - w*(w - 1)/2 and the count 2*pairs/s (s when the window covers the sequence)."""
        w, s = self.sliding_window, self.seq_len
        if not w or w >= s:
            return float(s)
        return 2.0 * w - w * (w - 1) / s

    @property
    def attention_keys(self) -> float:
        """Keys per query of the mean layer (causal counted as full): seq_len without sliding windows."""
        if not self.sliding_window:
            return float(self.seq_len)
        windowed = self.windowed_layers
        return ((self.layers - windowed) * self.seq_len + windowed * self.window_keys) / self.layers

    @property
    def unbuilt_by_trainer(self) -> tuple[str, ...]:
        """The attention features of this model that exatrain's trainer does not build yet (the planner counts
        them): a head width other than hidden/heads, QK-norm, latent attention, sliding windows, attention sinks,
        biases on a llama-family model's linear layers."""
        own_width = bool(self.kv_channels and self.kv_channels != self.hidden // self.heads)
        return tuple(
            name
            for name, on in (
                ("a head width other than hidden/heads", own_width),
                ("QK-norm", self.qk_norm),
                ("latent attention", self.mla),
                ("sliding windows", bool(self.sliding_window)),
                ("attention sinks", self.attention_sinks),
                ("biases on a llama-family model's linear layers", self.linear_bias),
            )
            if on
        )

    @property
    def kv_hidden(self) -> int:
        """Width of the K (and of the V) projection: kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def has_bias(self) -> bool:
        return self.arch == "gpt"

    @property
    def gated_mlp(self) -> bool:
        return self.arch == "llama"

    @property
    def learned_positions(self) -> bool:
        return self.arch == "gpt"

    # ---- validation ----------------------------------------------------------------------
    def check(self) -> None:
        """Raise UserError naming the first thing wrong with this spec."""
        where = f"model {self.name!r}"
        if self.arch not in ARCHS:
            raise UserError(f"{where}: unknown arch {self.arch!r}; use one of {', '.join(ARCHS)}")
        for field in ("layers", "hidden", "heads", "seq_len", "vocab", "kv_heads"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UserError(f"{where}: {field} must be a positive integer, got {value!r}")
            if value > MAX_COUNT:  # exatrain.limits
                raise UserError(f"{where}: {field} must be a positive integer of at most {MAX_COUNT:,}, got {value}")
        self._check_extension_types(where)
        if self.arch == "llama" and self.ffn_hidden <= 0:
            raise UserError(f"{where}: a llama-style model needs ffn_hidden (the SwiGLU width); pass --ffn-hidden")
        if not isinstance(self.ffn_hidden, int) or self.ffn_hidden <= 0:
            raise UserError(f"{where}: ffn_hidden must be a positive integer, got {self.ffn_hidden!r}")
        if self.ffn_hidden > MAX_COUNT:  # exatrain.limits
            raise UserError(
                f"{where}: ffn_hidden must be a positive integer of at most {MAX_COUNT:,}, got {self.ffn_hidden}"
            )
        if self.hidden % self.heads and not self.kv_channels:
            raise UserError(
                f"{where}: hidden {self.hidden} is not divisible by heads {self.heads}; choose heads that divide hidden"
            )
        if self.heads % self.kv_heads:
            raise UserError(f"{where}: heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.arch == "gpt" and self.kv_heads != self.heads:
            raise UserError(
                f"{where}: grouped-query attention (kv_heads) is a llama-style feature; "
                "use arch 'llama' or drop kv_heads"
            )
        if not isinstance(self.dropout, (int, float)) or isinstance(self.dropout, bool) or not 0 <= self.dropout < 1:
            raise UserError(f"{where}: dropout must be in [0, 1), got {self.dropout!r}")
        if self.arch == "llama" and not self.mla and self.head_dim % 2:
            raise UserError(f"{where}: rotary embeddings need an even head_dim, got {self.head_dim}")
        self._check_extensions(where)

    def _check_extension_types(self, where: str) -> None:
        """Types of the MoE / MLA / head-width fields, before anything derives from them."""
        for field in (
            "kv_channels",
            "experts",
            "top_k",
            "shared_experts",
            "expert_ffn_hidden",
            "dense_layers",
            "q_lora_rank",
            "kv_lora_rank",
            "rope_head_dim",
            "sliding_window",
            "full_attention_every",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"{where}: {field} must be a non-negative integer, got {value!r}")
            if value > MAX_COUNT:  # exatrain.limits
                raise UserError(f"{where}: {field} must be an integer of at most {MAX_COUNT:,}, got {value}")
        for field in ("qk_norm", "router_bias", "attention_sinks", "linear_bias"):
            if not isinstance(getattr(self, field), bool):
                raise UserError(f"{where}: {field} must be true or false, got {getattr(self, field)!r}")
        if not isinstance(self.moe_every, int) or isinstance(self.moe_every, bool) or self.moe_every < 1:
            raise UserError(f"{where}: moe_every must be a positive integer, got {self.moe_every!r}")
        if not isinstance(self.router, str) or self.router not in ROUTERS:
            raise UserError(f"{where}: unknown router {self.router!r}; use one of {', '.join(ROUTERS)}")

    def _check_extensions(self, where: str) -> None:
        """The MoE / MLA / head-width fields (module doc): ranges and consistency."""
        extended = [f for f, off in EXTENDED_DEFAULTS.items() if getattr(self, f) != off]
        if self.arch != "llama" and extended:
            raise UserError(f"{where}: {', '.join(extended)} describe llama-family models; use arch 'llama'")
        if self.experts == 0:
            moe_only = [
                f
                for f in (
                    "top_k",
                    "shared_experts",
                    "expert_ffn_hidden",
                    "dense_layers",
                    "moe_every",
                    "router",
                    "router_bias",
                )
                if getattr(self, f) != EXTENDED_DEFAULTS[f]
            ]
            if moe_only:
                raise UserError(
                    f"{where}: {', '.join(moe_only)} apply to mixture-of-experts models only; set experts > 0"
                )
        else:
            if self.top_k < 1:
                raise UserError(f"{where}: a mixture-of-experts model needs top_k >= 1 (experts per token)")
            if self.top_k > self.experts:
                raise UserError(f"{where}: top_k {self.top_k} exceeds experts {self.experts}")
            if self.dense_layers >= self.layers or self.moe_layers == 0:
                raise UserError(
                    f"{where}: dense_layers {self.dense_layers} and moe_every {self.moe_every} leave "
                    f"no MoE layer among {self.layers}; lower them or set experts = 0"
                )
        if self.full_attention_every and not self.sliding_window:
            raise UserError(
                f"{where}: full_attention_every applies to sliding-window models only; set sliding_window > 0"
            )
        if self.mla:
            if self.rope_head_dim < 2 or self.rope_head_dim % 2:
                raise UserError(
                    f"{where}: multi-head latent attention needs an even rope_head_dim >= 2, got {self.rope_head_dim}"
                )
            if self.kv_heads != self.heads:
                raise UserError(
                    f"{where}: multi-head latent attention has no grouped keys; "
                    f"kv_heads must equal heads ({self.heads})"
                )
            if self.qk_norm:
                raise UserError(f"{where}: qk_norm is not modelled together with multi-head latent attention")
            if self.linear_bias:
                raise UserError(f"{where}: linear_bias is not modelled together with multi-head latent attention")
        elif self.q_lora_rank or self.rope_head_dim:
            raise UserError(
                f"{where}: q_lora_rank and rope_head_dim belong to multi-head latent attention; set kv_lora_rank too"
            )

    # ---- (de)serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """All fields, except the MoE / MLA / head-width ones left at their dense defaults (so a dense
        model's dict is the same as before those fields existed)."""
        d = dataclasses.asdict(self)
        for field, off in EXTENDED_DEFAULTS.items():
            if d[field] == off:
                del d[field]
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "model") -> "ModelSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(
                f"{source}: unknown model field(s) {', '.join(unknown)}; known fields are {', '.join(sorted(known))}"
            )
        missing = [f for f in ("name", "arch", "layers", "hidden", "heads", "seq_len", "vocab") if f not in data]
        if missing:
            raise UserError(f"{source}: missing model field(s) {', '.join(missing)}")
        try:
            return cls(**dict(data))
        except TypeError as exc:  # pragma: no cover - guarded by the field checks above
            raise UserError(f"{source}: {exc}") from None

    def replace(self, **changes: Any) -> "ModelSpec":
        """A copy with some fields changed (e.g. CLI flags overriding a preset)."""
        return dataclasses.replace(self, **changes)


def _load_table_file(path: Path) -> dict[str, Any]:
    """Read a TOML or JSON file into a dict, turning every parse problem into a UserError."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = _toml_loads(text)
    except (ValueError, TypeError) as exc:
        raise UserError(
            f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'TOML'}: {str(exc).splitlines()[0]}"
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a table/object at the top level")
    return data


def _toml_loads(text: str) -> dict[str, Any]:
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(text)


_PRESETS: dict[str, ModelSpec] | None = None


def model_presets() -> dict[str, ModelSpec]:
    """All built-in models, by name (read once from data/models.toml)."""
    global _PRESETS
    if _PRESETS is None:
        path = Path(__file__).with_name("data") / "models.toml"
        raw = _load_table_file(path)
        _PRESETS = {
            name: ModelSpec.from_dict({"name": name, **fields}, source=f"{path.name}[{name}]")
            for name, fields in raw.get("model", {}).items()
        }
    return dict(_PRESETS)


def get_model(name: str) -> ModelSpec:
    presets = model_presets()
    if name not in presets:
        close = [n for n in presets if name.lower() in n or n in name.lower()]
        hint = f" (did you mean {', '.join(close[:3])}?)" if close else ""
        raise UserError(
            f"unknown model preset {name!r}{hint}; `exatrain models` lists them, "
            "or describe one with --model-file / --layers --hidden --heads ..."
        )
    return presets[name]
