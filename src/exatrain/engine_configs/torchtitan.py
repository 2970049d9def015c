"""torchtitan configurations for a plan: a TOML job file for torchtitan v0.2.2 (``--for torchtitan``) and the
command line of torchtitan 0.3 (``--for torchtitan-0.3``), each building the model that was planned.

torchtitan v0.2.2 (73a0e697, 2026-02-20) is the last release that reads TOML job files: keys checked against
torchtitan/config/job_config.py (sections and fields), torchtitan/distributed/pipeline_parallel.py
(module_fqns_per_model_part, microbatches = local_batch_size / pipeline_parallel_microbatch_size, looped stage
placement), torchtitan/train.py (gradient accumulation = global_batch_size / (local_batch_size x dp); the model
built from ``train_spec.model_args[model.flavor]`` on the meta device), torchtitan/models/llama3/infra/parallelize.py
(DDP only as the sole parallelism; TP always shards the norms = sequence parallel), the same job_config.py for
parallelism.context_parallel_degree, parallelism.expert_parallel_degree and expert_tensor_parallel_degree
(etp = tp: ep inside dp_shard*cp, cp | ep; etp = 1: ep over all of tp and cp and part of dp_shard, tp*cp | ep;
torchtitan/distributed/parallel_dims.py ParallelDims._validate) and quantize.linear.float8 (recipe_name tensorwise
/ rowwise; torchao Float8Linear, swapped in by the model converter "quantize.linear.float8").

torchtitan 0.3.0 (the PyPI release of 2026) reads no job file: torchtitan/config/manager.py ConfigManager takes
``--module FAMILY --config FUNCTION`` (a function of ``torchtitan.models.FAMILY.config_registry`` that returns the
whole Trainer.Config, the model included) and then command-line overrides parsed by tyro, spelt
``--section.field-name`` (dashes), with the activation checkpointing policy a subcommand that comes last
(``activation-checkpoint:full``); torchtitan/config/configs.py (TrainingConfig, ParallelismConfig, CompileConfig),
torchtitan/distributed/parallel_dims.py (no expert-tensor parallelism: experts whole, ep | dp_shard*cp*tp), and
torchtitan/distributed/activation_checkpoint.py (FullAC, SelectiveAC: per-op only). The model comes only from a
config function, so a model without one is refused in one line.

The model families (torchtitan/models/*/__init__.py at both releases): llama3 (dense, untied, the FFN width from
multiple_of and ffn_dim_multiplier), qwen3 (a head width of its own, QK-norm, tied or untied, dense or a MoE layer in
every layer), deepseek_v3 (latent attention, leading dense layers, shared experts, sigmoid routing) and gpt_oss
(sliding windows every other layer, attention sinks, biases). A model none of them builds — GPT-2-style models
among them — is refused in one line; one they build but ship no flavor of gets, for v0.2.2, the model arguments to
register as that flavor (in the header, and a note).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from exatrain.accounting.engines import get_engine
from exatrain.catalog.models import ModelSpec
from exatrain.engine_configs.common import Export, Flag, FlagGroup, summary
from exatrain.engine_configs.megatron import render_arrays
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.settings import cp_comm_for, setting_notes

TORCHTITAN_SOURCE = "pytorch/torchtitan@v0.2.2"
TORCHTITAN_03 = "torchtitan 0.3.0"
RELEASES = ("0.2.2", "0.3.0")
# exatrain schedule -> torch.distributed.pipelining schedule name (get_schedule_class)
SCHEDULE_NAMES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved": "Interleaved1F1B",
    "zero_bubble": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}
# Where each family's flavors live (v0.2.2: a dict of model arguments in torchtitan/models/FAMILY/__init__.py)
FLAVOR_DICTS = {
    "llama3": ("llama3_args", "TransformerModelArgs"),
    "qwen3": ("qwen3_args", "Qwen3ModelArgs"),
    "deepseek_v3": ("deepseekv3_args", "DeepSeekV3ModelArgs"),
    "gpt_oss": ("gptoss_configs", "GptOssModelArgs"),
}
# The output projection's module name: v0.2.2's models call it "output", 0.3's decoders "lm_head"
HEAD_MODULE = {"0.2.2": "output", "0.3.0": "lm_head"}


@dataclass(frozen=True)
class Flavor:
    """A model torchtitan ships: its family and flavor name, the model as a ModelSpec (the shape and the
    rope_theta / norm_eps the flavor sets), whether its MoE keeps a per-expert balancing bias (a buffer, set
    by load_balance_coeff), and torchtitan 0.3's config function for it ("" where 0.3 has none)."""

    family: str
    name: str
    model: ModelSpec
    expert_bias: bool = False
    config: str = ""
    config_fp8: str = ""  # the float8 recipe 0.3's config function converts the model's linear layers to


def _llama(name: str, **f: Any) -> ModelSpec:
    return ModelSpec(name=name, arch="llama", seq_len=8192, **f)


# Recorded from torchtitan v0.2.2's torchtitan/models/{llama3,qwen3,deepseek_v3,gpt_oss}/__init__.py (the same
# flavors are 0.3.0's model_registry entries) and 0.3.0's config_registry.py functions; the debug models left out.
# llama3's widths are its FeedForward's: int(2*4*dim/3) x ffn_dim_multiplier, rounded up to multiple_of.
_MOE_QWEN = dict(router="softmax", shared_experts=0, dense_layers=0)
FLAVORS: tuple[Flavor, ...] = (
    Flavor(
        "llama3",
        "8B",
        _llama("8B", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, rope_theta=500000.0),
        config="llama3_8b",
    ),
    Flavor(
        "llama3",
        "70B",
        _llama(
            "70B", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256, rope_theta=500000.0
        ),
        config="llama3_70b",
    ),
    Flavor(
        "llama3",
        "405B",
        _llama(
            "405B", layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256, rope_theta=500000.0
        ),
        config="llama3_405b",
        config_fp8="current",
    ),
    *(
        Flavor(
            "qwen3",
            name,
            _llama(
                name,
                layers=layers,
                hidden=dim,
                heads=heads,
                kv_heads=8,
                kv_channels=128,
                ffn_hidden=ffn,
                vocab=151936,
                qk_norm=True,
                tied_embeddings=tied,
                rope_theta=1000000.0,
                norm_eps=1e-6,
            ),
            config=config,
        )
        for name, layers, dim, heads, ffn, tied, config in (
            ("0.6B", 28, 1024, 16, 3072, True, "qwen3_0_6b"),
            ("1.7B", 28, 2048, 16, 6144, True, "qwen3_1_7b"),
            ("4B", 36, 2560, 32, 9728, True, ""),
            ("8B", 36, 4096, 32, 12288, False, ""),
            ("14B", 40, 5120, 40, 17408, False, "qwen3_14b"),
            ("32B", 64, 5120, 64, 25600, False, "qwen3_32b"),
        )
    ),
    Flavor(
        "qwen3",
        "30B-A3B",
        _llama(
            "30B-A3B",
            layers=48,
            hidden=2048,
            heads=32,
            kv_heads=4,
            kv_channels=128,
            ffn_hidden=6144,
            vocab=151936,
            qk_norm=True,
            rope_theta=1000000.0,
            norm_eps=1e-6,
            experts=128,
            top_k=8,
            expert_ffn_hidden=768,
        ),
        expert_bias=True,
        config="qwen3_30b_a3b",
    ),
    Flavor(
        "qwen3",
        "235B-A22B",
        _llama(
            "235B-A22B",
            layers=94,
            hidden=4096,
            heads=64,
            kv_heads=4,
            kv_channels=128,
            ffn_hidden=12288,
            vocab=151936,
            qk_norm=True,
            rope_theta=5000000.0,
            norm_eps=1e-6,
            experts=128,
            top_k=8,
            expert_ffn_hidden=1536,
        ),
        expert_bias=True,
    ),
    Flavor(
        "deepseek_v3",
        "16B",
        _llama(
            "16B",
            layers=27,
            hidden=2048,
            heads=16,
            kv_channels=128,
            ffn_hidden=10944,
            vocab=102400,
            kv_lora_rank=512,
            rope_head_dim=64,
            experts=64,
            top_k=6,
            shared_experts=2,
            expert_ffn_hidden=1408,
            dense_layers=1,
        ),
        expert_bias=True,
        config="deepseek_v3_16b",
    ),
    Flavor(
        "deepseek_v3",
        "236B",
        _llama(
            "236B",
            layers=60,
            hidden=5120,
            heads=128,
            kv_channels=128,
            ffn_hidden=12288,
            vocab=102400,
            q_lora_rank=1536,
            kv_lora_rank=512,
            rope_head_dim=64,
            experts=160,
            top_k=6,
            shared_experts=2,
            expert_ffn_hidden=1536,
            dense_layers=1,
        ),
        expert_bias=True,
    ),
    Flavor(
        "deepseek_v3",
        "671B",
        _llama(
            "671B",
            layers=61,
            hidden=7168,
            heads=128,
            kv_channels=128,
            ffn_hidden=18432,
            vocab=129280,
            q_lora_rank=1536,
            kv_lora_rank=512,
            rope_head_dim=64,
            experts=256,
            top_k=8,
            shared_experts=1,
            expert_ffn_hidden=2048,
            dense_layers=3,
            router="sigmoid",
            router_bias=True,
        ),
        expert_bias=True,
        config="deepseek_v3_671b",
    ),
    *(
        Flavor(
            "gpt_oss",
            name,
            _llama(
                name,
                layers=layers,
                hidden=2880,
                heads=64,
                kv_heads=8,
                kv_channels=64,
                ffn_hidden=2880,
                vocab=201088,
                rope_theta=150000.0,
                experts=experts,
                top_k=4,
                expert_ffn_hidden=2880,
                sliding_window=128,
                full_attention_every=2,
                attention_sinks=True,
                linear_bias=True,
            ),
            expert_bias=True,
            config=config,
        )
        for name, layers, experts, config in (("20b", 24, 32, "gpt_oss_20b"), ("120b", 36, 128, "gpt_oss_120b"))
    ),
)


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


def registered_model(line: str, seq_len: int) -> tuple[str, str, ModelSpec]:
    """(family, flavor, model) of a v0.2.2 registration line as ``flavor_snippet`` writes it (``TABLE[NAME] =
    ARGS(field=literal, ..., moe_args=MoEArgs(...))``), each family's fields and defaults as its model/args.py and
    models/moe/moe.py (MoEArgs) give them; UserError for a line of another form."""
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

        a = kwargs(call)
    except (SyntaxError, ValueError, KeyError, AttributeError, IndexError, TypeError):
        raise UserError(
            f"not a torchtitan flavor registration ({', '.join(t for t in tables)}[NAME] = "
            f"...Args(...)): {line.strip()[:80]}"
        ) from None
    moe = a.get("moe_args") or {}
    base = dict(
        name=str(flavor),
        arch="llama",
        seq_len=seq_len,
        vocab=a.get("vocab_size", 128256),
        hidden=a.get("dim", 4096),
        norm_eps=float(a.get("norm_eps", 1e-5)),
        rope_theta=float(a.get("rope_theta", 10000.0)),
    )

    def width(head_dim: int, heads: int) -> int:  # a head width of its own, or 0: hidden/heads (ModelSpec's form)
        return head_dim if head_dim != base["hidden"] // heads or base["hidden"] % heads else 0

    routed = (
        dict(
            experts=moe.get("num_experts", 8),
            top_k=moe.get("top_k", 1),
            shared_experts=moe.get("num_shared_experts", 1),
            router=moe.get("score_func", "sigmoid"),
            router_bias=moe.get("load_balance_coeff", 1e-3) is not None,
        )
        if moe
        else {}
    )
    if family == "llama3":  # FeedForward: int(2*4*dim/3) x ffn_dim_multiplier, rounded up to multiple_of
        width = int(2 * 4 * base["hidden"] / 3)
        if a.get("ffn_dim_multiplier") is not None:
            width = int(a["ffn_dim_multiplier"] * width)
        multiple = a.get("multiple_of", 256)
        model = ModelSpec(
            layers=a.get("n_layers", 32),
            heads=a.get("n_heads", 32),
            kv_heads=a.get("n_kv_heads") or 0,
            ffn_hidden=multiple * -(-width // multiple),
            **base,
        )
    elif family == "qwen3":
        layers = dict(
            layers=a.get("n_layers", 28),
            heads=a.get("n_heads", 16),
            kv_heads=a.get("n_kv_heads", 8),
            kv_channels=width(a.get("head_dim", 128), a.get("n_heads", 16)),
            ffn_hidden=a.get("hidden_dim", 3072),
            qk_norm=a.get("qk_norm", True),
            tied_embeddings=a.get("enable_weight_tying", False),
        )
        moe_layers = dict(expert_ffn_hidden=a.get("moe_inter_dim", 768), **routed) if a.get("moe_enabled") else {}
        model = ModelSpec(**layers, **moe_layers, **base)
    elif family == "deepseek_v3":
        if a.get("qk_nope_head_dim", 128) != a.get("v_head_dim", 128):
            raise UserError(
                f"{flavor}: query/key head width {a.get('qk_nope_head_dim')} and value width "
                f"{a.get('v_head_dim')} differ: not modelled (one head_dim)"
            )
        model = ModelSpec(
            layers=a.get("n_layers", 27),
            heads=a.get("n_heads", 16),
            kv_channels=a.get("qk_nope_head_dim", 128),
            ffn_hidden=a.get("inter_dim", 10944),
            q_lora_rank=a.get("q_lora_rank", 0),
            kv_lora_rank=a.get("kv_lora_rank", 512),
            rope_head_dim=a.get("qk_rope_head_dim", 64),
            expert_ffn_hidden=a.get("moe_inter_dim", 1408),
            dense_layers=a.get("n_dense_layers", 1),
            **routed,
            **base,
        )
    else:  # gpt_oss: windows on every other layer, sinks and biases are the family's own
        model = ModelSpec(
            layers=a.get("n_layers", 24),
            heads=a.get("n_heads", 64),
            kv_heads=a.get("n_kv_heads", 8),
            kv_channels=width(a.get("head_dim", 64), a.get("n_heads", 64)),
            ffn_hidden=a.get("moe_inter_dim", 2880),
            expert_ffn_hidden=a.get("moe_inter_dim", 2880),
            sliding_window=a.get("sliding_window_size", 128),
            full_attention_every=2,
            attention_sinks=True,
            linear_bias=True,
            **routed,
            **base,
        )
    return family, str(flavor), model


def flavor_model(family: str, flavor: str) -> ModelSpec | None:
    """The recorded built-in flavor (FLAVORS) as a ModelSpec, or None."""
    return next((f.model for f in FLAVORS if f.family == family and f.name == flavor), None)


def model_parts(plan: Plan, head: str = "output") -> list[list[str]]:
    """Module names of each virtual stage in model order (tok_embeddings, layers.i, norm and the output
    projection ``head``: HEAD_MODULE); torchtitan places part k on pipeline rank k % pp, or in a V for ZBVZeroBubble
    and DualPipeV (rank r: parts r and 2 pp - 1 - r), as the plan does."""
    parts: list[list[str]] = []
    first = 0
    for n in plan.layers_per_stage():
        parts.append([f"layers.{i}" for i in range(first, first + n)])
        first += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", head]
    return parts


def _model_section(plan: Plan) -> tuple[dict[str, Any], list[str], str]:
    """([model] for v0.2.2, notes, the registration line or "" for a built-in flavor)."""
    m = plan.model
    family = model_family(m)
    flavor = builtin_flavor(m, "0.2.2")
    if flavor is not None:
        return {"name": family, "flavor": flavor.name}, flavor_notes(m, flavor), ""
    table = FLAVOR_DICTS[family][0]
    return (
        {"name": family, "flavor": m.name},
        [
            f"torchtitan v0.2.2 ships no {family} flavor of {m.name}: register it as the header says "
            f"(torchtitan/models/{family}/__init__.py, {table})"
        ],
        flavor_snippet(m),
    )


def torchtitan_config(plan: Plan, release: str = "0.2.2") -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """(sections, notes): the job config as nested dicts in v0.2.2's section and field names, and what it cannot
    express exactly; ``release`` "0.3.0" gives the fields torchtitan 0.3 takes on its command line instead
    (``torchtitan_03_args`` spells them), a model section of its --module and --config."""
    m = plan.model
    if plan.dtype == "float16":  # training.mixed_precision_param is bfloat16 or float32, and there is no loss scaler
        raise UserError(
            "torchtitan trains in bfloat16 or float32, not float16 (it has no loss scaling): export this "
            "plan for megatron or deepspeed, or plan it with --dtype bfloat16"
        )
    v03 = release == "0.3.0"
    model, notes, _ = _model_section_03(plan) if v03 else _model_section(plan)
    only_dp = plan.tp == 1 and plan.pp == 1
    reshard: str | None = None
    if plan.dp == 1:
        replicate, shard = 1, 1
    elif plan.zero_stage == 0 and only_dp and plan.ep == 1:
        replicate, shard = plan.dp, 1  # plain DDP (expert parallelism shards its experts' gradients: FSDP)
    else:
        replicate, shard = 1, plan.dp
        reshard = "always" if plan.zero_stage == 3 else "never"
        if plan.zero_stage in (1, 2):
            notes.append(
                f"torchtitan has no ZeRO-{plan.zero_stage}: FSDP2 over dp with reshard_after_forward "
                "'never' shards weights, gradients and optimizer states at rest and gathers the "
                "weights once per step (ZeRO-2's traffic, ZeRO-3's resting memory)"
            )
        elif plan.zero_stage == 0:
            notes.append("torchtitan runs DDP only as the sole parallelism; with tp/pp the dp dimension is FSDP2")
    if plan.tp > 1 and not plan.sequence_parallel and not v03:
        notes.append("torchtitan's tensor parallelism always shards the norms over tp (sequence parallel on)")
    if plan.recompute == "selective":
        notes.append(
            "torchtitan's selective checkpointing is per operator ("
            + ("SelectiveAC" if v03 else "selective_ac_option 'op'")
            + ": matmul outputs kept), not Megatron's attention-core recompute"
        )
    if plan.dtype == "bfloat16" and shard == 1 and not only_dp:
        notes.append(
            "torchtitan applies mixed_precision_param through FSDP (dp > 1) or DDP-only autocast; "
            "this layout has neither, so it trains in float32 unless training.dtype is set"
        )
    pipelined = plan.pp > 1
    training = {
        # per dp rank and step: all of a pipeline's micro-batches, or one accumulation micro-batch
        "local_batch_size": plan.micro_batch * (plan.num_microbatches if pipelined else 1),
        "global_batch_size": plan.global_batch,
        "seq_len": m.seq_len,
        "mixed_precision_param": plan.dtype,
        "mixed_precision_reduce": "float32",
    }
    if plan.offload == "params":  # FSDP2's CPUOffloadPolicy (v0.2.2 job_config.py Training; 0.3's too)
        training["enable_cpu_offload"] = True
    if v03 and (pipelined or plan.ep > 1):  # 0.3 captures CUDA graphs by default, which it refuses with a
        # pipeline or its standard expert-parallel dispatcher (trainer.py Config._validate_cuda_graphs)
        training["disable_cuda_graphs"] = True
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
    }
    if reshard is not None:
        par["fsdp_reshard_after_forward"] = reshard
    par["tensor_parallel_degree"] = plan.tp
    if v03 and plan.tp > 1:  # 0.3 can leave the norms whole (ParallelismConfig.enable_sequence_parallel)
        par["enable_sequence_parallel"] = plan.sequence_parallel
    par["pipeline_parallel_degree"] = plan.pp
    if pipelined:
        if plan.schedule not in SCHEDULE_NAMES:  # zbh1: torchtitan runs a multi-stage class over >= 2 stages a rank
            raise UserError(
                "torchtitan has no one-chunk zero-bubble schedule (it runs InterleavedZeroBubble over 2 "
                "or more stages a rank): export the plan with --schedule zero_bubble --interleave 2 or "
                "--schedule zbv, or for exatrain's trainer"
            )
        par["pipeline_parallel_schedule"] = SCHEDULE_NAMES[plan.schedule]
        par["pipeline_parallel_microbatch_size"] = plan.micro_batch
        par["module_fqns_per_model_part"] = model_parts(plan, HEAD_MODULE[release])
    par["context_parallel_degree"] = plan.cp
    if plan.cp > 1 and not v03:  # the exchange priced (cost.context.cp_exposed_s): torch's rotate method
        comm = cp_comm_for("torchtitan", plan.cp_comm, plan.model)
        par["context_parallel_rotate_method"] = {"all_gather": "allgather", "p2p": "alltoall"}[comm]
    if plan.model.is_moe:
        par["expert_parallel_degree"] = plan.ep
        if v03 and plan.ep > 1 and (plan.dp * plan.cp * plan.tp) % plan.ep:
            raise UserError(
                f"torchtitan 0.3 spreads ep over dp x cp x tp = {plan.dp * plan.cp * plan.tp} ranks "
                f"(parallel_dims.py efsdp), which ep {plan.ep} does not divide"
            )
        if v03:
            pass  # no expert-tensor parallelism: experts whole on each rank, as priced
        elif plan.ep > 1 and plan.ep % (plan.tp * plan.cp) == 0:
            par["expert_tensor_parallel_degree"] = 1  # ep takes all of tp and cp: experts whole, as priced
        elif plan.ep > 1 and plan.tp > 1:
            par["expert_tensor_parallel_degree"] = plan.tp
            notes.append(
                f"torchtitan runs ep {plan.ep} inside dp with its experts split over tp "
                f"(expert_tensor_parallel_degree {plan.tp}); the estimate priced them whole on each rank"
            )
    quant: dict[str, Any] = {}
    if plan.fp8 and v03 and builtin_flavor(m, "0.3.0").config_fp8 == plan.fp8:
        pass  # the config function's own float8 converter: what the plan priced
    elif plan.fp8 and v03:
        notes.append(
            "torchtitan 0.3 has no command-line switch for float8 GEMMs (its float8 converters come with "
            "config functions): this command line trains without the plan's FP8"
        )
    elif plan.fp8:
        recipe = {"current": "tensorwise", "block": "rowwise"}.get(plan.fp8, "tensorwise")
        quant = {"recipe_name": recipe}
        if plan.fp8_param_gather:
            # FSDP's all-gather in float8 is torchtitan's tensorwise path without a recipe name (v0.2.2
            # components/quantization/float8.py asserts the two are not set together), with the scales
            # precomputed once a step for the sharded weights
            quant = {"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True}
        if plan.fp8 in ("delayed", "mxfp8", "block"):
            notes.append(
                f"torchtitan's float8 has no {plan.fp8!r} scaling: this config uses its {recipe} "
                "recipe (per-tensor current scales, or per-row for the block recipe), which the "
                "plan's estimate did not price"
            )
    # torch.compile per block is what --elementwise fused priced, and the compiled loss what --cross-entropy
    # fused (torchtitan's own with compiled blocks) priced; eager otherwise
    components = [
        c
        for c, on in (
            ("model", plan.elementwise == "fused"),
            ("loss", get_engine("torchtitan").cross_entropy(plan.cross_entropy, plan.elementwise) == "fused"),
        )
        if on
    ]
    ac: dict[str, Any] = {"mode": plan.recompute}
    if plan.recompute == "selective":
        ac["selective_ac_option"] = "op"
    elif plan.recompute == "full" and plan.recompute_every and not v03:  # layer-level: every Nth block whole
        ac = {"mode": "selective", "selective_ac_option": str(plan.recompute_every)}
    sections = {
        **({} if v03 else {"job": {"description": f"exatrain plan: {summary(plan)}"}}),
        "model": {**model, **({"converters": ["quantize.linear.float8"]} if quant else {})},
        "training": training,
        "parallelism": par,
        "activation_checkpoint": ac,
        "compile": {
            "enable": bool(components),
            **({"components": components} if components else {}),
            # 0.3: async TP compiles the model; a config function that turns it on (llama3_405b) would
            # refuse a command line that turns compiling off (CompileConfig's check)
            **({"enable_async_tensor_parallel": False} if v03 and not components else {}),
        },
        **({"quantize.linear.float8": quant} if quant else {}),
        # Adam's kernel as the plan priced it (settings.ADAM_KERNELS; torchtitan's default: fused)
        **({"optimizer": {"implementation": plan.adam_kernel}} if plan.adam_kernel else {}),
        # round-robin routing, as the plan priced it (torchtitan/config/job_config.py Debug)
        **({"debug": {"moe_force_load_balance": True}} if plan.moe_force_balance else {}),
    }
    return sections, (*notes, *setting_notes(plan, "torchtitan-0.3" if v03 else "torchtitan"))


def _model_section_03(plan: Plan) -> tuple[dict[str, Any], list[str], str]:
    """(--module and --config of torchtitan 0.3, notes, ""), or UserError where 0.3 has no config function that
    builds the plan's model."""
    m = plan.model
    flavor = builtin_flavor(m, "0.3.0")
    if flavor is None:
        there = builtin_flavor(m, "0.2.2")
        has = f"; it has the {there.family} {there.name} model but no config function for it" if there else ""
        functions = ", ".join(f.config for f in FLAVORS if f.config)
        raise UserError(
            f"torchtitan 0.3 builds only the models of its config functions ({functions}), and "
            f"{m.name} is none of them{has}: use --for torchtitan (v0.2.2, whose flavor you can "
            "register) or --for megatron"
        )
    notes = flavor_notes(m, flavor)
    if flavor.config_fp8 and plan.fp8 != flavor.config_fp8:  # model converters are not on the command line
        notes.append(
            f"torchtitan 0.3's {flavor.config} converts the linear layers to float8 ({flavor.config_fp8} "
            "scaling), which its command line cannot undo: the plan priced "
            + (f"{plan.fp8} scaling" if plan.fp8 else f"{plan.dtype} GEMMs")
        )
    return {"module": flavor.family, "config": flavor.config}, notes, ""


def render_torchtitan(plan: Plan) -> Export:
    """The v0.2.2 TOML job file."""
    sections, notes = torchtitan_config(plan)
    _, _, register = _model_section(plan)
    lines = [
        f"# torchtitan job config for {summary(plan)}.",
        "# Rendered by `exatrain export-config --for torchtitan` for torchtitan v0.2.2 (the last release that reads",
        f"# TOML job files; keys checked against {TORCHTITAN_SOURCE} torchtitan/config/job_config.py; torchtitan 0.3:",
        "# --for torchtitan-0.3). Run: ./run_train.sh --job.config_file <this file>",
        f"# (world size {plan.gpus} = dp x tp x pp"
        + (" x cp" if plan.cp > 1 else "")
        + "). Add your dataset, optimizer and checkpoint sections.",
    ]
    if register:
        family = sections["model"]["name"]
        lines += [f"# Register the model as a flavor in torchtitan/models/{family}/__init__.py:", f"#   {register}"]
    lines += [f"# note: {n}" for n in notes]
    for name, fields in sections.items():
        lines += ["", f"[{name}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in fields.items()]
    return Export("torchtitan", "\n".join(lines) + "\n", notes)


def _cli_name(section: str, key: str) -> str:
    """tyro's spelling of a config field: --section.field-name (torchtitan 0.3 config/manager.py)."""
    return f"--{section}.{key}".replace("_", "-")


def torchtitan_03_args(plan: Plan) -> tuple[tuple[FlagGroup, ...], tuple[str, ...]]:
    """torchtitan 0.3's command line for the plan, in flag groups, and its notes (``torchtitan_config`` with
    release "0.3.0", each field spelt as tyro parses it; the checkpointing policy a subcommand, last)."""
    sections, notes = torchtitan_config(plan, "0.3.0")
    model = sections.pop("model")
    ac = sections.pop("activation_checkpoint")
    groups = [
        FlagGroup(
            "MODEL_ARGS",
            "model: a config function of torchtitan.models.<module>.config_registry",
            "torchtitan/config/manager.py (ConfigManager._load_config)",
            (Flag("--module", model["module"]), Flag("--config", model["config"])),
        )
    ]
    titles = {
        "training": ("TRAINING_ARGS", "batch and precision", "torchtitan/config/configs.py (TrainingConfig)"),
        "parallelism": ("PARALLEL_ARGS", "parallel layout", "torchtitan/config/configs.py (ParallelismConfig)"),
        "compile": ("COMPILE_ARGS", "torch.compile", "torchtitan/config/configs.py (CompileConfig)"),
        "optimizer": ("OPTIMIZER_ARGS", "optimizer kernel", "torchtitan/components/optimizer"),
        "debug": ("DEBUG_ARGS", "routing", "torchtitan/config/configs.py (DebugConfig)"),
    }
    for section, fields in sections.items():
        flags: list[Flag] = []
        for key, value in fields.items():
            name = _cli_name(section, key)
            if isinstance(value, bool):  # tyro's paired switches: --x / --no-x
                flags.append(Flag(name if value else name.replace(f"--{section}.", f"--{section}.no-")))
            elif key == "module_fqns_per_model_part":  # one word per model part, its modules comma-separated
                words = [",".join(part) for part in value]
                flags.append(Flag(name, words[0], tuple(words[1:])))
            elif isinstance(value, list):
                flags.append(Flag(name, ",".join(value)))
            else:
                flags.append(Flag(name, str(value)))
        var, title, source = titles[section]
        groups.append(FlagGroup(var, title, source, tuple(flags)))
    policy = {"full": "full", "selective": "selective", "none": "none"}[ac["mode"]]
    groups.append(
        FlagGroup(
            "CHECKPOINT_ARGS",
            "activation checkpointing: a subcommand, after every other option",
            "torchtitan/distributed/activation_checkpoint.py (FullAC, SelectiveAC)",
            (Flag(f"activation-checkpoint:{policy}"),),
        )
    )
    return tuple(groups), notes


def render_torchtitan_03(plan: Plan) -> Export:
    """torchtitan 0.3's command line as bash arrays."""
    groups, notes = torchtitan_03_args(plan)
    header = [
        f"# torchtitan command line for {summary(plan)}.",
        "# Rendered by `exatrain export-config --for torchtitan-0.3` for torchtitan 0.3 (checked against the "
        "0.3.0 release:",
        "# torchtitan/config/manager.py, configs.py); it reads no job file, so this is its command line "
        "(v0.2.2: --for torchtitan).",
        f"# World size {plan.gpus} = dp x tp x pp"
        + (" x cp" if plan.cp > 1 else "")
        + ". Add your dataset, optimizer and checkpoint options before the checkpointing subcommand.",
    ]
    text = render_arrays(
        "TORCHTITAN",
        header,
        groups,
        notes,
        f'{plan.gpus} ranks, e.g. torchrun ... -m torchtitan.train "${{TORCHTITAN_ARGS[@]}}".',
    )
    return Export("torchtitan-0.3", text, notes)


def _toml_value(value: Any) -> str:
    """TOML for the values used here: str, int, bool, and lists of them (JSON's syntax coincides)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML rendering for {type(value).__name__}")


__all__ = [
    "FLAVORS",
    "FLAVOR_DICTS",
    "Flavor",
    "HEAD_MODULE",
    "RELEASES",
    "SCHEDULE_NAMES",
    "TORCHTITAN_SOURCE",
    "TORCHTITAN_03",
    "architecture",
    "builtin_flavor",
    "flavor_model",
    "flavor_notes",
    "flavor_snippet",
    "llama3_ffn_args",
    "model_family",
    "model_parts",
    "registered_model",
    "render_torchtitan",
    "render_torchtitan_03",
    "torchtitan_03_args",
    "torchtitan_config",
]
