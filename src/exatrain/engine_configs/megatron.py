"""Megatron-LM and Megatron-DeepSpeed arguments (+ the DeepSpeed JSON) for a plan.

Option names checked against (facts only; nothing copied):
* NVIDIA/Megatron-LM @ d98e8a64 (2026-08-22): megatron/training/arguments.py, whose
  add_megatron_arguments also generates options from megatron/core/model_parallel_config.py,
  megatron/core/transformer/transformer_config.py and megatron/training/config/training_config.py;
  megatron/core/transformer/pipeline_parallel_layer_layout.py (the layout string);
  megatron/core/tokenizers/utils/build_tokenizer.py (vocabulary padding);
  megatron/core/transformer/enums.py (AttnBackend: the --attention-backend choices); the Transformer-Engine
  group (--fp8-format e4m3/hybrid, --fp8-recipe tensorwise/delayed/mxfp8/blockwise,
  --fp8-amax-history-len), --context-parallel-size and --cp-comm-type, and the MoE options
  (--num-experts, --moe-router-topk, --moe-ffn-hidden-size, --moe-shared-expert-intermediate-size,
  --moe-layer-freq, --expert-model-parallel-size, --expert-tensor-parallel-size,
  --moe-token-dispatcher-type, --moe-grouped-gemm); megatron/core/parallel_state.py
  (initialize_model_parallel: the expert-tensor-parallel size defaults to the tp size, and the expert
  layers' etp x ep x edp grid folds over the same tp*cp*dp ranks).
* deepspeedai/Megatron-DeepSpeed @ 4efb479d (2025-07-16): megatron/arguments.py,
  megatron/model/gpt_model.py (GPTModelPipe's activation-checkpoint interval),
  examples_deepspeed/rebase/ds_pretrain_gpt_13B.sh (how the DeepSpeed flags are combined).
* deepspeedai/DeepSpeed @ edaa7221 (2026-08-22): deepspeed/__init__.py (--deepspeed,
  --deepspeed_config), deepspeed/runtime/constants.py and deepspeed/runtime/zero/config.py (JSON
  keys), deepspeed/runtime/pipe/engine.py (ZeRO-2/3 are rejected with pipeline parallelism).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from exatrain.engine_configs.common import Export, Flag, FlagGroup, even_split, summary
from exatrain.engine_configs.megatron_flags import (
    MEGATRON_FP8_RECIPES,
    attention_backend,
    attention_shape_flags,
    fp8_flags,
    moe_flags,
    moe_layer_freq,
    precision_flags,
)
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.settings import cp_comm_for, setting_notes

MEGATRON_LM = "NVIDIA/Megatron-LM@d98e8a64"
MEGATRON_DEEPSPEED_SOURCE = "deepspeedai/Megatron-DeepSpeed@4efb479d"
DEEPSPEED = "deepspeedai/DeepSpeed@edaa7221"
DEEPSPEED_RELEASE = "0.19.8"  # the release scripts/check_exports.py runs the exports through


def vocab_divisor(plan: Plan) -> int:
    """--make-vocab-size-divisible-by. Megatron pads the tokenizer's vocabulary up to a multiple of
    (this x tp) (build_tokenizer.py vocab_size_with_padding; Megatron-DeepSpeed
    megatron/tokenizer/tokenizer.py _vocab_size_with_padding); vocab/tp makes the padded size
    exactly the plan's vocab for any tokenizer of at most that many tokens (GPT-2's 50,257 -> 51,200)."""
    return plan.model.vocab // plan.tp


def dropout_flags(plan: Plan) -> list[Flag]:
    """The model's dropout on attention probabilities and the residual branches: Megatron-LM's and Megatron-DeepSpeed's
    --attention-dropout and --hidden-dropout default to 0.1, so a model without dropout must say 0."""
    value = repr(float(plan.model.dropout))
    return [Flag("--attention-dropout", value), Flag("--hidden-dropout", value)]


def pipeline_layout(plan: Plan) -> str:
    """Megatron-LM's --pipeline-model-parallel-layout for an uneven split: virtual stages separated
    by '|', 't' a transformer layer (t*n for n of them), 'E' the embedding on the first and 'L' the
    loss on the last (pipeline_parallel_layer_layout.py parse_str_to_list)."""
    stages = [f"t*{n}" if n > 1 else "t" for n in plan.layers_per_stage()]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "L"
    return "|".join(stages)


def _lm_shape_flags(plan: Plan) -> list[Flag]:
    """Megatron-LM's model shape: sizes, positions, normalization, MLP, biases, attention and tying."""
    m = plan.model
    shape = [
        Flag("--num-layers", str(m.layers)),
        Flag("--hidden-size", str(m.hidden)),
        Flag("--ffn-hidden-size", str(m.ffn_hidden)),
        Flag("--num-attention-heads", str(m.heads)),
        Flag("--seq-length", str(m.seq_len)),
        Flag("--max-position-embeddings", str(m.seq_len)),
        Flag("--make-vocab-size-divisible-by", str(vocab_divisor(plan))),
        Flag("--norm-epsilon", repr(m.norm_eps)),
        *dropout_flags(plan),
    ]
    if m.arch == "gpt":  # learned positions, LayerNorm, biases, GELU: Megatron's GPT defaults, made explicit
        shape += [Flag("--position-embedding-type", "learned_absolute"), Flag("--normalization", "LayerNorm")]
    else:
        shape += [
            Flag("--position-embedding-type", "rope"),
            Flag("--rotary-base", str(int(m.rope_theta))),
            Flag("--normalization", "RMSNorm"),
            Flag("--swiglu"),
        ]
        if not m.linear_bias:  # Megatron's linear layers carry biases unless told not to (add_bias_linear)
            shape.append(Flag("--disable-bias-linear"))
        shape += attention_shape_flags(m)
    if not m.tied_embeddings:
        shape.append(Flag("--untie-embeddings-and-output-weights"))
    return shape


def _lm_parallel_flags(plan: Plan, notes: list[str]) -> list[Flag]:
    """Megatron-LM's tp, pp (its uneven layout or virtual stages) and sequence parallelism, with a note where
    its schedules differ from the plan's."""
    par = [Flag("--tensor-model-parallel-size", str(plan.tp)), Flag("--pipeline-model-parallel-size", str(plan.pp))]
    if plan.pp > 1 and not even_split(plan):
        par.append(Flag("--pipeline-model-parallel-layout", pipeline_layout(plan)))
    elif plan.interleave > 1:
        par.append(Flag("--num-virtual-stages-per-pipeline-rank", str(plan.interleave)))
    if plan.sequence_parallel:
        par.append(Flag("--sequence-parallel"))
    if plan.pp > 1 and plan.schedule == "gpipe":
        notes.append(
            "Megatron-LM has no GPipe schedule: it runs this layout with 1F1B (same bubble, "
            "fewer micro-batches of activations in flight)"
        )
    if plan.pp > 1 and plan.schedule in ("zero_bubble", "zbv", "dualpipev"):
        notes.append(
            "Megatron-LM has no zero-bubble schedule: it runs these virtual stages with "
            "interleaved 1F1B (a larger bubble than the plan's estimate)"
            + (", placed looped (rank r: r, r + pp), not in a V" if plan.v_shape else "")
        )
    elif plan.pp > 1 and plan.schedule == "zbh1":
        notes.append(
            "Megatron-LM has no zero-bubble schedule: it runs this layout with 1F1B (a larger bubble "
            "than the plan's estimate)"
        )
    return par


def _lm_memory_flags(plan: Plan) -> list[Flag]:
    """Megatron-LM's recompute, distributed optimizer, CPU offload or Megatron-FSDP."""
    mem: list[Flag] = []
    if plan.recompute == "full" and plan.recompute_layers:  # the first N layers of each model chunk
        mem += [
            Flag("--recompute-granularity", "full"),
            Flag("--recompute-method", "block"),
            Flag("--recompute-num-layers", str(plan.recompute_layers)),
        ]
    elif plan.recompute == "full":  # every layer recomputed from its input (Korthikanti 2022 "full")
        mem += [
            Flag("--recompute-granularity", "full"),
            Flag("--recompute-method", "uniform"),
            Flag("--recompute-num-layers", "1"),
        ]
    elif plan.recompute == "selective":  # default --recompute-modules is core_attn: the attention core
        mem.append(Flag("--recompute-granularity", "selective"))
        if plan.recompute_modules:  # a list of its own (settings.RECOMPUTE_MODULES: Megatron-Core's names, nargs='*')
            mem.append(Flag("--recompute-modules", plan.recompute_modules[0], plan.recompute_modules[1:]))
    if plan.distribute_saved_activations:  # each checkpoint split over tp (tensor_parallel.random.CheckpointFunction)
        mem.append(Flag("--distribute-saved-activations"))
    if plan.zero_stage == 1:  # the distributed optimizer shards fp32 master weights + Adam states over dp
        mem.append(Flag("--use-distributed-optimizer"))
    if plan.offload != "none":  # HybridDeviceOptimizer, all of it on the CPU (megatron/core/optimizer/cpu_offloading)
        mem += [
            Flag("--optimizer-cpu-offload"),
            Flag("--optimizer-offload-fraction", "1.0"),
            Flag("--use-precision-aware-optimizer"),
            Flag("--overlap-cpu-optimizer-d2h-h2d"),
        ]
    elif plan.zero_stage in (2, 3):  # Megatron-FSDP: optim_grads = ZeRO-2, optim_grads_params = ZeRO-3;
        # validate_args requires its checkpoint format, and CUDA_DEVICE_MAX_CONNECTIONS unset or > 1
        mem += [
            Flag("--use-megatron-fsdp"),
            Flag("--data-parallel-sharding-strategy", "optim_grads" if plan.zero_stage == 2 else "optim_grads_params"),
            Flag("--ckpt-format", "fsdp_dtensor"),
        ]
    return mem


def _lm_precision_flags(plan: Plan) -> list[Flag]:
    """Megatron-LM's dtype, gradient accumulation and reduction, attention backend and FP8."""
    prec: list[Flag] = precision_flags(plan)
    if plan.grad_accum == "bfloat16":  # gradients accumulated and reduced in bf16 (settings.GRAD_ACCUM)
        prec.append(Flag("--grad-reduce-in-bf16"))
    if plan.grad_accum_fusion == "off":  # accumulated by the backward hook, not the GEMMs (settings.GRAD_ACCUM_FUSION)
        prec.append(Flag("--no-gradient-accumulation-fusion"))
    prec.append(Flag("--attention-backend", attention_backend(plan)))
    prec += fp8_flags(plan)
    return prec


def megatron_lm_groups(plan: Plan) -> tuple[tuple[FlagGroup, ...], tuple[str, ...]]:
    """Megatron-LM's arguments for the plan in flag groups (model, MoE, layout, batch, memory, precision), and
    what they cannot express exactly."""
    notes: list[str] = []
    args = "megatron/training/arguments.py"
    shape = _lm_shape_flags(plan)
    par = _lm_parallel_flags(plan, notes)
    batch = [Flag("--micro-batch-size", str(plan.micro_batch)), Flag("--global-batch-size", str(plan.global_batch))]
    mem = _lm_memory_flags(plan)
    prec = _lm_precision_flags(plan)
    # the exchange the planner prices (cost.context.cp_exposed_s; Megatron spells all_gather "allgather")
    if plan.cp > 1:
        comm = cp_comm_for("megatron-core", plan.cp_comm, plan.model)
        par += [
            Flag("--context-parallel-size", str(plan.cp)),
            Flag("--cp-comm-type", {"all_gather": "allgather"}.get(comm, comm)),
        ]
    moe = moe_flags(plan)

    cfg = "megatron/core/transformer/transformer_config.py"
    groups = (
        FlagGroup("MODEL_ARGS", "model shape", f"{args} (_add_network_size_args) and {cfg}", tuple(shape)),
        *(
            (
                FlagGroup(
                    "MOE_ARGS",
                    "mixture of experts and expert parallelism (folded over tp*cp*dp; experts whole on each rank)",
                    f"{args} (_add_moe_args) and {cfg}",
                    tuple(moe),
                ),
            )
            if moe
            else ()
        ),
        FlagGroup(
            "PARALLEL_ARGS",
            "parallel layout (data-parallel size = world size / (tp*cp*pp))"
            if plan.cp > 1
            else "parallel layout (data-parallel size = world size / (tp*pp))",
            f"megatron/core/model_parallel_config.py via {args} (_add_distributed_args)",
            tuple(par),
        ),
        FlagGroup("BATCH_ARGS", "batch", f"megatron/training/config/training_config.py via {args}", tuple(batch)),
        FlagGroup(
            "MEMORY_ARGS",
            "recompute and optimizer-state sharding",
            f"{cfg}; megatron/core/distributed/distributed_data_parallel_config.py via {args}",
            tuple(mem),
        ),
        FlagGroup(
            "PRECISION_ARGS",
            "precision and attention kernel",
            f"megatron/core/model_parallel_config.py, {cfg}",
            tuple(prec),
        ),
    )
    return groups, (*notes, *setting_notes(plan, "megatron"))


def _ds_checks(plan: Plan) -> None:
    """UserError for what Megatron-DeepSpeed cannot build or run: MoE, cp, FP8, latent attention, QK-norm,
    sliding windows, attention sinks, or ZeRO-2/3 under a pipeline."""
    m = plan.model
    if plan.model.is_moe or plan.cp > 1 or plan.fp8:
        raise UserError(
            "--for deepspeed renders dense layouts without context parallelism or FP8; "
            "use --for megatron for mixture-of-experts, --cp or --fp8 plans"
        )
    # Megatron-DeepSpeed's GPT model has no latent attention, QK-norm, sliding windows or attention sinks
    # (megatron/arguments.py, megatron/model/transformer.py at the pinned commit)
    unbuilt = [
        name
        for name, on in (
            ("latent attention", m.mla),
            ("QK-norm", m.qk_norm),
            ("sliding windows", bool(m.sliding_window)),
            ("attention sinks", m.attention_sinks),
        )
        if on
    ]
    if unbuilt:
        raise UserError(f"Megatron-DeepSpeed does not build {' or '.join(unbuilt)} ({m.name}): use --for megatron")
    if plan.pp > 1 and plan.zero_stage >= 2:
        raise UserError(
            f"DeepSpeed's pipeline engine rejects ZeRO-{plan.zero_stage} with pipeline parallelism "
            "(deepspeed/runtime/pipe/engine.py): use ZeRO-1 or pp 1 for --for deepspeed"
        )


def _ds_shape_flags(plan: Plan) -> list[Flag]:
    """Megatron-DeepSpeed's model shape: sizes, positions, normalization, MLP, biases, heads and tying."""
    m = plan.model
    shape = [
        Flag("--num-layers", str(m.layers)),
        Flag("--hidden-size", str(m.hidden)),
        Flag("--ffn-hidden-size", str(m.ffn_hidden)),
        Flag("--num-attention-heads", str(m.heads)),
        Flag("--seq-length", str(m.seq_len)),
        Flag("--max-position-embeddings", str(m.seq_len)),
        Flag("--make-vocab-size-divisible-by", str(vocab_divisor(plan))),
        Flag("--layernorm-epsilon", repr(m.norm_eps)),
        *dropout_flags(plan),
    ]
    if m.arch == "gpt":
        shape.append(Flag("--normalization", "layernorm"))
    else:
        shape += [
            Flag("--use-rotary-position-embeddings"),
            Flag("--rotary-position-embeddings-theta", str(int(m.rope_theta))),
            Flag("--no-position-embedding"),
            Flag("--normalization", "rmsnorm"),
            Flag("--swiglu"),
        ]
        if not m.linear_bias:
            shape.append(Flag("--disable-bias-linear"))
        if m.kv_heads != m.heads:
            shape.append(Flag("--num-key-value-heads", str(m.kv_heads)))
        if m.kv_channels:  # the head width, where the model names one (default hidden/heads)
            shape.append(Flag("--kv-channels", str(m.kv_channels)))
    if not m.tied_embeddings:
        shape.append(Flag("--untie-embeddings-and-output-weights"))
    return shape


def _ds_parallel_flags(plan: Plan, notes: list[str]) -> list[Flag]:
    """Megatron-DeepSpeed's tp and pp, with a note where DeepSpeed's pipeline engine differs from the plan."""
    par = [Flag("--tensor-model-parallel-size", str(plan.tp)), Flag("--pipeline-model-parallel-size", str(plan.pp))]
    if plan.pp == 1:  # otherwise Megatron-DeepSpeed builds a one-stage DeepSpeed pipeline
        par.append(Flag("--no-pipeline-parallel"))
    if plan.sequence_parallel:
        par.append(Flag("--sequence-parallel"))
    if plan.pp > 1 and plan.interleave > 1:
        notes.append(
            f"DeepSpeed's pipeline engine has no interleaved schedule: each of the {plan.pp} pipeline "
            f"ranks runs one contiguous stage instead of {plan.interleave} virtual stages"
        )
    elif plan.pp > 1 and plan.schedule in ("gpipe", "zbh1"):
        notes.append(f"DeepSpeed's pipeline engine runs 1F1B, not {'GPipe' if plan.schedule == 'gpipe' else 'ZB-H1'}")
    if plan.pp > 1 and not even_split(plan) and plan.interleave == 1:
        notes.append(
            f"DeepSpeed balances transformer layers over stages itself (partition_method "
            f"'type:transformer'); the plan's split {list(plan.layers_per_stage())} is not forced"
        )
    return par


def megatron_deepspeed_groups(plan: Plan, ds_config_path: str) -> tuple[tuple[FlagGroup, ...], tuple[str, ...]]:
    """Megatron-DeepSpeed's arguments for the plan in flag groups, the DeepSpeed JSON at ``ds_config_path``, and
    what they cannot express exactly; UserError for a plan it cannot run."""
    notes: list[str] = []
    src = "megatron/arguments.py"
    _ds_checks(plan)
    shape = _ds_shape_flags(plan)
    par = _ds_parallel_flags(plan, notes)
    batch = [Flag("--micro-batch-size", str(plan.micro_batch)), Flag("--global-batch-size", str(plan.global_batch))]
    mem: list[Flag] = []
    if plan.recompute == "full":  # GPTModelPipe checkpoints every checkpoint_num_layers layers
        mem += [Flag("--checkpoint-activations"), Flag("--checkpoint-num-layers", "1")]
    elif plan.recompute == "selective":
        mem.append(Flag("--recompute-granularity", "selective"))
    mem.append(Flag("--zero-stage", str(plan.zero_stage)))
    ds = [Flag("--deepspeed"), Flag("--deepspeed_config", ds_config_path)]
    if plan.recompute == "full":
        ds.append(Flag("--deepspeed-activation-checkpointing"))
    if plan.distribute_saved_activations:  # deepspeed.checkpointing.configure(partition_activations=...)
        ds.append(Flag("--partition-activations"))
    prec: list[Flag] = precision_flags(plan)
    if plan.flash_attention:  # the flash-attn package's kernels (no cuDNN, no SDPA): fused or sdpa get a note
        prec.append(Flag("--use-flash-attn-v2"))

    groups = (
        FlagGroup("MODEL_ARGS", "model shape", f"{src} (_add_network_size_args)", tuple(shape)),
        FlagGroup(
            "PARALLEL_ARGS",
            "parallel layout (data-parallel size = world size / (tp*pp))",
            f"{src} (_add_distributed_args, _add_training_args)",
            tuple(par),
        ),
        FlagGroup("BATCH_ARGS", "batch", f"{src} (_add_training_args)", tuple(batch)),
        FlagGroup(
            "MEMORY_ARGS",
            "recompute and ZeRO stage",
            f"{src} (_add_training_args, _add_zero_args); megatron/model/gpt_model.py",
            tuple(mem),
        ),
        FlagGroup(
            "ENGINE_ARGS",
            "DeepSpeed engine",
            f"deepspeed/__init__.py (add_config_arguments); {src} (_add_activation_checkpoint_args)",
            tuple(ds),
        ),
        FlagGroup(
            "PRECISION_ARGS",
            "precision and attention kernel",
            f"{src} (_add_mixed_precision_args, _add_training_args)",
            tuple(prec),
        ),
    )
    return groups, (*notes, *setting_notes(plan, "deepspeed"))


def _ds_offload(plan: Plan) -> dict[str, Any]:
    """zero_optimization's offload blocks (deepspeed/runtime/zero/offload_config.py: device "cpu", pinned host
    buffers): the optimizer for --offload optimizer, the parameters too for --offload params (ZeRO-3 only)."""
    if plan.offload == "none":
        return {}
    cpu = {"device": "cpu", "pin_memory": True}
    return {"offload_optimizer": dict(cpu), **({"offload_param": dict(cpu)} if plan.offload == "params" else {})}


def deepspeed_config(plan: Plan) -> dict[str, Any]:
    """The DeepSpeed JSON: batch (train_batch_size = micro x accumulation x dp, which DeepSpeed
    checks), ZeRO stage and precision; keys from deepspeed/runtime/constants.py and zero/config.py."""
    return {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": {"stage": plan.zero_stage, **_ds_offload(plan)},
        "bf16": {"enabled": plan.dtype == "bfloat16"},
        # float16: dynamic loss scaling (loss_scale 0) from 2^16, halved on an overflow, doubled after 1,000 clean
        # steps, the scale lowered only after 2 overflows in a row (deepspeed/runtime/fp16/loss_scaler.py; the
        # Megatron-DeepSpeed examples' block)
        **(
            {
                "fp16": {
                    "enabled": True,
                    "loss_scale": 0,
                    "initial_scale_power": 16,
                    "loss_scale_window": 1000,
                    "hysteresis": 2,
                    "min_loss_scale": 1,
                }
            }
            if plan.dtype == "float16"
            else {}
        ),
        # fp32 gradient accumulation selects DeepSpeed's BF16_Optimizer (settings.GRAD_ACCUM; engine.py
        # get_data_types); the default is the model dtype
        **(
            {"data_types": {"grad_accum_dtype": "fp32"}}
            if plan.grad_accum == "float32" and plan.zero_stage <= 1
            else {}
        ),
    }


def render_arrays(
    target: str, header: list[str], groups: tuple[FlagGroup, ...], notes: tuple[str, ...], launch_hint: str
) -> str:
    """A bash fragment: the header and notes as comments, one array per flag group, and ``<target>_ARGS``
    holding them all in order."""
    lines = ["#!/bin/bash", *header]
    lines += [f"# note: {n}" for n in notes]
    lines += [f"# Launch {launch_hint}", ""]
    for g in groups:
        lines.append(f"# {g.title} — {g.source}")
        lines.append(f"{g.name}=(")
        lines += [f"  {' '.join(_q(w) for w in f.words())}" for f in g.flags]
        lines.append(")")
    lines.append(f"{target}_ARGS=(" + " ".join(f'"${{{g.name}[@]}}"' for g in groups) + ")")
    return "\n".join(lines) + "\n"


def _q(word: str) -> str:
    return shlex.quote(word)


def device_connections_hint(plan: Plan) -> str:
    """What Megatron-LM's validate_args demands of CUDA_DEVICE_MAX_CONNECTIONS for this layout."""
    if plan.zero_stage >= 2:
        return "# Environment: leave CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 (Megatron-FSDP asserts it)."
    if plan.tp > 1:
        return "# Environment: export CUDA_DEVICE_MAX_CONNECTIONS=1 (asserted for tensor parallelism before Blackwell)."
    return "# Environment: nothing layout-specific."


def render_megatron(plan: Plan) -> Export:
    groups, notes = megatron_lm_groups(plan)
    header = [
        f"# Megatron-LM arguments for {summary(plan)}.",
        f"# Rendered by `exatrain export-config --for megatron` for Megatron-LM {MEGATRON_LM.split('@')[1]} "
        "(option names from",
        f"# {MEGATRON_LM} megatron/training/arguments.py). Add your data, tokenizer and optimizer flags.",
        device_connections_hint(plan),
    ]
    text = render_arrays(
        "MEGATRON",
        header,
        groups,
        notes,
        f'{plan.gpus} ranks, e.g. torchrun ... pretrain_gpt.py "${{MEGATRON_ARGS[@]}}" <data flags>.',
    )
    return Export("megatron", text, notes)


def render_deepspeed(plan: Plan, ds_config_path: str = "ds_config.json") -> Export:
    groups, notes = megatron_deepspeed_groups(plan, ds_config_path)
    cfg = json.dumps(deepspeed_config(plan), indent=2)
    header = [
        f"# Megatron-DeepSpeed arguments and DeepSpeed config for {summary(plan)}.",
        f"# Rendered by `exatrain export-config --for deepspeed` for Megatron-DeepSpeed "
        f"{MEGATRON_DEEPSPEED_SOURCE.split('@')[1]} with DeepSpeed {DEEPSPEED_RELEASE}",
        f"# (names from {MEGATRON_DEEPSPEED_SOURCE} megatron/arguments.py and {DEEPSPEED} "
        "deepspeed/runtime/constants.py).",
    ]
    if plan.sequence_parallel:  # megatron/arguments.py validate_args raises without it on CUDA
        header.append("# Environment: export CUDA_DEVICE_MAX_CONNECTIONS=1 (required with --sequence-parallel).")
    text = render_arrays(
        "MEGATRON_DEEPSPEED",
        header,
        groups,
        notes,
        f'{plan.gpus} ranks, e.g. deepspeed pretrain_gpt.py "${{MEGATRON_DEEPSPEED_ARGS[@]}}" <data flags>.',
    )
    # The JSON goes beside the flags: a heredoc, so the fragment stays one self-contained file.
    text += (
        f"\n# DeepSpeed config — {DEEPSPEED} deepspeed/runtime/constants.py, deepspeed/runtime/zero/config.py\n"
        f"cat > {_q(ds_config_path)} <<'EXATRAIN_DS_CONFIG'\n{cfg}\nEXATRAIN_DS_CONFIG\n"
    )
    return Export("deepspeed", text, notes, files=((ds_config_path, cfg + "\n"),))


__all__ = [
    "DEEPSPEED",
    "MEGATRON_FP8_RECIPES",
    "MEGATRON_DEEPSPEED_SOURCE",
    "MEGATRON_LM",
    "attention_backend",
    "attention_shape_flags",
    "deepspeed_config",
    "dropout_flags",
    "fp8_flags",
    "megatron_deepspeed_groups",
    "megatron_lm_groups",
    "moe_flags",
    "moe_layer_freq",
    "pipeline_layout",
    "precision_flags",
    "render_arrays",
    "render_deepspeed",
    "render_megatron",
    "vocab_divisor",
]
