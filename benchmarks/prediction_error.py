"""Out-of-sample error of the predicted step time (and memory) against published runs, per engine and
hardware family; and the uncertainty bands the estimate carries (planner/band.py).

Rows: benchmarks/data/published_runs_by_engine.csv (every row with a measured throughput). Each
becomes a Plan with ``runtime`` = the row's engine, and is predicted through the planner's one
evaluation path (``planner.estimate.estimate_plan``), so a runtime-aware cost model is picked up.

Leave one source out. The only thing the cost model takes from data is its per-device coefficients
(planner/cost/coefficients.py):
  * the A100 and MI250X priors were chosen by hand against the rows of the catalog's calibration
    table (Narayanan 2021, Korthikanti 2022, Dash 2023); the 500 W H100's clock factor and FP8
    speed-up were fitted to torchtitan's three benchmark pages, and the 700 W Hopper parts' FP8
    speed-up to Megatron-Bridge's two performance pages and torchtitan's H200 page, the DGX H100 and
    H200 runs together (``FIT_GROUP``: one die) (``PRIOR_CHOSEN_ON``; ``--fit-prior``). Rows of those
    sources are predicted by coefficients refitted without them (``REFIT``: the calibrate machinery's
    factors, ``calibrate.RUN_FACTORS``, at most ``MAX_FACTORS``, from the generic ``CostParams()`` with the
    prior's cited constants, chosen against no run (``coefficients.cited_params``: A100's attention rate,
    NCCL's and RCCL's per-call latency and ring rate over the NICs); or
    the Hopper factors from the H100 prior, the FP8 speed-up started from the data sheet's FP8 ratio;
    Levenberg-Marquardt on the log step time) on the same device group's rows of every *other* source;
    the shipped prior's error on them is printed apart, as in-sample;
  * every other row is predicted with the shipped prior, which never saw its source (the H100/H200
    priors' bf16 kernels come from micro-benchmarks);
  * a torchtitan row whose torch predates 2.11 is planned with ``attention_kernel="fa2"`` (``_flash_kernel``):
    FlashAttention-2's rate, as a user on that torch would plan with --attention-kernel fa2;
  * a row's ``compile`` column sets how its element-wise ops run (``_elementwise``): compiled rows with
    ``elementwise="fused"``, eager ones with "eager", or "eager-composite" where the run's torch predates
    torch's fused RMSNorm kernel (2.9), as a user would plan with --elementwise; a compiled torchtitan row
    from before torchtitan compiled its loss with the model (2025-04) with ``cross_entropy="upcast"``
    (``_cross_entropy``), as a user would plan with --cross-entropy upcast; an llm-foundry row with "fused" (MPT's
    default loss, flash-attn's fused cross-entropy);
  * a Megatron-DeepSpeed row whose ``zero_mode`` names DeepSpeed's BF16_Optimizer is planned with
    ``grad_accum="float32"`` (``_grad_accum``), as a user would plan with --grad-accum float32;
  * a row whose ``dtype`` column is "fp16" is planned in float16 (``_dtype``: its engine's 16-bit gradients and
    dynamic loss scaling), as a user would plan with --dtype float16; every other row (bf16, fp8, or a
    precision the source does not state) in bfloat16;
  * a row's ``preset`` column names the catalog model whose architecture beyond the shape columns (head
    width, QK-norm, multi-head latent attention, shared experts, leading dense layers) it has
    (``_with_preset``);
  * a MoE row's ``moe_routing`` column sets how evenly its tokens reached the experts (``_moe_routing``):
    "force-balanced" is planned with ``moe_force_balance``, "capacity C padded" with
    ``moe_capacity_factor=C``, as a user would plan with --moe-force-balance / --moe-capacity-factor C.
Memory has no fitted factor: each engine profile (accounting.engines) is predicted as
benchmarks/engine_memory.py does, so its error is out of sample by construction. The memory band
(planner/memory_band.py) is fitted on the measured peaks of every source but the row's own (its half-width from the
residuals each out of its own source, symmetric, ``_memory_fit``; a row stating torch's max reserved beside its max
allocated gives both figures, ``memory_figures``), and with it every run that trained gets the verdict of its
predicted worst stage against its device: a run that trained fitted, so "does not fit" there is a miss (target 0),
and the report counts those and the tight ones. ``--runs FILE`` adds the trainer's own measured peaks (RunRecords
that measured device memory) as memory rows of runtime exatrain, one source per file.

Measured step time, from the row's own figure in this order: s/iteration; tokens/s/GPU
(global_batch * seq / (tokens/s/GPU * GPUs)); TFLOPS/GPU with the source's hardware-FLOP count
(accounting.flops.hardware_flops_per_step: Narayanan 2021 Eq. 3 under full recompute); MFU with
model FLOPs (Korthikanti 2022 Eq. 7) against the catalog peak. Error = predicted / measured - 1.

    python benchmarks/prediction_error.py [--engine E] [--family F] [--json OUT] [--write-bands] [--runs FILE ...]
    python benchmarks/prediction_error.py --fit-prior h100-sxm-500w   (or h100-sxm: the 700 W parts)
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from exatrain.accounting.flops import hardware_flops_per_step, model_flops_per_step
from exatrain.catalog import get_cluster, get_model
from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.errors import UserError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.settings import recompute_modules_of
from exatrain.planner import band as bandlib
from exatrain.planner import memory_band as memband
from exatrain.planner.band import BANDS_PATH, hardware_family
from exatrain.planner.cost import shrinkage
from exatrain.planner.cost.calibrate import RUN_FACTORS, levenberg_marquardt
from exatrain.planner.cost.coefficients import CostParams, cited_params, default_params
from exatrain.planner.cost.overlap import overlap_priced
from exatrain.planner.cost.published import MEGATRON_LM_2021
from exatrain.planner.estimate import estimate_plan
from exatrain.planner.plan_cost import step_time


CSV_PATH = Path(__file__).resolve().parent / "data" / "published_runs_by_engine.csv"
NARAYANAN, KORTHIKANTI, DASH = (
    "https://arxiv.org/abs/2104.04473",
    "https://arxiv.org/abs/2205.05198",
    "https://arxiv.org/abs/2312.12705",
)
TORCHTITAN = "https://github.com/pytorch/torchtitan/blob/"
TT_2412, TT_ASYNC, TT_DOCS = (
    TORCHTITAN + "main/benchmarks/llama3_h100_202412_torchtitan.md",
    TORCHTITAN + "main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md",
    TORCHTITAN + "4d88a8a44/docs/performance.md",
)
# The sources each device's shipped prior was chosen against (coefficients.py DEFAULTS comment).
MB_PAGES = (
    "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/docs/fern/"
    "versions/nightly/pages/"
)
MB_SUMMARY, MB_ARCHIVE = MB_PAGES + "performance-summary.mdx", MB_PAGES + "performance-summary-archive.mdx"
TT_H200 = TORCHTITAN + "main/benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md"
# The runs that set CUDA_LAUNCH_BLOCKING=1 (their ``overlap`` field says so), which the one host factor of synchronous
# launches, CostParams.blocking_launch_s, is fitted to (``--fit-launch-blocking``): BLOOM-176B's training and
# BigScience's topology sweep before it, both on Jean Zay. Each is predicted with the factor fitted to the other.
BIGSCIENCE = "https://github.com/bigscience-workshop/bigscience/blob/"
BLOCKING_CHOSEN_ON = (
    BIGSCIENCE + "master/train/tr11-176B-ml/README.md",
    BIGSCIENCE + "053adafee86d8b0beb10ddd95e5bbbbe3d702f3c/train/tr11-176B-ml/chronicles-prequel.md",
)
PRIOR_CHOSEN_ON = {
    "a100-80gb": (NARAYANAN, KORTHIKANTI),
    "mi250x-gcd": (DASH,),
    "h100-sxm-500w": (TT_2412, TT_ASYNC, TT_DOCS),
    "h100-sxm": (MB_SUMMARY, MB_ARCHIVE, TT_H200),
}
# Devices whose prior is fitted as one: the H200 is the H100's die (its HBM larger and faster, which the
# catalog prices), so an FP8 GEMM's speed-up over a bf16 one is the same on both at the same 700 W.
FIT_GROUP = {"h200-sxm": "h100-sxm"}


def fit_group(device: str) -> str:
    """The device whose prior ``device``'s runs are fitted into (FIT_GROUP; else itself)."""
    return FIT_GROUP.get(device, device)


# What a held-out source's refit fits, and from which parameters: the A100 and MI250X priors' free
# factors from the generic CostParams() with the prior's cited constants (coefficients.CITED); the 500 W
# H100's clock factor and FP8 speed-up from the H100 prior (its micro-benchmarked kernels, at the clock a
# 500 W limit leaves); the 700 W Hopper parts' FP8 speed-up from the H100 prior (their bf16 kernels are
# micro-benchmarked; no FP8 GEMM has been).
REFIT = {"h100-sxm-500w": (("clock_factor", "fp8_speedup"), "h100-sxm"), "h100-sxm": (("fp8_speedup",), "h100-sxm")}
# A device whose prior takes a factor fitted on another device's runs: B200 plans run Transformer Engine's FP8 recipes
# at the speed-up over bf16 fitted to the 700 W Hopper runs (coefficients.DEFAULTS["b200"]). A B200 row of a source
# that fit saw is predicted with that factor refitted without its source (``out_of_sample``).
BORROWS = {"b200": ("h100-sxm", ("fp8_speedup",))}
MAX_FACTORS = 3  # factors refitted per held-out source (gemm_eff, step_overhead_s, mem_eff): keeps the run short
GIB = 2.0**30
FLAGGED = "flagged by its source: "  # a row whose ``source_flag`` says the figure measures an engine defect


@dataclass
class Row:
    """One published run: its plan (or why there is none), what was measured, what was predicted."""

    index: int
    source: str  # the document (url), the unit left out
    engine: str  # the engine that ran it, as the table names it
    family: str
    kind: str  # dense / moe / long-context, as the table marks it
    name: str
    measured_s: float | None
    measured_from: str
    plan: Plan | None = None
    cluster: ClusterSpec | None = None
    not_priced: str = ""  # the planner's one-line refusal, or the missing field
    notes: list[str] = field(default_factory=list)
    traits: list[str] = field(default_factory=list)  # FP8, context parallel, MoE: what the planner may not price
    memory_gib: float | None = None
    memory_allocated: bool = False
    prior_s: float | None = None  # shipped prior
    in_sample: bool = False  # the shipped prior was chosen against this row's source
    oos_s: float | None = None  # out-of-sample prediction
    oos_how: str = ""
    memory_pred_gib: float | None = None
    overlap: str | None = None  # which of the runtime's overlaps the run had on (cost.overlap.overlap_rules); None:
    # not stated, priced at its engine's defaults with the band's low end reaching every overlap on (``best_ratio``)
    best_ratio: float | None = None  # the step with every overlap on over the one priced, where overlap is None
    predicted_mfu: float | None = None  # the shipped prior's MFU (estimate's: model FLOPs over the dense peak)
    mfu_flag: str = ""  # the estimate's flag: above the best published MFU of its class (catalog studies.toml)
    flash_kernel: str = ""  # the attention kernel the run had where its engine's profile would guess wrong
    elementwise: str = ""  # how its element-wise ops ran (plan.ELEMENTWISE), "" = the engine's own
    cross_entropy: str = ""  # how its loss ran over the logits (plan.CROSS_ENTROPY), "" = the engine's own
    band: tuple[float, float] | None = None  # its p10-p90 of measured / predicted, fitted without its source
    runtime: str = ""  # the exatrain runtime it is planned with: its engine, or the ``priced_as`` profile
    memory_full_gib: float | None = None  # the worst stage as ``estimate`` gives it (the verdict's prediction)
    memory_reserved_gib: float | None = None  # torch's max reserved where the source states it beside max allocated
    memory_band: tuple[float, float] | None = None  # p10-p90 of measured / predicted memory, without its source
    verdict: str = ""  # the memory verdict with that band (planner/memory_band.py), for a run that trained
    trained: bool = False  # the run trained (a measured step time, or a RunRecord that ended ok)


def _int(text: str, default: int | None = None) -> int | None:
    text = (text or "").strip()
    return int(text) if text else default


def _cluster(hardware: str) -> ClusterSpec:
    for key, name in (
        ("400 Gb/s a node", "a100-400g"),
        ("800 Gb/s a node", "h100-800g"),
        ("Jean Zay", "jean-zay-a100"),
        ("A100", "dgx-a100"),
        ("500W", "grand-teton-h100"),
        ("lower TDP", "grand-teton-h100"),
        ("H100", "dgx-h100"),
        ("H200", "dgx-h200"),
        ("DGX-B200", "dgx-b200"),
        ("LUMI", "lumi"),
        ("MI250X", "frontier"),
    ):
        if key in hardware:
            return get_cluster(name)
    raise UserError(f"no catalog cluster for hardware {hardware!r}")


def _fp8_recipe(dtype: str) -> str:
    """The accounting.fp8 scaling nearest to the source's words (estimate refuses FP8 either way)."""
    d = dtype.lower()
    if "mx" in d:
        return "mxfp8"
    if "granular" in d or "rowwise" in d or "block" in d:
        return "block"
    return "current"


def _measured_step_s(r: dict, model: ModelSpec | None, peak: float | None) -> tuple[float | None, str]:
    values = [v.strip() for v in r["throughput"].split(";")]
    units = [u.strip() for u in r["throughput_unit"].split(";")]
    got = {}
    for v, u in zip(values, units):
        m = re.match(r"[-+]?\d+(?:\.\d+)?", v)
        if m:
            got[u.split(" (")[0]] = float(m.group())
    n, gb = _int(r["n_gpus"]), _int(r["global_batch"])
    if "s/iteration" in got:
        return got["s/iteration"], "s/iteration"
    if model is None or not n or not gb:
        return None, "no shape or batch to convert the figure"
    if "tokens/s/GPU" in got:
        return gb * model.seq_len / (got["tokens/s/GPU"] * n), "tokens/s/GPU"
    if "samples/s" in got:  # the whole job's samples a second
        return gb / got["samples/s"], "samples/s"
    tf = next((got[u] for u in ("TFLOPS/GPU", "TFLOPS/GCD") if u in got), None)
    if tf is not None:  # the source's count includes the recompute forward (Narayanan 2021 Eq. 3)
        # (a full recomputation's note, "full (checkpoints split over tp)", reruns every layer all the same)
        recompute = "full" if r["recompute"].startswith("full") else r["recompute"] or "none"
        return hardware_flops_per_step(model, gb, recompute) / (tf * 1e12 * n), "TFLOPS (Eq. 3)"
    mfu = next((v for u, v in got.items() if u.startswith("MFU")), None)
    if mfu is not None and peak:
        return model_flops_per_step(model, gb) / (mfu / 100 * peak * n), "MFU (Eq. 7)"
    return None, f"unit {r['throughput_unit']!r} not converted"


def load_rows(path: Path = CSV_PATH) -> list[Row]:
    """Every row of the table as a Row, priced or not (a row is never dropped)."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    out = []
    for i, r in enumerate(csv.DictReader(path.open(encoding="utf-8"))):
        cluster = _cluster(r["hardware"])
        row = Row(
            index=i,
            source=r["url"].split("#")[0],
            engine=r["engine"],
            family=hardware_family(cluster.device.name),
            kind=r["kind"],
            name=f"{r['model']} ({r['source'].split(',')[0]})",
            measured_s=None,
            measured_from="",
            cluster=cluster,
        )
        row.runtime = r.get("priced_as", "").strip() or r["engine"]
        if row.runtime != row.engine:
            row.notes.append(f"planned as {row.runtime} (exatrain has no profile of {row.engine})")
        row.overlap = _overlap(row.source, row.runtime, r.get("overlap", ""))
        row.flash_kernel = _flash_kernel(r)
        if row.flash_kernel:
            which = "the flash-attn package" if row.engine == "llm-foundry" else "SDPA of a torch before 2.11"
            row.notes.append(f"attention {row.flash_kernel} ({which})")
        row.elementwise = _elementwise(r)
        if row.elementwise:
            row.notes.append(f"element-wise {row.elementwise}")
        row.cross_entropy = _cross_entropy(r)
        if row.cross_entropy:
            why = (
                "(flash-attn's fused loss)"
                if row.engine == "llm-foundry"
                else "(torch's eager loss)"
                if row.engine == "fms-fsdp"
                else "(torchtitan before 2025-04 compiled no loss)"
            )
            row.notes.append(f"cross-entropy {row.cross_entropy} {why}")
        if _launch_blocking(r):
            row.notes.append("synchronous launches (CUDA_LAUNCH_BLOCKING=1)")
        if _adam_kernel(r):
            row.notes.append(f"Adam {_adam_kernel(r)} (torchtitan's default before 2025-02)")
        if r["memory_per_gpu_gib"].strip():
            row.memory_gib = float(r["memory_per_gpu_gib"])
            row.memory_allocated = "allocated" in r["memory_kind"]
            reserved = re.search(r"max reserved ([\d.]+) MiB", r["memory_kind"])
            if row.memory_allocated and reserved:  # the same run's peak with the allocator's cache (memory_figures)
                row.memory_reserved_gib = float(reserved.group(1)) / 1024
        out.append(row)
        missing = [
            k
            for k in ("layers", "hidden", "heads", "seq", "tp", "pp", "dp", "micro_batch", "global_batch", "recompute")
            if not r[k].strip()
        ]
        model = None
        if not missing:
            tp = _int(r["tp"])
            vocab = _int(r["vocab"])
            if vocab is None:
                # GPT-2 BPE (50,257) padded as Megatron pads it: to a multiple of 128 * tp
                # (Megatron-LM megatron/training/tokenizer _vocab_size_with_padding).
                vocab = math.ceil(50257 / (128 * tp)) * 128 * tp
                row.notes.append(f"vocab {vocab} (GPT-2 BPE padded, assumed)")
            experts = _int(r["moe_experts"], 0)
            try:
                # a preset's head width already, so a head dim that is not hidden/heads builds (GPT-OSS's 64)
                head = get_model(r["preset"].strip()).kv_channels if r.get("preset", "").strip() else 0
                model = ModelSpec(
                    name=r["model"],
                    arch=r["arch"] or "gpt",
                    layers=_int(r["layers"]),
                    hidden=_int(r["hidden"]),
                    heads=_int(r["heads"]),
                    kv_heads=_int(r["kv_heads"], 0),
                    ffn_hidden=_int(r["ffn"], 0),
                    seq_len=_int(r["seq"]),
                    vocab=vocab,
                    dropout=float(r["dropout"] or 0.0),
                    experts=experts,
                    top_k=_int(r["moe_topk"], 0) if experts else 0,
                    expert_ffn_hidden=_int(r["moe_ffn"], 0) if experts else 0,
                    kv_channels=head,
                )
                if r.get("preset", "").strip():
                    model = _with_preset(model, r["preset"].strip(), i)
                    row.notes.append(f"architecture of preset {r['preset'].strip()}")
            except UserError as exc:  # a shape the planner cannot build: this row is not priced, the rest are
                row.not_priced = f"the planner refuses the model: {exc}"
                continue
        dtype = r["dtype"].lower()
        row.traits = [
            t
            for t, on in (
                ("FP8", dtype.startswith("fp8")),
                ("context parallel", _int(r["cp"], 1) > 1),
                ("MoE", r["kind"] == "moe"),
            )
            if on
        ]
        row.measured_s, row.measured_from = _measured_step_s(r, model, cluster.device.peak_flops("bfloat16"))
        row.trained = bool(row.measured_s)
        if r.get("source_flag", "").strip():
            # the source itself says the figure measures a defect of its engine (data README)
            row.not_priced = f"{FLAGGED}{r['source_flag'].strip()}"
            continue
        if missing:
            row.not_priced = f"the source does not state {', '.join(missing)}" + (
                f" (and: {', '.join(row.traits)})" if row.traits else ""
            )
            continue
        recompute = r["recompute"].split(" (")[0]
        modules = r["recompute"][len(recompute) :].strip(" ()")
        recompute_modules: tuple[str, ...] = ()
        every = 0
        distribute = False
        if r["engine"] == "megatron-core" and recompute == "selective" and modules:
            # Megatron-Core --recompute-modules: planned as it ran (Plan.recompute_modules)
            recompute_modules = recompute_modules_of(modules.replace(" ", ""))
            row.notes.append(f"recompute modules {','.join(recompute_modules)}")
        elif r["engine"] in ("torchtitan", "fms-fsdp") and recompute == "selective" and modules == "every other layer":
            # torchtitan's layer-level selective checkpointing (selective_ac_option 2), fms-fsdp's
            # selective_checkpointing 2: every other block checkpointed whole (Plan.recompute_every)
            recompute, every = "full", 2
            row.notes.append("recompute one layer in 2, whole (every other block checkpointed)")
        elif recompute == "full" and modules == "checkpoints split over tp":
            # Megatron-Core --distribute-saved-activations, DeepSpeed partition_activations, metaseq
            # --distribute-checkpointed-activations: planned as it ran (Plan.distribute_saved_activations)
            distribute = True
            row.notes.append("checkpoints split over tp")
        elif recompute != r["recompute"]:
            row.notes.append(f"recompute {r['recompute']!r} planned as {recompute}")
        capacity, balance = _moe_routing(r.get("moe_routing", ""))
        if capacity or balance:
            row.notes.append(f"routing {r['moe_routing'].strip()}")
        # FP8 weights gathered in FP8 (torchtitan's float8 all-gather, Megatron-Core --fp8-param-gather)
        gather = any(
            k in r.get("overlap", "").lower() for k in ("float8 all-gather", "fp8-param-gather", "fp8_param_gather")
        )
        if gather:
            row.notes.append("FP8 parameter gather")
        pp, v = _int(r["pp"]), _int(r["vpp"], 1)
        schedule = "interleaved" if pp > 1 and v > 1 else "1f1b"
        try:
            plan = Plan(
                model=model,
                dims=ParallelDims(_int(r["tp"]), pp, _int(r["dp"]), ep=_int(r["ep"], 1), cp=_int(r["cp"], 1)),
                shape=TrainShape(_int(r["micro_batch"]), _int(r["global_batch"])),
                zero_stage=_int(r["zero"], 0),
                recompute=recompute,
                sequence_parallel=r["sp"] == "y",
                schedule=schedule,
                interleave=v if schedule == "interleaved" else 1,
                dtype=_dtype(r),
                flash_attention=r["attention"].startswith(("flash", "triton")),
                cluster=cluster.name,
                runtime=row.runtime,
                fp8=_fp8_recipe(dtype) if dtype.startswith("fp8") else "",
                moe_dispatcher=_dispatcher(r.get("overlap", "")) if experts else "alltoall",
                attention_kernel=row.flash_kernel if r["attention"].startswith("flash") else "",
                elementwise=row.elementwise,
                moe_capacity_factor=capacity,
                moe_force_balance=balance,
                fp8_param_gather=gather,
                cross_entropy=row.cross_entropy,
                grad_accum=_grad_accum(r),
                grad_accum_fusion=_grad_accum_fusion(r),
                adam_kernel=_adam_kernel(r),
                recompute_modules=recompute_modules,
                recompute_every=every,
                distribute_saved_activations=distribute,
                launch_blocking=_launch_blocking(r),
                stage_layers=tuple(int(x) for x in r.get("stage_layers", "").split()),
            )
            if plan.stage_layers:
                row.notes.append(f"layers per stage {' '.join(map(str, plan.stage_layers))} (the engine's split)")
            row.plan = plan.validate(cluster)
        except UserError as exc:
            row.not_priced = str(exc)
    return out


# The switches a source may name in its ``overlap`` field -> the communications they hide
# (accounting.engines.COMMS). torchtitan: FSDP2 prefetches the next block's all-gather and issues
# each reduce-scatter as the block's backward ends (both dp overlaps); async TP is off unless the
# run enables it (job_config ``parallelism.enable_async_tensor_parallel``, default false).
STATED_SWITCHES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fsdp2 prefetch", ("dp_grad_reduce", "dp_param_gather")),
    ("async tp", ("tp",)),
    ("tp_comm_overlap", ("tp",)),
    ("tp-comm-overlap", ("tp",)),
    ("overlap_grad_reduce", ("dp_grad_reduce",)),
    ("overlap-grad-reduce", ("dp_grad_reduce",)),
    ("overlap_param_gather", ("dp_param_gather",)),
    ("overlap-param-gather", ("dp_param_gather",)),
    ("overlap_p2p", ("pp_p2p",)),
    ("overlap-p2p", ("pp_p2p",)),
    ("overlap_moe_expert_parallel_comm", ("ep_a2a",)),
    ("overlap-moe-expert-parallel-comm", ("ep_a2a",)),
)


# A clause that names a switch to say it was off ("overlap_grad_reduce off", "no TP comm overlap
# (tp_comm_overlap False)", "requested but tp 1") turns nothing on.
_NEGATED = re.compile(r"\b(off|false|no|not|without|requested but)\b")


def _overlap(source: str, engine: str, stated: str = "") -> str | None:
    """The overlaps a run had on. Megatron-LM of 2021-22 overlapped only the DDP gradient
    all-reduce (``cost.published``); a row whose ``overlap`` field names switches gets exactly those
    (``STATED_SWITCHES``; ';'-separated clauses, a negated clause skipped); otherwise None, not stated, as a user who
    leaves --overlap unset plans it: its engine's defaults (DeepSpeed's overlap_comm off at ZeRO-1, torchtitan's
    FSDP2 prefetch without async TP, Megatron-Core's interleaved P2P overlap alone), the band reaching down to every
    overlap on (``best_ratio``). Until 2026-12-07 an unstated Megatron-Core run was priced with every overlap on."""
    if source in (NARAYANAN, KORTHIKANTI) and engine == "megatron-core":
        # torch DDP's all-reduce overlaps the backward; Megatron-LM's local DDP (the sc21 scripts' pipelined
        # sizes) and the runs Korthikanti et al. say did not overlap it reduce after the last backward
        return "none" if "not overlapped" in stated.lower() else MEGATRON_LM_2021
    clauses = [c for c in stated.lower().split(";") if not _NEGATED.search(c)]
    named = sorted({c for clause in clauses for key, comms in STATED_SWITCHES if key in clause for c in comms})
    if named:
        return ",".join(named)
    return None


def _dispatcher(stated: str) -> str:
    """The MoE token dispatcher a row's ``overlap`` field names (plan.MOE_DISPATCHERS): Megatron-Core's
    flex dispatcher with its DeepEP or HybridEP backend, else the all-to-all."""
    low = stated.lower()
    for name in ("hybridep", "deepep"):
        if name in low:
            return name
    return "alltoall"


# The shape columns a ``preset`` must agree with (the rest of its architecture is what the row takes).
_PRESET_SHAPE = ("arch", "layers", "hidden", "heads", "kv_heads", "experts", "top_k", "expert_ffn_hidden")


def _with_preset(model: ModelSpec, preset: str, index: int) -> ModelSpec:
    """``model`` (the row's shape columns) with the architecture the columns cannot say — head width,
    QK-norm, multi-head latent attention, sliding windows, shared experts, leading dense layers, router — taken from the
    catalog preset the row's ``preset`` column names (data README); the row's shape must be the preset's."""
    base = get_model(preset)
    differ = [
        f"{k} {getattr(model, k)} != {getattr(base, k)}" for k in _PRESET_SHAPE if getattr(model, k) != getattr(base, k)
    ]
    if differ:
        raise UserError(f"row {index}: its shape is not preset {preset}'s ({'; '.join(differ)})")
    return base.replace(
        name=model.name,
        seq_len=model.seq_len,
        vocab=model.vocab,
        dropout=model.dropout,
        ffn_hidden=model.ffn_hidden,
        description="",
    )


def _moe_routing(stated: str) -> tuple[float, bool]:
    """(capacity factor, forced balance) of a row's ``moe_routing`` column (data README): "" dropless,
    "force-balanced", or "capacity C padded"."""
    text = stated.strip().lower()
    if not text:
        return 0.0, False
    if text == "force-balanced":
        return 0.0, True
    m = re.fullmatch(r"capacity (\d+(?:\.\d+)?) padded", text)
    if m and float(m.group(1)) > 0:
        return float(m.group(1)), False
    raise UserError(f"moe_routing must be empty, 'force-balanced' or 'capacity C padded', got {stated!r}")


def _flash_kernel(r: dict) -> str:
    """ "fa2" for a run whose torch SDPA predates 2.11: before it, SDPA's flash backend on Hopper is
    FlashAttention-2, cuDNN's kernel being opt-in (pytorch/pytorch#138522; from 2.11 the bundled cuDNN
    passes sdp_utils.cpp's check_prefer_cudnn_attention gate). The torch version is the row's
    ``torch 2.N``, else its dates (every year before 2026 predates 2.11). "" where the engine's own
    profile holds (Megatron's Transformer Engine kernels, flash-attn 2 in Megatron-DeepSpeed)."""
    if r.get("engine") == "llm-foundry":
        # its own kernel (Triton's FlashAttention) unless the run chose the flash-attn package's (FlashAttention-2
        # for the large-scale table's runs: the row's unstated_assumed says which version), which llm-foundry's
        # flash_attn_fn of 2024-01 calls on unpadded tokens (bert_padding.unpad_input / pad_input around
        # flash_attn_varlen_func, llmfoundry/models/layers/attention.py at 5e85bd62d)
        return "fa2-varlen" if r.get("attention", "").startswith("flash-attn") else "triton"
    if "SDPA" not in r.get("attention", ""):
        return ""
    version = r.get("engine_version", "")
    m = re.search(r"torch 2\.(\d+)", version)
    if m:
        return "fa2" if int(m.group(1)) < 11 else ""
    years = [int(y) for y in re.findall(r"\b(20\d\d)\b", version)]
    return "fa2" if years and max(years) < 2026 else ""


def _elementwise(r: dict) -> str:
    """How the row's element-wise ops ran (plan.ELEMENTWISE) from its ``compile`` column: "fused" for a
    compiled run, "eager" for an eager one, "eager-composite" where its torch predates the fused RMSNorm
    kernel (aten._fused_rms_norm, first in torch 2.9: its ``torch 2.N``, else every date before 2025);
    "" (the engine's own) where the column is empty."""
    flag = r.get("compile", "").strip().lower()
    if flag == "y":
        return "fused"
    if flag != "n":
        return ""
    version = r.get("engine_version", "")
    m = re.search(r"torch 2\.(\d+)", version)
    years = [int(y) for y in re.findall(r"\b(20\d\d)\b", version)]
    old = int(m.group(1)) < 9 if m else bool(years) and max(years) < 2025
    return "eager-composite" if old else "eager"


# torchtitan compiles its loss with the model from 2025-04 (pytorch/torchtitan bbb1b616e, build_loss_fn:
# components/loss.py build_cross_entropy_loss); at 9dec370 (2024-12) train.py left it eager ("compiling loss
# function causes CUDA errors, turning off for now").
_TORCHTITAN_COMPILED_LOSS = (2025, 4)


def _cross_entropy(r: dict) -> str:
    """How a torchtitan row's loss ran (plan.CROSS_ENTROPY): "upcast" for a compiled run whose torchtitan's
    dates (``engine_version``, YYYY-MM) all predate ``_TORCHTITAN_COMPILED_LOSS``; else "" (the engine's own:
    the loss compiled with a compiled model, upcast with an eager one)."""
    if r.get("engine") == "llm-foundry":
        # MPT's loss_fn defaults to fused_crossentropy (llmfoundry/models/mpt/modeling_mpt.py, since 5f43bf160 of
        # 2023-05-03, before every table): flash-attn's CrossEntropyLoss, one kernel over the bf16 logits keeping them
        # and their bf16 gradient (flash_attn/losses/cross_entropy.py)
        return "fused"
    if r.get("engine") == "fms-fsdp":
        return "upcast"  # torch's CrossEntropyLoss on the logits, eager
    if r.get("engine") != "torchtitan" or r.get("compile", "").strip().lower() != "y":
        return ""
    dates = [(int(y), int(mo)) for y, mo in re.findall(r"\b(20\d\d)-(\d\d)\b", r.get("engine_version", ""))]
    return "upcast" if dates and max(dates) < _TORCHTITAN_COMPILED_LOSS else ""


def _launch_blocking(r: dict) -> bool:
    """The run set CUDA_LAUNCH_BLOCKING=1, as its ``overlap`` field states: synchronous kernel launches
    (settings: launch_blocking)."""
    return "cuda_launch_blocking=1" in r.get("overlap", "").lower().replace(" ", "")


def _dtype(r: dict) -> str:
    """The precision a row is planned in: float16 where its ``dtype`` column says fp16, else bfloat16."""
    return "float16" if r["dtype"].strip().lower() == "fp16" else "bfloat16"


def _grad_accum(r: dict) -> str:
    """The dtype a row's gradients accumulated in where its engine's default is not what it ran
    (settings.GRAD_ACCUM): DeepSpeed's BF16_Optimizer, named in the ``zero_mode`` column, accumulates and
    all-reduces them in fp32, as a user would plan with --grad-accum float32; torch FSDP1 under llm-foundry's and
    fms-fsdp's mixed precision reduces them in bf16; "" otherwise (Megatron's fp16 training keeps them in the
    parameters' 16 bits, megatron/arguments.py, which is its own for float16)."""
    if r["engine"] == "megatron-deepspeed" and "BF16_Optimizer" in r.get("zero_mode", ""):
        return "float32"
    if r["engine"] in ("llm-foundry", "fms-fsdp"):
        # Composer's mixed precision DEFAULT and PURE, fms-fsdp's bfSixteen: torch FSDP1 reduces in bf16
        return "bfloat16"
    return ""


# Megatron-LM's gradient accumulation fusion (the weight-gradient GEMM adds into main_grad) landed on
# 2022-02-13 (NVIDIA/Megatron-LM commit 83b1e42); a version from before then accumulated outside the GEMMs.
_MEGATRON_ACCUM_FUSION = 2022


# Engines planned through Megatron-Core's profile (``priced_as``) that accumulate gradients outside the GEMMs: nanotron
# adds each micro-batch's bf16 gradient into its fp32 buffer after the backward (src/nanotron/optim/
# gradient_accumulator.py FP32GradientAccumulator._accumulate_grad, fp32_grad.add_(half_param.grad), and on the sync
# step the DDP hook get_fp32_accum_hook's fp32_grad_buffer.add_(grad)); its linears return fresh weight gradients
# (parallel/tensor_parallel/functional.py), nothing fused into them.
_UNFUSED_ACCUM_ENGINES = ("nanotron",)


def _grad_accum_fusion(r: dict) -> str:
    """ "off" for a Megatron row whose ``engine_version`` years all predate the fusion
    (``_MEGATRON_ACCUM_FUSION``), or a row of an engine that accumulates outside the GEMMs
    (``_UNFUSED_ACCUM_ENGINES``), as a user would plan it with --grad-accum-fusion off; else "" (its own)."""
    if r["engine"] in _UNFUSED_ACCUM_ENGINES:
        return "off"
    years = [int(y) for y in re.findall(r"\b(20\d\d)\b", r.get("engine_version", ""))]
    return "off" if r["engine"] == "megatron-core" and years and max(years) < _MEGATRON_ACCUM_FUSION else ""


# torchtitan's Adam: torch.optim.AdamW(foreach=True) unless --optimizer.fused was set, until fused became the
# default on 2025-02-24 (pytorch/torchtitan 6e49885, "use Fused AdamW as default"; optimizer.implementation).
_TORCHTITAN_FUSED_ADAM = (2025, 2)


def _adam_kernel(r: dict) -> str:
    """ "foreach" for a torchtitan row whose ``engine_version`` dates (YYYY-MM, or a bare year) all predate
    ``_TORCHTITAN_FUSED_ADAM``, as a user would plan it with --adam-kernel foreach; else "" (its own: fused)."""
    if r.get("engine") != "torchtitan":
        return ""
    version = r.get("engine_version", "")
    dates = [(int(y), int(mo)) for y, mo in re.findall(r"\b(20\d\d)-(\d\d)\b", version)]
    dates += [(int(y), 12) for y in re.findall(r"\b(20\d\d)\b(?!-\d\d)", version)]
    return "foreach" if dates and max(dates) < _TORCHTITAN_FUSED_ADAM else ""


def _predicted_memory_gib(row: Row, worst_bytes: float) -> float:
    """The worst stage's bytes as ``estimate`` gives them for the row's engine (the evaluation path,
    which counts cp, ep and FP8; memory does not depend on the cost parameters); without the engine's
    allocator allowance where the source reports allocated rather than reserved bytes."""
    from exatrain.accounting.engines import get_engine

    allowance = get_engine(row.runtime).allocator_allowance
    return (worst_bytes / (1 + allowance) if row.memory_allocated else worst_bytes) / GIB


def _predict_s(row: Row, params: CostParams) -> float:
    """The row's step time under ``params``: the one evaluation ``estimate`` prices it with, without the estimate's
    memory counts, notes and advice, which the refits that call this for every row and iteration do not read."""
    return step_time(row.plan, row.cluster, params, overlap_priced(row.overlap))[0].step


def _best_ratio(row: Row, est) -> float | None:
    """Where the row states no overlaps: its step with every overlap its engine offers on over the one priced at
    the engine's defaults (below 1), as ``estimate`` carries it into the band (``band.with_best_case``); else None."""
    if row.overlap is not None or row.plan.launch_blocking:
        return None
    # the step alone (step_time: the estimate's evaluation without its memory counts, notes and advice)
    best = step_time(row.plan, row.cluster, default_params(row.cluster.device.name), overlap="all")[0].step
    return best / est.time_s.step if best < est.time_s.step else None


def price(rows: list[Row]) -> None:
    """Predict every row with the shipped prior; record the planner's refusal where it refuses."""
    for row in rows:
        if row.plan is None:
            continue
        try:
            est = estimate_plan(
                row.plan, row.cluster, default_params(row.cluster.device.name), overlap=overlap_priced(row.overlap)
            )
            row.best_ratio = _best_ratio(row, est)
            row.predicted_mfu = est.mfu
            row.mfu_flag = (est.mfu_above_published or {}).get("text", "")
        except UserError as exc:
            row.not_priced = str(exc)
            continue
        row.prior_s = est.time_s.step
        row.memory_full_gib = est.memory_bytes.total / GIB
        if row.memory_gib is not None:
            row.memory_pred_gib = _predicted_memory_gib(row, est.memory_bytes.total)


# Factors whose prior default is None (the data sheet's value): where a refit starts them.
_FROM_DATA_SHEET = {"fp8_speedup": lambda d: d.peak_flops("float8") / d.peak_flops("bfloat16")}


_INSIDE = 0.95  # where a fit of a factor bounded by the data sheet starts, as a fraction of the bound


def refit_spec(device: str) -> tuple[tuple[str, ...] | None, CostParams]:
    """(the factors a refit for ``device`` fits, None: the first of RUN_FACTORS; the parameters it starts from)."""
    factors, base = REFIT.get(device, (None, None))
    if not base:
        return factors, cited_params(device)
    # a fitted factor starts from the data sheet, never from the shipped value fitted on these runs
    return factors, default_params(base).replace(**{f: None for f in factors or () if f in _FROM_DATA_SHEET})


def fit_without(
    train: list[Row], base: CostParams, max_iter: int = 8, factors: tuple[str, ...] | None = None
) -> CostParams:
    """Factors shared by ``train`` (one device), fitted to their measured step times through the
    estimate itself (calibrate.fit_runs' objective: squared log error, a light pull to the start);
    ``factors``: which (default: the first of RUN_FACTORS, at most MAX_FACTORS and half the runs)."""
    factors = factors or RUN_FACTORS[: max(1, min(MAX_FACTORS, len(train) // 2))]
    device = train[0].cluster.device
    # a factor bounded by the data sheet starts just inside its bound: at the bound the forward-difference
    # Jacobian sees the clip, not the model, and the fit never leaves it
    x0 = np.log(
        [
            max(_INSIDE * _FROM_DATA_SHEET[f](device) if getattr(base, f) is None else getattr(base, f), 1e-9)
            for f in factors
        ]
    )
    log_measured = np.log([r.measured_s for r in train])

    def params_at(x: np.ndarray) -> CostParams:
        vals = {f: float(v) for f, v in zip(factors, np.exp(x))}
        for f in ("gemm_eff", "attn_eff", "mem_eff", "link_eff"):
            if f in vals:  # a fraction of the data sheet's peak: a GPU runs no faster than it
                vals[f] = min(vals[f], 1.0)
        for f, sheet in _FROM_DATA_SHEET.items():
            if f in vals:  # FP8 GEMMs at most the data sheet's FP8 / bf16 peak ratio faster than bf16 ones
                vals[f] = min(vals[f], sheet(device))
        return base.replace(**vals)

    def residuals(x: np.ndarray) -> np.ndarray:
        p = params_at(x)
        pred = np.log([_predict_s(r, p) for r in train])
        return np.concatenate([(pred - log_measured) / math.sqrt(len(train)), 1e-3 * (x - x0)])

    x, _ = levenberg_marquardt(residuals, x0, max_iter=max_iter)
    fitted = params_at(x).replace(source=f"refit on {len(train)} runs of other sources")
    # a factor the fit took to its data-sheet bound stays there, and the others are fitted again without
    # it: past the bound the clip leaves the Jacobian nothing to follow, and the rest stop short
    pinned = {f for f in factors if f in _FROM_DATA_SHEET and getattr(fitted, f) >= _FROM_DATA_SHEET[f](device)}
    if pinned and len(pinned) < len(factors):
        return fit_without(train, fitted, max_iter, tuple(f for f in factors if f not in pinned))
    return fitted


def out_of_sample(rows: list[Row]) -> None:
    """Fill ``oos_s``: the shipped prior where it never saw the row's source, else a refit on the
    same device's rows of the other sources (leave one source out)."""
    priced = [r for r in rows if r.prior_s is not None and r.measured_s]
    group = lambda r: fit_group(r.cluster.device.name)  # noqa: E731
    # a refit learns a device's factors from runs priced with their own engine's profile; a run planned through
    # another engine's (``priced_as``) is predicted, never fitted to
    fits = [r for r in priced if r.runtime == r.engine]
    for r in priced:
        r.in_sample = r.source in PRIOR_CHOSEN_ON.get(group(r), ())
        if not r.in_sample:
            r.oos_s, r.oos_how = r.prior_s, "shipped prior (never saw this source)"
    held = {(group(r), r.source) for r in priced if r.in_sample}
    refits: dict[tuple[str, str], CostParams] = {}

    def refit(device: str, source: str) -> tuple[CostParams | None, list[Row]]:
        train = [r for r in fits if group(r) == device and r.source != source]
        if (device, source) not in refits and train:
            factors, base = refit_spec(device)
            refits[(device, source)] = fit_without(train, base, factors=factors)
        return refits.get((device, source)), train

    for device, source in sorted(held):
        params, train = refit(device, source)
        test = [r for r in priced if group(r) == device and r.source == source]
        if params is None:
            for r in test:
                r.oos_how = "no other source on this device to fit from"
            continue
        for r in test:
            r.oos_s = _predict_s(r, params)
            r.oos_how = f"refit on {len(train)} runs of {len({t.source for t in train})} other source(s)"
    for r in priced:  # a borrowed factor fitted on the lender's runs of the row's own source: refitted without it
        lender, borrowed = BORROWS.get(group(r), ("", ()))
        if lender and r.source in PRIOR_CHOSEN_ON.get(lender, ()):
            params, train = refit(lender, r.source)
            r.in_sample = True
            if params is None:
                r.oos_s, r.oos_how = None, f"no other source of {lender} to fit {', '.join(borrowed)} from"
                continue
            mine = default_params(r.cluster.device.name).replace(**{f: getattr(params, f) for f in borrowed})
            r.oos_s = _predict_s(r, mine)
            r.oos_how = (
                f"{', '.join(borrowed)} of {lender} refit on {len(train)} runs of "
                f"{len({t.source for t in train})} other source(s)"
            )


def _blocking_params(r: Row, x: float) -> CostParams:
    return default_params(r.cluster.device.name).replace(blocking_launch_s=x)


def fit_launch_blocking(train: list[Row]) -> float:
    """CostParams.blocking_launch_s fitted to ``train`` (runs with synchronous launches), every other factor its
    device's shipped prior: the value in [0, 1 ms] whose squared log errors sum least (a grid, then golden
    section)."""
    log_measured = np.log([r.measured_s for r in train])

    def loss(x: float) -> float:
        pred = np.log([_predict_s(r, _blocking_params(r, x)) for r in train])
        return float(np.sum((pred - log_measured) ** 2))

    grid = np.concatenate([[0.0], np.geomspace(1e-6, 1e-3, 16)])
    i = int(np.argmin([loss(x) for x in grid]))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = loss(a), loss(b)
    for _ in range(24):  # the bracket shrinks to 0.618^24 (1e-5) of a grid step
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = loss(b)
    return (lo + hi) / 2


def blocking_rows(rows: list[Row]) -> list[Row]:
    """The priced rows with a measured step that ran with synchronous launches."""
    return [r for r in rows if r.prior_s is not None and r.measured_s and r.plan.launch_blocking]


def blocking_out_of_sample(rows: list[Row]) -> None:
    """Rows with synchronous launches whose source the shipped blocking_launch_s was fitted to
    (``BLOCKING_CHOSEN_ON``): predicted with the factor fitted to the other sources' such rows (leave one source
    out), the rest of their device's prior as shipped."""
    blocking = blocking_rows(rows)
    for source in sorted({r.source for r in blocking if r.source in BLOCKING_CHOSEN_ON}):
        test = [r for r in blocking if r.source == source]
        train = [r for r in blocking if r.source != source]
        for r in test:
            r.in_sample = True
        if not train:
            for r in test:
                r.oos_s, r.oos_how = None, "no other source with synchronous launches to fit blocking_launch_s from"
            continue
        x = fit_launch_blocking(train)
        for r in test:
            r.oos_s = _predict_s(r, _blocking_params(r, x))
            r.oos_how = (
                f"blocking_launch_s {x * 1e6:.0f} us fitted to {len(train)} runs of "
                f"{len({t.source for t in train})} other source(s), the rest the shipped prior"
            )


def fit_prior(rows: list[Row], device: str) -> CostParams:
    """The shipped prior of a device whose prior is fitted to published runs (``REFIT``): the refit
    on every priced run of the sources it is chosen on (``PRIOR_CHOSEN_ON``; what coefficients.DEFAULTS holds;
    the held-out refits leave a source out of this)."""
    train = [
        r
        for r in rows
        if r.prior_s is not None
        and r.measured_s
        and fit_group(r.cluster.device.name) == device
        and r.runtime == r.engine
        and r.source in PRIOR_CHOSEN_ON.get(device, ())
    ]
    if not train:
        raise UserError(f"no priced run on device {device!r}")
    factors, base = refit_spec(device)
    return fit_without(train, base, factors=factors)


def _stats(errs: list[float]) -> dict:
    if not errs:
        return {"n": 0}
    a = np.abs(np.asarray(errs))
    return {
        "n": int(a.size),
        "median": float(np.median(a)),
        "p90": float(np.percentile(a, 90)),
        "max": float(a.max()),
        "signed": float(np.median(errs)),
    }


def table(rows: list[Row]) -> dict:
    """Per (engine, family) and overall: out-of-sample step-time error, memory error, in-sample prior
    error, and the rows not priced; plus the band cells (quantiles of measured / predicted)."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        for key in ((r.engine, r.family), ("all", r.family), ("all", "all")):
            groups.setdefault(key, []).append(r)
    cells = {}
    for (engine, family), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        oos = [r for r in rs if r.oos_s is not None]
        ratios = [r.measured_s / r.oos_s for r in oos]
        cell = {
            "engine": engine,
            "family": family,
            "rows": len(rs),
            "step": _stats([r.oos_s / r.measured_s - 1 for r in oos]),
            "memory": _stats([r.memory_pred_gib / r.memory_gib - 1 for r in rs if r.memory_pred_gib is not None]),
            "in_sample_prior": _stats([r.prior_s / r.measured_s - 1 for r in rs if r.in_sample]),
            "not_priced": sum(1 for r in rs if r.not_priced),
            "no_measured_step": sum(1 for r in rs if not r.not_priced and not r.measured_s),
        }
        if ratios:
            cell["ratio_low"], cell["ratio_high"] = (float(np.percentile(ratios, q)) for q in (10, 90))
        cell["band"] = band_stats([r for r in oos if r.band is not None])
        cells[f"{engine}/{family}"] = cell
    return {
        "cells": cells,
        "kinds": by_kind(rows),
        "rank": rank_correlations(rows),
        "memory": memory_summary(rows),
        "sources": per_source(rows),
        "rows": [
            {
                "index": r.index,
                "name": r.name,
                "engine": r.engine,
                "family": r.family,
                "source": r.source,
                "measured_s": r.measured_s,
                "measured_from": r.measured_from,
                "prior_s": r.prior_s,
                "in_sample": r.in_sample,
                "out_of_sample_s": r.oos_s,
                "how": r.oos_how,
                "memory_gib": r.memory_gib,
                "memory_predicted_gib": r.memory_pred_gib,
                "memory_worst_stage_gib": r.memory_full_gib,
                "memory_band": list(r.memory_band) if r.memory_band else None,
                "memory_verdict": r.verdict,
                "not_priced": r.not_priced,
                "notes": r.notes,
                "mfu_flag": r.mfu_flag,
                "band": list(r.band) if r.band else None,
            }
            for r in rows
        ],
    }


def measured_mfu(r: Row) -> float | None:
    """The row's measured MFU as exatrain states it (model FLOPs, ``model_flops_per_step``, over the device's dense
    peak of the plan's dtype), from its measured step time."""
    peak = r.cluster.device.peak_flops(r.plan.dtype) if r.plan is not None else None
    if not r.measured_s or not peak:
        return None
    return model_flops_per_step(r.plan.model, r.plan.global_batch) / (r.measured_s * r.plan.gpus * peak)


def best_measured_mfu(rows: list[Row]) -> dict[tuple[str, str], tuple[float, Row]]:
    """Per (family, precision: "16-bit" / "fp8") the highest measured MFU of the priced rows and its row: what the
    catalog's best-published-MFU table (catalog/data/studies.toml ``[[mfu]]``) holds, checked by
    tests/bench/test_prediction_error.py."""
    out: dict[tuple[str, str], tuple[float, Row]] = {}
    for r in rows:
        m = measured_mfu(r) if r.prior_s is not None else None
        if m is None:
            continue
        key = (r.family, "fp8" if r.plan.fp8 else "16-bit")
        if key not in out or m > out[key][0]:
            out[key] = (m, r)
    return out


def per_source(rows: list[Row]) -> list[dict]:
    """Per source (left out in turn) and, within it, per engine and hardware family: runs, median |error|, signed
    median (predicted / measured - 1: below 0 predicted too fast), share inside its band."""
    by: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        if r.oos_s is not None:
            by.setdefault((r.source, r.engine, r.family), []).append(r)
    out = []
    for (src, engine, family), rs in sorted(by.items(), key=lambda kv: -len(kv[1])):
        e = [r.oos_s / r.measured_s - 1 for r in rs]
        inside = [r.band[0] <= r.measured_s / r.oos_s <= r.band[1] for r in rs if r.band]
        out.append(
            {
                "source": src,
                "engine": engine,
                "family": family,
                "name": rs[0].name.split(" (", 1)[-1].rstrip(")"),
                "n": len(rs),
                "median": float(np.median(np.abs(e))),
                "signed": float(np.median(e)),
                "coverage": float(np.mean(inside)) if inside else None,
            }
        )
    return out


def log_ratios_by_source(rows: list[Row], without: str = "") -> dict[str, list[float]]:
    """log(measured / predicted out of sample) of the priced runs, by source (``without``: leave that source out):
    what ``cost.shrinkage.estimate`` splits into the spread between sources and within one."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if r.oos_s is not None and r.measured_s and r.source != without:
            out.setdefault(r.source, []).append(math.log(r.measured_s / r.oos_s))
    return out


def term_shares(rows: list[Row]) -> dict[int, np.ndarray]:
    """Each priced run's share of its step that each term of the cost model makes (``cost.shrinkage.shares``), as
    its device's prior prices it: what ``term_samples`` pairs with its log ratio."""
    return {
        r.index: shrinkage.shares(lambda p, r=r: np.array([_predict_s(r, p)]), default_params(r.cluster.device.name))[0]
        for r in rows
        if r.oos_s is not None and r.measured_s
    }


def term_samples(rows: list[Row], shares: dict[int, np.ndarray], without: str = "") -> dict[str, list]:
    """(log(measured / predicted out of sample), term shares) of the priced runs, by source (``without``: leave that
    source out): what ``cost.shrinkage.estimate_terms`` fits each term's spread to."""
    out: dict[str, list] = {}
    for r in rows:
        if r.index in shares and r.source != without:
            out.setdefault(r.source, []).append((math.log(r.measured_s / r.oos_s), shares[r.index]))
    return out


def shrinkage_of(rows: list[Row], shares: dict[int, np.ndarray], without: str = "") -> shrinkage.Shrinkage:
    """The calibration shrinkage measured on the priced runs (``without``: leave that source out): the spreads of
    the whole step's log ratio and of each term's (``cost.shrinkage``)."""
    whole = shrinkage.estimate(log_ratios_by_source(rows, without))
    return dataclasses.replace(whole, terms=shrinkage.estimate_terms(term_samples(rows, shares, without)))


def source_markdown(t: dict) -> str:
    """Per source x engine x hardware family (``per_source``): where the signed bias sits."""
    lines = ["| source | engine | hardware | runs | median | signed | in band |", "|---|---|---|---|---|---|---|"]
    for p in t["sources"]:
        cov = f"{p['coverage']:.0%}" if p["coverage"] is not None else "—"
        lines.append(
            f"| {p['name'][:60]} | {p['engine']} | {p['family']} | {p['n']} | {p['median']:.1%} | {p['signed']:+.1%} "
            f"| {cov} |"
        )
    return "\n".join(lines)


# The kinds of run the README reports apart: the table's ``kind`` column (dense, moe, long-context), dense
# runs split by FP8 GEMMs; a row is in one kind only.
KINDS = ("dense bf16/fp16", "dense FP8", "moe", "long-context")


def kind_of(r: Row) -> str:
    if r.kind == "dense":
        return "dense FP8" if "FP8" in r.traits else "dense bf16/fp16"
    return r.kind


def by_kind(rows: list[Row]) -> dict[str, dict]:
    """Out-of-sample step-time error per kind of run (``KINDS``), every engine and family together."""
    return {
        k: _stats([r.oos_s / r.measured_s - 1 for r in rows if r.oos_s is not None and kind_of(r) == k]) for k in KINDS
    }


def _pct(s: dict, k: str) -> str:
    return f"{s[k]:.1%}" if s.get("n") else "—"


def _signed(s: dict) -> str:
    """The median signed error (predicted / measured - 1: below 0 predicted too fast)."""
    return f"{s['signed']:+.1%}" if s.get("n") else "—"


def markdown(t: dict) -> str:
    """The README / RESULTS table."""
    lines = [
        "| engine | hardware | runs | not priced | step n | median | signed | p90 | max "
        "| p10–p90 measured/predicted | in band | band width | memory n | median | max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in t["cells"].values():
        s, m, b = c["step"], c["memory"], c["band"]
        band = f"{c['ratio_low']:.2f}–{c['ratio_high']:.2f}" if "ratio_low" in c else "—"
        cov = f"{b['coverage']:.0%}" if b["n"] else "—"
        width = f"{b['median_width']:.0%}" if b["n"] else "—"
        lines.append(
            f"| {c['engine']} | {c['family']} | {c['rows']} | {c['not_priced']} | {s['n']} "
            f"| {_pct(s, 'median')} | {_signed(s)} | {_pct(s, 'p90')} | {_pct(s, 'max')} | {band} | {cov} "
            f"| {width} "
            f"| {m['n']} | {_pct(m, 'median')} | {_pct(m, 'max')} |"
        )
    return "\n".join(lines)


def rank_markdown(t: dict) -> str:
    """Rank correlation among the layouts of one model, per family (``rank_correlations``)."""
    lines = [
        "| hardware | sweeps, any GPU count | median Spearman | worst | sweeps at one GPU count | median Spearman "
        "| worst | pairs on the same GPUs | ordered right |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rank = t["rank"]
    for f in sorted(set(rank["families"]) | set(rank["one_count"]) | set(rank["pairs"]), key=lambda f: (f == "all", f)):
        cells = []
        for v in (rank["families"].get(f), rank["one_count"].get(f)):
            cells.append(f"{v['sweeps']} | {v['median']:.2f} | {v['min']:.2f}" if v else "0 | — | —")
        p = rank["pairs"].get(f)
        cells.append(f"{p['pairs']} | {p['ordered']:.0%}" if p else "0 | —")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def not_priced_summary(rows: list[Row]) -> str:
    """Why rows are not priced, counted (a row can have several reasons)."""
    out = [r for r in rows if r.not_priced]
    flagged = [r for r in out if r.not_priced.startswith(FLAGGED)]
    rest = [r for r in out if r not in flagged]
    counts = {
        "unstated shape/layout/recompute": sum(r.not_priced.startswith("the source") for r in rest),
        "flagged as a defect by the source": len(flagged),
        "refused by the planner": sum(not r.not_priced.startswith("the source") for r in rest),
    }
    for trait in ("FP8", "context parallel", "MoE"):
        counts[trait] = sum(trait in r.traits for r in out)
    return (
        f"not priced: {len(out)} of {len(rows)} rows — "
        + ", ".join(f"{k} {v}" for k, v in counts.items())
        + " (a row can have several)"
    )


def memory_lines(rows: list[Row], m: dict) -> list[str]:
    """The memory section of the report: each measured peak beside its prediction and band, the error and band
    coverage, and the verdicts on the runs that trained (misses listed)."""
    out = [
        "memory: measured peak (allocated or reserved, as the source states) against the prediction, the band "
        "fitted without the row's source:",
        f"{'#':>3} {'run':52} {'measured':>9} {'kind':>5} {'predicted':>9} {'error':>7}  band",
    ]
    for r in memory_figures(rows):
        band = f"{r.memory_band[0]:.2f}–{r.memory_band[1]:.2f}" if r.memory_band else "—"
        out.append(
            f"{r.index:3d} {r.name[:52]:52} {r.memory_gib:9.2f} {'alloc' if r.memory_allocated else 'resv':>5} "
            f"{r.memory_pred_gib:9.2f} {r.memory_pred_gib / r.memory_gib - 1:+7.1%}  {band}"
        )
    e, b = m["error"], m["band"]
    if e["n"]:
        out.append(
            f"memory error: n={e['n']} of {m['sources']} sources, median {e['median']:.1%}, p90 {e['p90']:.1%}, "
            f"max {e['max']:.1%}"
            + (
                f"; inside the band (leave one source out): {b['coverage']:.0%} "
                f"({b['coverage_by_source']:.0%} with every source weighing the same), "
                f"median width {b['median_width']:.2f}"
                if b["n"]
                else ""
            )
        )
    v = m["verdicts"]
    out.append(
        f"runs that trained: {m['trained']}, called does not fit: {v['does not fit']} (target 0), tight: "
        f"{v['tight']}, fits: {v['fits']}"
    )
    for x in m["misses"]:
        out.append(
            f"  {x['verdict']:12} #{x['index']:<3d} {x['name'][:60]:60} {x['predicted_gib']:.1f} GiB of "
            f"{x['capacity_gib']:.1f} (band {x['band'][0]:.2f}–{x['band'][1]:.2f})"
        )
    return out


def bands(rows: list[Row], t: dict, command: str) -> dict:
    """The catalog's error_bands.json contents (planner/band.py): the band's parameters fitted on every priced
    run's out-of-sample ratio, what the runs validate per family, and the leave-one-source-out coverage and width
    the same fit reached on sources it never saw."""
    items = band_items(rows)
    params = bandlib.fit_across_sources(*_fit_inputs(items))
    return {
        **_band_file(
            "exatrain-error-bands",
            2,
            command,
            params,
            "p10-p90 of measured/predicted step time: center + sigma x quantiles of the standardized "
            "out-of-sample log ratios, sigma growing with the distance from the validated runs",
        ),
        "validated": _validated(items),
        "leave_one_source_out": {k: c["band"] for k, c in t["cells"].items() if c["band"]["n"]},
    }


def _band_file(kind: str, version: int, command: str, params: dict, statistic: str) -> dict:
    """The fields a band file (error_bands.json, memory_bands.json) opens with: what it is, how it was made, and
    the fitted center, scales and quantiles, rounded."""
    rnd = lambda x: round(float(x), 5)  # noqa: E731
    return {
        "kind": kind,
        "version": version,
        "date": datetime.date.today().isoformat(),
        "command": command,
        "statistic": statistic,
        "center": rnd(params["center"]),
        "sigma": {k: rnd(v) for k, v in params["sigma"].items()},
        "quantiles": [rnd(q) for q in params["quantiles"]],
        "runs": params["runs"],
        "sources": params["sources"],
    }


# ---- bands: fitted on other sources' runs, judged on the held-out source's --------------------------------------


def band_items(rows: list[Row]) -> list[tuple[Row, "bandlib.Traits"]]:
    """Every row with an out-of-sample prediction, with its traits (a row planned through another engine's
    profile is a proxy run)."""
    return [
        (r, bandlib.traits_of(r.plan, r.cluster, proxy=r.runtime != r.engine))
        for r in rows
        if r.oos_s is not None and r.plan is not None
    ]


def _validated(items: list) -> dict:
    """What ``items`` validate per family (``band.validated_summary``), with how much their sources disagree."""
    return bandlib.validated_summary(
        [tr for _, tr in items], [math.log(r.measured_s / r.oos_s) for r, _ in items], [r.source for r, _ in items]
    )


def _distances(items: list) -> list[dict[str, float]]:
    """Each row's distance from what the runs of the *other* sources validate."""
    by_source = {r.source for r, _ in items}
    summary = {s: _validated([x for x in items if x[0].source != s]) for s in by_source}
    return [bandlib.distance(tr, summary[r.source]) for r, tr in items]


def _fit_inputs(items: list, distances: list | None = None):
    distances = _distances(items) if distances is None else distances
    return (
        [math.log(r.measured_s / r.oos_s) for r, _ in items],
        distances,
        [r.source for r, _ in items],
        [tr.defaults for _, tr in items],
    )


def loso_bands(rows: list[Row]) -> None:
    """Fill each row's ``band``: the band fitted on the runs of every other source (nested leave one source
    out: neither the row's prediction nor its band saw its source)."""
    items = band_items(rows)
    if len({r.source for r, _ in items}) < 2:
        return
    dist = _distances(items)
    for source in sorted({r.source for r, _ in items}):
        train = [i for i, (r, _) in enumerate(items) if r.source != source]
        params = bandlib.fit_across_sources(*_fit_inputs([items[i] for i in train], [dist[i] for i in train]))
        for i, (r, tr) in enumerate(items):
            if r.source == source:
                lo, hi, _ = bandlib.interval(tr, dist[i], params)
                r.band = (lo * (r.best_ratio or 1.0), hi)  # unstated overlaps: down to every one on


def one_cell_bands(rows: list[Row], engine: str = "megatron-core", family: str = "A100") -> None:
    """Broken on purpose (tests/bench/test_prediction_error.py): every row's band the p10-p90 of one
    (engine, family) cell's out-of-sample ratios of the other sources, as the band was before it was pooled."""
    for r in rows:
        cell = [
            x.measured_s / x.oos_s
            for x in rows
            if x.oos_s is not None and x.engine == engine and x.family == family and x.source != r.source
        ]
        if r.oos_s is not None and len(cell) >= 2:
            r.band = tuple(float(np.percentile(cell, q)) for q in (10, 90))


def band_stats(rows: list[Row]) -> dict:
    """Share of runs whose measured / predicted lies inside their band, by run and with every source weighing
    the same, and the median width (p90 - p10) over the prediction."""
    if not rows:
        return {"n": 0}
    inside = np.array([r.band[0] <= r.measured_s / r.oos_s <= r.band[1] for r in rows], dtype=float)
    per = {}
    for r, x in zip(rows, inside):
        per.setdefault(r.source, []).append(x)
    width = np.array([r.band[1] - r.band[0] for r in rows])
    weight = np.array([1.0 / len(per[r.source]) for r in rows])
    return {
        "n": len(rows),
        "coverage": float(inside.mean()),
        "coverage_by_source": float(np.mean([np.mean(v) for v in per.values()])),
        "median_width": float(np.median(width)),
        "median_width_by_source": bandlib.weighted_quantile(width, weight, 0.5),
    }


# ---- memory: bands fitted on other sources' measured peaks, verdicts on the runs that trained -------------------


def memory_figures(rows: list[Row]) -> list[Row]:
    """Every measured peak memory with its prediction, one Row each: a row's own figure, and where its source states
    torch's max reserved beside its max allocated (Megatron's memory line prints both), that figure too, compared
    with the whole prediction (the allocator allowance included, as every reserved figure is). Both are of the row's
    source, so leaving a source out leaves both out; the reserved one carries what the allowance, one stated
    fraction, does not: how much the caching allocator holds beyond the tensors in that run."""
    out = []
    for r in rows:
        if r.memory_gib is None or r.memory_pred_gib is None or r.plan is None:
            continue
        out.append(r)
        if r.memory_reserved_gib is not None and r.memory_full_gib is not None:
            out.append(
                dataclasses.replace(
                    r,
                    memory_gib=r.memory_reserved_gib,
                    memory_allocated=False,
                    memory_pred_gib=r.memory_full_gib,
                    memory_reserved_gib=None,
                )
            )
    return out


MEMORY_COVERAGE = 0.8  # the share of an unseen source's measured peaks the memory band is made to hold (p10-p90's)


def memory_items(rows: list[Row]) -> list[tuple[Row, "bandlib.Traits"]]:
    """Every measured peak memory (``memory_figures``) with its run's traits."""
    return [(r, bandlib.traits_of(r.plan, r.cluster, proxy=r.runtime != r.engine)) for r in memory_figures(rows)]


def _memory_scale(train: list) -> dict | None:
    """The memory band's center and scales fitted on ``train`` (None below two sources), each run's distance
    measured from what the *other* sources of ``train`` validate."""
    sources = {r.source for r, _ in train}
    if len(sources) < 2:
        return None
    summary = {src: bandlib.validated_summary([tr for r, tr in train if r.source != src]) for src in sources}
    dist = [memband.memory_distance(tr, summary[r.source]) for r, tr in train]
    return memband.fit_scale(
        [math.log(r.memory_gib / r.memory_pred_gib) for r, _ in train],
        dist,
        [r.source for r, _ in train],
        [tr.defaults for _, tr in train],
    )


def _memory_fit(items: list, holdout: str | None = None) -> dict | None:
    """The memory band's parameters from ``items`` of every source but ``holdout`` (None below two sources): the
    center and scales of ``_memory_scale``, and the band's half-width in scales: the 80th percentile of the absolute
    residuals each out of its own source (every source of the fit left out of an inner fit in turn, its runs
    standardized by that fit's center and scale, each source weighing the same). Measured memories come from a
    handful of sources whose offsets differ, so quantiles of in-fit residuals would cover the fit's sources and not
    the next one; and with so few, which side of the center the next source lands on is not known from the others,
    so the band is symmetric about the center (split-conformal with the absolute residual as its score): a source
    that lands above as far as another landed below is covered alike."""
    train = [(r, tr) for r, tr in items if r.source != holdout]
    params = _memory_scale(train)
    if params is None:
        return None
    srcs = sorted({r.source for r, _ in train})
    u, w = [], []
    for src in srcs:
        inner = _memory_scale([x for x in train if x[0].source != src])
        if inner is None:
            continue
        seen = bandlib.validated_summary([tr for r, tr in train if r.source != src])
        held = [(r, tr) for r, tr in train if r.source == src]
        for r, tr in held:
            # an inner fit on fewer sources is no narrower than the fit it checks (two sources can agree closely)
            scale = max(
                bandlib.sigma_of(
                    memband.memory_distance(tr, seen), tr.defaults, inner["sigma"], memband.SCALE_FEATURES
                ),
                params["sigma"]["base"],
            )
            u.append((math.log(r.memory_gib / r.memory_pred_gib) - inner["center"]) / scale)
            w.append(1.0 / (len(srcs) * len(held)))
    if u:
        half = bandlib.weighted_quantile(np.abs(np.array(u)), np.array(w), MEMORY_COVERAGE)
        params["quantiles"] = [-half, half]
        params["quantiles_from"] = f"out of source, symmetric: the {MEMORY_COVERAGE:.0%} quantile of |residual|"
    params["validated"] = bandlib.validated_summary([tr for _, tr in train])
    return params


def loso_memory_bands(rows: list[Row]) -> None:
    """Fill every priced row's ``memory_band`` from a fit that never saw its source (nested leave one source out:
    the memory model has no fitted factor, so its prediction is out of sample already), and, for a run that trained
    (a measured step time), its ``verdict`` against its device's capacity."""
    items = memory_items(rows)
    fits: dict[str | None, dict | None] = {}
    for r in rows:
        if r.plan is None or r.memory_full_gib is None:
            continue
        key = r.source if any(x.source == r.source for x, _ in items) else None
        if key not in fits:
            fits[key] = _memory_fit(items, key)
        params = fits[key]
        if params is None:
            continue
        tr = bandlib.traits_of(r.plan, r.cluster, proxy=r.runtime != r.engine)
        lo, hi, _ = bandlib.interval(
            tr, memband.memory_distance(tr, params["validated"]), params, memband.SCALE_FEATURES
        )
        r.memory_band = (lo, hi)
        if r.trained and not r.not_priced:
            r.verdict = memband.verdict(
                r.memory_full_gib * GIB, r.cluster.device.hbm_bytes, lo, hi, allowance=memband.allowance_of(r.runtime)
            )


def memory_summary(rows: list[Row]) -> dict:
    """Memory error and band coverage on the measured peaks (every source weighing the same too), and the verdicts
    on the runs that trained: a run that trained fitted, so "does not fit" is a miss (target 0)."""
    meas = memory_figures(rows)
    banded = [r for r in meas if r.memory_band is not None]
    inside = [r.memory_band[0] <= r.memory_gib / r.memory_pred_gib <= r.memory_band[1] for r in banded]
    per: dict[str, list[bool]] = {}
    for r, x in zip(banded, inside):
        per.setdefault(r.source, []).append(x)
    trained = [r for r in rows if r.verdict]
    counts = {v: sum(r.verdict == v for r in trained) for v in memband.VERDICTS}
    return {
        "n": len(meas),
        "sources": len({r.source for r in meas}),
        "error": _stats([r.memory_pred_gib / r.memory_gib - 1 for r in meas]),
        "band": {
            "n": len(banded),
            "coverage": float(np.mean(inside)) if inside else None,
            "coverage_by_source": float(np.mean([np.mean(v) for v in per.values()])) if per else None,
            "median_width": (
                float(np.median([r.memory_band[1] - r.memory_band[0] for r in banded])) if banded else None
            ),
        },
        "trained": len(trained),
        "verdicts": counts,
        "misses": [
            {
                "index": r.index,
                "name": r.name,
                "predicted_gib": r.memory_full_gib,
                "capacity_gib": r.cluster.device.hbm_bytes / GIB,
                "band": list(r.memory_band),
                "verdict": r.verdict,
            }
            for r in trained
            if r.verdict != "fits"
        ],
    }


def memory_bands(rows: list[Row], t: dict, command: str) -> dict:
    """The catalog's memory_bands.json (planner/memory_band.py): the band fitted on every measured peak, what those
    runs validate per family, and the leave-one-source-out coverage and verdict counts the same fit reached."""
    params = _memory_fit(memory_items(rows))
    if params is None:
        raise UserError("the memory band needs measured peak memory from at least two sources")
    return {
        **_band_file(
            "exatrain-memory-bands",
            1,
            command,
            params,
            "central 80% of measured/predicted peak memory: center +- sigma x the 80% quantile of the absolute "
            "standardized log ratios (each out of its own source), sigma growing with the distance from the "
            "measured runs",
        ),
        "unseen": params["unseen"],
        "validated": params["validated"],
        "leave_one_source_out": {k: t["memory"][k] for k in ("band", "trained", "verdicts")},
    }


def record_rows(paths: list[Path], start: int) -> list[Row]:
    """The trainer's own measured peaks: every RunRecord of ``paths`` that measured device memory (not a CPU's
    RSS), as a memory row of runtime exatrain (one source per file); its peak is torch's max allocated, so the
    prediction is compared without the allocator allowance."""
    from exatrain.records import read_run_records
    from exatrain.planner.compare import cluster_for

    out = []
    for path in paths:
        for rec in read_run_records(path):
            m = rec.measured
            if rec.status != "ok" or m is None or not m.peak_memory_bytes or rec.device in ("", "cpu"):
                continue
            cluster = cluster_for(rec)
            if cluster is None:
                continue
            row = Row(
                index=start + len(out),
                source=f"exatrain runs {path}",
                engine="exatrain",
                family=hardware_family(cluster.device.name),
                kind="dense",
                name=f"{rec.plan.model.name} {rec.plan.label} (exatrain run on {rec.device})",
                measured_s=None,
                measured_from="RunRecord (memory only)",
                plan=rec.plan,
                cluster=cluster,
                runtime="exatrain",
                memory_gib=m.peak_memory_bytes / GIB,
                memory_allocated=True,
                trained=True,
            )
            out.append(row)
    return out


# ---- rank correlation among the layouts of one model ----------------------------------------------------------


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):  # ties share their mean rank
        tie = x == v
        ranks[tie] = ranks[tie].mean()
    return ranks


def spearman(a, b) -> float:
    """Spearman's rank correlation (Pearson's on the ranks, ties averaged)."""
    ra, rb = _ranks(np.asarray(a, dtype=float)), _ranks(np.asarray(b, dtype=float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _sweeps(rows: list[Row], min_layouts: int, one_count: bool) -> list[dict]:
    """The sweeps of >= ``min_layouts`` runs of one model (and sequence length) in one source on one family, at one
    GPU count each where ``one_count``, with the Spearman rho of their predicted and measured tokens/s/GPU."""
    sweeps: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.oos_s is not None and r.plan is not None:
            model = r.name.split(" (")[0] + f" seq {r.plan.model.seq_len}"
            sweeps.setdefault((r.family, r.source, model, r.plan.gpus if one_count else 0), []).append(r)
    out = []
    for (family, source, model, gpus), rs in sorted(sweeps.items()):
        if len(rs) < min_layouts:
            continue
        rate = lambda r, s: r.plan.tokens_per_step / (s * r.plan.gpus)  # noqa: E731
        rho = spearman([rate(r, r.oos_s) for r in rs], [rate(r, r.measured_s) for r in rs])
        if not math.isnan(rho):
            out.append(
                {
                    "family": family,
                    "source": source,
                    "model": model,
                    "layouts": len(rs),
                    "spearman": rho,
                    **({"gpus": gpus} if one_count else {}),
                }
            )
    return out


def _by_family(sweeps: list[dict]) -> dict:
    fams: dict[str, list[float]] = {}
    for s in sweeps:
        fams.setdefault(s["family"], []).append(s["spearman"])
    fams["all"] = [s["spearman"] for s in sweeps]
    return {f: {"sweeps": len(v), "median": float(np.median(v)), "min": float(min(v))} for f, v in fams.items() if v}


def rank_correlations(rows: list[Row], min_layouts: int = 3) -> dict:
    """Among the layouts of one model in one source on one family (a multi-layout sweep), the rank correlation of
    predicted and measured throughput per GPU (tokens/s/GPU, so runs of different batch or GPU count compare); per
    family, the median and worst sweep: over sweeps at any GPU count (``families``: what a scaling study compares
    too) and at one GPU count each (``one_count``: what a search ranks)."""
    out = _sweeps(rows, min_layouts, one_count=False)
    fixed = _sweeps(rows, min_layouts, one_count=True)
    # what a search decides: of two layouts of one model on the same GPUs, which is faster
    pairs: dict[str, list[bool]] = {}
    same: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.oos_s is not None and r.plan is not None:
            same.setdefault(
                (r.family, r.source, r.name.split(" (")[0], r.plan.model.seq_len, r.plan.gpus, r.plan.global_batch), []
            ).append(r)
    for key, rs in same.items():
        for i, a in enumerate(rs):
            for b in rs[i + 1 :]:
                if a.measured_s != b.measured_s:
                    ok = (a.oos_s < b.oos_s) == (a.measured_s < b.measured_s)
                    for f in (key[0], "all"):
                        pairs.setdefault(f, []).append(ok)
    return {
        "sweeps": out,
        "families": _by_family(out),
        "one_count_sweeps": fixed,
        "one_count": _by_family(fixed),
        "pairs": {f: {"pairs": len(v), "ordered": float(np.mean(v))} for f, v in pairs.items()},
    }


def run(
    path: Path = CSV_PATH, engine: str | None = None, family: str | None = None, runs: list[Path] | None = None
) -> tuple[list[Row], dict]:
    every = load_rows(path)
    every += record_rows(list(runs or ()), len(every))
    rows = [r for r in every if (engine is None or r.engine == engine) and (family is None or r.family == family)]
    if not rows:
        raise UserError(
            f"no published row matches --engine {engine} --family {family} (engines: "
            f"{', '.join(sorted({r.engine for r in every}))}; families: "
            f"{', '.join(sorted({r.family for r in every}))})"
        )
    price(rows)
    out_of_sample(rows)
    blocking_out_of_sample(rows)
    loso_bands(rows)
    loso_memory_bands(rows)
    return rows, table(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=CSV_PATH)
    ap.add_argument("--engine", help="only this engine's rows (megatron-core, megatron-deepspeed, torchtitan)")
    ap.add_argument("--family", help="only this hardware family's rows (A100, H100/H200, MI250X)")
    ap.add_argument("--json", type=Path, metavar="OUT", help="write the table (cells and rows) as JSON")
    ap.add_argument(
        "--write-bands",
        action="store_true",
        help=f"write {BANDS_PATH.name} and {memband.MEMORY_BANDS_PATH.name} into the catalog",
    )
    ap.add_argument(
        "--runs",
        type=Path,
        nargs="+",
        metavar="RUNS",
        default=[],
        help="runs files (RunRecords) whose measured device peak memory joins the memory rows",
    )
    ap.add_argument(
        "--fit-prior",
        metavar="DEVICE",
        choices=sorted(REFIT),
        help="print the prior fitted on every run of DEVICE (coefficients.DEFAULTS) and stop",
    )
    ap.add_argument(
        "--fit-launch-blocking",
        action="store_true",
        help="print blocking_launch_s fitted on every run with synchronous launches and stop",
    )
    args = ap.parse_args(argv)
    try:
        if args.write_bands and (args.engine or args.family or args.csv != CSV_PATH):
            raise UserError("--write-bands takes the whole published table: drop --engine/--family/--csv")
        for path in args.runs:
            if not path.is_file():
                raise UserError(f"{path}: no such runs file")
        if args.fit_prior:
            every = load_rows(args.csv)
            price(every)
            p = fit_prior(every, args.fit_prior)
            factors, _ = refit_spec(args.fit_prior)
            print(", ".join(f"{f}={getattr(p, f):.4f}" for f in factors) + f"  ({p.source})")
            return 0
        if args.fit_launch_blocking:
            every = load_rows(args.csv)
            price(every)
            train = blocking_rows(every)
            if not train:
                raise UserError("no priced run with synchronous launches (CUDA_LAUNCH_BLOCKING=1) in the table")
            x = fit_launch_blocking(train)
            print(
                f"blocking_launch_s={x:.3e}  (fitted on {len(train)} runs of {len({r.source for r in train})} sources)"
            )
            return 0
        rows, t = run(args.csv, args.engine, args.family, args.runs)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{'#':>3} {'run':52} {'engine':18} {'hw':9} {'measured s':>10} {'prior':>8} {'out of sample':>13}  how")
    for r in rows:
        if r.not_priced or not r.measured_s:
            continue
        prior = f"{r.prior_s / r.measured_s - 1:+.1%}" + ("*" if r.in_sample else " ")
        oos = f"{r.oos_s / r.measured_s - 1:+13.1%}" if r.oos_s is not None else f"{'—':>13}"
        print(
            f"{r.index:3d} {r.name[:52]:52} {r.engine:18} {r.family:9} {r.measured_s:10.3f} {prior:>8} {oos}  "
            f"{r.oos_how}{'; ' + '; '.join(r.notes) if r.notes else ''}"
        )
    print("(* the shipped prior was chosen against this row's source: in-sample)\n")
    print("not priced:")
    for r in rows:
        if r.not_priced:
            print(f"{r.index:3d} {r.name[:52]:52} {r.engine:18} {r.family:9} {r.not_priced[:110]}")
    print(not_priced_summary(rows) + "\n")
    print(markdown(t))
    b = t["cells"]["all/all"]["band"] if "all/all" in t["cells"] else {"n": 0}
    if b["n"]:
        print(
            f"\nbands (fitted on the other sources' runs, nested leave one source out): {b['coverage']:.0%} of "
            f"{b['n']} runs inside their p10–p90 ({b['coverage_by_source']:.0%} with every source weighing the "
            "same); "
            f"median width (p90 - p10) {b['median_width']:.0%} of the prediction "
            f"({b['median_width_by_source']:.0%} with every source weighing the same)"
        )
    print(
        "\nrank correlation of predicted and measured tokens/s/GPU among the layouts of one model at one sequence "
        "length in one source (sweeps of >= 3 layouts: at any GPU count, and at one GPU count each, what a search "
        "ranks), and the share of pairs of layouts on the same GPUs and batch whose faster one is predicted "
        "faster:\n" + rank_markdown(t)
    )
    print(
        "\nby kind of run (out of sample, every engine and family): "
        + "; ".join(
            f"{k} n={v['n']}" + (f" median {v['median']:.1%} p90 {v['p90']:.1%} max {v['max']:.1%}" if v["n"] else "")
            for k, v in t["kinds"].items()
        )
    )
    print("\nper source, engine and hardware (each source left out in turn):\n" + source_markdown(t))
    above = [r for r in rows if r.predicted_mfu is not None and r.mfu_flag]
    print(
        "\nbest measured MFU per hardware family and precision (model FLOPs over the dense peak; "
        "catalog/data/studies.toml [[mfu]]): "
        + "; ".join(
            f"{fam} {prec} {m:.1%} ({r.name})" for (fam, prec), (m, r) in sorted(best_measured_mfu(rows).items())
        )
        + f"; predictions above their class's best, flagged by the estimate: {len(above)}"
    )
    print("\n" + "\n".join(memory_lines(rows, t["memory"])))
    ins = [c for c in t["cells"].values() if c["in_sample_prior"]["n"]]
    for c in ins:
        s = c["in_sample_prior"]
        print(
            f"\nin-sample, shipped prior, {c['engine']}/{c['family']}: n={s['n']} median {s['median']:.1%} "
            f"p90 {s['p90']:.1%} max {s['max']:.1%}"
        )
    command = "python benchmarks/prediction_error.py" + (" --write-bands" if args.write_bands else "")
    if args.json:
        args.json.write_text(json.dumps(t, indent=1) + "\n", encoding="utf-8")
    if args.write_bands:
        BANDS_PATH.write_text(json.dumps(bands(rows, t, command), indent=1) + "\n", encoding="utf-8")
        memband.MEMORY_BANDS_PATH.write_text(
            json.dumps(memory_bands(rows, t, command), indent=1) + "\n", encoding="utf-8"
        )
        shrink = shrinkage_of(rows, term_shares(rows))
        shrinkage.SHRINKAGE_PATH.write_text(
            json.dumps(shrinkage.to_dict(shrink, command, datetime.date.today().isoformat()), indent=1) + "\n",
            encoding="utf-8",
        )
        print(f"\nwrote {BANDS_PATH}, {memband.MEMORY_BANDS_PATH} and {shrinkage.SHRINKAGE_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
