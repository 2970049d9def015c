"""The settings a Megatron-LM or Megatron-DeepSpeed launch runs with (read_megatron's second part): pipeline
layout, batch, memory, precision, MoE dispatch and overlap from the command's options and the DeepSpeed JSON,
with the JSON's own checks."""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from exatrain.accounting.engines import get_engine
from exatrain.engine_configs.megatron import MEGATRON_FP8_RECIPES
from exatrain.engine_configs.read_common import number, positive
from exatrain.engine_configs.read_megatron_flags import _Flags, _stage
from exatrain.engine_configs.shell import Script
from exatrain.errors import UserError
from exatrain.plan import balanced_split


def _pipeline(f: _Flags, s: dict[str, Any], model: Mapping[str, Any], pp: int, source: str, notes: list[str]) -> None:
    """Virtual stages and an uneven split: --num-virtual-stages-per-pipeline-rank, --num-layers-per-virtual-
    pipeline-stage, --pipeline-model-parallel-layout, --decoder-first/last-pipeline-num-layers."""
    layers = model.get("layers", 0)
    stages: list[int] | None = None
    layout = f.value("--pipeline-model-parallel-layout")
    virtual = f.int("--num-virtual-stages-per-pipeline-rank")
    per_virtual = f.int("--num-layers-per-virtual-pipeline-stage")
    first, last = f.int("--decoder-first-pipeline-num-layers"), f.int("--decoder-last-pipeline-num-layers")
    if layout is not None:
        stages = _parse_layout(layout, source)
        if len(stages) % pp:
            raise UserError(
                f"{source}: --pipeline-model-parallel-layout has {len(stages)} stages, not a multiple of pp {pp}"
            )
        virtual = len(stages) // pp
    elif per_virtual and layers:
        if layers % (pp * per_virtual):
            raise UserError(
                f"{source}: {layers} layers do not split into pp {pp} x stages of "
                f"--num-layers-per-virtual-pipeline-stage {per_virtual}"
            )
        virtual = layers // (pp * per_virtual)
    elif (first or last) and layers and pp > 1:
        rest = layers - (first or 0) - (last or 0)
        middle = pp - (first is not None) - (last is not None)
        if middle < 0 or rest < 0 or (middle and rest % middle) or (not middle and rest):
            raise UserError(
                f"{source}: --decoder-first/last-pipeline-num-layers leave {rest} layers for {middle} stages"
            )
        each = rest // middle if middle else 0
        stages = ([first] if first is not None else []) + [each] * middle + ([last] if last is not None else [])
    virtual = virtual or 1
    if pp > 1:
        s["schedule"] = "interleaved" if virtual > 1 else "1f1b"
        s["interleave"] = virtual
    if stages is not None:
        if layers and sum(stages) != layers:
            raise UserError(f"{source}: the pipeline layout holds {sum(stages)} layers, the model {layers}")
        if not (layers and tuple(stages) == balanced_split(layers, len(stages))):
            s["stage_layers"] = tuple(stages)


def _parse_layout(text: str, source: str) -> list[int]:
    """Megatron-LM's --pipeline-model-parallel-layout: stages split by '|', 't' a layer, 't*n' n of them, 'E' the
    embedding, 'L' the loss (pipeline_parallel_layer_layout.py); other modules (MTP 'm') are not modelled."""
    stages = []
    for stage in text.replace('"', "").split("|"):
        count = 0
        for token in re.findall(r"[A-Za-z](?:\*\d+)?", stage.replace(",", "")):
            kind, _, times = token.partition("*")
            if kind == "t":
                count += int(times or 1)
            elif kind not in "EL":
                raise UserError(f"{source}: --pipeline-model-parallel-layout module {kind!r} is not modelled (t, E, L)")
        stages.append(count)
    return stages


def _batch(f: _Flags, s: dict[str, Any], ds: Mapping[str, Any], defaults: list[str], source: str) -> None:
    micro = f.int("--micro-batch-size")
    ds_micro = ds.get("train_micro_batch_size_per_gpu")
    if micro is not None and ds_micro is not None and micro != ds_micro:
        raise UserError(
            f"{source}: --micro-batch-size {micro} but the DeepSpeed JSON's "
            f"train_micro_batch_size_per_gpu is {ds_micro}"
        )
    micro = micro or (positive(ds_micro, "train_micro_batch_size_per_gpu", source) if ds_micro is not None else None)
    if micro is None:
        defaults.append("--micro-batch-size (1)")
    s["micro_batch"] = micro or 1
    glob = f.int("--global-batch-size")
    ds_glob = ds.get("train_batch_size")
    if glob is not None and ds_glob is not None and glob != ds_glob:
        raise UserError(f"{source}: --global-batch-size {glob} but the DeepSpeed JSON's train_batch_size is {ds_glob}")
    glob = glob or (positive(ds_glob, "train_batch_size", source) if ds_glob is not None else None)
    if glob is None:
        defaults.append("--global-batch-size (micro-batch x data-parallel size)")
    else:
        s["global_batch"] = glob


def _memory(
    f: _Flags,
    s: dict[str, Any],
    ds: Mapping[str, Any],
    deepspeed: bool,
    source: str,
    defaults: list[str],
    notes: list[str],
) -> None:
    """Recomputation and optimizer-state sharding."""
    granularity = f.value("--recompute-granularity")
    method, count = f.value("--recompute-method"), f.int("--recompute-num-layers")
    if f.has("--checkpoint-activations") and granularity is None:
        granularity = "full"  # Megatron-DeepSpeed (and Megatron-LM's legacy spelling): every layer
        every = f.int("--checkpoint-num-layers", default=1)
        if every > 1:
            notes.append(f"--checkpoint-num-layers {every} (chunks of layers) is priced as every layer recomputed")
    if f.has("--recompute-activations") and granularity is None:
        granularity = "selective"
    if granularity == "full":
        s["recompute"] = "full"
        if f.has("--distribute-saved-activations") or f.has("--partition-activations"):
            s["distribute_saved_activations"] = True  # each checkpoint split over tp (Megatron-Core, DeepSpeed)
        if method == "block" and count:
            s["recompute_layers"] = count
        elif method == "uniform" and count and count > 1:
            notes.append(
                f"--recompute-method uniform --recompute-num-layers {count} (chunks of {count} layers) is "
                "priced as every layer recomputed"
            )
    elif granularity == "selective":
        s["recompute"] = "selective"
        modules = f.values("--recompute-modules")
        if modules:
            s["recompute_modules"] = tuple(modules)
    elif granularity is not None:
        raise UserError(f"{source}: --recompute-granularity {granularity} is not full or selective")
    else:
        defaults.append("recomputation (none)")
    zero = None
    if f.has("--use-distributed-optimizer"):
        zero = 1
    if f.has("--use-megatron-fsdp"):
        strategy = f.value("--data-parallel-sharding-strategy") or "no_shard"
        zero = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(strategy)
        if zero is None:
            raise UserError(f"{source}: --data-parallel-sharding-strategy {strategy} is not modelled")
    if f.has("--use-torch-fsdp2"):
        zero = 3
        notes.append("--use-torch-fsdp2 is priced as ZeRO-3 (Megatron-FSDP's optim_grads_params)")
    stage_text = f.value("--zero-stage")
    flag_stage = None if stage_text is None else _stage(stage_text, "--zero-stage", source)
    ds_stage = ds.get("zero_optimization", {}).get("stage") if isinstance(ds.get("zero_optimization"), dict) else None
    if deepspeed:
        if flag_stage is not None and ds_stage is not None and flag_stage != ds_stage:
            raise UserError(
                f"{source}: --zero-stage {flag_stage} but the DeepSpeed JSON's zero_optimization.stage is {ds_stage}"
            )
        zero = ds_stage if ds_stage is not None else flag_stage
    if zero is None:
        defaults.append(
            "ZeRO (0: " + ("no zero_optimization.stage" if deepspeed else "no --use-distributed-optimizer") + ")"
        )
    s["zero"] = zero or 0


def _precision(
    f: _Flags,
    s: dict[str, Any],
    ds: Mapping[str, Any],
    runtime: str,
    source: str,
    defaults: list[str],
    notes: list[str],
) -> None:
    engine = get_engine(runtime)
    bf16, fp16 = f.has("--bf16"), f.has("--fp16")
    ds_bf16 = (ds.get("bf16") or {}).get("enabled") if isinstance(ds.get("bf16"), dict) else None
    ds_fp16 = (ds.get("fp16") or {}).get("enabled") if isinstance(ds.get("fp16"), dict) else None
    if ds_bf16 is not None and ds_bf16 != bf16 and (bf16 or ds_bf16):
        raise UserError(
            f"{source}: {'--bf16' if bf16 else 'no --bf16'} but the DeepSpeed JSON's bf16.enabled is "
            f"{str(ds_bf16).lower()}"
        )
    if (bf16 or ds_bf16) and (fp16 or ds_fp16):
        raise UserError(f"{source}: both bf16 and fp16 are set; Megatron trains in one of them")
    if not (bf16 or fp16 or ds_bf16 or ds_fp16):
        defaults.append("precision (float32: no --bf16)")
    s["dtype"] = "float16" if (fp16 or ds_fp16) else "bfloat16" if (bf16 or ds_bf16) else "float32"
    if runtime == "megatron-core":
        backend = f.value("--attention-backend")
        if backend is None:
            defaults.append("--attention-backend (auto: Transformer Engine's fused)")
            kernel = "fa2" if f.has("--use-flash-attn") else ""
            s["flash_attention"] = True
        elif backend in ("unfused", "local"):
            s["flash_attention"], kernel = False, ""
        elif backend in ("flash", "fused", "auto"):
            s["flash_attention"], kernel = True, {"flash": "fa2", "fused": "fused", "auto": ""}[backend]
        else:
            raise UserError(f"{source}: --attention-backend {backend} is not flash, fused, unfused, local or auto")
    else:
        flash = [
            n
            for n in (
                "--use-flash-attn-v2",
                "--use-flash-attn",
                "--use-flash-attn-v1",
                "--use-flash-attn-triton",
                "--use-flash-attn-builder",
            )
            if f.has(n)
        ]
        s["flash_attention"] = bool(flash)
        kernel = "fa2" if flash else ""
        if not flash:
            defaults.append("attention (no flash attention: no --use-flash-attn-v2)")
        elif flash[0] != "--use-flash-attn-v2":
            notes.append(f"{flash[0]} is priced as FlashAttention-2")
    if kernel and kernel != engine.activations.flash_kernel:
        s["attention_kernel"] = kernel
    fmt, recipe = f.value("--fp8-format"), f.value("--fp8-recipe")
    if fmt is not None or recipe is not None:
        recipe = recipe or "delayed"  # Megatron-LM's default --fp8-recipe
        inverse = {v: k for k, v in MEGATRON_FP8_RECIPES.items()}
        if recipe not in inverse:
            raise UserError(f"{source}: --fp8-recipe {recipe} is not modelled ({', '.join(inverse)})")
        s["fp8"] = inverse[recipe]
    if f.has("--fp8-param-gather"):
        s["fp8_param_gather"] = True
    accum = (
        "bfloat16"
        if f.has("--grad-reduce-in-bf16")
        else "float32"
        if f.has("--accumulate-allreduce-grads-in-fp32")
        else None
    )
    ds_accum = (ds.get("data_types") or {}).get("grad_accum_dtype") if isinstance(ds.get("data_types"), dict) else None
    if ds_accum is not None:
        accum = {"fp32": "float32", "bf16": "bfloat16", "fp16": "bfloat16"}.get(str(ds_accum), accum)
    if accum is not None and s["dtype"] == "bfloat16" and accum != engine.accum_dtype("bfloat16"):
        s["grad_accum"] = accum
    if f.has("--no-gradient-accumulation-fusion"):
        s["grad_accum_fusion"] = "off"


def _moe_settings(f: _Flags, s: dict[str, Any], source: str, defaults: list[str], notes: list[str]) -> None:
    dispatcher = f.value("--moe-token-dispatcher-type")
    if dispatcher == "flex":
        backend = f.value("--moe-flex-dispatcher-backend") or "deepep"
        if backend not in ("deepep", "hybridep"):
            raise UserError(f"{source}: --moe-flex-dispatcher-backend {backend} is not modelled (deepep or hybridep)")
        s["moe_dispatcher"] = backend
    elif dispatcher in (None, "allgather"):
        (defaults if dispatcher is None else notes).append(
            "--moe-token-dispatcher-type (allgather, priced as alltoall)"
            if dispatcher is None
            else "--moe-token-dispatcher-type allgather is priced as alltoall"
        )
    elif dispatcher not in ("alltoall", "alltoall_seq"):
        raise UserError(
            f"{source}: --moe-token-dispatcher-type {dispatcher} is not modelled (alltoall, allgather or flex)"
        )
    capacity = f.value("--moe-expert-capacity-factor")
    if capacity is not None and capacity != "None":
        s["moe_capacity_factor"] = number(capacity, "--moe-expert-capacity-factor", source)
        if not f.has("--moe-pad-expert-input-to-capacity"):
            notes.append("a capacity factor without --moe-pad-expert-input-to-capacity is priced padded to capacity")
    if f.has("--moe-router-force-load-balancing"):
        s["moe_force_balance"] = True


def _overlap(f: _Flags, ds: Mapping[str, Any], runtime: str, defaults: list[str]) -> str:
    """The --overlap value of the overlaps the launch switches on (accounting.engines' switches)."""
    engine = get_engine(runtime)
    offered = {o.comm: o for o in engine.overlaps}
    on = {c for c, o in offered.items() if o.default_on}
    if runtime == "megatron-core":
        for comm, flag in (
            ("dp_grad_reduce", "--overlap-grad-reduce"),
            ("dp_param_gather", "--overlap-param-gather"),
            ("tp", "--tp-comm-overlap"),
            ("ep_a2a", "--overlap-moe-expert-parallel-comm"),
        ):
            if f.has(flag):
                on.add(comm)
        if f.has("--no-overlap-p2p-communication"):
            on.discard("pp_p2p")
        f.has("--overlap-p2p-communication")
        what = "--overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap"
    else:
        zero = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
        if zero.get("overlap_comm"):
            on |= {"dp_grad_reduce", "dp_param_gather"}
        what = "zero_optimization.overlap_comm"
    on &= set(offered)
    default_on = {c for c, o in offered.items() if o.default_on}
    if on == default_on:
        defaults.append(f"overlap ({what} off)")
        return "default"
    return ",".join(c for c in offered if c in on) or "none"


# ---- DeepSpeed JSON ----------------------------------------------------------------------------------------------
_DS_KNOWN = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "bf16",
    "fp16",
    "data_types",
}
_DS_IGNORED = {
    "gradient_clipping",
    "steps_per_print",
    "wall_clock_breakdown",
    "optimizer",
    "scheduler",
    "flops_profiler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comms_logger",
    "zero_allow_untested_optimizer",
    "memory_breakdown",
    "dump_state",
    "prescale_gradients",
    "gradient_predivide_factor",
    "seed",
    "zero_force_ds_cpu_optimizer",
}
_ZERO_KNOWN = {
    "stage",
    "overlap_comm",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "contiguous_gradients",
    "reduce_scatter",
    "allgather_partitions",
    "round_robin_gradients",
    "sub_group_size",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save",
    "ignore_unused_parameters",
    "elastic_checkpoint",
    "load_from_fp32_weights",
}


def _deepspeed_json(path: str, script: Script, side_files: Mapping[str, str], source: str) -> dict[str, Any]:
    text = script.heredocs.get(path)
    if text is None:
        text = side_files.get(path)
    if text is None:
        raise UserError(f"{source}: --deepspeed_config {path} is neither written by the script nor beside it")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{source}: the DeepSpeed JSON {path} is not valid JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{source}: the DeepSpeed JSON {path} is not an object")
    return data


def _ds_unknown(ds: Mapping[str, Any]) -> tuple[str, ...]:
    out = [k for k in ds if k not in _DS_KNOWN | _DS_IGNORED]
    zero = ds.get("zero_optimization")
    if isinstance(zero, dict):
        out += [f"zero_optimization.{k}" for k in zero if k not in _ZERO_KNOWN]
    return tuple(out)


def _accum(ds: Mapping[str, Any], s: Mapping[str, Any]) -> int:
    accum = ds.get("gradient_accumulation_steps")
    return accum if isinstance(accum, int) and accum > 0 else 1


def _check_deepspeed_batch(
    ds: Mapping[str, Any], s: Mapping[str, Any], ranks: int, gpus: int | None, source: str
) -> None:
    """DeepSpeed's own check (runtime/config.py _batch_assertion): train_batch_size = micro x accumulation x dp."""
    batch, accum = ds.get("train_batch_size"), ds.get("gradient_accumulation_steps")
    micro = s["micro_batch"]
    if batch is None or accum is None:
        return
    if not isinstance(batch, int) or not isinstance(accum, int) or batch <= 0 or accum <= 0:
        raise UserError(
            f"{source}: the DeepSpeed JSON's train_batch_size and gradient_accumulation_steps must be positive integers"
        )
    if batch % (micro * accum):
        raise UserError(
            f"{source}: the DeepSpeed JSON's train_batch_size {batch} is not micro-batch {micro} x "
            f"gradient_accumulation_steps {accum} x data-parallel ranks"
        )
    dp = batch // (micro * accum)
    if gpus is not None and gpus != dp * ranks:
        raise UserError(
            f"{source}: the DeepSpeed JSON's batch makes {dp} data-parallel ranks, {dp * ranks} ranks with "
            f"tp*pp {ranks}, but the launch runs {gpus}"
        )
