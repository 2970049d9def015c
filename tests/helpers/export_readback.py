"""The model an export makes its engine build, read back into a ModelSpec with each engine's defaults, so that
exatrain's own accounting can count it (tests/launch/test_export_params.py) — torch- and engine-free.

Each reader applies the engine's meaning of every flag or field it sees, and its default for one it does not
(facts from the pinned sources): Megatron-LM d98e8a64 (megatron/training/arguments.py,
megatron/core/transformer/transformer_config.py: kv_channels = hidden/heads, num_query_groups = heads without
--group-query-attention, add_bias_linear on unless --disable-bias-linear, softmax_type vanilla, no window; under
latent attention the latents' norms only with --qk-layernorm, gpt_layer_specs.py), Megatron-DeepSpeed 4efb479d
(megatron/arguments.py), torchtitan v0.2.2's model args classes (llama3 TransformerModelArgs, Qwen3ModelArgs,
DeepSeekV3ModelArgs, GptOssModelArgs, MoEArgs) and the flavors recorded in exatrain.engine_configs.torchtitan
(checked against torchtitan itself by scripts/check_exports.py). A combination the ModelSpec cannot describe
raises ValueError: it is not the model exatrain planned.
"""

from __future__ import annotations

import ast
import math
import re
import subprocess
import tomllib
from pathlib import Path

from exatrain.catalog.models import ModelSpec
from exatrain.engine_configs.torchtitan import FLAVORS


def bash_array(text: str, name: str, cwd: Path) -> list[str]:
    """The words of a bash array after bash itself sources the rendered text (in ``cwd``)."""
    script = cwd / "export.sh"
    script.write_text(text)
    out = subprocess.run(
        ["bash", "-c", f'set -eu; source "$1" >/dev/null; printf "%s\\n" "${{{name}[@]}}"', "x", str(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.splitlines()


def options(argv: list[str]) -> dict[str, list[str]]:
    """['--a', '1', '--b', '--c', 'x', 'y'] -> {'--a': ['1'], '--b': [], '--c': ['x', 'y']}; a repeated option
    fails (argparse would keep the last: an export never repeats one)."""
    out: dict[str, list[str]] = {}
    current = None
    for word in argv:
        if word.startswith("--"):
            if word in out:
                raise ValueError(f"{word} given twice")
            out[word], current = [], word
        elif current is None:
            raise ValueError(f"{word!r} before any option")
        else:
            out[current].append(word)
    return out


def _moe_layer_freq(expr: str, layers: int) -> tuple[int, int]:
    """(dense_layers, moe_every) of Megatron's --moe-layer-freq: an int N (every N-th layer, 0-based i % N == 0)
    or a Python list expression of 0/1 per layer (arguments.py moe_freq_type)."""
    if re.fullmatch(r"\d+", expr):
        n = int(expr)
        kinds = [int(i % n == 0) for i in range(layers)]
    else:
        if not re.fullmatch(r"[\[\]\d\s,*+()]+", expr):
            raise ValueError(f"--moe-layer-freq {expr!r} is not a list expression")
        kinds = eval(expr, {"__builtins__": {}})  # digits, brackets, * and + only (checked above)
    if len(kinds) != layers:
        raise ValueError(f"--moe-layer-freq gives {len(kinds)} layers, the model has {layers}")
    for every in range(1, layers + 1):  # ModelSpec: layer i is MoE when (i - dense + 1) % every == 0, i >= dense
        for dense in range(layers):
            if [int(i >= dense and (i - dense + 1) % every == 0) for i in range(layers)] == list(kinds):
                return dense, every
    raise ValueError(f"--moe-layer-freq {expr!r} is no dense prefix followed by every N-th layer MoE")


def _int(o: dict[str, list[str]], name: str, default: int | None = None) -> int:
    if name in o:
        return int(o[name][0])
    if default is None:
        raise ValueError(f"{name} missing")
    return default


def megatron_model(argv: list[str], vocab: int, name: str = "megatron") -> ModelSpec:
    """The model Megatron-LM builds from ``argv`` for a tokenizer of ``vocab`` tokens."""
    o = options(argv)
    hidden, heads, layers = _int(o, "--hidden-size"), _int(o, "--num-attention-heads"), _int(o, "--num-layers")
    tp = _int(o, "--tensor-model-parallel-size", 1)
    multiple = _int(o, "--make-vocab-size-divisible-by", 128) * tp  # vocab_size_with_padding
    padded = math.ceil(vocab / multiple) * multiple
    swiglu = "--swiglu" in o
    rope = o.get("--position-embedding-type", ["learned_absolute"])[0] == "rope"
    rms = o.get("--normalization", ["LayerNorm"])[0] == "RMSNorm"
    bias = "--disable-bias-linear" not in o
    fields: dict = dict(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        seq_len=_int(o, "--seq-length"),
        vocab=padded,
        ffn_hidden=_int(o, "--ffn-hidden-size", 4 * hidden),
        tied_embeddings="--untie-embeddings-and-output-weights" not in o,
        norm_eps=float(o.get("--norm-epsilon", ["1e-5"])[0]),
    )
    if not (swiglu or rope or rms):  # GPT-2 style: learned positions, LayerNorm, biases, GELU
        if not bias:
            raise ValueError("a GPT-style model without biases is not a ModelSpec architecture")
        return ModelSpec(arch="gpt", **fields)
    if not (swiglu and rope and rms):
        raise ValueError("SwiGLU, RoPE and RMSNorm come together in a llama-family ModelSpec")
    fields.update(arch="llama", rope_theta=float(_int(o, "--rotary-base", 10000)), linear_bias=bias)
    mla = "--multi-latent-attention" in o
    if mla:
        qk, v = _int(o, "--qk-head-dim", 128), _int(o, "--v-head-dim", 128)
        if qk != v:
            raise ValueError(f"latent attention with query/key width {qk} and value width {v}")
        if "--qk-layernorm" not in o:
            raise ValueError("latent attention without --qk-layernorm builds no latent RMSNorms")
        fields.update(
            kv_channels=qk,
            q_lora_rank=_int(o, "--q-lora-rank", 0),
            kv_lora_rank=_int(o, "--kv-lora-rank", 32),
            rope_head_dim=_int(o, "--qk-pos-emb-head-dim", 64),
        )
    else:
        fields.update(
            kv_heads=_int(o, "--num-query-groups", 1) if "--group-query-attention" in o else heads,
            kv_channels=_int(o, "--kv-channels", 0),
            qk_norm="--qk-layernorm" in o,
        )
    if "--window-size" in o:
        left, right = (int(x) for x in o["--window-size"][0].split(","))
        if right != 0:
            raise ValueError(f"--window-size {left},{right}: a causal window has nothing to the right")
        fields.update(sliding_window=left + 1, full_attention_every=_int(o, "--window-attn-skip-freq", 0))
    fields["attention_sinks"] = o.get("--softmax-type", ["vanilla"])[0] == "learnable"
    if "--num-experts" in o:
        dense, every = _moe_layer_freq(o.get("--moe-layer-freq", ["1"])[0], layers)
        expert = _int(o, "--moe-ffn-hidden-size", fields["ffn_hidden"])
        shared = _int(o, "--moe-shared-expert-intermediate-size", 0)
        if shared % expert:
            raise ValueError(f"a shared MLP of {shared} is no whole number of experts of {expert}")
        fields.update(
            experts=_int(o, "--num-experts"),
            top_k=_int(o, "--moe-router-topk", 2),
            expert_ffn_hidden=expert,
            shared_experts=shared // expert,
            dense_layers=dense,
            moe_every=every,
            router=o.get("--moe-router-score-function", ["softmax"])[0],
            router_bias="--moe-router-enable-expert-bias" in o,
        )
    return ModelSpec(**fields)


def deepspeed_model(argv: list[str], vocab: int, name: str = "deepspeed") -> ModelSpec:
    """The model Megatron-DeepSpeed builds from ``argv`` (its megatron/arguments.py names and defaults)."""
    o = options(argv)
    hidden, heads = _int(o, "--hidden-size"), _int(o, "--num-attention-heads")
    tp = _int(o, "--tensor-model-parallel-size", 1)
    multiple = _int(o, "--make-vocab-size-divisible-by", 128) * tp
    fields: dict = dict(
        name=name,
        layers=_int(o, "--num-layers"),
        hidden=hidden,
        heads=heads,
        seq_len=_int(o, "--seq-length"),
        vocab=math.ceil(vocab / multiple) * multiple,
        ffn_hidden=_int(o, "--ffn-hidden-size", 4 * hidden),
        tied_embeddings="--untie-embeddings-and-output-weights" not in o,
        norm_eps=float(o.get("--layernorm-epsilon", ["1e-5"])[0]),
    )
    llama = "--swiglu" in o
    if llama != ("--use-rotary-position-embeddings" in o) or llama != (
        o.get("--normalization", ["layernorm"])[0] == "rmsnorm"
    ):
        raise ValueError("SwiGLU, rotary positions and RMSNorm come together in a llama-family ModelSpec")
    if not llama:
        return ModelSpec(arch="gpt", **fields)
    return ModelSpec(
        arch="llama",
        kv_heads=_int(o, "--num-key-value-heads", heads),
        kv_channels=_int(o, "--kv-channels", 0),
        linear_bias="--disable-bias-linear" not in o,
        rope_theta=float(_int(o, "--rotary-position-embeddings-theta", 10000)),
        **fields,
    )


def _call_kwargs(node: ast.Call) -> dict:
    out = {}
    for kw in node.keywords:
        out[kw.arg] = _call_kwargs(kw.value) if isinstance(kw.value, ast.Call) else ast.literal_eval(kw.value)
    return out


def torchtitan_args_model(family: str, snippet: str, seq_len: int) -> ModelSpec:
    """The model of a v0.2.2 registration line ``table["flavor"] = Args(...)`` under each family's args class."""
    call = ast.parse(snippet).body[0].value
    a = _call_kwargs(call)
    moe = a.get("moe_args", {})
    base = dict(
        name="torchtitan",
        arch="llama",
        seq_len=seq_len,
        vocab=a["vocab_size"],
        hidden=a["dim"],
        norm_eps=a.get("norm_eps", 1e-5),
        rope_theta=float(a.get("rope_theta", 10000.0)),
    )
    experts = (
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
    if family == "llama3":  # FeedForward: int(2*4*dim/3) x multiplier, rounded up to multiple_of
        width = int(2 * 4 * a["dim"] / 3)
        if a.get("ffn_dim_multiplier") is not None:
            width = int(a["ffn_dim_multiplier"] * width)
        multiple = a.get("multiple_of", 256)
        return ModelSpec(
            layers=a["n_layers"],
            heads=a["n_heads"],
            kv_heads=a.get("n_kv_heads") or a["n_heads"],
            ffn_hidden=multiple * ((width + multiple - 1) // multiple),
            **base,
        )
    if family == "qwen3":
        fields = dict(
            layers=a["n_layers"],
            heads=a["n_heads"],
            kv_heads=a["n_kv_heads"],
            kv_channels=a["head_dim"],
            ffn_hidden=a["hidden_dim"],
            qk_norm=a.get("qk_norm", True),
            tied_embeddings=a.get("enable_weight_tying", False),
        )
        if a.get("moe_enabled"):
            fields.update(expert_ffn_hidden=a["moe_inter_dim"], **experts)
        return ModelSpec(**fields, **base)
    if family == "deepseek_v3":
        if a["qk_nope_head_dim"] != a["v_head_dim"]:
            raise ValueError("query/key and value head widths differ")
        return ModelSpec(
            layers=a["n_layers"],
            heads=a["n_heads"],
            kv_channels=a["qk_nope_head_dim"],
            ffn_hidden=a["inter_dim"],
            q_lora_rank=a["q_lora_rank"],
            kv_lora_rank=a["kv_lora_rank"],
            rope_head_dim=a["qk_rope_head_dim"],
            expert_ffn_hidden=a["moe_inter_dim"],
            dense_layers=a["n_dense_layers"],
            **experts,
            **base,
        )
    if family == "gpt_oss":  # windows on even layers, sinks, biases: the family's own
        if not moe.get("gate_bias"):
            raise ValueError("gpt_oss's router without its bias")
        return ModelSpec(
            layers=a["n_layers"],
            heads=a["n_heads"],
            kv_heads=a["n_kv_heads"],
            kv_channels=a["head_dim"],
            ffn_hidden=a["moe_inter_dim"],
            expert_ffn_hidden=a["moe_inter_dim"],
            sliding_window=a["sliding_window_size"],
            full_attention_every=2,
            attention_sinks=True,
            linear_bias=True,
            **experts,
            **base,
        )
    raise ValueError(f"unknown torchtitan family {family!r}")


def _flavor(family: str, **match) -> ModelSpec:
    for f in FLAVORS:
        if f.family == family and all(getattr(f, k) == v for k, v in match.items()):
            return f.model
    raise ValueError(f"torchtitan has no {family} flavor {match}")


def torchtitan_model(text: str) -> ModelSpec:
    """The model a v0.2.2 TOML export makes torchtitan build: its registered flavor (the header's line) or the
    built-in one it names."""
    job = tomllib.loads(text)
    family, flavor = job["model"]["name"], job["model"]["flavor"]
    lines = text.splitlines()
    register = [
        lines[i + 1][1:].strip()
        for i, line in enumerate(lines[:-1])
        if line.startswith("# Register the model as a flavor")
    ]
    seq = job["training"]["seq_len"]
    if register:
        if f"[{flavor!r}]" not in register[0]:
            raise ValueError(f"the header registers another flavor than {flavor}")
        return torchtitan_args_model(family, register[0], seq)
    return _flavor(family, name=flavor).replace(seq_len=seq)


def torchtitan_03_model(argv: list[str]) -> ModelSpec:
    """The model torchtitan 0.3 builds from the exported command line: its --config function's."""
    o = options([w for w in argv if w.startswith("--") or not w.startswith("activation-checkpoint:")])
    return _flavor(o["--module"][0], config=o["--config"][0]).replace(seq_len=_int(o, "--training.seq-len"))


__all__ = [
    "bash_array",
    "deepspeed_model",
    "megatron_model",
    "options",
    "torchtitan_03_model",
    "torchtitan_args_model",
    "torchtitan_model",
]
