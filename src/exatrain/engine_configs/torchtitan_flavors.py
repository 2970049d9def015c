"""The models torchtitan ships, recorded: each family's flavor dict (where v0.2.2 registers a flavor) and every
built-in flavor as a ModelSpec, with torchtitan 0.3's config function for it. Pure data, read by
engine_configs.torchtitan_models (which flavor a plan's model is) and the exports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exatrain.catalog.models import ModelSpec

# Where each family's flavors live (v0.2.2: a dict of model arguments in torchtitan/models/FAMILY/__init__.py)
FLAVOR_DICTS = {
    "llama3": ("llama3_args", "TransformerModelArgs"),
    "qwen3": ("qwen3_args", "Qwen3ModelArgs"),
    "deepseek_v3": ("deepseekv3_args", "DeepSeekV3ModelArgs"),
    "gpt_oss": ("gptoss_configs", "GptOssModelArgs"),
}


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


__all__ = ["FLAVORS", "FLAVOR_DICTS", "Flavor"]
