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
from typing import Any

from exatrain.accounting.engines import get_engine
from exatrain.engine_configs.common import Export, Flag, FlagGroup, summary
from exatrain.engine_configs.megatron import render_arrays
from exatrain.engine_configs.torchtitan_flavors import FLAVOR_DICTS, FLAVORS, Flavor
from exatrain.engine_configs.torchtitan_models import (
    architecture,
    builtin_flavor,
    flavor_model,
    flavor_notes,
    flavor_snippet,
    llama3_ffn_args,
    model_family,
    registered_model,
)
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
# The output projection's module name: v0.2.2's models call it "output", 0.3's decoders "lm_head"
HEAD_MODULE = {"0.2.2": "output", "0.3.0": "lm_head"}


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


def _data_parallel(plan: Plan, notes: list[str]) -> tuple[int, int, str | None]:
    """(replicate, shard, reshard_after_forward or None): how torchtitan spreads dp, plain DDP only where it is
    the sole parallelism; a note where FSDP2 stands in for the plan's ZeRO stage."""
    if plan.dp == 1:
        return 1, 1, None
    if plan.zero_stage == 0 and plan.tp == 1 and plan.pp == 1 and plan.ep == 1:
        return plan.dp, 1, None  # plain DDP (expert parallelism shards its experts' gradients: FSDP)
    if plan.zero_stage in (1, 2):
        notes.append(
            f"torchtitan has no ZeRO-{plan.zero_stage}: FSDP2 over dp with reshard_after_forward "
            "'never' shards weights, gradients and optimizer states at rest and gathers the "
            "weights once per step (ZeRO-2's traffic, ZeRO-3's resting memory)"
        )
    elif plan.zero_stage == 0:
        notes.append("torchtitan runs DDP only as the sole parallelism; with tp/pp the dp dimension is FSDP2")
    return 1, plan.dp, "always" if plan.zero_stage == 3 else "never"


def _layout_notes(plan: Plan, v03: bool, shard: int) -> list[str]:
    """What torchtitan's sequence parallelism, selective checkpointing and mixed precision do otherwise than the
    plan says."""
    notes = []
    if plan.tp > 1 and not plan.sequence_parallel and not v03:
        notes.append("torchtitan's tensor parallelism always shards the norms over tp (sequence parallel on)")
    if plan.recompute == "selective":
        notes.append(
            "torchtitan's selective checkpointing is per operator ("
            + ("SelectiveAC" if v03 else "selective_ac_option 'op'")
            + ": matmul outputs kept), not Megatron's attention-core recompute"
        )
    if plan.dtype == "bfloat16" and shard == 1 and not (plan.tp == 1 and plan.pp == 1):
        notes.append(
            "torchtitan applies mixed_precision_param through FSDP (dp > 1) or DDP-only autocast; "
            "this layout has neither, so it trains in float32 unless training.dtype is set"
        )
    return notes


def _training_section(plan: Plan, v03: bool) -> dict[str, Any]:
    """[training]: batch sizes, sequence length, precision, CPU offload and (0.3) CUDA graphs."""
    pipelined = plan.pp > 1
    training = {
        # per dp rank and step: all of a pipeline's micro-batches, or one accumulation micro-batch
        "local_batch_size": plan.micro_batch * (plan.num_microbatches if pipelined else 1),
        "global_batch_size": plan.global_batch,
        "seq_len": plan.model.seq_len,
        "mixed_precision_param": plan.dtype,
        "mixed_precision_reduce": "float32",
    }
    if plan.offload == "params":  # FSDP2's CPUOffloadPolicy (v0.2.2 job_config.py Training; 0.3's too)
        training["enable_cpu_offload"] = True
    if v03 and (pipelined or plan.ep > 1):  # 0.3 captures CUDA graphs by default, which it refuses with a
        # pipeline or its standard expert-parallel dispatcher (trainer.py Config._validate_cuda_graphs)
        training["disable_cuda_graphs"] = True
    return training


def _pipeline_fields(plan: Plan, release: str) -> dict[str, Any]:
    """The pipeline schedule, micro-batch size and model parts of [parallelism]; UserError for a schedule
    torchtitan has no class for."""
    if plan.schedule not in SCHEDULE_NAMES:  # zbh1: torchtitan runs a multi-stage class over >= 2 stages a rank
        raise UserError(
            "torchtitan has no one-chunk zero-bubble schedule (it runs InterleavedZeroBubble over 2 "
            "or more stages a rank): export the plan with --schedule zero_bubble --interleave 2 or "
            "--schedule zbv, or for exatrain's trainer"
        )
    return {
        "pipeline_parallel_schedule": SCHEDULE_NAMES[plan.schedule],
        "pipeline_parallel_microbatch_size": plan.micro_batch,
        "module_fqns_per_model_part": model_parts(plan, HEAD_MODULE[release]),
    }


def _expert_fields(plan: Plan, v03: bool, notes: list[str]) -> dict[str, Any]:
    """Expert parallelism in [parallelism] (module doc: where ep and etp may sit); UserError where 0.3 cannot
    place the plan's ep."""
    par: dict[str, Any] = {"expert_parallel_degree": plan.ep}
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
    return par


def _parallelism_section(
    plan: Plan, release: str, dp_layout: tuple[int, int, str | None], notes: list[str]
) -> dict[str, Any]:
    """[parallelism]: the dp split (``_data_parallel``), tp, pp and its schedule, cp and its exchange, ep."""
    v03 = release == "0.3.0"
    replicate, shard, reshard = dp_layout
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
    if plan.pp > 1:
        par.update(_pipeline_fields(plan, release))
    par["context_parallel_degree"] = plan.cp
    if plan.cp > 1 and not v03:  # the exchange priced (cost.context.cp_exposed_s): torch's rotate method
        comm = cp_comm_for("torchtitan", plan.cp_comm, plan.model)
        par["context_parallel_rotate_method"] = {"all_gather": "allgather", "p2p": "alltoall"}[comm]
    if plan.model.is_moe:
        par.update(_expert_fields(plan, v03, notes))
    return par


def _float8_section(plan: Plan, v03: bool, notes: list[str]) -> dict[str, Any]:
    """[quantize.linear.float8] for the plan's FP8 (empty where none is set or 0.3's config function sets it),
    with a note where torchtitan's recipe is not the one priced."""
    if not plan.fp8:
        return {}
    if v03 and builtin_flavor(plan.model, "0.3.0").config_fp8 == plan.fp8:
        return {}  # the config function's own float8 converter: what the plan priced
    if v03:
        notes.append(
            "torchtitan 0.3 has no command-line switch for float8 GEMMs (its float8 converters come with "
            "config functions): this command line trains without the plan's FP8"
        )
        return {}
    recipe = {"current": "tensorwise", "block": "rowwise"}.get(plan.fp8, "tensorwise")
    quant: dict[str, Any] = {"recipe_name": recipe}
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
    return quant


def _compile_section(plan: Plan, v03: bool) -> dict[str, Any]:
    """[compile]: torch.compile per block is what --elementwise fused priced, and the compiled loss what
    --cross-entropy fused (torchtitan's own with compiled blocks) priced; eager otherwise."""
    components = [
        c
        for c, on in (
            ("model", plan.elementwise == "fused"),
            ("loss", get_engine("torchtitan").cross_entropy(plan.cross_entropy, plan.elementwise) == "fused"),
        )
        if on
    ]
    return {
        "enable": bool(components),
        **({"components": components} if components else {}),
        # 0.3: async TP compiles the model; a config function that turns it on (llama3_405b) would
        # refuse a command line that turns compiling off (CompileConfig's check)
        **({"enable_async_tensor_parallel": False} if v03 and not components else {}),
    }


def _checkpoint_section(plan: Plan, v03: bool) -> dict[str, Any]:
    """[activation_checkpoint]: the plan's recompute (selective per operator; v0.2.2's every-Nth-block form)."""
    ac: dict[str, Any] = {"mode": plan.recompute}
    if plan.recompute == "selective":
        ac["selective_ac_option"] = "op"
    elif plan.recompute == "full" and plan.recompute_every and not v03:  # layer-level: every Nth block whole
        ac = {"mode": "selective", "selective_ac_option": str(plan.recompute_every)}
    return ac


def torchtitan_config(plan: Plan, release: str = "0.2.2") -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """(sections, notes): the job config as nested dicts in v0.2.2's section and field names, and what it cannot
    express exactly; ``release`` "0.3.0" gives the fields torchtitan 0.3 takes on its command line instead
    (``torchtitan_03_args`` spells them), a model section of its --module and --config."""
    if plan.dtype == "float16":  # training.mixed_precision_param is bfloat16 or float32, and there is no loss scaler
        raise UserError(
            "torchtitan trains in bfloat16 or float32, not float16 (it has no loss scaling): export this "
            "plan for megatron or deepspeed, or plan it with --dtype bfloat16"
        )
    v03 = release == "0.3.0"
    model, notes, _ = _model_section_03(plan) if v03 else _model_section(plan)
    dp_layout = _data_parallel(plan, notes)
    notes += _layout_notes(plan, v03, dp_layout[1])
    training = _training_section(plan, v03)
    par = _parallelism_section(plan, release, dp_layout, notes)
    quant = _float8_section(plan, v03, notes)
    sections = {
        **({} if v03 else {"job": {"description": f"exatrain plan: {summary(plan)}"}}),
        "model": {**model, **({"converters": ["quantize.linear.float8"]} if quant else {})},
        "training": training,
        "parallelism": par,
        "activation_checkpoint": _checkpoint_section(plan, v03),
        "compile": _compile_section(plan, v03),
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
