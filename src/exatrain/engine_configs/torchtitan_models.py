"""Which torchtitan model family and flavor builds a plan's model, and the v0.2.2 flavor registration line for one
torchtitan builds but ships no flavor of (written by ``flavor_snippet``, read back by ``registered_model``).

The families (torchtitan/models/*/__init__.py at both releases): llama3 (dense, untied, the FFN width from
multiple_of and ffn_dim_multiplier), qwen3 (a head width of its own, QK-norm, tied or untied, dense or a MoE layer in
every layer), deepseek_v3 (latent attention, leading dense layers, shared experts, sigmoid routing) and gpt_oss
(sliding windows every other layer, attention sinks, biases). A model none of them builds is refused in one line.
"""

from __future__ import annotations

from typing import Any

from exatrain.catalog.models import ModelSpec
from exatrain.engine_configs.torchtitan_flavors import FLAVOR_DICTS, FLAVORS, Flavor
from exatrain.errors import UserError


def architecture(m: ModelSpec) -> tuple:
    """What makes two models the same network, parameter for parameter (the name, sequence length, rope base,
    norm epsilon and dropout left out; the dense MLP's width only where a layer has one; the router's balancing
    bias left out: torchtitan keeps it as a buffer, which a flavor turns on for every MoE)."""
    dense_width = m.ffn_hidden if m.moe_layers < m.layers else 0
    moe = (
        (m.experts, m.top_k, m.shared_experts, m.expert_width, m.dense_layers, m.moe_every, m.router)
        if m.is_moe
        else ()
    )
    return (
        m.arch,
        m.layers,
        m.hidden,
        m.heads,
        m.kv_heads,
        m.head_dim,
        dense_width,
        m.vocab,
        m.tied_embeddings,
        m.qk_norm,
        moe,
        m.q_lora_rank,
        m.kv_lora_rank,
        m.rope_head_dim,
        m.sliding_window,
        m.full_attention_every,
        m.attention_sinks,
        m.linear_bias,
    )


def model_family(m: ModelSpec) -> str:
    """torchtitan's model family that builds ``m`` (module doc), or UserError naming why none does."""

    def refuse(why: str) -> UserError:
        return UserError(f"torchtitan has no model like {m.name}: {why}; use --for megatron")

    if m.arch == "gpt":
        raise refuse("no GPT-2-style model (learned positions, LayerNorm and biases, GELU MLP, tied head)")
    every_layer_moe = m.is_moe and m.dense_layers == 0 and m.moe_every == 1
    if m.mla:
        if not m.is_moe or m.moe_every != 1:
            raise refuse("its latent-attention model (deepseek_v3) has a MoE layer in every layer after the dense ones")
        return "deepseek_v3"
    if m.sliding_window or m.attention_sinks or m.linear_bias:
        gpt_oss = (
            m.sliding_window
            and m.full_attention_every == 2
            and m.attention_sinks
            and m.linear_bias
            and every_layer_moe
            and not m.shared_experts
            and not m.qk_norm
            and m.router == "softmax"
        )
        if not gpt_oss:
            raise refuse(
                "its only model with sliding windows, attention sinks or biases (gpt_oss) has all three, "
                "a window every other layer and a softmax-routed MoE layer in every layer"
            )
        return "gpt_oss"
    own_width = bool(m.kv_channels) and m.kv_channels != m.hidden // m.heads
    if m.qk_norm or own_width or m.is_moe or m.tied_embeddings or m.hidden % m.heads:
        if m.is_moe and not every_layer_moe:
            raise refuse("its MoE models without latent attention (qwen3) have a MoE layer in every layer")
        return "qwen3"
    return "llama3"


def builtin_flavor(m: ModelSpec, release: str = "0.2.2") -> Flavor | None:
    """The torchtitan flavor that is ``m``'s network (``architecture``), in ``release``'s terms: 0.3.0 needs a
    config function for it; None when there is none."""
    family, arch = model_family(m), architecture(m)
    for f in FLAVORS:
        if f.family == family and architecture(f.model) == arch and (release == "0.2.2" or f.config):
            return f
    return None


def flavor_notes(m: ModelSpec, flavor: Flavor) -> list[str]:
    """What a built-in flavor sets differently from the plan's model without changing a parameter."""
    notes = [
        f"torchtitan's {flavor.family} {flavor.name} sets {field} {theirs:g}; the plan's model has {ours:g} "
        "(the parameter count is the same)"
        for field, theirs, ours in (
            ("rope_theta", flavor.model.rope_theta, m.rope_theta),
            ("norm_eps", flavor.model.norm_eps, m.norm_eps),
        )
        if theirs != ours
    ]
    if m.is_moe and flavor.expert_bias and not m.router_bias:
        notes.append(
            f"torchtitan's {flavor.family} {flavor.name} balances its experts with a per-expert bias on the "
            "router scores (load_balance_coeff), which the plan's model does not have"
        )
    return notes


def llama3_ffn_args(dim: int, width: int) -> tuple[int, float]:
    """(multiple_of, ffn_dim_multiplier) that make torchtitan's llama3 FeedForward exactly ``width``
    wide: it takes int(2*4*dim/3), scales by the multiplier (truncating) and rounds up to a multiple
    of multiple_of (llama3/model/model.py FeedForward). The product lands on width or width-1, so a
    multiple_of >= 2 that divides width rounds it to width."""
    base = int(2 * (4 * dim) / 3)
    multiple = width & -width  # largest power of two dividing width
    multiple = min(multiple, 1024) if multiple >= 2 else width
    return multiple, width / base


def _moe_args(m: ModelSpec, **extra: Any) -> str:
    """torchtitan's MoEArgs for ``m`` (torchtitan/models/moe/moe.py): the balancing bias buffer exactly where the
    model routes with one (load_balance_coeff; None turns it off)."""
    fields = dict(
        num_experts=m.experts,
        num_shared_experts=m.shared_experts,
        top_k=m.top_k,
        score_func=m.router,
        route_norm=True,
        score_before_experts=False,
        **extra,
        load_balance_coeff=1e-3 if m.router_bias else None,
    )
    return "MoEArgs(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def flavor_snippet(m: ModelSpec, flavor: str = "") -> str:
    """The v0.2.2 model arguments to register as ``flavor`` (default the model's name) in its family's flavor dict
    (FLAVOR_DICTS; field names from each family's model/args.py)."""
    family = model_family(m)
    table, cls = FLAVOR_DICTS[family]
    if family == "llama3":
        multiple, mult = llama3_ffn_args(m.hidden, m.ffn_hidden)
        args = dict(
            dim=m.hidden,
            n_layers=m.layers,
            n_heads=m.heads,
            n_kv_heads=m.kv_heads,
            vocab_size=m.vocab,
            multiple_of=multiple,
            ffn_dim_multiplier=mult,
            norm_eps=m.norm_eps,
            rope_theta=m.rope_theta,
        )
    elif family == "qwen3":
        args = dict(
            dim=m.hidden,
            n_layers=m.layers,
            n_heads=m.heads,
            n_kv_heads=m.kv_heads,
            vocab_size=m.vocab,
            head_dim=m.head_dim,
            hidden_dim=m.ffn_hidden,
            norm_eps=m.norm_eps,
            rope_theta=m.rope_theta,
            qk_norm=m.qk_norm,
            enable_weight_tying=m.tied_embeddings,
        )
        if m.is_moe:
            args.update(moe_enabled=True, moe_inter_dim=m.expert_width)
    elif family == "deepseek_v3":
        args = dict(
            vocab_size=m.vocab,
            dim=m.hidden,
            inter_dim=m.ffn_hidden,
            moe_inter_dim=m.expert_width,
            n_layers=m.layers,
            n_dense_layers=m.dense_layers,
            n_heads=m.heads,
            norm_eps=m.norm_eps,
            rope_theta=m.rope_theta,
            q_lora_rank=m.q_lora_rank,
            kv_lora_rank=m.kv_lora_rank,
            qk_nope_head_dim=m.head_dim,
            qk_rope_head_dim=m.rope_head_dim,
            v_head_dim=m.head_dim,
        )
    else:  # gpt_oss: alternating windows, sinks and biases are the family's own
        args = dict(
            vocab_size=m.vocab,
            dim=m.hidden,
            moe_inter_dim=m.expert_width,
            n_layers=m.layers,
            norm_eps=m.norm_eps,
            head_dim=m.head_dim,
            n_heads=m.heads,
            n_kv_heads=m.kv_heads,
            sliding_window_size=m.sliding_window,
            rope_theta=m.rope_theta,
        )
    text = ", ".join(f"{k}={v!r}" for k, v in args.items())
    if m.is_moe:
        text += ", moe_args=" + _moe_args(m, **({"gate_bias": True} if family == "gpt_oss" else {}))
    return f"{table}[{(flavor or m.name)!r}] = {cls}({text})"


def _parse_registration(line: str) -> tuple[str, Any, dict[str, Any]]:
    """(family, flavor name, the call's keyword literals, nested calls as dicts) of ``TABLE[NAME] = ARGS(...)``;
    UserError for a line of another form."""
    import ast

    tables = {table: (family, cls) for family, (table, cls) in FLAVOR_DICTS.items()}
    try:
        stmt = ast.parse(line.strip()).body[0]
        target, call = stmt.targets[0], stmt.value  # type: ignore[attr-defined]
        family, cls = tables[target.value.id]
        flavor = ast.literal_eval(target.slice)
        if call.func.id != cls:
            raise ValueError(call.func.id)

        def kwargs(node: ast.Call) -> dict[str, Any]:
            return {
                k.arg: kwargs(k.value) if isinstance(k.value, ast.Call) else ast.literal_eval(k.value)
                for k in node.keywords
            }

        return family, flavor, kwargs(call)
    except (SyntaxError, ValueError, KeyError, AttributeError, IndexError, TypeError):
        raise UserError(
            f"not a torchtitan flavor registration ({', '.join(t for t in tables)}[NAME] = "
            f"...Args(...)): {line.strip()[:80]}"
        ) from None


def _routed_fields(moe: dict[str, Any]) -> dict[str, Any]:
    """ModelSpec's routing fields from MoEArgs' literals and defaults (models/moe/moe.py); {} for no MoEArgs."""
    if not moe:
        return {}
    return dict(
        experts=moe.get("num_experts", 8),
        top_k=moe.get("top_k", 1),
        shared_experts=moe.get("num_shared_experts", 1),
        router=moe.get("score_func", "sigmoid"),
        router_bias=moe.get("load_balance_coeff", 1e-3) is not None,
    )


def _own_head_width(hidden: int, head_dim: int, heads: int) -> int:
    """A head width of its own, or 0: hidden/heads (ModelSpec's form)."""
    return head_dim if head_dim != hidden // heads or hidden % heads else 0


def _llama3_model(a: dict[str, Any], base: dict[str, Any]) -> ModelSpec:
    """llama3's TransformerModelArgs; FeedForward: int(2*4*dim/3) x ffn_dim_multiplier, rounded up to
    multiple_of."""
    width = int(2 * 4 * base["hidden"] / 3)
    if a.get("ffn_dim_multiplier") is not None:
        width = int(a["ffn_dim_multiplier"] * width)
    multiple = a.get("multiple_of", 256)
    return ModelSpec(
        layers=a.get("n_layers", 32),
        heads=a.get("n_heads", 32),
        kv_heads=a.get("n_kv_heads") or 0,
        ffn_hidden=multiple * -(-width // multiple),
        **base,
    )


def _qwen3_model(a: dict[str, Any], base: dict[str, Any]) -> ModelSpec:
    """qwen3's Qwen3ModelArgs: a head width of its own, QK-norm, tying, and a MoE layer in every layer or none."""
    layers = dict(
        layers=a.get("n_layers", 28),
        heads=a.get("n_heads", 16),
        kv_heads=a.get("n_kv_heads", 8),
        kv_channels=_own_head_width(base["hidden"], a.get("head_dim", 128), a.get("n_heads", 16)),
        ffn_hidden=a.get("hidden_dim", 3072),
        qk_norm=a.get("qk_norm", True),
        tied_embeddings=a.get("enable_weight_tying", False),
    )
    routed = _routed_fields(a.get("moe_args") or {})
    moe_layers = dict(expert_ffn_hidden=a.get("moe_inter_dim", 768), **routed) if a.get("moe_enabled") else {}
    return ModelSpec(**layers, **moe_layers, **base)


def _deepseek_v3_model(a: dict[str, Any], base: dict[str, Any], flavor: Any) -> ModelSpec:
    """deepseek_v3's DeepSeekV3ModelArgs; UserError where its query/key and value heads differ in width."""
    if a.get("qk_nope_head_dim", 128) != a.get("v_head_dim", 128):
        raise UserError(
            f"{flavor}: query/key head width {a.get('qk_nope_head_dim')} and value width "
            f"{a.get('v_head_dim')} differ: not modelled (one head_dim)"
        )
    return ModelSpec(
        layers=a.get("n_layers", 27),
        heads=a.get("n_heads", 16),
        kv_channels=a.get("qk_nope_head_dim", 128),
        ffn_hidden=a.get("inter_dim", 10944),
        q_lora_rank=a.get("q_lora_rank", 0),
        kv_lora_rank=a.get("kv_lora_rank", 512),
        rope_head_dim=a.get("qk_rope_head_dim", 64),
        expert_ffn_hidden=a.get("moe_inter_dim", 1408),
        dense_layers=a.get("n_dense_layers", 1),
        **_routed_fields(a.get("moe_args") or {}),
        **base,
    )


def _gpt_oss_model(a: dict[str, Any], base: dict[str, Any]) -> ModelSpec:
    """gpt_oss's GptOssModelArgs: windows on every other layer, sinks and biases are the family's own."""
    return ModelSpec(
        layers=a.get("n_layers", 24),
        heads=a.get("n_heads", 64),
        kv_heads=a.get("n_kv_heads", 8),
        kv_channels=_own_head_width(base["hidden"], a.get("head_dim", 64), a.get("n_heads", 64)),
        ffn_hidden=a.get("moe_inter_dim", 2880),
        expert_ffn_hidden=a.get("moe_inter_dim", 2880),
        sliding_window=a.get("sliding_window_size", 128),
        full_attention_every=2,
        attention_sinks=True,
        linear_bias=True,
        **_routed_fields(a.get("moe_args") or {}),
        **base,
    )


def registered_model(line: str, seq_len: int) -> tuple[str, str, ModelSpec]:
    """(family, flavor, model) of a v0.2.2 registration line as ``flavor_snippet`` writes it (``TABLE[NAME] =
    ARGS(field=literal, ..., moe_args=MoEArgs(...))``), each family's fields and defaults as its model/args.py and
    models/moe/moe.py (MoEArgs) give them; UserError for a line of another form."""
    family, flavor, a = _parse_registration(line)
    base = dict(
        name=str(flavor),
        arch="llama",
        seq_len=seq_len,
        vocab=a.get("vocab_size", 128256),
        hidden=a.get("dim", 4096),
        norm_eps=float(a.get("norm_eps", 1e-5)),
        rope_theta=float(a.get("rope_theta", 10000.0)),
    )
    if family == "llama3":
        model = _llama3_model(a, base)
    elif family == "qwen3":
        model = _qwen3_model(a, base)
    elif family == "deepseek_v3":
        model = _deepseek_v3_model(a, base, flavor)
    else:
        model = _gpt_oss_model(a, base)
    return family, str(flavor), model


def flavor_model(family: str, flavor: str) -> ModelSpec | None:
    """The recorded built-in flavor (FLAVORS) as a ModelSpec, or None."""
    return next((f.model for f in FLAVORS if f.family == family and f.name == flavor), None)


__all__ = [
    "architecture",
    "builtin_flavor",
    "flavor_model",
    "flavor_notes",
    "flavor_snippet",
    "llama3_ffn_args",
    "model_family",
    "registered_model",
]
