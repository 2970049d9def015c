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
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from exatrain.errors import UserError

ARCHS = ("gpt", "llama")


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
        return self.hidden // self.heads

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
        if self.arch == "llama" and self.ffn_hidden <= 0:
            raise UserError(f"{where}: a llama-style model needs ffn_hidden (the SwiGLU width); "
                            "pass --ffn-hidden")
        if not isinstance(self.ffn_hidden, int) or self.ffn_hidden <= 0:
            raise UserError(f"{where}: ffn_hidden must be a positive integer, got {self.ffn_hidden!r}")
        if self.hidden % self.heads:
            raise UserError(f"{where}: hidden {self.hidden} is not divisible by heads {self.heads}; "
                            "choose heads that divide hidden")
        if self.heads % self.kv_heads:
            raise UserError(f"{where}: heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.arch == "gpt" and self.kv_heads != self.heads:
            raise UserError(f"{where}: grouped-query attention (kv_heads) is a llama-style feature; "
                            "use arch 'llama' or drop kv_heads")
        if not isinstance(self.dropout, (int, float)) or isinstance(self.dropout, bool) or not 0 <= self.dropout < 1:
            raise UserError(f"{where}: dropout must be in [0, 1), got {self.dropout!r}")
        if self.arch == "llama" and self.head_dim % 2:
            raise UserError(f"{where}: rotary embeddings need an even head_dim, got {self.head_dim}")

    # ---- (de)serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "model") -> "ModelSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"{source}: unknown model field(s) {', '.join(unknown)}; "
                            f"known fields are {', '.join(sorted(known))}")
        missing = [f for f in ("name", "arch", "layers", "hidden", "heads", "seq_len", "vocab")
                   if f not in data]
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
        raise UserError(f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'TOML'}: "
                        f"{str(exc).splitlines()[0]}") from None
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
        raise UserError(f"unknown model preset {name!r}{hint}; `exatrain models` lists them, "
                        "or describe one with --model-file / --layers --hidden --heads ...")
    return presets[name]


def load_model_file(path: str | Path) -> ModelSpec:
    """A user's model file: TOML or JSON holding the ModelSpec fields (flat, or under [model])."""
    path = Path(path)
    data = _load_table_file(path)
    if "model" in data and isinstance(data["model"], dict):
        data = data["model"]
    data = {"name": path.stem, **data}
    return ModelSpec.from_dict(data, source=str(path))
