"""A torchtitan TOML job config (``--job.config_file``) for a plan.

Keys checked against pytorch/torchtitan v0.2.2 (73a0e697, 2026-02-20), the last release that reads
TOML job files: torchtitan/config/job_config.py (sections and fields),
torchtitan/distributed/pipeline_parallel.py (module_fqns_per_model_part, microbatches =
local_batch_size / pipeline_parallel_microbatch_size, looped stage placement), torchtitan/train.py
(gradient accumulation = global_batch_size / (local_batch_size x dp)),
torchtitan/models/llama3/model/model.py and model/args.py (FeedForward width, flavor fields),
torchtitan/models/llama3/infra/parallelize.py (DDP only as the sole parallelism; TP always shards
the norms = sequence parallel), and the same job_config.py for parallelism.context_parallel_degree,
parallelism.expert_parallel_degree and expert_tensor_parallel_degree (etp = tp: ep inside
dp_shard*cp, cp | ep; etp = 1: ep over all of tp and cp and part of dp_shard, tp*cp | ep; checked in
torchtitan/distributed/parallel_dims.py ParallelDims._validate) and quantize.linear.float8
(recipe_name tensorwise / rowwise; torchao Float8Linear, swapped in by the model converter
"quantize.linear.float8"). torchtitan main replaced TOML files with Python config functions
(#2386, 2026-02-23); the same section.field names remain its (frozen) command-line overrides.
"""

from __future__ import annotations

import json
from typing import Any

from exatrain.accounting.engines import get_engine
from exatrain.engine_configs.common import Export, fusion_note, kernel_note, summary
from exatrain.plan import Plan, cp_comm_for

TORCHTITAN = "pytorch/torchtitan@v0.2.2"
# exatrain schedule -> torch.distributed.pipelining schedule name (get_schedule_class)
SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B",
                  "zero_bubble": "InterleavedZeroBubble"}


def llama3_ffn_args(dim: int, width: int) -> tuple[int, float]:
    """(multiple_of, ffn_dim_multiplier) that make torchtitan's llama3 FeedForward exactly ``width``
    wide: it takes int(2*4*dim/3), scales by the multiplier (truncating) and rounds up to a multiple
    of multiple_of (llama3/model/model.py FeedForward). The product lands on width or width-1, so a
    multiple_of >= 2 that divides width rounds it to width."""
    base = int(2 * (4 * dim) / 3)
    multiple = width & -width  # largest power of two dividing width
    multiple = min(multiple, 1024) if multiple >= 2 else width
    return multiple, width / base


def model_parts(plan: Plan) -> list[list[str]]:
    """Module names of each virtual stage in model order (llama3's tok_embeddings, layers.i,
    norm, output); torchtitan places part k on pipeline rank k % pp, as the plan does."""
    parts: list[list[str]] = []
    first = 0
    for n in plan.layers_per_stage():
        parts.append([f"layers.{i}" for i in range(first, first + n)])
        first += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def torchtitan_config(plan: Plan) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """(sections, notes): the job config as nested dicts, and what it cannot express exactly."""
    m = plan.model
    notes: list[str] = []
    if m.arch == "gpt":
        notes.append("torchtitan has no GPT-2-style model (learned positions, LayerNorm with biases, GELU, "
                     "tied head): the flavor below is the llama3 family with the same depth, width, heads "
                     "and vocabulary and a SwiGLU of equal parameter count")
    only_dp = plan.tp == 1 and plan.pp == 1
    reshard: str | None = None
    if plan.dp == 1:
        replicate, shard = 1, 1
    elif plan.zero_stage == 0 and only_dp:
        replicate, shard = plan.dp, 1  # plain DDP
    else:
        replicate, shard = 1, plan.dp
        reshard = "always" if plan.zero_stage == 3 else "never"
        if plan.zero_stage in (1, 2):
            notes.append(f"torchtitan has no ZeRO-{plan.zero_stage}: FSDP2 over dp with reshard_after_forward "
                         "'never' shards weights, gradients and optimizer states at rest and gathers the "
                         "weights once per step (ZeRO-2's traffic, ZeRO-3's resting memory)")
        elif plan.zero_stage == 0:
            notes.append("torchtitan runs DDP only as the sole parallelism; with tp/pp the dp dimension is FSDP2")
    if plan.tp > 1 and not plan.sequence_parallel:
        notes.append("torchtitan's tensor parallelism always shards the norms over tp (sequence parallel on)")
    if plan.recompute == "selective":
        notes.append("torchtitan's selective checkpointing is per operator (selective_ac_option 'op': matmul "
                     "outputs kept), not Megatron's attention-core recompute")
    if plan.dtype == "bfloat16" and shard == 1 and not only_dp:
        notes.append("torchtitan applies mixed_precision_param through FSDP (dp > 1) or DDP-only autocast; "
                     "this layout has neither, so it trains in float32 unless training.dtype is set")

    if plan.grad_accum == "bfloat16":
        notes.append("the plan was priced with its gradients accumulated and reduced in bfloat16; torchtitan reduces "
                     "them in float32 (mixed_precision_reduce), as this config sets")
    note = fusion_note(plan, "torchtitan")
    notes += [note] if note else []
    pipelined = plan.pp > 1
    training = {
        # per dp rank and step: all of a pipeline's micro-batches, or one accumulation micro-batch
        "local_batch_size": plan.micro_batch * (plan.num_microbatches if pipelined else 1),
        "global_batch_size": plan.global_batch,
        "seq_len": m.seq_len,
        "mixed_precision_param": plan.dtype,
        "mixed_precision_reduce": "float32",
    }
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
    }
    if reshard is not None:
        par["fsdp_reshard_after_forward"] = reshard
    par["tensor_parallel_degree"] = plan.tp
    par["pipeline_parallel_degree"] = plan.pp
    if pipelined:
        par["pipeline_parallel_schedule"] = SCHEDULE_NAMES[plan.schedule]
        par["pipeline_parallel_microbatch_size"] = plan.micro_batch
        par["module_fqns_per_model_part"] = model_parts(plan)
    par["context_parallel_degree"] = plan.cp
    if plan.cp > 1:  # the exchange the planner prices (cost.experts.cp_exposed_s): torch's rotate method
        comm = cp_comm_for("torchtitan", plan.cp_comm, plan.model)
        par["context_parallel_rotate_method"] = {"all_gather": "allgather", "p2p": "alltoall"}[comm]
    if plan.model.is_moe:
        par["expert_parallel_degree"] = plan.ep
        if plan.ep > 1 and plan.ep % (plan.tp * plan.cp) == 0:
            par["expert_tensor_parallel_degree"] = 1  # ep takes all of tp and cp: experts whole, as priced
        elif plan.ep > 1 and plan.tp > 1:
            par["expert_tensor_parallel_degree"] = plan.tp
            notes.append(f"torchtitan runs ep {plan.ep} inside dp with its experts split over tp "
                         f"(expert_tensor_parallel_degree {plan.tp}); the estimate priced them whole on each rank")
        notes.append("torchtitan's llama3 family has no MoE layer: use its deepseek_v3 or qwen3 model with "
                     "this expert count and width as the flavor")
        if plan.moe_dispatcher != "alltoall":
            notes.append(f"the plan was priced with the {plan.moe_dispatcher} dispatcher (one copy per destination "
                         "rank and node); this config sets no dispatcher: torchtitan's own all-to-all sends every "
                         "routed copy")
        if plan.moe_capacity_factor:
            notes.append(f"the plan was priced with token drop at capacity factor {plan.moe_capacity_factor:g}, "
                         "every expert padded to it; torchtitan's MoE is dropless and this config cannot set it")
    note = kernel_note(plan, "torchtitan", ("sdpa",), "torch SDPA picks its kernel by torch version and device "
                       "(cuDNN's on Hopper from torch 2.11, FlashAttention-2's before)")
    notes += [note] if note else []
    quant: dict[str, Any] = {}
    if plan.fp8:
        recipe = {"current": "tensorwise", "block": "rowwise"}.get(plan.fp8, "tensorwise")
        quant = {"recipe_name": recipe}
        if plan.fp8_param_gather:
            # FSDP's all-gather in float8 is torchtitan's tensorwise path without a recipe name (v0.2.2
            # components/quantization/float8.py asserts the two are not set together), with the scales
            # precomputed once a step for the sharded weights
            quant = {"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True}
        if plan.fp8 in ("delayed", "mxfp8", "block"):
            notes.append(f"torchtitan's float8 has no {plan.fp8!r} scaling: this config uses its {recipe} "
                         "recipe (per-tensor current scales, or per-row for the block recipe), which the "
                         "plan's estimate did not price")
    # torch.compile per block is what --elementwise fused priced, and the compiled loss what --cross-entropy
    # fused (torchtitan's own with compiled blocks) priced; eager otherwise
    components = [c for c, on in (("model", plan.elementwise == "fused"),
                                  ("loss", get_engine("torchtitan").cross_entropy(plan.cross_entropy,
                                                                                  plan.elementwise) == "fused")) if on]
    if plan.elementwise == "eager-composite":
        notes.append("the plan was priced with each RMSNorm as composite ops (--elementwise eager-composite); "
                     "torchtitan's nn.RMSNorm runs one fused kernel from torch 2.9")
    ac: dict[str, Any] = {"mode": plan.recompute}
    if plan.recompute == "selective":
        ac["selective_ac_option"] = "op"
    elif plan.recompute == "full" and plan.recompute_every:  # layer-level: every Nth block checkpointed whole
        ac = {"mode": "selective", "selective_ac_option": str(plan.recompute_every)}
    sections = {
        "job": {"description": f"exatrain plan: {summary(plan)}"},
        "model": {"name": "llama3", "flavor": m.name,
                  **({"converters": ["quantize.linear.float8"]} if quant else {})},
        "training": training,
        "parallelism": par,
        "activation_checkpoint": ac,
        "compile": {"enable": bool(components), **({"components": components} if components else {})},
        **({"quantize.linear.float8": quant} if quant else {}),
        # Adam's kernel as the plan priced it (plan.ADAM_KERNELS; torchtitan's default: fused)
        **({"optimizer": {"implementation": plan.adam_kernel}} if plan.adam_kernel else {}),
        # round-robin routing, as the plan priced it (torchtitan/config/job_config.py Debug)
        **({"debug": {"moe_force_load_balance": True}} if plan.moe_force_balance else {}),
    }
    return sections, tuple(notes)


def flavor_snippet(plan: Plan) -> str:
    """The TransformerModelArgs to register as the flavor (llama3/model/args.py field names)."""
    m = plan.model
    width = m.ffn_hidden if m.gated_mlp else _swiglu_width(m.ffn_hidden)
    multiple, mult = llama3_ffn_args(m.hidden, width)
    return (f'llama3_args["{m.name}"] = TransformerModelArgs(dim={m.hidden}, n_layers={m.layers}, '
            f"n_heads={m.heads}, n_kv_heads={m.kv_heads}, vocab_size={m.vocab}, multiple_of={multiple}, "
            f"ffn_dim_multiplier={mult!r}, norm_eps={m.norm_eps!r}, rope_theta={m.rope_theta!r})")


def _swiglu_width(gelu_width: int) -> int:
    """A SwiGLU (3 matrices) with the parameters of a 2-matrix MLP: 2/3 of the width, rounded up to 256."""
    return -(-(2 * gelu_width) // (3 * 256)) * 256


def render_torchtitan(plan: Plan) -> Export:
    sections, notes = torchtitan_config(plan)
    lines = [f"# torchtitan job config for {summary(plan)}.",
             "# Rendered by `exatrain export-config --for torchtitan`; keys checked against",
             f"# {TORCHTITAN} torchtitan/config/job_config.py. Run: ./run_train.sh --job.config_file <this file>",
             f"# (world size {plan.gpus} = dp x tp x pp" + (" x cp" if plan.cp > 1 else "")
             + "). Add your dataset, optimizer and checkpoint sections.",
             "# Register the model shape as a flavor in torchtitan/models/llama3/__init__.py:",
             f"#   {flavor_snippet(plan)}"]
    lines += [f"# note: {n}" for n in notes]
    for name, fields in sections.items():
        lines += ["", f"[{name}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in fields.items()]
    return Export("torchtitan", "\n".join(lines) + "\n", notes)


def _toml_value(value: Any) -> str:
    """TOML for the values used here: str, int, bool, and lists of them (JSON's syntax coincides)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML rendering for {type(value).__name__}")


__all__ = ["SCHEDULE_NAMES", "TORCHTITAN", "flavor_snippet", "llama3_ffn_args", "model_parts",
           "render_torchtitan", "torchtitan_config"]
