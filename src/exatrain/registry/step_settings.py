"""The records of the run settings of a step's gradients, optimizer and communication: gradient accumulation and
its fusion, the Adam kernel, the context-parallel exchange, what recomputation reruns, host offload and blocking
launches (one ``Setting`` each)."""

from __future__ import annotations

from exatrain.registry.exports import adam_note, blocking_note, fusion_note, label, titan03_cp_note, trainer_layers
from exatrain.registry.problems import (
    adam_kernel_problem,
    cp_comm_for,
    distribute_saved_problem,
    cp_comm_rule,
    grad_accum_fusion_problem,
    grad_accum_problem,
    offload_problem,
    recompute_layers_problem,
    recompute_modules_problem,
)
from exatrain.registry.record import Own, Setting
from exatrain.registry.vocab import (
    ADAM_BYTES,
    ADAM_KERNELS,
    CP_COMMS,
    GRAD_ACCUM,
    GRAD_ACCUM_FUSION,
    HALF_DTYPES,
    OFFLOADS,
    RECOMPUTE_EVERY_RUNTIMES,
    RECOMPUTE_LAYERS_RUNTIMES,
    RECOMPUTE_MODULES,
    RECOMPUTE_MODULES_RUNTIMES,
    recompute_modules_of,
)


# ---- an estimate's notes (Setting.note; facts: planner.estimate_notes.NoteFacts) ---------------------------------
def _grad_accum_line(f) -> str:
    plan, rt = f.plan, f.plan.runtime
    if plan.dtype != "bfloat16":
        return ""
    own = next(s for s in STEP_SETTINGS if s.name == "grad_accum").engines[rt].value
    return (
        f"gradients accumulated and reduced in {f.run.engine.grad_accum_dtype} ("
        + (f"set by --grad-accum; {rt}'s own: {own}" if plan.grad_accum else f"{rt}'s own; --grad-accum")
        + ")"
    )


def _accumulation_line(f) -> str:
    """Where each micro-batch's gradients are added up: a pass outside the GEMMs, the parameter passes of an
    autocast or FSDP2 engine, or inside the GEMMs where the engine offers the switch."""
    plan, engine = f.plan, f.run.engine
    ddp_passes = plan.zero_stage in engine.param_pass_zero
    if engine.accum_pass(plan.dtype):
        return (
            f"gradient accumulation: {engine.accum_pass(plan.dtype):g} bytes a parameter every micro-batch "
            f"outside the GEMMs ({engine.accum_pass_why()}"
            + ("; set by --grad-accum-fusion off" if plan.grad_accum_fusion == "off" else "")
            + ")"
        )
    if ddp_passes or (plan.zero_stage in engine.fsdp_pass_zero and plan.dtype in HALF_DTYPES):
        how = (
            "DDP: autocast's weight casts, the gradients cast back, autograd's adds into .grad"
            if ddp_passes
            else "FSDP2: its gathers' copies, the unsharded gradients kept in fp32, the reduce-scatter's copies"
        )
        return (
            f"parameter passes every micro-batch ({how}; cost.step.with_parameter_passes): {engine.param_pass_source}"
        )
    if engine.accum_fusion_switch:
        return (
            "gradient accumulation: inside the weight-gradient GEMMs ("
            + ("set by --grad-accum-fusion on" if plan.grad_accum_fusion else f"{plan.runtime}'s own")
            + f"; --grad-accum-fusion off prices {engine.accum_fusion_switch})"
        )
    return ""


def _adam_line(f) -> str:
    plan, engine = f.plan, f.run.engine
    kernel = str(
        engine.adam_kernel(
            tp=plan.tp,
            ep=plan.ep,
            zero=plan.zero_stage,
            shard=plan.dp * plan.cp if plan.zero_stage >= 1 else 1,
            on_host=f.cluster.device.is_host,
        )
    )
    around = sum(engine.step_passes(plan.dtype))
    return (
        f"optimizer step: {kernel} Adam, {ADAM_BYTES[kernel]:g} bytes a parameter of the optimizer shard ("
        + ("set by --adam-kernel; " if plan.adam_kernel else "")
        + f"{engine.adam_source})"
        + (f", and {around:g} bytes a parameter around it ({engine.step_pass_source})" if around else "")
    )


def _cp_line(f) -> str:
    plan = f.plan
    if plan.cp <= 1:
        return ""
    x = f.run.cp_exchange
    how = {
        "p2p": "K,V blocks passed round the ring, each behind a block's attention",
        "all_gather": "K,V all-gathered" + (", behind the local block's attention" if x.overlapped else ", exposed"),
        "a2a": "all-to-all of Q,K,V and of the output (heads/cp a rank over the whole sequence), exposed",
    }
    return (
        f"cp {plan.cp}: s/cp tokens per rank; {how[x.comm]} — {x.comm} ({x.switch}"
        + ("; set by --cp-comm" if plan.cp_comm else "")
        + f"; {x.source}) (cost.context.cp_exposed_s)"
    )


def _modules_line(f) -> str:
    modules = f.plan.recompute_modules
    if not modules:
        return ""
    return (
        f"selective recomputation reruns {', '.join(modules)} in the backward (Megatron-Core "
        f"--recompute-modules {' '.join(modules)}): their outputs are not kept "
        "(accounting.memory.layer_activation_bytes), their forward runs again, with the TP collectives "
        "inside them and, for moe, the all-to-alls (cost.recompute.module_rerun_s)"
    )


def _rerun_line(plan, how: str) -> str:
    """The layers of each pipeline rank a partial full recomputation reruns (``how``: which, by whose switch)."""
    rerun = [plan.recomputed_layers_of_rank(r) for r in range(plan.pp)]
    held = [sum(plan.layers_per_stage()[v] for v in plan.stages_of_rank(r)) for r in range(plan.pp)]
    return (
        f"full recomputation of {how}: "
        + ", ".join(f"{n} of {m}" for n, m in zip(rerun, held))
        + " layers by pipeline rank rerun their forward; the others keep what they keep without recomputation"
    )


def _layers_line(f) -> str:
    plan = f.plan
    if not (plan.recompute_layers and plan.recompute == "full"):
        return ""
    n = plan.recompute_layers
    how = f"the first {n} layers of each stage (Megatron-Core --recompute-method block --recompute-num-layers {n})"
    return _rerun_line(plan, how)


def _every_line(f) -> str:
    plan = f.plan
    if plan.recompute_layers or not (plan.recompute_every and plan.recompute == "full"):
        return ""
    n = plan.recompute_every
    return _rerun_line(plan, f'one layer in {n} (torchtitan\'s selective_ac_option "{n}")')


STEP_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "grad_accum",
        str,
        "",
        note=_grad_accum_line,
        engines={
            "megatron-core": Own(
                "float32",
                (
                    "megatron/training/arguments.py: --bf16 sets accumulate_allreduce_grads_in_fp32 unless "
                    "--grad-reduce-in-bf16"
                ),
            ),
            "megatron-deepspeed": Own(
                "bfloat16",
                (
                    "deepspeed/runtime/engine.py get_data_types: data_types.grad_accum_dtype defaults to the model "
                    "dtype; fp32 selects BF16_Optimizer at ZeRO-1 (_do_optimizer_sanity_check)"
                ),
            ),
            "torchtitan": Own(
                "float32",
                "torchtitan training.mixed_precision_reduce = float32; sharded gradients in the fp32 params' dtype",
            ),
            "exatrain": Own("float32", "trainer: autocast over fp32 parameters, fp32 .grad (trainer/parallel/data.py)"),
            "llm-foundry": Own(
                "bfloat16",
                (
                    "composer/trainer/mosaic_fsdp.py get_mixed_precision: DEFAULT = MixedPrecision(param_dtype=bf16, "
                    "buffer_dtype=bf16, reduce_dtype=None), PURE adds reduce_dtype=bf16; torch FSDP1 flat_param.py "
                    "FlatParamHandle._init_param_reduce_dtypes: a param_dtype without a reduce_dtype reduces in the "
                    "param dtype; the sharded gradient is cast back to the fp32 parameters' dtype after the "
                    "reduce-scatter (_runtime_utils.py _cast_grad_to_param_dtype) and accumulated there; a "
                    "mixed_precision dict with reduce_dtype fp32 reduces in fp32 (--grad-accum float32)"
                ),
            ),
        },
        profile=("grad_accum_dtype", "grad_accum_source"),
        before_search=True,
        choices=GRAD_ACCUM,
        load=str,
        problem=lambda v, p: grad_accum_problem(v, p.dtype, p.runtime),
        help=(
            "the dtype bfloat16 training accumulates and reduces its gradients in: float32 (Megatron-Core's "
            "default; DeepSpeed's BF16_Optimizer, data_types.grad_accum_dtype fp32, ZeRO-1: 18 bytes a parameter "
            "every micro-batch to accumulate them, all-reduced in fp32) or bfloat16 (DeepSpeed's default; "
            "Megatron-Core --grad-reduce-in-bf16); default: the runtime's (torchtitan and exatrain: float32 only)"
        ),
        # Its parameters and their gradients are fp32 under autocast (trainer/parallel/data.py).
        trainer=lambda v, c: (
            None
            if v != "bfloat16"
            else (
                "the exatrain trainer accumulates and reduces its gradients in float32; plan --grad-accum bfloat16 for "
                "Megatron-Core or DeepSpeed, or train a plan made without it"
            )
        ),
        label=label("{v} gradients"),
        # DeepSpeed's own is bfloat16; float32 it writes as data_types.grad_accum_dtype (ZeRO-0/1), else notes
        exports={"megatron": "--grad-reduce-in-bf16"},
        notes={
            "deepspeed": lambda p: (
                ""
                if not (p.grad_accum == "float32" and p.zero_stage > 1)
                else (
                    f"the plan was priced with float32 gradient accumulation; DeepSpeed accumulates in float32 only "
                    f"through its BF16_Optimizer (ZeRO-0/1), so this config at ZeRO-{p.zero_stage} keeps its "
                    "bfloat16 default"
                )
            ),
            "torchtitan": lambda p: (
                ""
                if p.grad_accum != "bfloat16"
                else (
                    "the plan was priced with its gradients accumulated and reduced in bfloat16; torchtitan reduces "
                    "them in float32 (mixed_precision_reduce), as this config sets"
                )
            ),
        },
    ),
    Setting(
        "grad_accum_fusion",
        str,
        "",
        note=_accumulation_line,
        before_search=True,
        choices=GRAD_ACCUM_FUSION,
        load=str,
        problem=lambda v, p: grad_accum_fusion_problem(v, p.runtime),
        help=(
            "whether each micro-batch's weight gradients are added to the accumulated ones inside the "
            "weight-gradient GEMMs (on: Megatron-Core's default) or by a pass over the stage's gradients after "
            "each backward (off: Megatron-Core's --no-gradient-accumulation-fusion, 10 bytes a parameter every "
            "micro-batch into fp32 main gradients); Megatron-Core only"
        ),
        trainer=lambda v, c: (
            None
            if not v
            else (
                f"--grad-accum-fusion {v} is Megatron-Core's switch; the exatrain trainer accumulates its gradients "
                "through autograd: train a plan made without it"
            )
        ),
        label=label("gradient-accumulation fusion {v}"),
        exports={"megatron": "--no-gradient-accumulation-fusion"},
        notes={"deepspeed": fusion_note("Megatron-DeepSpeed"), "torchtitan": fusion_note("torchtitan")},
    ),
    Setting(
        "adam_kernel",
        str,
        "",
        note=_adam_line,
        engines={
            "megatron-core": Own(
                "fused", "megatron/core/optimizer/__init__.py: Transformer Engine's FusedAdam, else apex's"
            ),
            "megatron-deepspeed": Own(
                "fused", "deepspeed/ops/adam/fused_adam.py FusedAdam (Megatron-DeepSpeed's --optimizer adam)"
            ),
            "torchtitan": Own(
                "fused",
                (
                    "torchtitan/components/optimizer: optimizer.implementation 'fused' by default since 2025-02-24 "
                    "(6e49885, 'use Fused AdamW as default'); 'foreach' before (--optimizer.fused off by default)"
                ),
            ),
            "exatrain": Own(
                "fused",
                (
                    "trainer/train.py build_optimizer: torch.optim.AdamW(fused=True) over plain tensors on a GPU "
                    "(fused_adamw_ok); its foreach path over DTensors (tensor and expert parallelism, FSDP2), under "
                    "ZeroRedundancyOptimizer (ZeRO-1) and on the CPU"
                ),
            ),
            "llm-foundry": Own(
                "foreach",
                (
                    "composer/optim/decoupled_weight_decay.py DecoupledAdamW.adamw: a loop over the parameters, each "
                    "update a chain of element-wise ops (mul_, add_, mul_, addcmul_, sqrt, div, add_, addcdiv_): the "
                    "bytes of torch's foreach chain, whose weight-decay mul_ the YAMLs' weight_decay 0 skips"
                ),
            ),
        },
        profile=("adam_default", "adam_source"),
        before_search=True,
        choices=ADAM_KERNELS,
        load=str,
        problem=lambda v, p: adam_kernel_problem(v, p.runtime),
        help=(
            "the kernel the optimizer step runs Adam with: fused (one kernel, 28 bytes a parameter; torchtitan's "
            "default since 2025-02) or foreach (torch's chain of multi-tensor kernels, 84 bytes a parameter; "
            "torchtitan's --optimizer.implementation foreach, its default before); torchtitan only"
        ),
        # The trainer picks its own (train.fused_adamw_ok).
        trainer=lambda v, c: (
            None
            if not v
            else (
                f"--adam-kernel {v} is torchtitan's switch; the exatrain trainer runs fused Adam over plain tensors on "
                "a GPU and foreach elsewhere: train a plan made without it"
            )
        ),
        label=label("{v} Adam"),
        exports={"torchtitan": "implementation", "torchtitan-0.3": "--optimizer.implementation"},
        notes={"megatron": adam_note("Megatron-Core"), "deepspeed": adam_note("Megatron-DeepSpeed")},
    ),
    Setting(
        "cp_comm",
        str,
        "",
        note=_cp_line,
        before_search=True,
        choices=CP_COMMS,
        problem=cp_comm_rule,
        load=str,
        help=(
            "how attention's operands travel under --cp: p2p (a ring of K,V blocks, each behind a block's "
            "attention), all_gather (K,V gathered; exposed in Transformer Engine and exatrain, behind the local "
            "block in torchtitan) or a2a (all-to-all of Q,K,V and the output: DeepSpeed-Ulysses, Megatron-Core "
            "--cp-comm-type a2a; cp must divide the heads a rank holds); default: the runtime's (Megatron-Core "
            "p2p, a2a for sliding-window models; Megatron-DeepSpeed a2a; torchtitan and exatrain all_gather)"
        ),
        # Its context parallelism all-gathers K,V (parallel/context.py).
        trainer=lambda v, c: (
            None
            if v in ("", "all_gather")
            else (
                f"the exatrain trainer runs context parallelism by all-gathering K,V; plan --cp-comm {v} for the "
                "runtime that runs it, or train a plan made without it (or with all_gather)"
            )
        ),
        label=label("cp {v}"),
        own=lambda engine, s, model: cp_comm_for(engine.name, "", model),
        exports={"megatron": "--cp-comm-type", "torchtitan": "context_parallel_rotate_method"},
        notes={"torchtitan-0.3": titan03_cp_note},
    ),
    Setting(
        "recompute_modules",
        tuple,
        (),
        note=_modules_line,
        before_search=True,
        searched_with={"recompute": "selective"},
        runtimes=RECOMPUTE_MODULES_RUNTIMES,
        arg="list",
        choices=RECOMPUTE_MODULES,
        problem=lambda v, p: recompute_modules_problem(v, p.recompute, p.runtime),
        help=(
            "what --recompute selective reruns, Megatron-Core's modules, comma-separated: core_attn (its default), "
            "layernorm, moe_act, mla_up_proj, mlp (a dense layer's), shared_experts, moe; --runtime megatron-core "
            "only (its --recompute-modules); a search with it tries selective recomputation only"
        ),
        # Its selective recomputation reruns the attention core (parallel/activation.py).
        trainer=lambda v, c: (
            None
            if not v
            else (
                f"the exatrain trainer's selective recomputation reruns the attention core; plan --recompute-modules "
                f"{','.join(v)} for Megatron-Core (--runtime megatron-core), or train a plan made without it"
            )
        ),
        label=lambda v, s: f"recompute modules {','.join(v)}",
        exports={"megatron": "--recompute-modules"},
        load=recompute_modules_of,
        dump=list,
    ),
    Setting(
        "recompute_layers",
        int,
        0,
        note=_layers_line,
        before_search=True,
        searched_with={"recompute": "full"},
        runtimes=RECOMPUTE_LAYERS_RUNTIMES,
        arg="count_or_auto",
        problem=lambda v, p: recompute_layers_problem(v, p.recompute, p.runtime),
        help=(
            "with --recompute full: recompute only the first N layers of each (virtual) pipeline stage, the "
            "others keeping all they keep without recomputation (Megatron-Core --recompute-method block "
            "--recompute-num-layers N); --runtime megatron-core only; default: every layer; a search with a "
            "number tries full recomputation only, with 'auto' (search and scaling) each full-recomputation "
            "layout recomputes the fewest layers a stage with which it fits"
        ),
        trainer=lambda v, c: trainer_layers("--recompute-layers", v) if v else None,
        label=label("the first {v} layers of each stage recomputed"),
        exports={"megatron": "--recompute-num-layers"},
    ),
    Setting(
        "recompute_every",
        int,
        0,
        note=_every_line,
        before_search=True,
        searched_with={"recompute": "full"},
        runtimes=RECOMPUTE_EVERY_RUNTIMES,
        arg="count",
        problem=lambda v, p: recompute_layers_problem(v, p.recompute, p.runtime, every=True),
        help=(
            "with --recompute full: recompute one layer in N of each rank (counted over its stages in order), the "
            "others keeping all they keep without recomputation (torchtitan's layer-level selective "
            "checkpointing: activation_checkpoint.mode selective, selective_ac_option N); --runtime torchtitan "
            "or llm-foundry; default: every layer; a search with it tries full recomputation only"
        ),
        trainer=lambda v, c: trainer_layers("--recompute-every", v) if v else None,
        label=label("one layer in {v} recomputed"),
        exports={"torchtitan": "selective_ac_option"},
        notes={
            "torchtitan-0.3": lambda p: (
                ""
                if not (p.recompute == "full" and p.recompute_every)
                else (
                    f"torchtitan 0.3 checkpoints every block or none (FullAC): the plan checkpoints one block in "
                    f"{p.recompute_every}, and this command line every block"
                )
            )
        },
    ),
    Setting(
        "distribute_saved_activations",
        bool,
        False,
        arg="switch",
        problem=distribute_saved_problem,
        help=(
            "with --recompute full, --tp > 1 and no --sequence-parallel: keep each layer's checkpointed input as "
            "1/tp of it per tensor-parallel rank, all-gathered over tp before the layer's rerun (Megatron-Core "
            "--distribute-saved-activations, Megatron-DeepSpeed --partition-activations, metaseq "
            "--distribute-checkpointed-activations); --runtime megatron-core or megatron-deepspeed; priced as the "
            "memory it frees (the one all-gather a layer it adds to the backward is not priced); default off"
        ),
        # Its full recomputation keeps every block's input whole (parallel/activation.py).
        trainer=lambda v, c: (
            None
            if not v
            else (
                "the exatrain trainer keeps each checkpointed layer input whole on every tp rank; plan "
                "--distribute-saved-activations for Megatron-Core or Megatron-DeepSpeed, or train a plan made "
                "without it"
            )
        ),
        label=label("checkpoints split over tp"),
        exports={"megatron": "--distribute-saved-activations", "deepspeed": "--partition-activations"},
        notes={
            "torchtitan": lambda p: (
                "the plan was priced with its checkpoints split over the tp ranks; torchtitan keeps each "
                "checkpointed block input whole"
                if p.distribute_saved_activations
                else ""
            )
        },
    ),
    Setting(
        "offload",
        str,
        "none",
        choices=OFFLOADS,
        load=str,
        problem=lambda v, p: offload_problem(v, p.runtime, p.zero_stage, p.dp * p.cp),
        help=(
            "keep model states in host memory: optimizer (Adam states, fp32 master weights and gradient partition "
            "on the host, Adam on the CPU: DeepSpeed offload_optimizer at ZeRO-1/2/3, Megatron-Core "
            "--optimizer-cpu-offload at ZeRO-1) or params (the sharded parameters too: DeepSpeed offload_param at "
            "ZeRO-3; FSDP2's CPUOffloadPolicy at ZeRO-2/3 under torchtitan and exatrain); priced with the node's "
            "host memory, the host link's copies and the CPU's Adam; default none (a search offers it when no "
            "layout fits without it)"
        ),
        # Its FSDP2 runs CPUOffloadPolicy (parallel/data.py); nothing else offloads there.
        trainer=lambda v, c: (
            None
            if v in ("none", "params")
            else (
                f"the exatrain trainer offloads through FSDP2's CPUOffloadPolicy (--offload params, ZeRO-2/3); plan "
                f"--offload {v} for DeepSpeed or Megatron-Core, or train a plan made with --offload params"
            )
        ),
        label=label("{v} offloaded to host memory"),
        exports={"deepspeed": "offload_", "megatron": "--optimizer-cpu-offload"},
        notes={
            "megatron": lambda p: (
                ""
                if p.offload != "params"
                else (
                    "the plan was priced with the parameters in host memory; Megatron-Core offloads the optimizer only "
                    "(--optimizer-cpu-offload), which this command line sets: its parameters stay on the GPU"
                )
            ),
            "torchtitan": lambda p: (
                ""
                if p.offload != "optimizer"
                else (
                    "the plan was priced with the optimizer alone in host memory; torchtitan's FSDP CPU offload "
                    "(training.enable_cpu_offload) moves the parameters and gradients too: plan --offload params for "
                    "it; this config does not offload"
                )
            ),
        },
    ),
    Setting(
        "launch_blocking",
        bool,
        False,
        arg="switch",
        help=(
            "price the run with synchronous kernel launches (CUDA_LAUNCH_BLOCKING=1 in the job's environment, as "
            "BLOOM-176B's training set it against NCCL hangs): each launch returns once its kernel has run, so "
            "the host's dispatch of every GEMM, element-wise kernel and collective (the cost model's "
            "blocking_launch_s) adds to the step and no communication overlaps compute; default off"
        ),
        trainer=lambda v, c: (
            None
            if not v
            else (
                "--launch-blocking prices an environment variable (CUDA_LAUNCH_BLOCKING=1) that the exatrain trainer "
                "does not set; export it in the job's environment and train a plan made without the switch"
            )
        ),
        label=label("synchronous launches"),
        notes={t: blocking_note for t in ("megatron", "deepspeed", "torchtitan")},
    ),
)
