"""The cost model's free factors: how close real kernels and collectives come to the datasheet.

One ``CostParams`` per device kind (and its cluster's links) — never per run. Defaults below are
the planner's prior; ``exatrain bench`` measures them on the machine at hand and ``exatrain
calibrate`` refits them from RunRecords, both writing a calibration file (JSON) that
``load_calibration`` reads and ``exatrain estimate --calibration`` applies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from exatrain.catalog.hardware import ClusterSpec, LinkTier
from exatrain.errors import UserError
from exatrain.jsonio import read_json, write_json_atomic
from exatrain.planner.cost.variability import SPEED_SPREAD


@dataclass(frozen=True)
class CostParams:
    """Efficiencies and overheads of one device type and its cluster's links."""

    gemm_eff: float = 0.75  # fraction of dense peak a large GEMM reaches
    gemm_overhead_s: float = 20e-6  # fixed time per GEMM call: launch, tile and wave quantisation
    gemm_dim_half: float = 32.0  # a GEMM dimension d costs a factor d/(d + this): thin GEMMs are slow
    op_overhead_s: float = 4e-6  # fixed time per element-wise kernel (launch / dispatch)
    # Framework time the parallel machinery adds beyond arithmetic and bytes (bench.framework
    # measures the trainer's own at negligible size; 0 where it hides behind accelerator work):
    tp_layer_overhead_s: float = 0.0  # per layer and micro-batch under tensor parallelism (DTensor)
    fsdp_layer_overhead_s: float = 0.0  # per layer and micro-batch under FSDP (ZeRO-2/3, dp > 1)
    pp_microbatch_overhead_s: float = 0.0  # per micro-batch and virtual stage under a pipeline schedule
    dp_step_overhead_s: float = 0.0  # per step with data parallelism (reducer / bucket machinery)
    cores_per_node: int = 0  # CPU runs: cores a node's ranks share (more ranks than cores slow down)
    attn_eff: float = 0.30  # fused (flash) attention: fraction of peak, causal, full-count FLOPs
    # ... reached at long keys: the rate falls by n/(n + attn_seq_half) at key length n; plus a fixed
    # time per forward + backward call (cost.compute.flash_attention_s)
    attn_seq_half: float = 0.0
    attn_call_overhead_s: float = 0.0
    # FlashAttention-2's rate relative to that kernel, for runs that get FA2 instead (1: it is the kernel)
    fa2_attn_ratio: float = 1.0
    # speed of FP8 GEMMs over the training dtype's, measured (``exatrain bench``) or fitted (the Hopper
    # priors); None: the catalog's FP8 peak over the dtype's peak, at the same efficiency
    # (cost.fp8.fp8_speedup)
    fp8_speedup: float | None = None
    mem_eff: float = 0.70  # fraction of memory bandwidth reached by element-wise kernels
    link_eff: float = 0.75  # fraction of link bandwidth reached by collectives (algorithm bw)
    # ... and by the ring collectives and sends that cross the network tier (the cluster's last), where
    # they differ: a NIC's large messages come closer to its line rate than the node's links do.
    # None: link_eff (cost.network.tier_arrays; all-to-all and the context-parallel ring keep link_eff)
    net_eff: float | None = None
    # Fixed time per collective call beyond its per-hop latency: the library's launch and protocol
    # setup (NCCL's own cost model: src/graph/tuning.cc baseLat, Ring/Simple 8.4 us; RCCL's 17 us).
    collective_overhead_s: float = 0.0
    dp_overlap: float = 1.0  # fraction of one micro-batch's backward that hides DP reduction
    # Fraction by which compute slows while a data-parallel collective runs beside it: NCCL's and RCCL's kernels
    # take SMs and memory bandwidth from the GEMMs they overlap (cost.step.step_times prices it on the DP
    # seconds hidden behind compute)
    comm_contention: float = 0.0
    step_overhead_s: float = 0.01  # per optimizer step: data, logging, launch latency
    # Relative standard deviation of the sustained speed of a cluster's GPUs of one model: a synchronous step runs
    # at its slowest GPU's pace (cost.variability; cited there, chosen against no run). A host's processes: 0.
    speed_spread: float = SPEED_SPREAD
    # Host time per kernel launch that a run with synchronous launches (settings: launch_blocking,
    # CUDA_LAUNCH_BLOCKING=1) adds to every GEMM, element-wise kernel and collective, nothing overlapping
    # (planner.evaluate): PyTorch's dispatch, the launch and the wait for the kernel's completion. A host
    # property, not a device one: one value for every device, fitted to the runs that set it (BLOOM-176B's
    # training and BigScience's topology sweep on Jean Zay's A100s:
    # `python benchmarks/prediction_error.py --fit-launch-blocking`; each is predicted with the other's fit).
    # It is per kernel the cost model counts (about 33 a layer and micro-batch, forward and backward), which
    # eager Megatron-DeepSpeed exceeds (its dropouts, casts and RNG bookkeeping), so it reads larger than one
    # launch's wait; the two sources' fits differ (171 us from BLOOM's one run, 243 from the sweep).
    blocking_launch_s: float = 2.419e-4
    peak_flops: float | None = None  # measured peak overriding the catalog (e.g. a CPU, which has none)
    # Sustained arithmetic clock against the one the catalog's peaks assume: a power-capped part (an
    # H100 held at 500 W) runs every GEMM and attention kernel at this fraction of its datasheet rate
    clock_factor: float = 1.0
    mem_bytes_per_s: float | None = None  # measured memory bandwidth overriding the catalog
    # What `exatrain calibrate` fits to a cluster x engine's own runs (bench/fit.py): the measured over the predicted
    # step time that no other factor explains, applied to the whole step (planner.evaluate), and how many runs they
    # were fitted to; and where those runs, each predicted without itself, landed: p10 and p90 of measured / predicted
    # over ``band_runs`` held-out runs (0: none measured; the published-run band of planner/band.py holds, centred on
    # the calibrated prediction)
    step_scale: float = 1.0
    calibrated_runs: int = 0  # the runs `exatrain calibrate` fitted these to (0: none)
    band_low: float = 0.0
    band_high: float = 0.0
    band_runs: int = 0
    source: str = "default"

    def replace(self, **kw: Any) -> "CostParams":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "calibration") -> "CostParams":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"{source}: unknown cost parameter(s) {', '.join(unknown)}")
        out = cls(**{k: v for k, v in d.items()})
        for f in dataclasses.fields(cls):
            v = getattr(out, f.name)
            if f.name == "source":
                continue
            if v is None and f.name in ("peak_flops", "mem_bytes_per_s", "fp8_speedup", "net_eff"):
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise UserError(f"{source}: {f.name} must be a non-negative number, got {v!r}")
        return out


# Priors per device (see benchmarks/RESULTS.md for how each was chosen and how well it predicts).
# A100 and MI250X: one set each, chosen against all published rows of their cluster together
# (benchmarks/prediction_error.py); H200/H100 GEMM figures from reference/h200_anchor_2026-11-30.jsonl.
# Once the slowest GPU's lag was priced (cost.variability: runs of 8 to 3,072 GPUs gain 2-5%), the A100 and
# MI250X GEMM efficiencies, chosen against multi-GPU runs that held that lag, were chosen again against the same
# rows (PRIOR_CHOSEN_ON) so that their mean log error stays what it was: 0.80 -> 0.85 and 0.55 -> 0.58. The
# Hopper GEMM figures come from one GPU, which has no lag, and stay.
# Base latency of one collective in the libraries' own cost models (src/graph/tuning.cc, baseLat,
# Ring algorithm, Simple protocol — the one large messages use): NVIDIA/nccl 8.4 us, ROCm/rccl 17 us.
_NCCL_BASE_S, _RCCL_BASE_S = 8.4e-6, 17e-6
# Hopper's fused attention: the causal SDPA forward + backward points of the same H200 anchor (torch 2.11,
# whose SDPA runs cuDNN's kernel on sm90), fitted by calibrate.fit_attention (tests/planner/
# test_attention_cost.py refits them from benchmarks/data/h200_anchor_sdpa.jsonl). FlashAttention-2,
# what SDPA ran on Hopper before torch 2.11 and what flash-attn 2 runs: 329.5 against cuDNN's 631.3 TFLOPS
# at (1, 24, 4608, 128) on one H100 (pytorch/pytorch#142132, tritonbench flash_attention, 2024-12).
_HOPPER_FLASH = dict(
    attn_eff=1.2026, attn_seq_half=743.0, attn_call_overhead_s=409.9e-6, fa2_attn_ratio=329.483 / 631.338
)
# Fused attention kernels measured side by side on one A100 80GB SXM4: causal forward + backward, head dim 128, 16
# heads (hidden 2048), sequence 512 to 16k at 16k tokens (FlashAttention-2, Dao 2023, arXiv 2307.08691, Figure 4(d);
# the figure's bars are benchmarks/data/a100_flashattention2_fig4.csv). Each column fitted by calibrate.fit_attention
# (tests/planner/test_attention_cost.py refits them): (attn_eff, attn_seq_half, attn_call_overhead_s) of the
# model's full-count rate. FlashAttention-2 reaches 199 TFLOPS (causal half-count) at long keys, half of it at 522
# keys; the Triton FlashAttention (triton.ops.flash_attention in the paper's benchmarks/benchmark_flash_attention.py:
# Phil Tillet's Triton tutorial kernel, FlashAttention-1's algorithm, which flash_attn_triton.py, llm-foundry's
# attn_impl "triton", started from) 101 TFLOPS, half of it only at 992 keys (28 against FA2's 99 TFLOPS at 512
# keys, 92 against 189 at 16k).
A100_FA2_CURVE = (1.2750950, 522.44636, 0.0)
A100_TRITON_CURVE = (0.6468573, 992.27397, 9.5284826e-05)
# The A100 prior's attention is FlashAttention-2's curve (its Narayanan/Korthikanti/Dash rows have no flash kernel, so
# this changes none of the rows the rest of the A100 prior was chosen on).
_A100_FLASH = dict(zip(("attn_eff", "attn_seq_half", "attn_call_overhead_s"), A100_FA2_CURVE))
# Hopper's FP8 GEMMs against its bf16 ones, with the casts priced apart (cost.fp8.CAST_BYTES), bounded
# by the data sheet's FP8 / bf16 peak ratio (2.0001x). No FP8 GEMM has been micro-benchmarked, so the
# ratio is fitted to published runs, separately for the two power limits the table holds:
# * 700 W (DGX H100, H200): 1.7209, fitted to the 17 priced runs of Megatron-Bridge's two performance pages
#   and torchtitan's H200 page (`prediction_error.py --fit-prior h100-sxm`; the H200 is the H100's die), the
#   Megatron-Bridge runs with the FP8 parameter gather their recipes set (1.5946 before it, 2026-12-05);
# * 500 W: fitted with that part's clock to torchtitan's bf16 / FP8 runs on it (`--fit-prior
#   h100-sxm-500w`, 29 runs of three pages): at the bound, 2.0001.
# (Refitted 2026-12-05 once comm_contention was priced: 1.5872, 1.9624 and a clock of 0.6589 before; refitted
# again once the slowest GPU's lag was priced (cost.variability): 1.6066 and a clock of 0.6697 before; refitted
# 2026-12-08 once FSDP's per-unit collective latency was priced (cost.dp.per_unit): 1.7196 and 0.6938 before.)
# Why the capped part's FP8 runs gain more over its bf16 ones is not known; the published rows each fit is
# judged on are predicted with the other sources' fit (benchmarks/prediction_error.py, leave one source
# out). `exatrain bench` on a GPU measures the ratio itself (calibrate.fit_fp8) and replaces both.
_HOPPER_FP8_SPEEDUP = 1.7209
_HOPPER_500W_FP8_SPEEDUP = 2.0001
# NVIDIA's NICs under NCCL's ring collectives: "For NDR @ 400Gbps you should see 46-48GB/s per NIC"
# (NVIDIA/nccl-tests#290, an NCCL maintainer, 2025-03-03), and 24 GB/s reached on one 200 Gb/s HDR NIC
# (NVIDIA/nccl#1048): 0.92-0.96 of line rate, where the node's NVLink ring reaches 232.5 of 300 GB/s
# on DGX A100 (NVIDIA/nccl-tests#175), the 0.70-0.75 of link_eff. The low end, for every NVIDIA prior.
_IB_RING_EFF = 0.92
# Compute overlapped with communication runs 18.9% slower on average (40.0% at most) than alone, measured on 4
# A100s, H100s, MI250s and MI210s training GPT and Llama models (Characterizing Compute-Communication Overlap in
# GPU-Accelerated Distributed Deep Learning, arXiv 2507.03114, abstract): every GPU prior's.
_OVERLAP_SLOWDOWN = 0.189
_NCCL = dict(
    collective_overhead_s=_NCCL_BASE_S, net_eff=_IB_RING_EFF, comm_contention=_OVERLAP_SLOWDOWN
)  # every NVIDIA prior's
DEFAULTS: dict[str, CostParams] = {
    "a100-80gb": CostParams(
        gemm_eff=0.85,
        gemm_overhead_s=15e-6,
        **_A100_FLASH,
        mem_eff=0.70,
        link_eff=0.70,
        dp_overlap=1.0,
        step_overhead_s=0.02,
        **_NCCL,
        source="prior",
    ),
    "mi250x-gcd": CostParams(
        gemm_eff=0.58,
        gemm_overhead_s=25e-6,
        attn_eff=0.20,
        mem_eff=0.60,
        link_eff=0.60,
        dp_overlap=0.5,
        step_overhead_s=0.05,
        collective_overhead_s=_RCCL_BASE_S,
        comm_contention=_OVERLAP_SLOWDOWN,
        source="prior",
    ),
    "h100-sxm": CostParams(
        gemm_eff=0.74,
        gemm_overhead_s=30e-6,
        **_HOPPER_FLASH,
        mem_eff=0.75,
        link_eff=0.75,
        **_NCCL,
        fp8_speedup=_HOPPER_FP8_SPEEDUP,
        source="prior",
    ),
    "h200-sxm": CostParams(
        gemm_eff=0.74,
        gemm_overhead_s=30e-6,
        **_HOPPER_FLASH,
        mem_eff=0.75,
        link_eff=0.75,
        **_NCCL,
        fp8_speedup=_HOPPER_FP8_SPEEDUP,
        source="h200 anchor",
    ),
    # The H100 prior at the clock factor fitted, with its own FP8 speed-up (above), to every published run of
    # this part (torchtitan's three benchmark pages: `python benchmarks/prediction_error.py --fit-prior
    # h100-sxm-500w`); no other engine's runs exist on it, so the factor holds torchtitan's own losses
    # too (RESULTS.md).
    "h100-sxm-500w": CostParams(
        gemm_eff=0.74,
        gemm_overhead_s=30e-6,
        **_HOPPER_FLASH,
        mem_eff=0.75,
        link_eff=0.75,
        **_NCCL,
        fp8_speedup=_HOPPER_500W_FP8_SPEEDUP,
        clock_factor=0.6992,
        source="prior (clock and FP8 fitted to torchtitan's runs)",
    ),
    # B200: no micro-benchmark and no published run priced yet; the H100 prior's kernel efficiencies (the same
    # CUDA libraries, at the same fraction of the data sheet's peak) and NCCL's constants. Its attention rate is
    # checked against Blackwell's own: FlashAttention-4 on one B200, causal, head dim 128, 8,192 tokens, 1,418
    # TFLOPS forward and 1,209 backward (Dao-AILab/flash-attention#2280, 2026-02-27; half-count FLOPs), 56% of the
    # 2,250 TFLOPS peak, where this rate gives 55% at that length (the generic attn_eff priced it at 15%). Its FP8
    # GEMMs gain over bf16 what the 700 W Hopper runs show Transformer Engine's FP8 recipes gain there (1.72x, not
    # the data sheet's 2x, which both parts share: the casts, amax reductions and scaling run in the same
    # software); benchmarks/prediction_error.py refits it without a B200 row's own source (BORROWS).
    "b200": CostParams(
        gemm_eff=0.74,
        gemm_overhead_s=30e-6,
        **_HOPPER_FLASH,
        mem_eff=0.75,
        link_eff=0.75,
        **_NCCL,
        fp8_speedup=_HOPPER_FP8_SPEEDUP,
        source="prior (H100's efficiencies and FP8 speed-up; attention checked against FlashAttention-4 on B200)",
    ),
    "mi300x": CostParams(
        gemm_eff=0.60,
        gemm_overhead_s=30e-6,
        attn_eff=0.25,
        mem_eff=0.65,
        link_eff=0.65,
        collective_overhead_s=_RCCL_BASE_S,
        comm_contention=_OVERLAP_SLOWDOWN,
        source="prior",
    ),
    "cpu": CostParams(
        gemm_eff=1.0,
        gemm_overhead_s=10e-6,
        attn_eff=0.5,
        mem_eff=1.0,
        link_eff=1.0,
        op_overhead_s=10e-6,
        dp_overlap=0.0,
        step_overhead_s=0.005,
        peak_flops=2e10,
        speed_spread=0.0,
        source="prior",
    ),
}


# The fields of a hand-chosen prior that come from outside the published runs it was chosen against — a
# paper's or a library's own figure, cited above — and so were chosen against no run: A100's attention
# rate and its fall-off at short keys (Dao 2023), NCCL's per-call latency (tuning.cc baseLat) and its ring
# rate over the NICs (nccl-tests#290, nccl#1048); RCCL's per-call latency. A refit that holds a source out
# (benchmarks/prediction_error.py, leave one source out) starts from the generic CostParams() with these
# (``cited_params``) and fits only the factors chosen by hand.
CITED: dict[str, tuple[str, ...]] = {
    "a100-80gb": ("attn_eff", "attn_seq_half", "collective_overhead_s", "net_eff", "comm_contention"),
    "mi250x-gcd": ("collective_overhead_s", "comm_contention"),
}


def default_params(device_name: str) -> CostParams:
    return DEFAULTS.get(device_name, CostParams())


def cited_params(device_name: str) -> CostParams:
    """The generic ``CostParams()`` with the fields of ``device_name``'s prior that are cited (``CITED``),
    none of them chosen against a published run: where a refit of the hand-chosen factors starts."""
    prior = default_params(device_name)
    return CostParams().replace(**{f: getattr(prior, f) for f in CITED.get(device_name, ())})


FIT_KEY_SEP = "/"  # a calibration file's "fits" keys: "<cluster>/<runtime>"


@dataclass(frozen=True)
class Calibration:
    """A calibration file: cost parameters per device and, optionally, measured link tiers per
    cluster (``exatrain bench`` measures the local machine's; they replace the catalog's)."""

    devices: Mapping[str, CostParams]
    cluster_tiers: Mapping[str, tuple[LinkTier, ...]] = dataclasses.field(default_factory=dict)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # What `exatrain calibrate` fitted to one cluster's runs of one engine: (cluster, runtime) -> parameters
    fits: Mapping[tuple[str, str], CostParams] = dataclasses.field(default_factory=dict)

    def params_for(self, device_name: str, cluster: str = "", runtime: str = "") -> CostParams | None:
        """The parameters fitted to ``cluster``'s runs of ``runtime`` where the file has them, else the device's."""
        return self.fits.get((cluster, runtime)) or self.devices.get(device_name)

    def apply(self, cluster: ClusterSpec) -> ClusterSpec:
        """The cluster with measured tiers, when the file has them for it."""
        tiers = self.cluster_tiers.get(cluster.name)
        return dataclasses.replace(cluster, tiers=tuple(tiers)) if tiers else cluster


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration file::

    {"kind": "exatrain-calibration",
     "devices": {"<device>": {<CostParams fields>}},
     "clusters": {"<cluster>": {"tiers": [{"name", "span", "bytes_per_s", "latency_s"}, ...]}},
     "fits": {"<cluster>/<runtime>": {<CostParams fields>}},  (exatrain calibrate: one cluster's runs of one engine)
     ... anything else (raw measurements, machine description) is kept in ``extra``}
    """
    d = read_json(path)
    if not isinstance(d, dict) or d.get("kind") != "exatrain-calibration" or not isinstance(d.get("devices"), dict):
        raise UserError(
            f"{path}: not an exatrain calibration file (expected kind 'exatrain-calibration' "
            "and a 'devices' object); make one with `exatrain bench` or `exatrain calibrate`"
        )
    devices = {name: CostParams.from_dict(v, source=f"{path}: {name}") for name, v in d["devices"].items()}
    tiers: dict[str, tuple[LinkTier, ...]] = {}
    for name, c in (d.get("clusters") or {}).items():
        try:
            ts = tuple(
                LinkTier(
                    name=str(x["name"]),
                    span=int(x["span"]),
                    bytes_per_s=float(x["bytes_per_s"]),
                    latency_s=float(x["latency_s"]),
                )
                for x in c["tiers"]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{path}: cluster {name!r}: malformed tiers ({exc})") from None
        if not ts or ts[-1].span != 0 or any(t.bytes_per_s <= 0 or t.latency_s < 0 for t in ts):
            raise UserError(
                f"{path}: cluster {name!r}: tiers must end with the network (span 0), bandwidth > 0, latency >= 0"
            )
        tiers[name] = ts
    fits: dict[tuple[str, str], CostParams] = {}
    for key, v in (d.get("fits") or {}).items():
        cluster, sep, runtime = str(key).partition(FIT_KEY_SEP)
        if not sep or not cluster or not runtime or not isinstance(v, dict):
            raise UserError(
                f"{path}: fits key {key!r} is not 'cluster{FIT_KEY_SEP}runtime' with an object of cost parameters"
            )
        fits[(cluster, runtime)] = CostParams.from_dict(v, source=f"{path}: fits {key}")
    extra = {k: v for k, v in d.items() if k not in ("kind", "devices", "clusters", "fits")}
    return Calibration(devices=devices, cluster_tiers=tiers, extra=extra, fits=fits)


def save_calibration(path: str | Path, calibration: Calibration) -> None:
    write_json_atomic(
        path,
        {
            "kind": "exatrain-calibration",
            "devices": {k: v.to_dict() for k, v in calibration.devices.items()},
            "clusters": {
                k: {"tiers": [dataclasses.asdict(t) for t in v]} for k, v in calibration.cluster_tiers.items()
            },
            **(
                {"fits": {f"{c}{FIT_KEY_SEP}{r}": p.to_dict() for (c, r), p in calibration.fits.items()}}
                if calibration.fits
                else {}
            ),
            **dict(calibration.extra),
        },
    )
