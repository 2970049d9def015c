"""Trace vs analytical per-rank peak memory over a matrix of layouts (run as a script by
test_trace.py, in a process of its own: the trace keeps a fake process group for the process).

Prints one JSON object: {case id: [{rank, traced, analytical, traced_weights, params_here}, ...]};
run it directly to see the errors (``python tests/helpers/trace_matrix.py --table``; case ids as
arguments for some of them, e.g. the MoE and cp cases of test_trace_moe_cp.py). With ``--fast``,
each case is traced the fast way too (``bench.trace.fast_trace``: one rank per stage shape, every
stage replayed) and each row also holds both peaks by category (``full``, ``fast``) and whether
the fast trace fell back to tracing that stage in full (``fast_in_full``).
"""

from __future__ import annotations

import json
import sys

from exatrain.catalog.models import ModelSpec
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.accounting.memory import FRAGMENTATION_ALLOWANCE
from exatrain.accounting.params import stage_params, stage_params_split
from exatrain.accounting.trainer_memory import trainer_stage_memory

SMALL = dict(arch="gpt", hidden=256, heads=8, seq_len=128, vocab=256, layers=4)
LLAMA = dict(SMALL, arch="llama", kv_heads=2, ffn_hidden=704)
GPT175 = dict(arch="gpt", hidden=12288, heads=96, seq_len=2048, vocab=51200, layers=3)  # gpt-175b's layers

# id -> (model fields, layout, ranks or None for all, accelerator)
CASES = {
    "tp1": (SMALL, {}, None, False),
    "tp2": (SMALL, dict(tp=2), None, False),
    "tp2-sp-llama-gqa": (LLAMA, dict(tp=2, sequence_parallel=True), None, False),
    "selective": (SMALL, dict(recompute="selective"), None, False),
    "full-tp2-sp": (SMALL, dict(tp=2, sequence_parallel=True, recompute="full"), None, False),
    "fp32-math-kernel": (SMALL, dict(dtype="float32", flash_attention=False), None, False),
    "pp2-1f1b": (SMALL, dict(pp=2), None, False),
    "pp2-interleaved": (SMALL, dict(pp=2, schedule="interleaved", interleave=2), None, False),
    "pp2-gpipe": (SMALL, dict(pp=2, schedule="gpipe"), [0], False),
    "pp3-tp2": (dict(SMALL, layers=6), dict(tp=2, pp=3, m=12), None, False),
    "zero1-dp2": (SMALL, dict(dp=2, zero_stage=1), None, False),
    "zero2-dp2-tp2-sp": (SMALL, dict(dp=2, zero_stage=2, tp=2, sequence_parallel=True), None, False),
    "zero3-dp2-llama": (LLAMA, dict(dp=2, zero_stage=3), None, False),
    "foreach-adamw-tp2": (SMALL, dict(tp=2), None, True),
    "175b-tp8-sp-selective": (GPT175, dict(tp=8, pp=3, sequence_parallel=True, recompute="selective"), [1, 2], False),
    "175b-tp8-full-foreach": (GPT175, dict(tp=8, pp=3, recompute="full"), [1], True),
    "pp2-zero-bubble": (SMALL, dict(pp=2, schedule="zero_bubble", interleave=2), None, False),
    "pp1-interleaved-plan": (SMALL, dict(schedule="interleaved", interleave=2), None, False),  # runs as pp 1
    "pp2-zbh1": (SMALL, dict(pp=2, schedule="zbh1"), None, False),
    "pp2-zbv": (SMALL, dict(pp=2, schedule="zbv", interleave=2), None, False),
    "pp2-dualpipev": (SMALL, dict(pp=2, schedule="dualpipev", interleave=2), None, False),
    "zero0-dp2": (SMALL, dict(dp=2), None, False),
    "pp2-zero0-dp2": (SMALL, dict(pp=2, dp=2), None, False),
    # the data-parallel kinds beside tensor parallelism (parallel/build.py: DDP and ZeroRedundancyOptimizer
    # on tp shards stored locally, FSDP2 under a pipeline) and an untied head split from its embedding
    "zero0-dp2-tp2-sp": (SMALL, dict(dp=2, tp=2, sequence_parallel=True), None, False),
    "zero1-dp2-tp2": (SMALL, dict(dp=2, zero_stage=1, tp=2), None, False),
    "pp2-gpipe-zero2-dp2-untied": (
        dict(SMALL, tied_embeddings=False),
        dict(pp=2, dp=2, zero_stage=2, schedule="gpipe"),
        None,
        False,
    ),
    # a vocabulary large beside the rest, so that the loss's backward is the peak: torch's loss_parallel
    # on the vocabulary shard (16 bytes a logit, accounting.memory.logits_bytes_per_element) and on whole
    # logits (12)
    "big-vocab-tp2-sp": (dict(SMALL, vocab=16384, seq_len=512), dict(tp=2, sequence_parallel=True), None, False),
    "big-vocab-tp1": (dict(SMALL, vocab=16384, seq_len=512), {}, None, False),
}

# ZeRO-0/1 under a pipeline with tp shards stored locally: every in-flight micro-batch keeps its own
# 16-bit weight copies (trainer_memory ``_uncached_copies``)
CASES.update(
    {
        "pp2-zero1-dp2-tp2": (SMALL, dict(pp=2, dp=2, zero_stage=1, tp=2), None, False),
        "pp2-zero-bubble-zero1-dp2-tp2-sp": (
            SMALL,
            dict(pp=2, dp=2, zero_stage=1, tp=2, sequence_parallel=True, schedule="zero_bubble", interleave=2),
            None,
            False,
        ),
        "selective-tp2-sp": (SMALL, dict(tp=2, sequence_parallel=True, recompute="selective"), None, False),
        "zero2-dp2-selective": (SMALL, dict(dp=2, zero_stage=2, recompute="selective"), None, False),
        # gpt-175b's layers as the 175B line of `estimate` runs them (tp 8, SP, selective, ZeRO-1 over dp),
        # traced with a GPU's rules (accelerator: bench/gpu_rules.py's fp32 norms, foreach AdamW)
        "175b-tp8-sp-selective-zero1-dp2-gpu": (
            GPT175,
            dict(tp=8, pp=3, dp=2, zero_stage=1, sequence_parallel=True, recompute="selective"),
            [1, 2],
            True,
        ),
        # FSDP2 under a pipeline (torch pipelining reduces after a stage's last backward and keeps each layer
        # gathered from its backward to its next forward; the multi-stage schedules gather whole stages ahead)
        "pp2-1f1b-zero3-dp2": (SMALL, dict(pp=2, dp=2, zero_stage=3), None, False),
        "pp2-interleaved-zero3-dp2": (
            SMALL,
            dict(pp=2, dp=2, zero_stage=3, schedule="interleaved", interleave=2),
            None,
            False,
        ),
        "pp2-interleaved-zero3-dp2-tp2": (
            SMALL,
            dict(pp=2, dp=2, zero_stage=3, tp=2, schedule="interleaved", interleave=2),
            None,
            False,
        ),
        # a GPU's norms where they weigh: long sequences, LayerNorm and RMSNorm kept in fp32
        "gpu-norms-gpt-long": (dict(SMALL, seq_len=1024), dict(pp=2), None, True),
        "gpu-norms-llama-long-tp2-sp": (dict(LLAMA, seq_len=1024), dict(tp=2, sequence_parallel=True), None, True),
    }
)

# Layout families the trainer runs that CASES does not hold: traced (the test checks that each traces and
# holds the accounted parameter shard) but not held to the bound. None at present.
FAMILIES: dict = {}


# Mixture of experts (expert parallelism inside dp; routing traced at a balanced load) and context
# parallelism: shapes whose activations are as large as the model states or larger, so that the
# gathered keys and values and the routed token copies move the peak by more than the bound
# (test_trace_moe_cp.py). ``b``: the micro-batch.
MOE = dict(
    arch="llama",
    hidden=256,
    heads=8,
    kv_heads=2,
    ffn_hidden=704,
    seq_len=512,
    vocab=256,
    layers=4,
    experts=4,
    top_k=2,
    shared_experts=1,
    expert_ffn_hidden=256,
    dense_layers=1,
)
LONG = dict(SMALL, seq_len=1024)
MOE_CP = {
    "moe-ep2": (MOE, dict(dp=2, ep=2), None, False),
    "moe-ep2-pp2": (MOE, dict(dp=2, ep=2, pp=2), None, False),
    "moe-pp2": (MOE, dict(pp=2), None, False),  # MoE layers under a pipeline on 2 ranks (test_trace_counted.py)
    "moe-ep2-tp2": (MOE, dict(dp=2, ep=2, tp=2), None, False),
    "moe-zero3-dp2": (MOE, dict(dp=2, zero_stage=3), None, False),  # FSDP2 over MoE layers (ep 1)
    "cp2": (LONG, dict(cp=2, b=4), None, False),
    "cp2-tp2": (LONG, dict(cp=2, tp=2, b=4), None, False),
    "cp4": (dict(LONG, seq_len=2048), dict(cp=4, b=2), None, False),
}


# Pipelines whose stages share a shape but not an op order (4 and 8 stages, every schedule, uneven
# stage layers, ZeRO-1 and FSDP under a pipeline, MoE with a dense first layer, cp) and steps of many
# micro-batches: the fast trace replays these stages' orders from fewer ranks and fewer micro-batches
# than the step has, and must give every stage the full trace's peak (test_trace_fast.py).
SMALL8 = dict(SMALL, layers=8)
REPLAY = {
    "pp4-1f1b": (SMALL8, dict(pp=4), None, False),
    "pp4-gpipe": (SMALL8, dict(pp=4, schedule="gpipe"), None, False),
    "pp4-interleaved": (SMALL8, dict(pp=4, schedule="interleaved", interleave=2), None, False),
    "pp4-interleaved-m12": (SMALL8, dict(pp=4, schedule="interleaved", interleave=2, m=12), None, False),
    "pp4-zero-bubble": (SMALL8, dict(pp=4, schedule="zero_bubble", interleave=2), None, False),
    "pp4-uneven-1-2-2-3": (SMALL8, dict(pp=4, stage_layers=(1, 2, 2, 3)), None, False),
    "pp8-1f1b-m16-full": (SMALL8, dict(pp=8, m=16, recompute="full"), None, False),
    "pp4-tp2-sp-zero1-dp2": (SMALL8, dict(pp=4, tp=2, sequence_parallel=True, dp=2, zero_stage=1), None, False),
    "pp4-zero2-dp2": (dict(LLAMA, layers=8), dict(pp=4, dp=2, zero_stage=2), None, False),
    "pp4-interleaved-zero3-dp2": (
        SMALL8,
        dict(pp=4, dp=2, zero_stage=3, schedule="interleaved", interleave=2),
        None,
        False,
    ),
    "pp4-foreach-untied": (dict(SMALL8, tied_embeddings=False), dict(pp=4), None, True),
    "pp1-m8": (SMALL, dict(m=8), None, False),
    # FSDP without a pipeline reduces after the last of the step's micro-batches only
    "pp1-zero3-dp2-m6": (SMALL, dict(dp=2, zero_stage=3, m=6), None, False),
    "moe-ep2-pp4": (dict(MOE, layers=8), dict(dp=2, ep=2, pp=4), None, False),
    "moe-ep2-m4": (MOE, dict(dp=2, ep=2, m=4), None, False),
    # short sequences and foreach AdamW: the optimizer step is the peak, above the MoE layers' records
    # of every micro-batch's balancing loss, which are kept to the step's end
    "moe-ep2-m4-optimizer-peak": (dict(MOE, seq_len=32), dict(dp=2, ep=2, m=4), None, True),
    "moe-ep2-pp4-optimizer-peak": (dict(MOE, seq_len=32, layers=8), dict(dp=2, ep=2, pp=4), None, True),
    "cp2-pp4": (dict(LONG, layers=8), dict(cp=2, pp=4), None, False),
}


def plan_for(fields: dict, layout: dict) -> Plan:
    layout = dict(layout)
    tp, pp, dp = layout.pop("tp", 1), layout.pop("pp", 1), layout.pop("dp", 1)
    ep, cp, b = layout.pop("ep", 1), layout.pop("cp", 1), layout.pop("b", 1)
    m = layout.pop("m", 2 if pp == 1 else 2 * pp)
    model = ModelSpec(name="trace-case", **fields)
    return Plan(
        model=model, dims=ParallelDims(tp, pp, dp, ep=ep, cp=cp), shape=TrainShape(b, b * m * dp), **layout
    ).validate()


def params_here(plan: Plan) -> tuple[int, ...]:
    """Parameters one rank of each stage holds: with the routed experts split over ep."""
    if not plan.model.is_moe:
        return stage_params(plan)
    split = stage_params_split(
        plan.model,
        tp=plan.tp,
        pp=plan.pp,
        interleave=plan.interleave,
        layers_per_stage=plan.layers_per_stage(),
        ep=plan.ep,
    )
    return tuple(dense + experts for dense, experts in split)


def run(ids: list[str], fast: bool = False) -> dict:
    from exatrain.bench.trace import fast_trace, trace_stage

    out = {}
    for case in ids:
        fields, layout, ranks, accelerator = ALL[case]
        plan = plan_for(fields, layout)
        quick = fast_trace(plan, accelerator=accelerator) if fast else None
        rows = []
        for r in ranks if ranks is not None else range(plan.pp):
            traced = trace_stage(plan, r, accelerator=accelerator)
            est = trainer_stage_memory(plan, r, on_cpu=not accelerator)
            row = {
                "rank": r,
                "traced": traced.total,
                "analytical": est.total / (1 + FRAGMENTATION_ALLOWANCE),  # tensors only
                "traced_weights": traced.weights,
                "params_here": params_here(plan)[r],
            }
            if quick is not None:
                row.update(
                    full=traced.to_dict(),
                    fast=quick.stages[r].to_dict(),
                    fast_in_full=r in quick.traced_in_full,
                    shapes=len(quick.probes),
                    fast_ops=sum(len(p.order) for p in quick.probes),
                )
            rows.append(row)
        out[case] = rows
    return out


ALL = {**CASES, **FAMILIES, **MOE_CP, **REPLAY}

# Layouts run for real (tests/helpers/counted_run.py: the trainer's own step, its tensor storages counted per
# rank) and traced, by the number of ranks a run needs (test_trace_counted.py): recomputation none, selective and
# full, SP on and off, tp, pp, cp, ep, MoE under a pipeline and ZeRO 0-3 on 2 ranks (one launch; ep and pp are each
# counted there), and FSDP under a pipeline on 4 (pp 2 x dp 2). ``COUNTED_GAPS``: run and traced, the run holding
# more than the trace by more than the bound (torch.distributed.pipelining's receive buffers and the input gradients
# it keeps to the next step, not traced: bench/trace.py), the zero-bubble schedules, and FSDP under the
# interleaved schedule (stage 1: traced 23.67 MiB, counted 24.86-25.55 MiB with the launch's other cases).
COUNTED = {
    2: [
        "tp2",
        "selective-tp2-sp",
        "full-tp2-sp",
        "tp2-sp-llama-gqa",
        "pp2-1f1b",
        "zero0-dp2",
        "zero1-dp2",
        "zero2-dp2-selective",
        "zero3-dp2-llama",
        "cp2",
        "moe-ep2",
        "moe-pp2",
    ],
    4: ["pp2-1f1b-zero3-dp2"],
}
COUNTED_GAPS = {2: ["pp2-zero-bubble", "pp2-zbh1", "pp2-zbv"], 4: ["pp2-interleaved-zero3-dp2"]}


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--table", "--fast")]
    result = run(args or [*CASES, *FAMILIES], fast="--fast" in sys.argv)
    if "--table" in sys.argv:
        errs = []
        for case, rows in result.items():
            for row in rows:
                err = row["analytical"] / row["traced"] - 1
                errs.append(abs(err))
                print(
                    f"{case:24s} rank {row['rank']}: traced {row['traced'] / 2**20:9.1f} MiB  "
                    f"analytical {row['analytical'] / 2**20:9.1f} MiB  {err:+.2%}"
                )
        print(f"max |error| {max(errs):.2%} over {len(errs)} ranks")
    else:
        print(json.dumps(result))
