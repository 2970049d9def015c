"""One evaluation of one plan: memory per stage, FLOPs, communication bytes and (cost model) time.

This is the planner's single entry point for a plan; `exatrain estimate`, the trainer's CLI
(to attach a prediction to each run) and reports call it. Memory and time come from
``planner.evaluate`` with the plan as a batch of one: the very code the search runs on every
candidate, so a searched plan's estimate is what the search ranked it by.
"""

from __future__ import annotations

from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.studies import best_mfu_for
from exatrain.plan import MemoryBreakdown, Plan, StepEstimate, TimeBreakdown
from exatrain.settings import HALF_DTYPES, trainer_cannot_build
from exatrain.accounting.engines import ADAM_BYTES, get_engine, plan_run
from exatrain.accounting.flops import hardware_flops_per_step, model_flops_per_step
from exatrain.accounting.memory import FRAGMENTATION_ALLOWANCE, logits_bytes_per_element
from exatrain.accounting.offload import host_fits
from exatrain.errors import UserError
from exatrain.accounting.params import stage_params, total_params
from exatrain.planner.cost.coefficients import CostParams, default_params
from exatrain.planner.cost.overlap import overlap_for, overlap_priced, overlap_rules
from exatrain.planner.cost.offload import offload_note
from exatrain.planner.cost.step import TIME_FIELDS
from exatrain.planner.band import with_band
from exatrain.planner.memory_band import with_memory_band
from exatrain.planner.memory_advice import memory_advice
from exatrain.planner.cost.fp8 import CAST_BYTES, fp8_speedup
from exatrain.planner.plan_cost import comm_bytes
from exatrain.planner.evaluate import MEMORY_FIELDS, evaluate, trainer_models_it
from exatrain.planner.layouts import Layouts


def _setting_note(what: str, flag: str, chosen: str, runtime: str, own: str, own_source: str, priced_by: str) -> str:
    """The note for a plan setting that defaults to the runtime's own: the value, and who set it."""
    source = f"set by {flag}; {runtime}'s own: {own}" if chosen else own_source
    return f"{what}: {chosen or own} ({source}; {priced_by})"


def _routing_note(plan: Plan, load: float) -> str:
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


def estimate_plan(
    plan: Plan, cluster: ClusterSpec, params: CostParams | None = None, overlap: str | None = None
) -> StepEstimate:
    """Memory of every stage, the counts of one optimizer step, and the predicted step time of
    ``plan`` on ``cluster`` as its runtime (``plan.runtime``) runs it. ``params`` are the cost
    model's efficiencies (default: the device's prior, or what a calibration file measured);
    ``overlap``: which of the runtime's overlaps are on (``cost.overlap.overlap_rules``); None (not stated): the
    runtime's defaults, said in the notes, with the band reaching down to every overlap on (``_best_case``)."""
    coeffs = params or default_params(cluster.device.name)
    rt, run = plan.runtime, plan_run(plan)
    if plan.offload != "none" and cluster.host_memory_bytes is None:
        raise UserError(
            f"--offload {plan.offload}: cluster {cluster.name} states no host memory per node; describe "
            "it in a --cluster-file with host_memory_bytes and host_link_bytes_per_s"
        )
    memory = (rt,) if rt == "exatrain" else (rt, "exatrain")
    ev = evaluate(
        Layouts.from_plan(plan),
        plan.model,
        cluster,
        coeffs,
        global_batch=plan.global_batch,
        run=run,
        memory=memory,
        by_rank=True,
        overlap=overlap,
    )

    def stages(kind: str) -> tuple[MemoryBreakdown, ...]:
        parts = ev.by_rank[kind]
        return tuple(MemoryBreakdown(*(float(parts[f][0, r]) for f in MEMORY_FIELDS)) for r in range(plan.pp))

    by_stage = stages(rt)
    worst = by_stage[int(ev.worst_rank[rt][0])]
    capacity = cluster.device.hbm_bytes
    engine = run.engine
    rule = engine.state_rule(plan.dtype, plan.zero_stage)
    stated = overlap
    overlap = overlap_priced(overlap_for(overlap, plan.launch_blocking))  # as evaluate priced it
    rules = overlap_rules(engine, overlap)
    hid = {k: float(v[0]) for k, v in ev.hidden.items()}
    notes = (
        f"runtime {rt}: memory_bytes / memory_verdict are what it keeps ({rule.mode}; the verdict: the capacity "
        "against the band of measured peaks, planner/memory_band.py; fits: not 'does not fit'); trainer_memory_bytes / "
        "trainer_fits: what exatrain's own trainer keeps today (the point prediction against the capacity)",
        "bytes/param: weights {:g}, gradients {:g}, optimizer {:g} ({})".format(
            *rule.bytes_per_param(plan.dp), rule.source
        ),
        f"other = pipeline buffers + {FRAGMENTATION_ALLOWANCE:.0%} allocator allowance",
        "activations: Korthikanti et al. 2022 Table 2"
        + (f", dropout {plan.model.dropout:g}" if plan.model.dropout else ", no dropout")
        + (", flash attention" if plan.flash_attention else ", attention scores stored"),
    )
    if plan.flash_attention:
        acts = engine.activations
        notes += (
            _setting_note(
                "attention kernel",
                "--attention-kernel",
                plan.attention_kernel,
                rt,
                acts.flash_kernel,
                acts.flash_kernel_source,
                "cost.compute.with_attention_kernel",
            ),
        )
    if engine.version_assumed:
        notes += (f"engine version priced: {engine.version_assumed}",)
    notes += (
        _setting_note(
            "element-wise ops",
            "--elementwise",
            plan.elementwise,
            rt,
            engine.elementwise(),
            engine.elementwise_source,
            "cost.compute.unfused_extra",
        ),
    )
    loss = run.cross_entropy
    held = logits_bytes_per_element(loss, plan.dtype, plan.tp)
    whose = (
        f"set by --cross-entropy; {rt}'s own: {engine.cross_entropy('', plan.elementwise)}"
        if plan.cross_entropy
        else f"{rt}'s own with element-wise {engine.elementwise(plan.elementwise)}: "
        + (engine.cross_entropy_source or "it upcasts its logits to fp32 for the loss")
    )
    notes += (
        f"cross-entropy: {loss}, the logits held at {held:g} bytes an element"
        + (" of its vocabulary shard" if plan.tp > 1 else "")
        + f" ({whose}; accounting.memory.logits_bytes_per_element)",
    )
    if plan.dtype == "bfloat16":
        own = get_engine(rt).grad_accum_dtype
        notes += (
            f"gradients accumulated and reduced in {engine.grad_accum_dtype} ("
            + (f"set by --grad-accum; {rt}'s own: {own}" if plan.grad_accum else f"{rt}'s own; --grad-accum")
            + ")",
        )
    if plan.dtype == "float16":
        notes += (
            f"gradients accumulated and reduced in {engine.accum_dtype('float16')} ({rt}'s own for float16); "
            "dynamic loss scaling: the gradients unscaled every step (in the optimizer step's passes) and a "
            f"found-inf all-reduce before the update (cost.step.loss_scaling_s): {engine.loss_scale_source}",
        )
    ddp_passes = plan.zero_stage in engine.param_pass_zero
    if engine.accum_pass(plan.dtype):
        notes += (
            f"gradient accumulation: {engine.accum_pass(plan.dtype):g} bytes a parameter every micro-batch "
            f"outside the GEMMs ({engine.accum_pass_why()}"
            + ("; set by --grad-accum-fusion off" if plan.grad_accum_fusion == "off" else "")
            + ")",
        )
    elif ddp_passes or (plan.zero_stage in engine.fsdp_pass_zero and plan.dtype in HALF_DTYPES):
        how = (
            "DDP: autocast's weight casts, the gradients cast back, autograd's adds into .grad"
            if ddp_passes
            else "FSDP2: its gathers' copies, the unsharded gradients kept in fp32, the reduce-scatter's copies"
        )
        notes += (
            f"parameter passes every micro-batch ({how}; cost.step.with_parameter_passes): {engine.param_pass_source}",
        )
    elif engine.accum_fusion_switch:
        notes += (
            "gradient accumulation: inside the weight-gradient GEMMs ("
            + ("set by --grad-accum-fusion on" if plan.grad_accum_fusion else f"{rt}'s own")
            + f"; --grad-accum-fusion off prices {engine.accum_fusion_switch})",
        )
    later = float(engine.later_accum(plan.dtype, plan.zero_stage))
    if later and plan.num_microbatches > 1:
        notes += (
            f"gradient accumulation: autograd adds each micro-batch's gradient after the first into the "
            f"{engine.accum_dtype(plan.dtype)} .grad, {later:g} bytes a parameter "
            f"({engine.later_accum_source})",
        )
    kernel = str(
        engine.adam_kernel(
            tp=plan.tp,
            ep=plan.ep,
            zero=plan.zero_stage,
            shard=plan.dp * plan.cp if plan.zero_stage >= 1 else 1,
            on_host=cluster.device.is_host,
        )
    )
    around = sum(engine.step_passes(plan.dtype))
    notes += (
        f"optimizer step: {kernel} Adam, {ADAM_BYTES[kernel]:g} bytes a parameter of the optimizer shard ("
        + ("set by --adam-kernel; " if plan.adam_kernel else "")
        + f"{engine.adam_source})"
        + (f", and {around:g} bytes a parameter around it ({engine.step_pass_source})" if around else ""),
    )
    # the switches that can act on this plan: the expert all-to-all's only for a MoE model
    moe_switch = engine.overlap("ep_a2a")
    switches = [s for s in rules.switches if plan.model.is_moe or moe_switch is None or s != moe_switch.switch]
    notes += (
        (
            f"overlap {overlap}, switches assumed on: "
            + "; ".join(switches)
            + " — hidden per step: "
            + ", ".join(f"{k} {v:.3f} s" for k, v in hid.items())
            + " (dp: with what the pipeline's drain hides)"
        )
        if switches
        else f"overlap {overlap}: no communication hidden"
        + (
            " (synchronous launches, --launch-blocking: no kernel runs beside another; each kernel's fixed "
            f"time takes the host's {coeffs.blocking_launch_s * 1e6:.0f} us a launch, "
            "cost.compute.with_launch_blocking)"
            if plan.launch_blocking
            else ""
        ),
    )
    best_s = _best_case(plan, cluster, coeffs, run, stated, float(ev.time["step"][0]))
    if best_s is not None:
        notes += (
            f"--overlap not stated: priced with {rt}'s defaults (--overlap default); with every overlap it "
            f"offers on (--overlap all) the step would take {best_s:.4g} s, which the band's low end reaches",
        )
    if rules.tp and not rules.tp_backward and plan.tp > 1:
        notes += (
            f"{rt}'s TP overlap hides the forward's collectives (a full recomputation's rerun forward's "
            f"too); the backward's own stay exposed "
            f"({engine.overlap('tp').passes_source})",
        )
    if plan.tp > cluster.gpus_per_node:
        notes += (
            f"tp {plan.tp} spans {-(-plan.tp // cluster.gpus_per_node)} {cluster.name} nodes: its collectives "
            "are priced on the inter-node network, striped over all of a node's NICs as NCCL runs them "
            "(cost.network.collective_s)",
        )
    trainer_by_stage = stages("exatrain")
    own = trainer_models_it(plan.model, plan.ep, plan.cp, plan.fp8)
    if plan.recompute_modules:
        notes += (
            f"selective recomputation reruns {', '.join(plan.recompute_modules)} in the backward (Megatron-Core "
            f"--recompute-modules {' '.join(plan.recompute_modules)}): their outputs are not kept "
            "(accounting.memory.layer_activation_bytes), their forward runs again, with the TP collectives "
            "inside them and, for moe, the all-to-alls (cost.recompute.module_rerun_s)",
        )
    if (plan.recompute_layers or plan.recompute_every) and plan.recompute == "full":
        rerun = [plan.recomputed_layers_of_rank(r) for r in range(plan.pp)]
        how = (
            f"the first {plan.recompute_layers} layers of each stage (Megatron-Core --recompute-method block "
            f"--recompute-num-layers {plan.recompute_layers})"
            if plan.recompute_layers
            else f'one layer in {plan.recompute_every} (torchtitan\'s selective_ac_option "{plan.recompute_every}")'
        )
        notes += (
            f"full recomputation of {how}: "
            + ", ".join(
                f"{n} of {sum(plan.layers_per_stage()[v] for v in plan.stages_of_rank(r))}" for r, n in enumerate(rerun)
            )
            + " layers by pipeline rank rerun their forward; the others keep what they keep without "
            "recomputation",
        )
    if plan.model.is_moe:
        notes += (
            f"MoE: ep {plan.ep}, {plan.moe_dispatcher} dispatcher"
            + (
                " (each token once per destination rank and node)"
                if plan.moe_dispatcher != "alltoall"
                else " (every routed copy)"
            )
            + ", routed experts' states sharded over the expert-data-parallel group; "
            + _routing_note(plan, run.moe_load)
            + ("; trainer memory: N/ep experts a rank, routed tokens at a balanced load" if own else ""),
        )
    if plan.cp > 1:
        x = run.cp_exchange
        how = {
            "p2p": "K,V blocks passed round the ring, each behind a block's attention",
            "all_gather": "K,V all-gathered"
            + (", behind the local block's attention" if x.overlapped else ", exposed"),
            "a2a": "all-to-all of Q,K,V and of the output (heads/cp a rank over the whole sequence), exposed",
        }
        notes += (
            f"cp {plan.cp}: s/cp tokens per rank; {how[x.comm]} — {x.comm} ({x.switch}"
            + ("; set by --cp-comm" if plan.cp_comm else "")
            + f"; {x.source}) (cost.context.cp_exposed_s)",
        )
    if plan.fp8:
        speedup = fp8_speedup(cluster, plan.dtype, coeffs)
        whence = (
            "measured or fitted, cost params" if coeffs.fp8_speedup is not None else "the data sheet's FP8 peak ratio"
        )
        notes += (
            f"fp8 ({plan.fp8} scaling): linear-layer GEMMs at {speedup:.2f}x the {plan.dtype} rate ({whence}), "
            f"each cast to FP8 {CAST_BYTES[plan.fp8]:g} bytes an element of memory traffic; MFU and "
            f"HFU are against the {plan.dtype} peak",
        )
    if not own:
        notes += (
            "trainer memory: the per-tensor model counts the trainer's dense and MoE layers (with ep and cp), "
            "not latent attention, QK-norm, a separate head width, sliding windows or FP8; "
            + ("memory_bytes is the accounting's exatrain profile" if rt == "exatrain" else "not given"),
        )
    if rt == "exatrain" and (line := trainer_cannot_build(plan.model)):
        notes += (line,)
    host_ok, host_memory = True, None
    if plan.offload != "none":
        host = float(ev.host_bytes[0]) * min(plan.gpus, cluster.gpus_per_node)
        host_ok = bool(host_fits(float(ev.host_bytes[0]), cluster, plan.gpus))
        host_memory = {"bytes_per_node": host, "capacity_bytes": cluster.host_memory_bytes, "fits": host_ok}
        parts = {k: float(v[0]) for k, v in ev.offload_parts.items()}
        notes += (offload_note(plan, run, cluster, host, parts, host_ok),)
    time_s = TimeBreakdown(**{k: float(ev.time[k][0]) for k in TIME_FIELDS})
    model_flops = model_flops_per_step(plan.model, plan.global_batch)
    rerun_share = sum(plan.recomputed_layers_of_rank(r) for r in range(plan.pp)) / plan.model.layers
    hw_flops = hardware_flops_per_step(
        plan.model,
        plan.global_batch,
        plan.recompute,
        plan.recompute_modules,
        rerun_share=rerun_share if plan.recompute == "full" else 1.0,
    )
    model_tf = model_flops / time_s.step / plan.gpus / 1e12
    hw_tf = hw_flops / time_s.step / plan.gpus / 1e12
    peak = cluster.device.peak_flops(plan.dtype)
    if time_s.straggler > 0:
        notes += (
            f"straggler: the step waits for the slowest of {plan.gpus} GPUs, whose speeds spread "
            f"{coeffs.speed_spread:.1%} (a cluster's GPUs of one model; planner/cost/variability.py): "
            f"{time_s.straggler:.3g} s",
        )
    notes += (f"cost model: {coeffs.source} parameters for {cluster.device.name}",)
    above = mfu_above_published(cluster.device.name, bool(plan.fp8), model_tf * 1e12 / peak if peak else None)
    return with_memory_band(
        with_band(
            StepEstimate(
                params=total_params(plan.model),
                params_by_stage=stage_params(plan),
                memory_bytes=worst,
                memory_by_stage=by_stage,
                trainer_memory_bytes=trainer_by_stage[int(ev.worst_rank["exatrain"][0])] if own else None,
                trainer_memory_by_stage=trainer_by_stage if own else (),
                capacity_bytes=capacity,
                fits=worst.total <= capacity,
                model_flops_per_step=model_flops,
                hardware_flops_per_step=hw_flops,
                comm_bytes=comm_bytes(plan),
                time_s=time_s,
                tokens_per_s=plan.tokens_per_step / time_s.step,
                model_tflops_per_gpu=model_tf,
                mfu=None if peak is None else model_tf * 1e12 / peak,
                hardware_tflops_per_gpu=hw_tf,
                hfu=None if peak is None else hw_tf * 1e12 / peak,
                notes=notes,
                mfu_above_published=above,
                memory_advice=memory_advice(plan, cluster, coeffs),
            ),
            plan,
            cluster,
            coeffs,
            best_s=best_s,
        ),
        plan,
        cluster,
    ).replace(host_memory=host_memory, **({} if host_ok else {"fits": False, "memory_verdict": "does not fit"}))


def mfu_above_published(device: str, fp8: bool, mfu: float | None) -> dict | None:
    """The best published MFU of the device's class and precision (``catalog.studies.best_mfu_for``) where ``mfu``
    is above it, as a dict (mfu, run, source, text); else None: a prediction above every run ever published on such
    a device is more likely optimistic than a record."""
    best = best_mfu_for(device, fp8) if mfu is not None else None
    if best is None or mfu <= best.mfu:
        return None
    text = (
        f"predicted MFU {mfu:.1%} is above the highest published for {device} in "
        f"{best.precision} training, {best.mfu:.1%} ({best.run}; {best.source})"
    )
    return {"mfu": best.mfu, "precision": best.precision, "run": best.run, "source": best.source, "text": text}


def _best_case(
    plan: Plan, cluster: ClusterSpec, coeffs: CostParams, run, stated: str | None, step_s: float
) -> float | None:
    """The step time with every overlap the runtime offers on, where the run states none (``stated`` None) and that
    is faster than its defaults; else None. A setting left unstated is priced at its engine's default and the band
    carries the spread to the best case, rather than the best case taken silently."""
    if stated is not None or plan.launch_blocking:
        return None
    if overlap_rules(run.engine, "all").switches == overlap_rules(run.engine, "default").switches:
        return None  # its defaults are every overlap it offers
    ev = evaluate(
        Layouts.from_plan(plan),
        plan.model,
        cluster,
        coeffs,
        global_batch=plan.global_batch,
        run=run,
        memory=(),
        overlap="all",
    )
    best = float(ev.time["step"][0])
    return best if best <= step_s * (1 - 1e-9) else None
