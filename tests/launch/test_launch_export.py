"""export-config goldens: the Frontier study's 175B and 1T layouts as Megatron-LM, Megatron-DeepSpeed
(+ DeepSpeed JSON) and torchtitan config, every flag and key checked against the option names of
those projects (tests/helpers/upstream_names.py cites the files and commits).

Layouts (Dash et al. 2023, arXiv 2312.12705, the authors' launch scripts): 175B = tp4 pp16 dp2 on
128 GCDs, micro-batch 1, global batch 640, ZeRO-1, full recompute; 1T = tp8 pp64 dp2 on 1,024 GCDs,
micro-batch 1, ZeRO-1 (global batch 1024 and full recompute are our choices: the scripts do not
fix the batch, and without recompute 64 in-flight micro-batches do not fit 64 GB).
"""

from __future__ import annotations

import json
import math
import subprocess
import tomllib
from pathlib import Path

import pytest
from tests.helpers.export_readback import options
from tests.helpers.upstream_names import (
    DEEPSPEED_CONFIG_KEYS,
    DEEPSPEED_LAUNCHER_OPTIONS,
    MEGATRON_DEEPSPEED_OPTIONS,
    MEGATRON_LM_OPTIONS,
    TORCHTITAN_03_OPTIONS,
    TORCHTITAN_FIELDS,
)

from exatrain.catalog import get_model
from exatrain.errors import UserError
from exatrain.engine_configs import export
from exatrain.engine_configs.torchtitan import llama3_ffn_args
from exatrain.plan import ParallelDims, Plan, TrainShape


def plan_175b() -> Plan:
    return Plan(
        model=get_model("gpt-175b"),
        dims=ParallelDims(tp=4, pp=16, dp=2),
        shape=TrainShape(micro_batch=1, global_batch=640),
        zero_stage=1,
        recompute="full",
        cluster="frontier",
    ).validate()


def plan_1t() -> Plan:
    return Plan(
        model=get_model("gpt-1t"),
        dims=ParallelDims(tp=8, pp=64, dp=2),
        shape=TrainShape(micro_batch=1, global_batch=1024),
        zero_stage=1,
        recompute="full",
        cluster="frontier",
    ).validate()


def bash_array(text: str, name: str, cwd: Path) -> list[str]:
    """The words of a bash array after bash itself sources the rendered text (in ``cwd``)."""
    script = cwd / "args.sh"
    script.write_text(text)
    out = subprocess.run(
        ["bash", "-c", f'set -eu; source "$1"; printf "%s\\n" "${{{name}[@]}}"', "x", str(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.splitlines()


def as_flags(argv: list[str]) -> dict[str, str | None]:
    """['--a', '1', '--b'] -> {'--a': '1', '--b': None}; a repeated flag fails."""
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        name = argv[i]
        assert name.startswith("--") and name not in flags, (name, argv)
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        flags[name] = argv[i + 1] if has_value else None
        i += 2 if has_value else 1
    return flags


def megatron_padded_vocab(tokenizer_vocab: int, divisor: int, tp: int) -> int:
    # megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding (same rule in
    # Megatron-DeepSpeed megatron/tokenizer/tokenizer.py _vocab_size_with_padding)
    multiple = divisor * tp
    return math.ceil(tokenizer_vocab / multiple) * multiple


NO_DROPOUT = {"--attention-dropout": "0.0", "--hidden-dropout": "0.0"}  # both engines default to 0.1
MODEL_175B = {
    "--num-layers": "96",
    "--hidden-size": "12288",
    "--ffn-hidden-size": "49152",
    "--num-attention-heads": "96",
    "--seq-length": "2048",
    "--max-position-embeddings": "2048",
    "--make-vocab-size-divisible-by": "12800",
    **NO_DROPOUT,
}
MODEL_1T = {
    "--num-layers": "128",
    "--hidden-size": "25600",
    "--ffn-hidden-size": "102400",
    "--num-attention-heads": "128",
    "--seq-length": "2048",
    "--max-position-embeddings": "2048",
    "--make-vocab-size-divisible-by": "6400",
    **NO_DROPOUT,
}

MEGATRON_LM = {  # megatron/training/arguments.py @ d98e8a64
    "175b": {
        **MODEL_175B,
        "--norm-epsilon": "1e-05",
        "--position-embedding-type": "learned_absolute",
        "--normalization": "LayerNorm",
        "--tensor-model-parallel-size": "4",
        "--pipeline-model-parallel-size": "16",
        "--micro-batch-size": "1",
        "--global-batch-size": "640",
        "--recompute-granularity": "full",
        "--recompute-method": "uniform",
        "--recompute-num-layers": "1",
        "--use-distributed-optimizer": None,
        "--bf16": None,
        "--attention-backend": "fused",
    },
    "1t": {
        **MODEL_1T,
        "--norm-epsilon": "1e-05",
        "--position-embedding-type": "learned_absolute",
        "--normalization": "LayerNorm",
        "--tensor-model-parallel-size": "8",
        "--pipeline-model-parallel-size": "64",
        "--micro-batch-size": "1",
        "--global-batch-size": "1024",
        "--recompute-granularity": "full",
        "--recompute-method": "uniform",
        "--recompute-num-layers": "1",
        "--use-distributed-optimizer": None,
        "--bf16": None,
        "--attention-backend": "fused",
    },
}

MEGATRON_DEEPSPEED = {  # megatron/arguments.py @ 4efb479d, deepspeed/__init__.py @ edaa7221
    "175b": {
        **MODEL_175B,
        "--layernorm-epsilon": "1e-05",
        "--normalization": "layernorm",
        "--tensor-model-parallel-size": "4",
        "--pipeline-model-parallel-size": "16",
        "--micro-batch-size": "1",
        "--global-batch-size": "640",
        "--checkpoint-activations": None,
        "--checkpoint-num-layers": "1",
        "--zero-stage": "1",
        "--deepspeed": None,
        "--deepspeed_config": "ds_config.json",
        "--deepspeed-activation-checkpointing": None,
        "--bf16": None,
        "--use-flash-attn-v2": None,
    },
    "1t": {
        **MODEL_1T,
        "--layernorm-epsilon": "1e-05",
        "--normalization": "layernorm",
        "--tensor-model-parallel-size": "8",
        "--pipeline-model-parallel-size": "64",
        "--micro-batch-size": "1",
        "--global-batch-size": "1024",
        "--checkpoint-activations": None,
        "--checkpoint-num-layers": "1",
        "--zero-stage": "1",
        "--deepspeed": None,
        "--deepspeed_config": "ds_config.json",
        "--deepspeed-activation-checkpointing": None,
        "--bf16": None,
        "--use-flash-attn-v2": None,
    },
}

DEEPSPEED_JSON = {  # deepspeed/runtime/constants.py, deepspeed/runtime/zero/config.py @ edaa7221
    "175b": {
        "train_batch_size": 640,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 320,
        "zero_optimization": {"stage": 1},
        "bf16": {"enabled": True},
    },
    "1t": {
        "train_batch_size": 1024,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 512,
        "zero_optimization": {"stage": 1},
        "bf16": {"enabled": True},
    },
}

# The 175B layout (tp4 pp16 dp2, micro-batch 1, global batch 640, ZeRO-1, full recompute) on Llama 3 70B (80
# layers: 5 a stage): torchtitan has no GPT-2-style model, so the GPT plans themselves are refused (below).
TORCHTITAN = {  # torchtitan/config/job_config.py @ v0.2.2 (module_fqns_per_model_part checked separately)
    "model": {"name": "llama3", "flavor": "70B"},
    "training": {
        "local_batch_size": 320,
        "global_batch_size": 640,
        "seq_len": 8192,
        "mixed_precision_param": "bfloat16",
        "mixed_precision_reduce": "float32",
    },
    "parallelism": {
        "data_parallel_replicate_degree": 1,
        "data_parallel_shard_degree": 2,
        "fsdp_reshard_after_forward": "never",
        "tensor_parallel_degree": 4,
        "pipeline_parallel_degree": 16,
        "pipeline_parallel_schedule": "1F1B",
        "pipeline_parallel_microbatch_size": 1,
        "context_parallel_degree": 1,
    },
    "activation_checkpoint": {"mode": "full"},
    "compile": {"enable": False},
}


def plan_70b() -> Plan:
    return Plan(
        model=get_model("llama3-70b"),
        dims=ParallelDims(tp=4, pp=16, dp=2),
        shape=TrainShape(micro_batch=1, global_batch=640),
        zero_stage=1,
        recompute="full",
        sequence_parallel=True,
    ).validate()


PLANS = {"175b": plan_175b, "1t": plan_1t}


@pytest.mark.parametrize("layout", ["175b", "1t"])
def test_megatron_lm_golden(layout: str, tmp_path: Path) -> None:
    plan = PLANS[layout]()
    result = export(plan, "megatron")
    flags = as_flags(bash_array(result.text, "MEGATRON_ARGS", tmp_path))
    assert flags == MEGATRON_LM[layout]
    assert set(flags) <= MEGATRON_LM_OPTIONS, set(flags) - MEGATRON_LM_OPTIONS
    assert result.notes == ()  # both layouts are expressed exactly
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in result.text  # validate_args asserts it for tp > 1
    # the padded vocabulary of GPT-2's BPE (50,257 tokens) is exactly the plan's 51,200
    assert megatron_padded_vocab(50257, int(flags["--make-vocab-size-divisible-by"]), plan.tp) == plan.model.vocab
    assert plan.gpus == int(flags["--tensor-model-parallel-size"]) * int(flags["--pipeline-model-parallel-size"]) * 2


@pytest.mark.parametrize("layout", ["175b", "1t"])
def test_megatron_deepspeed_golden(layout: str, tmp_path: Path) -> None:
    plan = PLANS[layout]()
    result = export(plan, "deepspeed")
    flags = as_flags(bash_array(result.text, "MEGATRON_DEEPSPEED_ARGS", tmp_path))
    assert flags == MEGATRON_DEEPSPEED[layout]
    allowed = MEGATRON_DEEPSPEED_OPTIONS | DEEPSPEED_LAUNCHER_OPTIONS
    assert set(flags) <= allowed, set(flags) - allowed
    # sourcing the fragment wrote the DeepSpeed JSON it points --deepspeed_config at
    config = json.loads((tmp_path / flags["--deepspeed_config"]).read_text())
    assert config == DEEPSPEED_JSON[layout] == json.loads(dict(result.files)["ds_config.json"])
    for key, sub in config.items():
        assert key in DEEPSPEED_CONFIG_KEYS
        if isinstance(sub, dict):
            assert set(sub) <= DEEPSPEED_CONFIG_KEYS[key]
    # DeepSpeed's own consistency rule: train_batch_size = micro x accumulation x dp
    assert config["train_batch_size"] == (
        config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * plan.dp
    )
    # The two micro-batch sizes must agree. DeepSpeed's pipeline engine runs train_batch_size /
    # (its micro-batch x dp) micro-batches, each drawn from Megatron's loader at --micro-batch-size:
    # a JSON micro-batch of 4 against a flag of 1 trains a quarter of the global batch per
    # iteration, while Megatron's throughput line counts all of it (benchmarks/data/README.md,
    # the Frontier authors' run log).
    assert config["train_micro_batch_size_per_gpu"] == int(flags["--micro-batch-size"]) == plan.micro_batch
    assert config["train_batch_size"] == int(flags["--global-batch-size"]) == plan.global_batch


def test_torchtitan_golden() -> None:
    plan = plan_70b()
    result = export(plan, "torchtitan")
    config = tomllib.loads(result.text)
    for section, fields in config.items():
        assert set(fields) <= TORCHTITAN_FIELDS[section], (section, set(fields) - TORCHTITAN_FIELDS[section])
    parts = config["parallelism"].pop("module_fqns_per_model_part")
    config.pop("job")
    assert config == TORCHTITAN
    # one model part per pipeline stage, in model order, each layer exactly once
    per_stage = plan.model.layers // plan.pp
    assert len(parts) == plan.pp
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    layers = [name for part in parts for name in part if name.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(plan.model.layers)]
    assert all(sum(n.startswith("layers.") for n in part) == per_stage for part in parts)
    # torchtitan's microbatches per step = local_batch_size / microbatch size = the plan's
    assert (
        config["training"]["local_batch_size"] // config["parallelism"]["pipeline_parallel_microbatch_size"]
        == plan.num_microbatches
    )
    assert any("ZeRO-1" in n for n in result.notes)  # torchtitan has FSDP, not ZeRO-1: said, not hidden
    assert "Register the model" not in result.text  # the built-in 70B flavor is this network


def test_torchtitan_03_golden(tmp_path: Path) -> None:
    """torchtitan 0.3 takes the same layout on its command line: --module/--config, then tyro's
    --section.field-name options, the checkpointing subcommand last (upstream_names.TORCHTITAN_03_OPTIONS)."""
    plan = plan_70b()
    argv = bash_array(export(plan, "torchtitan-0.3").text, "TORCHTITAN_ARGS", tmp_path)
    assert argv[:4] == ["--module", "llama3", "--config", "llama3_70b"] and argv[-1] == "activation-checkpoint:full"
    names = [w for w in argv if w.startswith("--")]
    assert set(names) <= TORCHTITAN_03_OPTIONS, set(names) - TORCHTITAN_03_OPTIONS
    f = options(argv[:-1])
    assert f["--training.local-batch-size"] == ["320"] and f["--training.global-batch-size"] == ["640"]
    assert f["--parallelism.tensor-parallel-degree"] == ["4"] and f["--parallelism.pipeline-parallel-degree"] == ["16"]
    assert f["--parallelism.enable-sequence-parallel"] == [] and f["--training.disable-cuda-graphs"] == []
    parts = f["--parallelism.module-fqns-per-model-part"]  # one word per stage, its modules comma-separated
    assert len(parts) == plan.pp and parts[0].startswith("tok_embeddings,layers.0,")
    assert parts[-1].endswith(",norm,lm_head") and all(len(p.split(",")) >= 5 for p in parts)


@pytest.mark.parametrize("layout", ["175b", "1t"])
def test_torchtitan_refuses_gpt_models(layout: str) -> None:
    """torchtitan builds no GPT-2-style model; the export had named a llama3 flavor of equal size instead."""
    for target in ("torchtitan", "torchtitan-0.3"):
        with pytest.raises(UserError, match="no GPT-2-style model"):
            export(PLANS[layout](), target)


def torchtitan_ffn_width(dim: int, multiple_of: int, multiplier: float | None) -> int:
    # torchtitan v0.2.2 torchtitan/models/llama3/model/model.py FeedForward, called with hidden_dim=4*dim
    hidden = int(2 * (4 * dim) / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@pytest.mark.parametrize(
    "dim,width", [(12288, 32768), (4096, 14336), (8192, 28672), (16384, 53248), (64, 176), (25600, 68352), (100, 301)]
)
def test_torchtitan_flavor_ffn_is_exact(dim: int, width: int) -> None:
    multiple, mult = llama3_ffn_args(dim, width)
    assert torchtitan_ffn_width(dim, multiple, mult) == width


def test_export_variants_map_each_field(tmp_path: Path) -> None:
    """Interleaving, uneven stages, SP, selective recompute, GQA, ZeRO-2/3 and fp32 each change the
    flags they should (names again checked against the upstream sets)."""
    llama = Plan(
        model=get_model("llama3-8b"),
        dims=ParallelDims(4, 4, 2),
        shape=TrainShape(1, 64),
        zero_stage=1,
        recompute="selective",
        sequence_parallel=True,
        schedule="interleaved",
        interleave=2,
    ).validate()
    f = as_flags(bash_array(export(llama, "megatron").text, "MEGATRON_ARGS", tmp_path))
    assert set(f) <= MEGATRON_LM_OPTIONS
    assert f["--num-virtual-stages-per-pipeline-rank"] == "2" and "--sequence-parallel" in f
    assert f["--recompute-granularity"] == "selective" and "--recompute-method" not in f
    assert f["--num-query-groups"] == "8" and "--group-query-attention" in f and "--swiglu" in f
    assert f["--position-embedding-type"] == "rope" and f["--rotary-base"] == "500000"
    assert "--untie-embeddings-and-output-weights" in f and "--disable-bias-linear" in f

    uneven = Plan(model=get_model("gpt-1.4b"), dims=ParallelDims(2, 5, 1), shape=TrainShape(2, 40)).validate()
    f = as_flags(bash_array(export(uneven, "megatron").text, "MEGATRON_ARGS", tmp_path))
    assert f["--pipeline-model-parallel-layout"] == "Et*5|t*5|t*5|t*5|t*4L"  # balanced_split: 5,5,5,5,4

    zero3 = Plan(
        model=get_model("gpt-1.4b"),
        dims=ParallelDims(2, 1, 4),
        shape=TrainShape(2, 64),
        zero_stage=3,
        dtype="float32",
        flash_attention=False,
    ).validate()
    f = as_flags(bash_array(export(zero3, "megatron").text, "MEGATRON_ARGS", tmp_path))
    assert set(f) <= MEGATRON_LM_OPTIONS
    assert "--use-megatron-fsdp" in f and f["--data-parallel-sharding-strategy"] == "optim_grads_params"
    assert "--bf16" not in f and f["--attention-backend"] == "unfused"
    assert "CUDA_DEVICE_MAX_CONNECTIONS unset or > 1" in export(zero3, "megatron").text
    ds = as_flags(bash_array(export(zero3, "deepspeed").text, "MEGATRON_DEEPSPEED_ARGS", tmp_path))
    assert ds["--zero-stage"] == "3" and "--no-pipeline-parallel" in ds and "--use-flash-attn-v2" not in ds
    assert set(ds) <= MEGATRON_DEEPSPEED_OPTIONS | DEEPSPEED_LAUNCHER_OPTIONS
    tt = tomllib.loads(export(zero3.replace(model=get_model("llama3-8b")), "torchtitan").text)
    assert tt["parallelism"]["fsdp_reshard_after_forward"] == "always"
    assert tt["training"]["mixed_precision_param"] == "float32"

    ddp = Plan(model=get_model("llama-tiny"), dims=ParallelDims(1, 1, 4), shape=TrainShape(2, 16)).validate()
    tt = tomllib.loads(export(ddp, "torchtitan").text)
    assert tt["parallelism"]["data_parallel_replicate_degree"] == 4
    assert tt["parallelism"]["data_parallel_shard_degree"] == 1
    assert tt["training"]["local_batch_size"] == 2  # no pipeline: 2 accumulation steps of 2 x 4 ranks


def test_deepspeed_rejects_zero2_with_pipeline() -> None:
    plan = Plan(
        model=get_model("gpt-1.4b"), dims=ParallelDims(1, 2, 4), shape=TrainShape(2, 64), zero_stage=2
    ).validate()
    with pytest.raises(UserError, match="ZeRO-2"):
        export(plan, "deepspeed")
    assert "--use-megatron-fsdp" in export(plan, "megatron").text  # Megatron-LM can run it


def test_unknown_target() -> None:
    with pytest.raises(UserError, match="unknown export target"):
        export(plan_175b(), "colossalai")


def test_moe_cp_and_fp8_exports_use_megatron_options_only(tmp_path: Path) -> None:
    """The MoE (every dispatcher and routing), context-parallel and FP8 flags are Megatron-LM options too
    (upstream_names.MEGATRON_LM_OPTIONS), each taking the value the plan priced. (Broken on purpose: the
    force-balance flag misspelt --moe-router-force-balance; this failed.)"""
    from exatrain.api.plans import make_plan
    from exatrain.catalog import get_cluster

    h100 = get_cluster("dgx-h100")
    plans = [
        make_plan(
            "qwen3-30b-a3b",
            h100,
            gpus=16,
            ep=16,
            global_batch=64,
            zero=1,
            runtime="megatron-core",
            moe_capacity_factor=1.25,
        ),
        make_plan(
            "qwen3-30b-a3b",
            h100,
            gpus=16,
            ep=16,
            global_batch=64,
            zero=1,
            runtime="megatron-core",
            moe_dispatcher="hybridep",
            moe_force_balance=True,
        ),
        make_plan(
            "deepseek-v3",
            h100,
            gpus=512,
            tp=2,
            pp=8,
            ep=64,
            sequence_parallel=True,
            global_batch=512,
            zero=1,
            runtime="megatron-core",
            fp8="current",
        ),
        make_plan(
            "llama3.1-8b-128k",
            h100,
            gpus=32,
            tp=4,
            cp=4,
            sequence_parallel=True,
            global_batch=16,
            zero=1,
            recompute="full",
            runtime="megatron-core",
            fp8="block",
        ),
    ]
    flags = [as_flags(bash_array(export(p, "megatron").text, "MEGATRON_ARGS", tmp_path)) for p in plans]
    for f in flags:
        assert set(f) <= MEGATRON_LM_OPTIONS, set(f) - MEGATRON_LM_OPTIONS
    assert flags[0]["--moe-expert-capacity-factor"] == "1.25" and "--moe-pad-expert-input-to-capacity" in flags[0]
    assert flags[0]["--moe-token-dispatcher-type"] == "alltoall" and "--moe-router-force-load-balancing" not in flags[0]
    assert flags[1]["--moe-flex-dispatcher-backend"] == "hybridep" and "--moe-router-force-load-balancing" in flags[1]
    assert flags[2]["--expert-model-parallel-size"] == "64" and flags[2]["--fp8-recipe"] == "tensorwise"
    assert flags[3]["--context-parallel-size"] == "4" and flags[3]["--fp8-recipe"] == "blockwise"
