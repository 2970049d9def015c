"""The records of the run settings that choose the engine and how its layers compute: the runtime, FP8, MoE
routing and dispatch, the attention kernel, the element-wise ops and the loss (one ``Setting`` each)."""

from __future__ import annotations

from exatrain.registry.exports import elementwise_note, kernel_note, label, trainer_elementwise, trainer_routes
from exatrain.registry.problems import (
    balance_rule,
    capacity_rule,
    dispatcher_rule,
    elementwise_rule,
    fp8_rule,
    gather_rule,
    kernel_rule,
    loss_rule,
    runtime_rule,
)
from exatrain.registry.record import Own, Setting, own_line
from exatrain.registry.vocab import (
    ATTENTION_KERNELS,
    CROSS_ENTROPY,
    ELEMENTWISE,
    FP8_RECIPES,
    MOE_DISPATCHERS,
    RUNTIMES,
)


# ---- an estimate's notes (Setting.note; facts: planner.estimate_notes.NoteFacts) ---------------------------------
def _attention_line(f) -> str:
    plan = f.plan
    if not plan.flash_attention:
        return ""
    own = _own("attention_kernel", plan.runtime)
    return own_line(
        "attention kernel",
        "--attention-kernel",
        plan.attention_kernel,
        plan.runtime,
        own,
        "cost.compute.with_attention_kernel",
    )


def _elementwise_line(f) -> str:
    plan = f.plan
    own = _own("elementwise", plan.runtime)
    return own_line(
        "element-wise ops", "--elementwise", plan.elementwise, plan.runtime, own, "cost.compute.unfused_extra"
    )


def _cross_entropy_line(f) -> str:
    plan, run, rt = f.plan, f.run, f.plan.runtime
    whose = (
        f"set by --cross-entropy; {rt}'s own: {run.engine.cross_entropy('', plan.elementwise)}"
        if plan.cross_entropy
        else f"{rt}'s own with element-wise {run.elementwise}: "
        + (_own("cross_entropy", rt).source or "it upcasts its logits to fp32 for the loss")
    )
    return (
        f"cross-entropy: {run.cross_entropy}, the logits held at {f.logits_bytes:g} bytes an element"
        + (" of its vocabulary shard" if plan.tp > 1 else "")
        + f" ({whose}; accounting.memory.logits_bytes_per_element)"
    )


def _routing(plan, load: float) -> str:
    """What the busiest expert rank is priced to receive (``load``), and which routing setting says so."""
    if plan.moe_capacity_factor:
        how = (
            f"token drop at capacity factor {plan.moe_capacity_factor:g}, every expert's input padded to it "
            "(--moe-capacity-factor)"
        )
    elif plan.moe_force_balance:
        how = "routing forced even (--moe-force-balance)"
    else:
        how = "dropless routing, an assumption (--moe-capacity-factor or --moe-force-balance if the run sets either)"
    return f"busiest expert rank priced at {load:g}x the mean routed tokens: {how} (accounting.moe.moe_load)"


def _moe_line(f) -> str:
    plan = f.plan
    if not plan.model.is_moe:
        return ""
    sends = (
        " (each token once per destination rank and node)"
        if plan.moe_dispatcher != "alltoall"
        else " (every routed copy)"
    )
    return (
        f"MoE: ep {plan.ep}, {plan.moe_dispatcher} dispatcher{sends}, routed experts' states sharded over the "
        "expert-data-parallel group; "
        + _routing(plan, f.run.moe_load)
        + ("; trainer memory: N/ep experts a rank, routed tokens at a balanced load" if f.own else "")
    )


def _fp8_line(f) -> str:
    plan = f.plan
    if not plan.fp8:
        return ""
    whence = (
        "measured or fitted, cost params" if f.coeffs.fp8_speedup is not None else "the data sheet's FP8 peak ratio"
    )
    return (
        f"fp8 ({plan.fp8} scaling): linear-layer GEMMs at {f.fp8_speedup:.2f}x the {plan.dtype} rate ({whence}), "
        f"each cast to FP8 {f.cast_bytes:g} bytes an element of memory traffic; MFU and "
        f"HFU are against the {plan.dtype} peak"
    )


def _own(name: str, runtime: str) -> Own:
    """The record ``name``'s ``Own`` for ``runtime`` (the records are read once the module has made them)."""
    return next(s for s in COMPUTE_SETTINGS if s.name == name).engines[runtime]


COMPUTE_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "runtime",
        str,
        "exatrain",
        before_search=True,
        arg="engine",
        choices=RUNTIMES,
        metavar="ENGINE",
        problem=runtime_rule,
        help=(
            "the engine that runs the plan: megatron-core, megatron-deepspeed, torchtitan, llm-foundry (Composer's "
            "PyTorch FSDP1, data parallelism alone; priced, not exported) or exatrain (this project's trainer); its "
            "memory decides what fits and its overlaps and collectives the step time; "
            "default exatrain, or megatron-core for a model exatrain's trainer does not build (said in the "
            "output)"
        ),
        load=str,
    ),
    Setting(
        "fp8",
        str,
        "",
        note=_fp8_line,
        choices=FP8_RECIPES,
        problem=fp8_rule,
        load=str,
        help="run the linear layers' GEMMs in FP8 with this scaling recipe (default: none)",
        exports={"megatron": "--fp8-recipe", "torchtitan": "quantize.linear.float8"},
    ),
    Setting(
        "moe_dispatcher",
        str,
        "alltoall",
        note=_moe_line,
        choices=MOE_DISPATCHERS,
        problem=dispatcher_rule,
        load=str,
        help=(
            "how MoE tokens reach their experts: alltoall (every routed copy; default) or Megatron-Core's flex "
            "dispatcher with DeepEP / HybridEP (once per destination rank and node)"
        ),
        trainer=lambda v, c: (
            None
            if v == "alltoall"
            else (
                f"the exatrain trainer dispatches MoE tokens with its own all-to-all; plan --moe-dispatcher {v} for "
                "Megatron-Core (--runtime megatron-core) or train this plan with --moe-dispatcher alltoall"
            )
        ),
        label=label("{v} dispatcher"),
        exports={"megatron": "--moe-flex-dispatcher-backend"},
        notes={
            "torchtitan": lambda p: (
                ""
                if p.moe_dispatcher == "alltoall" or not p.model.is_moe
                else (
                    f"the plan was priced with the {p.moe_dispatcher} dispatcher (one copy per destination rank and "
                    "node); this config sets no dispatcher: torchtitan's own all-to-all sends every routed copy"
                )
            )
        },
    ),
    Setting(
        "moe_capacity_factor",
        float,
        0.0,
        arg="number",
        metavar="C",
        problem=capacity_rule,
        help=(
            "drop a MoE layer's tokens beyond C times an expert's mean load and pad every expert's input to it "
            "(Megatron-Core --moe-expert-capacity-factor C --moe-pad-expert-input-to-capacity; alltoall "
            "dispatcher); default 0: dropless, the busiest expert rank taking 1.25x the mean"
        ),
        trainer=lambda v, c: trainer_routes("--moe-capacity-factor") if v else None,
        label=label("token drop at capacity {v:g}, padded"),
        exports={"megatron": "--moe-expert-capacity-factor"},
        notes={
            "torchtitan": lambda p: (
                ""
                if not p.moe_capacity_factor or not p.model.is_moe
                else (
                    f"the plan was priced with token drop at capacity factor {p.moe_capacity_factor:g}, every expert "
                    "padded to it; torchtitan's MoE is dropless and this config cannot set it"
                )
            )
        },
    ),
    Setting(
        "moe_force_balance",
        bool,
        False,
        arg="switch",
        problem=balance_rule,
        help=(
            "route MoE tokens evenly whatever the router says (Megatron-Core --moe-router-force-load-balancing, "
            "a benchmarking switch): the busiest expert rank takes the mean; default off"
        ),
        trainer=lambda v, c: trainer_routes("--moe-force-balance") if v else None,
        label=lambda v, s: "" if s.moe_capacity_factor else "force-balanced routing",
        exports={
            "megatron": "--moe-router-force-load-balancing",
            "torchtitan": "moe_force_load_balance",
            "torchtitan-0.3": "--debug.moe-force-load-balance",
        },
    ),
    Setting(
        "fp8_param_gather",
        bool,
        False,
        arg="switch",
        problem=gather_rule,
        help=(
            "gather the FP8 GEMMs' weights in FP8 over the data-parallel group and keep no 16-bit copy of them "
            "(Megatron-Core --fp8-param-gather, with the distributed optimizer: ZeRO-1+; torchtitan "
            "enable_fsdp_float8_all_gather, with FSDP: ZeRO-2/3 and --fp8 current); needs --fp8; default off"
        ),
        # Its FP8 linears (trainer/fp8.py) keep 16-bit weights and FSDP gathers them in 16 bits.
        trainer=lambda v, c: (
            None
            if not v
            else (
                "the exatrain trainer gathers and keeps its weights in 16 bits; plan --fp8-param-gather for "
                "Megatron-Core or torchtitan (--runtime megatron-core / torchtitan) or train a plan made without it"
            )
        ),
        label=label("FP8 parameter gather"),
        exports={"megatron": "--fp8-param-gather", "torchtitan": "enable_fsdp_float8_all_gather"},
    ),
    Setting(
        "attention_kernel",
        str,
        "",
        note=_attention_line,
        engines={
            "megatron-core": Own(
                "fused",
                (
                    "Transformer Engine DotProductAttention, attention_backend auto: cuDNN FusedAttention where "
                    "eligible (transformer_engine/pytorch/attention backend selection)"
                ),
            ),
            "megatron-deepspeed": Own(
                "fa2", "--use-flash-attn-v2: the flash-attn package's FlashAttention-2 kernels (flash_attn_func)"
            ),
            "torchtitan": Own("sdpa", "torchtitan's attention: torch.nn.functional.scaled_dot_product_attention"),
            "exatrain": Own("sdpa", "trainer/model.py: torch.nn.functional.scaled_dot_product_attention"),
            "llm-foundry": Own(
                "triton",
                (
                    "llm-foundry attn_impl: triton in its pretraining YAMLs and submit_benchmarks.py's default "
                    "(llmfoundry/models/layers/flash_attn_triton.py, a copy of flash-attention's Triton kernel); "
                    "attn_impl flash runs the flash-attn package installed: --attention-kernel fa2 (fa2-varlen "
                    "for llm-foundry to 2024-01, whose flash_attn_fn unpads q, k, v and pads the output back)"
                ),
            ),
        },
        profile=("activations.flash_kernel", "activations.flash_kernel_source"),
        choices=ATTENTION_KERNELS,
        problem=kernel_rule,
        load=str,
        help=(
            "which kernel the run's flash attention is: fused (cuDNN / Transformer Engine), fa2 "
            "(FlashAttention-2: Megatron-DeepSpeed, and torch SDPA on Hopper before torch 2.11), sdpa (torch "
            "SDPA's own choice), triton (llm-foundry's Triton FlashAttention), fa2-varlen (FlashAttention-2 on "
            "unpadded tokens: llm-foundry's attn_impl flash to 2024-01); default: the runtime's"
        ),
        # Its attention is torch SDPA with SDPA's own kernel choice (model.py); forcing one would also have to
        # hold for cp's masks, the keyed dropout core and the CPU.
        trainer=lambda v, c: (
            None
            if v in ("", "sdpa")
            else (
                f"the exatrain trainer runs torch SDPA's own attention kernel choice; plan --attention-kernel {v} for "
                "another runtime, or train a plan made without --attention-kernel (or with sdpa)"
            )
        ),
        label=label("attention {v}"),
        own=lambda engine, s, model: engine.activations.flash_kernel,
        exports={"megatron": "--attention-backend", "deepspeed": "--use-flash-attn-v2"},
        notes={
            "megatron": kernel_note("Megatron-Core", ("fused", "fa2"), "this config runs --attention-backend fused"),
            "deepspeed": kernel_note(
                "Megatron-DeepSpeed", ("fa2",), "this config runs FlashAttention-2 (--use-flash-attn-v2)"
            ),
            "torchtitan": kernel_note(
                "torchtitan",
                ("sdpa",),
                "torch SDPA picks its kernel by torch version and "
                "device (cuDNN's on Hopper from torch 2.11, FlashAttention-2's before)",
            ),
        },
    ),
    Setting(
        "elementwise",
        str,
        "",
        note=_elementwise_line,
        engines={
            "megatron-core": Own(
                "fused",
                (
                    "Transformer Engine's fused norms (TELayerNormColumnParallelLinear), bias-SwiGLU/GELU fusion and "
                    "RoPE fusion, each on unless --no-bias-swiglu-fusion, --no-bias-gelu-fusion, --no-rope-fusion "
                    "(megatron/training/arguments.py)"
                ),
            ),
            "megatron-deepspeed": Own(
                "fused",
                (
                    "Megatron's fused kernels: apex FusedLayerNorm / MixedFusedRMSNorm, bias-GELU fusion, fused "
                    "scale-mask-softmax (megatron/model/fused_*.py; --no-bias-gelu-fusion turns one off)"
                ),
            ),
            "torchtitan": Own(
                "eager",
                (
                    "torch.compile is off unless the job config enables it ([compile] enable, training.compile before "
                    "2025; default false): plan a compiled run with --elementwise fused"
                ),
            ),
            "exatrain": Own(
                "eager", "the trainer runs eager; `exatrain train --compile` compiles each block (--elementwise fused)"
            ),
            "llm-foundry": Own(
                "eager",
                (
                    "llm-foundry trains its MPT models eager (no torch.compile in its benchmark runs): LayerNorm "
                    "(low_precision_layernorm), GELU and the residual adds a kernel each"
                ),
            ),
        },
        profile=("elementwise_default", "elementwise_source"),
        choices=ELEMENTWISE,
        problem=elementwise_rule,
        load=str,
        help=(
            "how the layers' element-wise ops run: fused (torch.compile, Megatron's fused kernels), eager (a "
            "kernel per PyTorch op), eager-composite (also each RMSNorm as its composite ops: a hand-written "
            "norm, or torch before 2.9); default: the runtime's (Megatron fused; torchtitan and exatrain eager)"
        ),
        trainer=trainer_elementwise,
        label=label("element-wise {v}"),
        own=lambda engine, s, model: engine.elementwise_default,
        exports={"torchtitan": "[compile]", "torchtitan-0.3": "--compile."},
        notes={
            "megatron": elementwise_note("Megatron-Core"),
            "deepspeed": elementwise_note("Megatron-DeepSpeed"),
            "torchtitan": lambda p: (
                ""
                if p.elementwise != "eager-composite"
                else (
                    "the plan was priced with each RMSNorm as composite ops (--elementwise eager-composite); "
                    "torchtitan's nn.RMSNorm runs one fused kernel from torch 2.9"
                )
            ),
        },
    ),
    Setting(
        "cross_entropy",
        str,
        "",
        note=_cross_entropy_line,
        engines={
            "megatron-core": Own(
                "inplace",
                (
                    "megatron/core/tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy: logits.float(), exp "
                    "and softmax in place, saved, the gradient in place"
                ),
            ),
            "megatron-deepspeed": Own(
                "inplace",
                (
                    "megatron/model/gpt_model.py: vocab_parallel_cross_entropy(output.float(), labels), Megatron's "
                    "in-place vocab-parallel loss (mpu/cross_entropy.py)"
                ),
            ),
            "torchtitan": Own(
                "upcast",
                (
                    "torchtitan/components/loss.py build_cross_entropy_loss compiles cross_entropy(pred.float(), "
                    'labels) with the model (since 2025-04; [compile] components "loss"); before it train.py left the '
                    "loss eager: plan such a run with --cross-entropy upcast"
                ),
            ),
            "exatrain": Own(
                "upcast", "trainer/train.py: F.cross_entropy(logits.float(), ...), uncompiled even under --compile"
            ),
            "llm-foundry": Own(
                "fused",
                (
                    "llmfoundry/models/mpt/modeling_mpt.py: loss_fn 'fused_crossentropy' by default, flash-attn's "
                    "CrossEntropyLoss (the xentropy CUDA kernel over the 16-bit logits); loss_fn torch_crossentropy "
                    "runs torch's: --cross-entropy upcast"
                ),
            ),
        },
        profile=("cross_entropy_default", "cross_entropy_source"),
        choices=CROSS_ENTROPY,
        problem=loss_rule,
        load=str,
        help=(
            "how the loss runs over the logits: upcast (torch's cross_entropy(logits.float()): 12 bytes a logit "
            "at its peak; torchtitan, exatrain), inplace (Megatron's vocab-parallel loss, one fp32 copy worked in "
            "place: e + 4 bytes) or fused (one compiled kernel over the 16-bit logits, 2e bytes: torchtitan's "
            'compiled loss, [compile] components "loss"); default: the runtime\'s (Megatron inplace; torchtitan '
            "fused when its element-wise ops are, else upcast; exatrain upcast)"
        ),
        # Its loss is cross_entropy(logits.float()) uncompiled, even under --compile (train.py).
        trainer=lambda v, c: (
            None
            if v in ("", "upcast")
            else (
                f"the exatrain trainer runs its loss upcast to fp32, uncompiled; plan --cross-entropy {v} for the "
                "runtime that runs it, or train a plan made without it (or with upcast)"
            )
        ),
        label=label("cross-entropy {v}"),
        own=lambda engine, s, model: engine.cross_entropy("", s.elementwise),
        exports={"torchtitan": "[compile]", "torchtitan-0.3": "--compile."},
    ),
)
