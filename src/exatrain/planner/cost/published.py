"""Published training runs the cost model is checked against (catalog/data/published_runs.csv).

Each row becomes a Plan on a catalog cluster plus the one figure the paper measured, in the paper's
own convention:
  * Narayanan et al. 2021 Table 1: TFLOPS per GPU counted with Eq. 3 (full recomputation included)
    -> compared with our ``hardware_tflops_per_gpu`` (whose full-recompute count is Eq. 3);
  * Korthikanti et al. 2022 Tables 3/5: iteration time -> our step time; where only MFU is given,
    our MFU;
  * Dash et al. 2023 (Frontier): TFLOPS per GCD. The paper's layouts for these numbers are not
    readable, so each gets the layout of the authors' launch scripts (ASSUMED_FRONTIER_LAYOUTS,
    stated below) with full recomputation, and is compared as hardware TFLOPS (Megatron-DeepSpeed's
    throughput counter includes the recompute forward).
"""

from __future__ import annotations

import csv
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from exatrain.catalog import get_cluster, get_model
from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.plan import ParallelDims, Plan, TrainShape

CSV_PATH = Path(__file__).resolve().parents[2] / "catalog" / "data" / "published_runs.csv"

# Frontier study rows: layouts from the authors' launch scripts (REFERENCE: "22B TP1·PP8 (16 GCDs) or
# TP4·PP8; 175B TP4·PP16·DP2 on 128 GCDs, micro-batch 1, global batch 640-1280, ZeRO-1, activation
# checkpointing; 1T TP8·PP64 or TP4·PP128 with DP2 on 1,024 GCDs, micro-batch 1, ZeRO-1").
# The 22B global batch is not stated; 128 keeps its 8-stage pipeline as full as the others'.
ASSUMED_FRONTIER_LAYOUTS = {
    "GPT 22B": ("gpt-22b", 1, 8, 2, 1, 128),
    "GPT 175B": ("gpt-175b", 4, 16, 2, 1, 640),
    "GPT 1T": ("gpt-1t", 8, 64, 2, 1, 1280),
}


MEGATRON_LM_2021 = "dp_grad_reduce"  # see PublishedRun.overlap


def _narayanan_overlap(pp: int) -> str:
    """The overlaps of a Narayanan et al. 2021 run: the sc21 scripts (run_table_1.sh) run --DDP-impl torch
    at pipeline size 1 and --DDP-impl local, which overlaps nothing, on the pipelined sizes."""
    return MEGATRON_LM_2021 if pp == 1 else "none"


@dataclass(frozen=True)
class PublishedRun:
    source: str  # "narayanan2021" | "korthikanti2022" | "dash2023"
    name: str
    plan: Plan
    cluster: ClusterSpec
    metric: str  # "hardware_tflops_per_gpu" | "step_s" | "mfu"
    measured: float
    # Which of the runtime's overlaps the run had on (cost.overlap.overlap_rules): Megatron-LM of
    # 2021-22 ran torch DDP where the sc21 scripts say --DDP-impl torch (pipeline size 1), whose bucketed
    # all-reduce overlaps backward, and its local DDP, which all-reduces after the last backward, where
    # they say --DDP-impl local (the pipelined sizes; ``_narayanan_overlap``), and had neither the distributed
    # optimizer's param-gather overlap nor TP comm overlap (both later Megatron-Core switches); the Frontier runs:
    # DeepSpeed's defaults (overlap_comm off at ZeRO-1, deepspeed/runtime/zero/config.py), the authors' DeepSpeed config
    # not being stated.
    overlap: str = "all"


def _cluster_for(hardware: str) -> ClusterSpec:
    if "A100" in hardware:
        return get_cluster("dgx-a100")
    if "MI250X" in hardware:
        return get_cluster("frontier")
    raise ValueError(f"no catalog cluster for {hardware!r}")


def _first_number(text: str) -> float | None:
    m = re.search(r"[-+]?\d+(?:\.\d+)?", text or "")
    return float(m.group()) if m else None


def _dash_run(r: dict[str, str], cluster: ClusterSpec) -> PublishedRun:
    """A Frontier row of Dash et al. 2023, its layout assumed (ASSUMED_FRONTIER_LAYOUTS): hardware TFLOPS."""
    preset, tp, pp, dp, mb, gb = ASSUMED_FRONTIER_LAYOUTS[r["model_name"]]
    plan = Plan(
        model=get_model(preset).replace(dropout=0.1),
        dims=ParallelDims(tp, pp, dp),
        shape=TrainShape(mb, gb),
        zero_stage=1,
        recompute="full",
        flash_attention=True,
        cluster=cluster.name,
        runtime="megatron-deepspeed",
    )
    return PublishedRun(
        "dash2023",
        r["model_name"],
        plan.validate(cluster),
        cluster,
        "hardware_tflops_per_gpu",
        _first_number(r["measured_tflops_per_gpu"]),
        overlap="default",
    )


def _megatron_plan(r: dict[str, str], cluster: ClusterSpec) -> Plan:
    """A Megatron-LM row's GPT model and layout as a validated plan (Megatron-LM's defaults of the time:
    attention and hidden dropout 0.1)."""
    model = ModelSpec(
        name=r["model_name"],
        arch="gpt",
        layers=int(r["n_layers"]),
        hidden=int(r["hidden"]),
        heads=int(r["n_heads"]),
        seq_len=int(r["seq_len"]),
        vocab=int(r["vocab"]),
        dropout=0.1,
    )
    v = int(_first_number(r["virtual_pipeline"]) or 1)
    pp = int(r["pp"])
    schedule = "interleaved" if v > 1 and pp > 1 else "1f1b"
    return Plan(
        model=model,
        dims=ParallelDims(int(r["tp"]), pp, int(r["dp"])),
        shape=TrainShape(int(r["micro_batch"]), int(r["global_batch"])),
        zero_stage=0,
        recompute=r["recompute"],
        sequence_parallel=r["sequence_parallel"] == "y",
        schedule=schedule,
        interleave=v if schedule == "interleaved" else 1,
        flash_attention=False,
        dtype="bfloat16",
        cluster=cluster.name,
        runtime="megatron-core",
    ).validate(cluster)


def _narayanan_run(r: dict[str, str], plan: Plan, cluster: ClusterSpec) -> PublishedRun:
    """A row of Narayanan et al. 2021: hardware TFLOPS. fp16 training (the script's --fp16): Megatron-LM kept
    the gradients in 16 bits, its own for float16, and, before its gradient accumulation fusion (2022-02),
    accumulated them by a pass after each backward (settings.GRAD_ACCUM_FUSION)."""
    plan = dataclasses.replace(plan, dtype="float16", grad_accum_fusion="off").validate(cluster)
    return PublishedRun(
        "narayanan2021",
        r["model_name"],
        plan,
        cluster,
        "hardware_tflops_per_gpu",
        float(r["measured_tflops_per_gpu"]),
        overlap=_narayanan_overlap(plan.pp),
    )


def _korthikanti_run(r: dict[str, str], plan: Plan, cluster: ClusterSpec) -> PublishedRun | None:
    """A row of Korthikanti et al. 2022: its iteration time where stated, else its MFU; None for neither."""
    it = re.search(r"iteration time ([\d.]+) s", r["measured_other"] or "")
    if it:
        return PublishedRun(
            "korthikanti2022", r["model_name"], plan, cluster, "step_s", float(it.group(1)), overlap=MEGATRON_LM_2021
        )
    mfu = re.search(r"MFU ([\d.]+)%", r["measured_mfu_or_hfu"] or "")
    if mfu:
        return PublishedRun(
            "korthikanti2022",
            r["model_name"],
            plan,
            cluster,
            "mfu",
            float(mfu.group(1)) / 100,
            overlap=MEGATRON_LM_2021,
        )
    return None


def published_runs(path: Path = CSV_PATH) -> list[PublishedRun]:
    """Every row of the published-runs table that states a measured figure, as a plan with its metric."""
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    out: list[PublishedRun] = []
    for r in rows:
        src = r["source"]
        cluster = _cluster_for(r["hardware"])
        if src.startswith("Dash"):
            out.append(_dash_run(r, cluster))
            continue
        plan = _megatron_plan(r, cluster)
        if src.startswith("Narayanan"):
            out.append(_narayanan_run(r, plan, cluster))
        else:
            run = _korthikanti_run(r, plan, cluster)
            if run is not None:
                out.append(run)
    return out


def predicted_metric(run: PublishedRun, estimate) -> float:
    """The estimate's figure in the row's convention."""
    if run.metric == "step_s":
        return estimate.time_s.step
    if run.metric == "mfu":
        return estimate.mfu
    return estimate.hardware_tflops_per_gpu
