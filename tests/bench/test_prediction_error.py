"""benchmarks/prediction_error.py: leave-one-source-out really leaves the source out; rows the
planner cannot price are listed, not dropped."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import benchmarks

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "prediction_error.py"
NARAYANAN, KORTHIKANTI = "https://arxiv.org/abs/2104.04473", "https://arxiv.org/abs/2205.05198"


@pytest.fixture(scope="module")
def pe():
    return benchmarks.load("prediction_error")


def _subset(tmp_path: Path, pe, scale_narayanan: float = 1.0) -> Path:
    """Small A100 rows of two in-sample sources and one other, an FP8 row, a row missing its
    micro-batch, an FP8 one missing its recompute and one its source flags as a defect; Narayanan's
    throughputs scaled by ``scale_narayanan``."""
    rows = list(csv.DictReader(pe.CSV_PATH.open(encoding="utf-8")))
    keep = []
    for r in rows:
        small = r["n_gpus"] in ("32", "64", "8") and "A100" in r["hardware"]
        if (
            r["url"] in (NARAYANAN, KORTHIKANTI)
            and small
            and r["model"].startswith(("GPT 1.7B", "GPT 3.6B", "GPT 22B"))
        ):
            keep.append(dict(r))
        elif r["engine"] == "torchtitan" and "A100" in r["hardware"] and r["model"] == "Llama 3 8B":
            keep.append(dict(r))
    keep.append(next(dict(r) for r in rows if r["dtype"] == "fp8" and r["engine"] == "torchtitan"))
    keep.append(next(dict(r) for r in rows if r["model"].startswith("MT-NLG")))
    keep.append(next(dict(r) for r in rows if r["model"].startswith("Nemotron-22B")))
    keep.append(next(dict(r) for r in rows if r["source_flag"]))
    for r in keep:
        if r["url"] == NARAYANAN:
            r["throughput"] = f"{float(r['throughput']) * scale_narayanan:g}"
    path = tmp_path / f"subset_{scale_narayanan}.csv"
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
    return path


@pytest.fixture(scope="module")
def base(pe, tmp_path_factory):
    return pe.run(_subset(tmp_path_factory.mktemp("pe"), pe))


def test_held_out_source_never_enters_its_fit(pe, base, tmp_path) -> None:
    rows, _ = base
    moved, _ = pe.run(_subset(tmp_path, pe, scale_narayanan=1.5))
    by_source = lambda rs, src: [r for r in rs if r.source == src]  # noqa: E731
    nar, nar_moved = by_source(rows, NARAYANAN), by_source(moved, NARAYANAN)
    kor, kor_moved = by_source(rows, KORTHIKANTI), by_source(moved, KORTHIKANTI)
    assert len(nar) == 2 and len(kor) == 2
    # Narayanan's own measurements changed; its out-of-sample predictions did not.
    for a, b in zip(nar, nar_moved):
        assert a.in_sample and a.measured_s != pytest.approx(b.measured_s)
        assert a.oos_s == pytest.approx(b.oos_s, rel=1e-12)
    # Korthikanti's rows are predicted from a fit that includes Narayanan's: they move.
    assert any(abs(a.oos_s / b.oos_s - 1) > 1e-3 for a, b in zip(kor, kor_moved))
    # A source the shipped prior never saw is predicted by the prior itself.
    titan = [
        r
        for r in rows
        if r.engine == "torchtitan"
        and not r.not_priced
        and r.source not in pe.PRIOR_CHOSEN_ON.get(pe.fit_group(r.cluster.device.name), ())
    ]
    assert titan and all(r.oos_s == r.prior_s and not r.in_sample for r in titan)


def test_rows_not_priced_are_counted_and_listed(pe, base) -> None:
    rows, table = base
    refused = [r for r in rows if r.not_priced]
    fp8 = [r for r in rows if r.engine == "torchtitan" and r.plan is not None and r.plan.fp8]
    assert fp8 and all(not r.not_priced and r.prior_s > 0 for r in fp8)  # FP8 GEMMs are priced
    assert any("micro_batch" in r.not_priced for r in refused)
    # the missing field, then the traits
    assert any("recompute" in r.not_priced and "FP8" in r.not_priced for r in refused)
    # a figure its source flags as an engine defect is listed with the flag, never priced
    flagged = [r for r in refused if r.not_priced.startswith(pe.FLAGGED)]
    assert len(flagged) == 1 and "torchtitan#1207" in flagged[0].not_priced
    assert flagged[0].prior_s is None and flagged[0].oos_s is None
    assert "flagged as a defect by the source 1" in pe.not_priced_summary(rows)
    assert table["cells"]["all/all"]["not_priced"] == len(refused) == 3
    assert table["cells"]["all/all"]["rows"] == len(rows)
    assert sum(1 for r in table["rows"] if r["not_priced"]) == 3
    md = pe.markdown(table)
    assert "| megatron-core | A100 |" in md and "| all | all |" in md


def test_cli_filters_json_and_bad_input(pe, tmp_path, capsys) -> None:
    out = tmp_path / "t.json"
    assert pe.main(["--csv", str(_subset(tmp_path, pe)), "--engine", "torchtitan", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert {c["engine"] for c in d["cells"].values()} <= {"torchtitan", "all"}
    assert all(r["engine"] == "torchtitan" for r in d["rows"])
    capsys.readouterr()
    assert pe.main(["--engine", "torchtitan", "--write-bands"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert pe.main(["--csv", str(tmp_path / "missing.csv")]) == 2
    capsys.readouterr()
    assert pe.main(["--csv", str(_subset(tmp_path, pe)), "--family", "B200"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "families: A100, H100 500W, H100/H200" in err


def test_published_qwen3_235b_rows_with_ep_wider_than_dp_are_priced(pe) -> None:
    """Megatron-Bridge's Qwen3-235B-A22B on 256 H100s runs tp 2 · pp 8 · ep 32 with dp 16: Megatron-Core
    folds ep over tp*dp (MoE parallel folding), so the planner prices its three rows (it refused them
    while ep had to divide dp) within 30% of the measured step. Broken on purpose: with
    ``rules.ep_fits`` keeping ep | dp for megatron-core the rows are refused again and this fails."""
    rows = [r for r in pe.load_rows() if r.name.startswith("Qwen3_235B")]
    assert len(rows) == 3
    pe.price(rows)
    for r in rows:
        assert not r.not_priced, r.not_priced
        assert (r.plan.tp, r.plan.pp, r.plan.dp, r.plan.ep) == (2, 8, 16, 32) and r.plan.runtime == "megatron-core"
        assert abs(r.prior_s / r.measured_s - 1) < 0.30, (r.index, r.prior_s, r.measured_s)


def test_fitted_device_prior_is_the_fit_and_held_out_sources_refit_without_it(pe, full) -> None:
    """The 500 W H100's shipped clock factor and FP8 speed-up are the fit on all its published runs (--fit-prior); a
    held-out torchtitan page is predicted from the other pages' fit, which differs from the shipped one;
    the SDPA runs of torch before 2.11 get FlashAttention-2's rate, and only those."""
    from exatrain.planner.cost.coefficients import default_params

    rows, _ = full  # priced and predicted out of sample (prediction_error.run)
    shipped = default_params("h100-sxm-500w")
    fitted = pe.fit_prior(rows, "h100-sxm-500w")
    assert shipped.clock_factor == pytest.approx(fitted.clock_factor, rel=2e-3)
    # the FP8 speed-up is fitted with it, to the data sheet's bound, where it stays while the clock is refitted
    # (broken on purpose: without fit_without's pinning the clock stops at 0.6628 and the first assert fails)
    assert shipped.fp8_speedup == pytest.approx(fitted.fp8_speedup, rel=2e-3) and fitted.fp8_speedup > 1.0
    # the 700 W parts' FP8 speed-up is its own fit, on the DGX H100 and the H200 runs together (one die)
    hopper = pe.fit_prior(rows, "h100-sxm")
    assert default_params("h100-sxm").fp8_speedup == pytest.approx(hopper.fp8_speedup, rel=2e-3)
    assert default_params("h200-sxm").fp8_speedup == default_params("h100-sxm").fp8_speedup
    assert 1.0 < hopper.fp8_speedup < shipped.fp8_speedup
    # a held-out page's refit starts from the data sheet's ratio, not from the shipped fit
    assert pe.refit_spec("h100-sxm-500w")[1].fp8_speedup is None
    assert pe.refit_spec("h100-sxm")[1].fp8_speedup is None
    assert shipped.replace(clock_factor=1.0, fp8_speedup=None, source="") == default_params("h100-sxm").replace(
        fp8_speedup=None, source=""
    )
    teton = [r for r in rows if r.cluster.device.name == "h100-sxm-500w" and r.oos_s is not None]
    assert {r.source for r in teton} == set(pe.PRIOR_CHOSEN_ON["h100-sxm-500w"])
    assert all(r.in_sample and r.oos_how.startswith("refit on") for r in teton)
    assert all(r.oos_s != pytest.approx(r.prior_s, rel=1e-6) for r in teton)
    # the H200 page is predicted from the DGX H100 pages' fit, and those from the other H100 page's and the H200's
    h200 = [r for r in rows if r.cluster.device.name == "h200-sxm" and r.oos_s is not None]
    # (the H100 rows of llm-foundry and of Megatron-LM's README, each priced with its own profile, enter the fit too:
    # bf16 runs, which the FP8 speed-up does not move; nanotron's, priced through another engine's profile, do not)
    assert len(h200) == 2 and all(r.in_sample and r.oos_how == "refit on 94 runs of 4 other source(s)" for r in h200)
    dgx = [r for r in rows if r.cluster.device.name == "h100-sxm" and r.oos_s is not None]
    own = [r for r in dgx if r.runtime == r.engine]
    chosen = [r for r in own if r.source in pe.PRIOR_CHOSEN_ON["h100-sxm"]]
    assert {r.source for r in chosen} == {pe.MB_SUMMARY, pe.MB_ARCHIVE} and all(r.in_sample for r in chosen)
    assert all(not r.in_sample and r.oos_s == r.prior_s for r in own if r.engine == "llm-foundry")
    # a run planned through another engine's profile (fms-fsdp's, priced_as llm-foundry; nanotron's, priced_as
    # megatron-core) is never in a fit: the shipped prior predicts it, and no refit counts it
    proxy = [r for r in dgx if r.runtime != r.engine]
    assert proxy and all(not r.in_sample and r.oos_s == r.prior_s for r in proxy)
    assert {r.engine for r in proxy} == {"fms-fsdp", "nanotron"}  # the Llama 3 rows state no micro-batch
    kernels = {(r.runtime, r.flash_kernel) for r in rows}
    assert ("torchtitan", "fa2") in kernels and ("llm-foundry", "triton") in kernels
    assert not any(k for e, k in kernels if e not in ("torchtitan", "llm-foundry"))
    # llm-foundry runs its own Triton kernel, except the large-scale runs that chose flash-attn 2.4.2, which its
    # flash_attn_fn of 2024-01 calls on unpadded tokens ("fa2-varlen")
    assert ("llm-foundry", "fa2-varlen") in kernels
    assert pe._flash_kernel({"engine": "llm-foundry", "attention": "triton (llm-foundry attn_impl triton)"}) == "triton"
    assert pe._flash_kernel({"engine": "llm-foundry", "attention": "flash-attn 2.4.2 (sweep.py)"}) == "fa2-varlen"
    assert pe._flash_kernel({"attention": "flash (SDPA)", "engine_version": "x, torch 2.11.0"}) == ""
    assert pe._flash_kernel({"attention": "flash (SDPA)", "engine_version": "x, torch 2.8.0a0"}) == "fa2"
    assert pe._flash_kernel({"attention": "flash (SDPA)", "engine_version": "torchtitan (2024)"}) == "fa2"
    # the MoE rows' stated dispatchers: HybridEP (Qwen3-30B-A3B, 26.04), DeepEP (DeepSeek-V3), else all-to-all
    moe: dict[str, set[str]] = {}
    for r in rows:
        if r.plan is not None and r.kind == "moe":
            moe.setdefault(r.name.split(" (")[0], set()).add(r.plan.moe_dispatcher)
    assert moe["DeepSeekV3"] == {"deepep"} and moe["Qwen3_30B_a3B"] == {"hybridep", "alltoall"}
    assert moe["Qwen3_235B_a22B"] == {"alltoall"}


def test_a_hand_chosen_priors_refit_keeps_its_cited_constants_and_fits_the_rest(pe) -> None:
    """A held-out A100 or MI250X source is predicted by a refit that starts from the generic CostParams() for
    the factors chosen by hand against those sources, but keeps what the prior cites from outside them (A100's
    FlashAttention-2 rate and its half-point, NCCL's per-call latency and NIC ring rate; RCCL's latency), chosen
    against no run.
    Broken on purpose: with the refit started from the bare CostParams() the A100 asserts fail (the torchtitan
    A100 rows in the Narayanan fit then run their flash kernel at 0.3 of peak, and Megatron on A100 reads 5.5%)."""
    from exatrain.planner.cost.coefficients import A100_FA2_CURVE, CITED, CostParams, default_params

    generic = CostParams()
    for device, cited in (
        ("a100-80gb", {"attn_eff", "attn_seq_half", "collective_overhead_s", "net_eff", "comm_contention"}),
        ("mi250x-gcd", {"collective_overhead_s", "comm_contention"}),
    ):
        assert set(CITED[device]) == cited
        start = pe.refit_spec(device)[1]
        prior = default_params(device)
        for f in cited:
            assert getattr(start, f) == getattr(prior, f) and getattr(prior, f) != getattr(generic, f), f
        for f in ("gemm_eff", "mem_eff", "step_overhead_s", "link_eff", "dp_overlap", "gemm_overhead_s"):
            assert getattr(start, f) == getattr(generic, f), f  # hand-chosen: never started from the shipped value
    assert pe.refit_spec("a100-80gb")[1].attn_eff == A100_FA2_CURVE[0]


def test_a_rows_compile_column_sets_its_elementwise_mode(pe) -> None:
    """``compile`` y -> fused; n -> eager, or eager-composite where its torch predates the fused RMSNorm
    kernel (2.9); empty -> the engine's own. Every torchtitan row states it, and the table's eager rows are
    planned so (a bug that read the column as always "y" fails the eager rows' assertion)."""
    assert pe._elementwise({"compile": "y", "engine_version": "torchtitan (2024)"}) == "fused"
    assert pe._elementwise({"compile": "n", "engine_version": "torchtitan (2024)"}) == "eager-composite"
    assert pe._elementwise({"compile": "n", "engine_version": "torchtitan abc, torch 2.8.0a0"}) == "eager-composite"
    assert pe._elementwise({"compile": "n", "engine_version": "torchtitan abc, torch 2.9.1"}) == "eager"
    assert pe._elementwise({"compile": "", "engine_version": "Megatron-LM 2021"}) == ""
    rows = pe.load_rows()
    titan = [r for r in rows if r.engine == "torchtitan"]
    assert titan and all(r.elementwise in ("fused", "eager-composite") for r in titan)
    eager = sorted(r.index for r in titan if r.elementwise == "eager-composite")
    table = list(csv.DictReader(pe.CSV_PATH.open(encoding="utf-8")))
    assert eager == [i for i, r in enumerate(table) if r["engine"] == "torchtitan" and r["compile"] == "n"]
    assert len(eager) == 5
    assert all(r.plan.elementwise == "eager-composite" for r in rows if r.index in eager and r.plan)
    assert all(r.elementwise == "" for r in rows if r.engine not in ("torchtitan", "llm-foundry", "fms-fsdp"))
    # llm-foundry ran eager (no torch.compile in its 2023 harness), on torch before 2.9
    assert all(r.elementwise == "eager-composite" for r in rows if r.engine == "llm-foundry")


def test_megatron_lm_2021_rows_are_planned_as_their_script_ran(pe) -> None:
    """The Narayanan rows: fp16 training (Megatron's own 16-bit gradients for float16, with dynamic loss scaling)
    and its gradients added into by a pass after each backward
    (Megatron-LM before its gradient accumulation fusion of 2022-02), torch DDP's overlapped all-reduce at
    pipeline size 1 and local DDP's unoverlapped one when pipelined (their ``overlap`` column, from the sc21
    script); later Megatron rows keep the engine's own. (Broken on purpose and seen to fail here:
    ``_grad_accum_fusion`` reading the year as ``<=`` 2022, which sends the Korthikanti rows through the pass;
    ``_overlap`` ignoring a row's "not overlapped".)"""
    assert pe._grad_accum_fusion({"engine": "megatron-core", "engine_version": "Megatron-LM 2021 (x)"}) == "off"
    assert pe._grad_accum_fusion({"engine": "megatron-core", "engine_version": "Megatron-LM 2022 (x)"}) == ""
    assert pe._grad_accum_fusion({"engine": "torchtitan", "engine_version": "torchtitan 2021"}) == ""
    assert pe._grad_accum({"engine": "megatron-core", "dtype": "fp16", "zero_mode": ""}) == ""
    assert pe._dtype({"dtype": "fp16"}) == "float16"
    assert pe._dtype({"dtype": "fp16 or bf16 (not stated)"}) == "bfloat16"
    rows = {r.index: r for r in pe.load_rows() if r.plan is not None}
    nar = [r for r in rows.values() if r.source == NARAYANAN and r.engine == "megatron-core"]
    assert len(nar) == 16  # Table 1, and Table 2's PTD-P runs
    zero3 = [r for r in rows.values() if r.source == NARAYANAN and r.engine == "megatron-deepspeed"]
    assert len(zero3) == 6  # Table 2's ZeRO-3 runs: DeepSpeed's overlaps not stated, so its defaults
    assert all(r.plan.zero_stage == 3 and r.plan.dtype == "float16" and r.overlap is None for r in zero3)
    for r in nar:
        assert (r.plan.dtype, r.plan.grad_accum, r.plan.grad_accum_fusion) == ("float16", "", "off"), r.index
        assert r.overlap == ("dp_grad_reduce" if r.plan.pp == 1 else "none"), r.index
    table = list(csv.DictReader(pe.CSV_PATH.open(encoding="utf-8")))
    fp16 = {i for i, r in enumerate(table) if r["dtype"] == "fp16"}
    assert {i for i, r in rows.items() if r.plan.dtype == "float16"} == fp16 & set(rows)
    assert {rows[i].engine for i in fp16 & set(rows)} == {"megatron-core", "megatron-deepspeed", "metaseq"}  # OPT-175B
    later = [r for r in rows.values() if r.engine == "megatron-core" and r.source != NARAYANAN]
    assert later and all(r.plan.grad_accum_fusion == "" for r in later)
    assert {r.index for r in later if r.overlap == "none"} == {18, 19}  # "not overlapped", as Korthikanti says


def test_opt_175b_is_planned_with_its_checkpoints_split_over_tp(pe) -> None:
    """OPT-175B's launcher (metaseq opt_baselines.py) sets --distribute-checkpointed-activations: each of its 96
    layers' checkpointed inputs is kept as 1/8 per tensor-parallel rank. The row says so (its recompute column) and
    is planned with it; that, not a wider band, is what brings its worst stage under the A100's 80 GiB: whole
    checkpoints (8 micro-batch sequences x 96 layers on every rank) would not fit. (Broken on purpose and seen to
    fail here: ``load_rows`` not reading "checkpoints split over tp" from the recompute column.)"""
    from exatrain.planner.memory_advice import worst_stage

    row = next(r for r in pe.load_rows() if r.name.startswith("OPT-175B"))
    assert row.plan.recompute == "full" and row.plan.distribute_saved_activations
    capacity = row.cluster.device.hbm_bytes
    _, split = worst_stage(row.plan, row.cluster)
    _, whole = worst_stage(row.plan.replace(distribute_saved_activations=False), row.cluster)
    m = row.plan.model
    kept = 2 * m.seq_len * row.plan.micro_batch * m.hidden * m.layers  # fp16 layer inputs, every layer
    assert whole.activations - split.activations == pytest.approx(kept * (1 - 1 / 8))
    assert split.total < 0.8 * capacity < capacity < whole.total


def test_nanotron_rows_accumulate_outside_the_gemms(pe) -> None:
    """nanotron adds each micro-batch's bf16 gradient into its fp32 buffer after the backward (its
    FP32GradientAccumulator), nothing fused into the weight-gradient GEMMs: its rows, planned through Megatron-Core's
    profile, run with --grad-accum-fusion off, whose 10-byte pass a parameter every micro-batch is in their step; the
    Megatron-Core rows of today keep the fusion. (Broken on purpose and seen to fail here: ``_UNFUSED_ACCUM_ENGINES``
    emptied, which plans the nanotron rows fused.)"""
    from exatrain.planner.cost.coefficients import default_params
    from exatrain.planner.plan_cost import step_time
    from tests.helpers.passes import pass_seconds

    assert pe._grad_accum_fusion({"engine": "nanotron", "engine_version": "nanotron v0.5 (2025-02)"}) == "off"
    assert pe._grad_accum_fusion({"engine": "megatron-core", "engine_version": "Megatron-Core r0.8.0 (2024)"}) == ""
    rows = [r for r in pe.load_rows() if r.engine == "nanotron" and r.plan is not None]
    assert len(rows) == 25 and all(r.runtime == "megatron-core" for r in rows)
    assert all(r.plan.grad_accum_fusion == "off" for r in rows)
    r = next(r for r in rows if r.plan.pp == 4)  # the 8.86B on one node: tp 1, pp 4, 128 micro-batches
    params = default_params(r.cluster.device.name)
    off = step_time(r.plan, r.cluster, params)[0]
    fused = step_time(r.plan.replace(grad_accum_fusion=""), r.cluster, params)[0]
    # the busiest stage's 10 bytes a parameter every micro-batch, at the element-wise kernels' bandwidth
    m = r.plan.num_microbatches
    assert off.compute - fused.compute == pytest.approx(pass_seconds(r.plan, r.cluster, 10.0 * m).max(), rel=1e-5)
    assert off.step > fused.step


def test_a_row_that_states_no_overlap_is_priced_at_its_engines_defaults(pe) -> None:
    """A published run whose ``overlap`` column names no switch is priced as a user who leaves --overlap unset plans
    it: its engine's defaults (``overlap_priced(None)``), never its best case; every overlap a row is priced with is
    one its column names (or, for the 2021-22 Megatron-LM papers, the sc21 scripts' DDP). (Broken on purpose and seen
    to fail here: ``_overlap`` returning "all" where nothing is stated.)"""
    from exatrain.planner.cost.overlap import overlap_priced

    table = list(csv.DictReader(pe.CSV_PATH.open(encoding="utf-8")))
    rows = [r for r in pe.load_rows() if r.plan is not None]
    unstated = [r for r in rows if r.overlap is None]
    assert len(unstated) > 200 and {overlap_priced(r.overlap) for r in unstated} == {"default"}
    assert pe._overlap("https://example.org", "megatron-core", "not stated (nanotron's bucketed DDP)") is None
    keys = {c: [k for k, comms in pe.STATED_SWITCHES if c in comms] for _, comms in pe.STATED_SWITCHES for c in comms}
    for r in rows:
        if r.overlap in (None, "none") or r.source in (NARAYANAN, KORTHIKANTI):
            continue
        stated = table[r.index]["overlap"].lower()
        for comm in r.overlap.split(","):
            assert any(k in stated for k in keys[comm]), (r.index, comm)


def test_torchtitan_rows_before_fused_adam_run_foreach(pe) -> None:
    """torchtitan's default Adam was torch's foreach AdamW until fused became the default on 2025-02-24: a row whose
    torchtitan dates (YYYY-MM or a bare year) all predate it is planned with --adam-kernel foreach, later ones and
    every other engine with their own. (Broken on purpose and seen to fail here: a bare year read as January,
    which sends "2025" rows through foreach; the YYYY-MM dates ignored, which keeps the 2024-12 rows fused.)"""
    assert pe._adam_kernel({"engine": "torchtitan", "engine_version": "torchtitan 9dec370 (2024-12-26)"}) == "foreach"
    assert pe._adam_kernel({"engine": "torchtitan", "engine_version": "torchtitan (2024)"}) == "foreach"
    assert pe._adam_kernel({"engine": "torchtitan", "engine_version": "torchtitan (2025)"}) == ""
    assert pe._adam_kernel({"engine": "torchtitan", "engine_version": "torchtitan 820504e, torch (2025-06)"}) == ""
    assert pe._adam_kernel({"engine": "torchtitan", "engine_version": "torchtitan e7c0cae (NGC 25.05)"}) == ""
    assert pe._adam_kernel({"engine": "megatron-core", "engine_version": "Megatron-LM 2021"}) == ""
    rows = [r for r in pe.load_rows() if r.plan is not None and r.engine == "torchtitan"]
    foreach = {r.index for r in rows if r.plan.adam_kernel == "foreach"}
    assert foreach and foreach == {r.index for r in rows if "Adam foreach" in " ".join(r.notes)}
    assert {r.plan.adam_kernel for r in rows} == {"foreach", ""}


def test_kinds_of_run_partition_the_priced_rows(pe, base) -> None:
    """The per-kind summary the docs quote counts every out-of-sample row exactly once: dense rows
    apart by FP8 GEMMs, MoE and long-context by the table's kind column."""
    rows, table = base
    kinds = table["kinds"]
    assert set(kinds) == set(pe.KINDS)
    assert sum(k["n"] for k in kinds.values()) == table["cells"]["all/all"]["step"]["n"] > 0
    fp8 = [r for r in rows if r.plan is not None and r.kind == "dense" and r.plan.fp8]
    assert fp8 and all(pe.kind_of(r) == "dense FP8" for r in fp8)
    assert kinds["dense FP8"]["n"] == sum(r.oos_s is not None for r in fp8)
    assert (
        kinds["dense bf16/fp16"]["n"]
        == sum(r.oos_s is not None and r.kind == "dense" and not r.plan.fp8 for r in rows if r.plan is not None)
        > 0
    )


@pytest.fixture(scope="module")
def full(pe):
    return pe.run()


def test_bands_hold_what_they_claim_on_sources_they_never_saw(pe, full) -> None:
    """Each run's band is fitted on the other sources' runs only (nested leave one source out): at least 70% of
    runs, and of the average source's runs, fall inside their p10-p90, and so do the runs planned through another
    engine's profile.
    Broken on purpose: a band computed from one cell only (megatron-core on A100, the other sources' p10-p90,
    ``one_cell_bands``: how the band was made before it was pooled) holds far fewer than 70%, and this test's
    coverage assert fails with it."""
    rows, t = full
    b = t["cells"]["all/all"]["band"]
    assert b["n"] >= 150 and b["coverage"] >= 0.70 and b["coverage_by_source"] >= 0.70
    banded = [r for r in rows if r.band is not None]
    assert len(banded) == b["n"]
    # runs planned through another engine's profile (fms-fsdp, nanotron, metaseq) are covered as the others are: their
    # band widens by the spread the other sources show for such runs (band.py's "proxy" scale), however small
    proxied = [r for r in banded if r.runtime != r.engine and r.oos_s is not None]
    assert len(proxied) >= 20 and pe.band_stats(proxied)["coverage"] >= 0.70
    saved = {r.index: r.band for r in rows}
    try:
        pe.one_cell_bands(rows)
        bad = pe.band_stats([r for r in rows if r.band is not None and r.oos_s is not None])
        assert bad["n"] >= 150 and bad["coverage"] < 0.70
    finally:
        for r in rows:
            r.band = saved[r.index]


def test_rank_correlation_among_layouts_of_one_model(pe, full) -> None:
    """Spearman's rho: 1 for the same order, -1 reversed, ties averaged; the table groups multi-layout sweeps of
    one model and reports them per family."""
    assert pe.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert pe.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert pe.spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)
    _, t = full
    sweeps = t["rank"]["sweeps"]
    assert sweeps and all(s["layouts"] >= 3 and -1.0 <= s["spearman"] <= 1.0 for s in sweeps)
    assert t["rank"]["families"]["all"]["sweeps"] == len(sweeps)
    # at one GPU count each (what a search ranks): every such sweep's runs share their GPU count
    rows, _ = full
    fixed = t["rank"]["one_count_sweeps"]
    assert fixed and t["rank"]["one_count"]["all"]["sweeps"] == len(fixed)
    for s in fixed:
        runs = [
            r
            for r in rows
            if r.oos_s is not None
            and r.plan is not None
            and r.source == s["source"]
            and r.family == s["family"]
            and r.name.split(" (")[0] + f" seq {r.plan.model.seq_len}" == s["model"]
        ]
        assert sum(r.plan.gpus == s["gpus"] for r in runs) == s["layouts"] >= 3
    # llm-foundry's sweeps vary the GPU count, one or two runs a count: none is a sweep at one count
    assert not any("llm-foundry" in s["source"] for s in fixed)
    # what a search and a scaling study live on, held out of sample: a median rho of 0.85 over the sweeps (0.77 at any
    # GPU count until a step waited for its slowest GPU, planner/cost/variability.py) and most pairs ordered right
    assert t["rank"]["families"]["all"]["median"] >= 0.85 and t["rank"]["one_count"]["all"]["median"] >= 0.85
    assert t["rank"]["pairs"]["all"]["pairs"] >= 150 and t["rank"]["pairs"]["all"]["ordered"] >= 0.8


def test_published_blocking_runs_are_predicted_with_the_other_sources_fit(pe, full) -> None:
    """BLOOM-176B's training and BigScience's topology sweep set CUDA_LAUNCH_BLOCKING=1 (their overlap field): the
    shipped blocking_launch_s is the fit on both (--fit-launch-blocking), and each source's rows are predicted with
    the factor fitted to the other's alone. Broken on purpose: blocking_out_of_sample fitting every blocking row
    (its own source's too) gives the sweep the shipped factor, and the sweep's assert fails."""
    from exatrain.planner.cost.coefficients import default_params

    assert pe._launch_blocking({"overlap": "none: CUDA_LAUNCH_BLOCKING=1 (the slurm script)"})
    assert not pe._launch_blocking({"overlap": "overlap_grad_reduce"})
    rows, _ = full
    blocking = pe.blocking_rows(rows)
    assert {r.source for r in blocking} == set(pe.BLOCKING_CHOSEN_ON) and len(blocking) >= 50
    assert default_params("a100-80gb").blocking_launch_s == pytest.approx(pe.fit_launch_blocking(blocking), rel=2e-3)
    bloom, sweep = ([r for r in blocking if r.source == s] for s in pe.BLOCKING_CHOSEN_ON)
    assert len(bloom) == 1 and all(r.in_sample and "1 other source" in r.oos_how for r in bloom + sweep)
    x = pe.fit_launch_blocking(bloom)
    assert [r.oos_s for r in sweep] == pytest.approx(
        [pe._predict_s(r, pe._blocking_params(r, x)) for r in sweep], rel=1e-9
    )
    assert x != pytest.approx(default_params("a100-80gb").blocking_launch_s, rel=0.05)


def test_b200_takes_the_hopper_fp8_speedup_refitted_without_its_own_source(pe, full) -> None:
    """The B200 prior runs FP8 GEMMs at the 700 W Hopper parts' fitted speed-up over bf16, not the data sheet's 2x;
    a B200 row of a source that fit saw (the Megatron-Bridge pages) is predicted with the speed-up refitted on the
    Hopper runs of the other sources, and counts as in-sample for the shipped prior. Broken on purpose: with the
    B200 prior's fp8_speedup left at None (the data sheet's ratio) the first assert fails; with BORROWS emptied the
    B200 rows read "shipped prior (never saw this source)" and the in-sample assert fails."""
    from exatrain.planner.cost.coefficients import default_params

    assert default_params("b200").fp8_speedup == default_params("h100-sxm").fp8_speedup < 2.0
    rows, _ = full  # priced and predicted out of sample (prediction_error.run)
    b200 = [r for r in rows if r.cluster.device.name == "b200" and r.oos_s is not None]
    assert len(b200) >= 4 and all(r.in_sample and r.oos_how.startswith("fp8_speedup of h100-sxm refit") for r in b200)
    speedups: dict[str, float] = {}  # the refit without each source, once a source
    for r in b200:
        assert r.source in pe.PRIOR_CHOSEN_ON["h100-sxm"]
        if r.source not in speedups:
            train = [
                t
                for t in rows
                if t.prior_s is not None
                and t.measured_s
                and t.runtime == t.engine
                and pe.fit_group(t.cluster.device.name) == "h100-sxm"
                and t.source != r.source
            ]
            factors, start = pe.refit_spec("h100-sxm")
            speedups[r.source] = pe.fit_without(train, start, factors=factors).fp8_speedup
        speedup = speedups[r.source]
        assert speedup != pytest.approx(default_params("h100-sxm").fp8_speedup, rel=1e-4)
        assert r.oos_s == pytest.approx(pe._predict_s(r, default_params("b200").replace(fp8_speedup=speedup)), rel=1e-9)


def test_a_samples_per_second_figure_is_the_global_batch_over_it(pe) -> None:
    """A source's samples/s (the whole job's) becomes global batch / samples/s, before any TFLOPS it also prints."""
    from exatrain.catalog import get_model

    row = {
        "throughput": "2.686; 74.90",
        "throughput_unit": "samples/s; TFLOPS/GCD",
        "n_gpus": "8",
        "global_batch": "1024",
        "recompute": "full",
    }
    assert pe._measured_step_s(row, get_model("gpt-1.3b"), None) == (pytest.approx(1024 / 2.686), "samples/s")


def test_memory_bands_never_see_their_source_and_trained_runs_get_a_verdict(pe, full) -> None:
    """Each measured peak's memory band is fitted on the other sources' measured peaks only (moving one source's
    figures leaves its own bands and predictions alone); every run that trained gets the verdict of its predicted worst
    stage against its device with that band, and the summary counts them: "does not fit" among runs that trained is a
    miss (the figure prediction_error.py prints, target 0). Broken on purpose: the verdict from the point prediction
    alone (capacity against the prediction, no band) calls no run tight, and the tight-count assert fails."""
    import dataclasses

    from exatrain.planner import memory_band as memband

    rows, t = full
    m = t["memory"]
    items = pe.memory_items(rows)
    assert m["n"] == len(items) >= 20 and m["sources"] >= 4 and m["band"]["n"] == m["n"]
    # moving one source's measured peaks moves the others' bands, never its own
    src = next(r.source for r, _ in items if "lumi-llm-scaling" in r.source)
    moved = [
        (dataclasses.replace(r, memory_gib=r.memory_gib * (1.5 if r.source == src else 1.0)), tr) for r, tr in items
    ]
    same, other = pe._memory_fit(items, src), pe._memory_fit(moved, src)
    assert same["center"] == other["center"] and same["quantiles"] == other["quantiles"]
    fit_all, fit_moved = pe._memory_fit(items, None), pe._memory_fit(moved, None)
    assert (fit_all["quantiles"], fit_all["sigma"]) != (fit_moved["quantiles"], fit_moved["sigma"])
    # the verdicts, recounted here
    trained = [r for r in rows if r.trained and r.plan is not None and r.memory_band is not None and not r.not_priced]
    assert len(trained) == m["trained"] >= 150
    recount = {v: 0 for v in memband.VERDICTS}
    for r in trained:
        v = memband.verdict(r.memory_full_gib, r.cluster.device.hbm_bytes / pe.GIB, *r.memory_band, allowance=0.05)
        assert v == r.verdict
        recount[v] += 1
    assert recount == m["verdicts"] and recount["tight"] > 0
    assert sorted(x["index"] for x in m["misses"]) == sorted(r.index for r in trained if r.verdict != "fits")
    point_only = sum(r.memory_full_gib * pe.GIB > r.cluster.device.hbm_bytes for r in trained)
    assert point_only <= recount["does not fit"] + recount["tight"]


@pytest.fixture(scope="module")
def memory_rows(pe):
    """The rows that state a measured peak memory, priced (their memory needs no cost fit)."""
    rows = [r for r in pe.load_rows() if r.memory_gib is not None]
    pe.price(rows)
    return rows


def test_a_row_stating_allocated_and_reserved_gives_both_figures(pe, memory_rows) -> None:
    """Megatron's memory line prints torch's max allocated and max reserved: a row holding both is two measured peaks
    of its source, the allocated one against the prediction without the allocator allowance, the reserved one
    against the whole prediction; a row stating one kind gives one. (Broken on purpose and seen to fail here: the
    reserved figure compared without the allowance; ``memory_figures`` dropping the reserved figures.)"""
    figs = pe.memory_figures(memory_rows)
    both = [r for r in memory_rows if r.memory_reserved_gib is not None]
    assert len(both) == 6 and all(r.memory_allocated for r in both)  # Frontier's run and LUMI's five
    assert len(figs) == len(memory_rows) + len(both)
    frontier = [f for f in figs if f.index == 56]
    assert [f.memory_gib for f in frontier] == [33.107, pytest.approx(37814 / 1024)]
    alloc, resv = frontier
    assert (alloc.memory_allocated, resv.memory_allocated) == (True, False) and alloc.source == resv.source
    assert resv.memory_pred_gib == alloc.memory_full_gib == pytest.approx(alloc.memory_pred_gib * 1.05)


def test_the_memory_band_is_symmetric_and_its_width_the_out_of_source_spread(pe, memory_rows) -> None:
    """The band is center -+ q x scale, q the 80% quantile of the absolute residuals standardized out of their own
    source (a source whose peaks land below the others' by as much as another lands above widens it on both sides
    alike), and leaving a source out its own figures never enter it. (Broken on purpose and seen to fail here: the
    quantiles of the signed residuals, p10 and p90, as before 2026-12-08: not symmetric.)"""
    items = pe.memory_items(memory_rows)
    fit = pe._memory_fit(items, None)
    lo, hi = fit["quantiles"]
    assert lo == -hi and hi > 0
    src = next(r.source for r, _ in items if "lumi-llm-scaling" in r.source)
    # every figure of a held-out source is judged by a band its figures never entered
    held = pe._memory_fit([(r, tr) for r, tr in items if r.source != src], None)
    assert held["quantiles"] == pe._memory_fit(items, src)["quantiles"]


def test_the_trainers_measured_peaks_join_the_memory_rows(pe, tmp_path) -> None:
    """A RunRecord that measured device memory (torch's max allocated) becomes a memory row of runtime exatrain,
    predicted without the allocator allowance; CPU runs (a process's RSS) and failed runs are skipped."""
    from exatrain.accounting.engines import get_engine
    from exatrain.plan import Measured, RunRecord
    from exatrain.records import append_run_record
    from exatrain.planner.estimate import estimate_plan
    from exatrain import api

    plan = api.estimate(model="gpt-1.3b", cluster="dgx-h200", gpus=1, micro_batch=4, global_batch=8)
    runs = tmp_path / "runs.jsonl"
    peak = 40 * 2**30
    for device, status in (("NVIDIA H200", "ok"), ("cpu", "ok"), ("NVIDIA H200", "oom")):
        append_run_record(
            runs,
            RunRecord(
                plan=plan,
                measured=Measured(steps=4, step_time_s=0.3, tokens_per_s=1.0, peak_memory_bytes=peak),
                status=status,
                device=device,
            ),
        )
    got = pe.record_rows([runs], 1000)
    assert len(got) == 1 and got[0].runtime == "exatrain" and got[0].memory_gib == 40.0 and got[0].trained
    pe.price(got)
    worst = estimate_plan(plan, got[0].cluster).memory_bytes.total
    assert got[0].memory_pred_gib == pytest.approx(worst / (1 + get_engine("exatrain").allocator_allowance) / 2**30)
    assert got[0].measured_s is None  # memory only: the trainer's step time is not a published run's


def test_catalog_best_published_mfu_is_the_best_measured_run_of_its_class_and_flags_above_it(pe, full) -> None:
    """catalog/data/studies.toml ``[[mfu]]`` holds, per hardware family and precision, the highest MFU a held run
    measured (model FLOPs over the dense peak, as estimate states MFU): each entry equals the table's best of its
    class, names that run, and covers every device of the family; every prediction above its class's entry carries
    the estimate's flag naming it, and none below does. Broken on purpose: with the 16-bit A100 entry raised to
    0.99 the first assert failed; with the flag's comparison reversed the last."""
    from exatrain.catalog.studies import best_mfu_for, best_published_mfu
    from exatrain.planner.band import FAMILIES

    rows, _ = full
    best = pe.best_measured_mfu(rows)
    assert len(best_published_mfu()) == len(best)
    for (family, precision), (mfu, row) in best.items():
        devices = [d for d, f in FAMILIES.items() if f == family]
        for d in devices:
            entry = best_mfu_for(d, precision == "fp8")
            assert entry is not None and entry.mfu == pytest.approx(mfu, abs=5e-4), (family, precision)
            assert entry.run == row.name
    for r in rows:
        if r.predicted_mfu is None:
            continue
        entry = best_mfu_for(r.cluster.device.name, bool(r.plan.fp8))
        above = entry is not None and r.predicted_mfu > entry.mfu
        assert bool(r.mfu_flag) == above, r.name
        if above:
            assert entry.run in r.mfu_flag and f"{entry.mfu:.1%}" in r.mfu_flag


def test_signed_bias_per_source_engine_and_hardware_and_the_shipped_shrinkage(pe, full) -> None:
    """The per-source table splits each source by engine and hardware (the runs add up to the priced ones, each
    signed median its cell's own), and the catalog's calibration shrinkage is what ``--write-bands`` estimates from
    these runs (each out of sample), never from a row's in-sample prior."""
    from exatrain.planner.cost import shrinkage

    rows, t = full
    cells = t["sources"]
    assert sum(c["n"] for c in cells) == t["cells"]["all/all"]["step"]["n"]
    assert len({(c["source"], c["engine"], c["family"]) for c in cells}) == len(cells)
    narayanan = {c["engine"]: c for c in cells if c["source"] == NARAYANAN}
    assert set(narayanan) == {"megatron-core", "megatron-deepspeed"}  # one source, two engines: two rows
    zero3 = [r.oos_s / r.measured_s - 1 for r in rows if r.source == NARAYANAN and r.engine == "megatron-deepspeed"]
    assert narayanan["megatron-deepspeed"]["signed"] == pytest.approx(float(np.median(zero3)))
    assert "| source | engine | hardware |" in pe.source_markdown(t)
    got = shrinkage.estimate(pe.log_ratios_by_source(rows))
    shipped = json.loads(shrinkage.SHRINKAGE_PATH.read_text(encoding="utf-8"))
    assert (shipped["runs"], shipped["sources"]) == (got.runs, got.sources)
    assert shipped["between"] == pytest.approx(got.between, abs=1e-5)
    assert shipped["within"] == pytest.approx(got.within, abs=1e-5)
    # leaving a source out leaves its runs out of the estimate
    held = pe.log_ratios_by_source(rows, without=NARAYANAN)
    assert NARAYANAN not in held and sum(map(len, held.values())) == got.runs - len(
        [r for r in rows if r.source == NARAYANAN and r.oos_s is not None]
    )
    # and the spread of each term of the cost model (a one-run calibration's prior), from the same runs and their
    # shares of each term as the device's prior prices them
    shares = pe.term_shares(rows)
    terms = pe.shrinkage_of(rows, shares).terms
    assert shipped["terms"] == pytest.approx(dict(terms.sigma), abs=1e-5)
    assert shipped["term_within"] == pytest.approx(terms.within, abs=1e-5)
    assert shrinkage.current().terms == terms
    # leaving a source out leaves its runs out of the term spreads too (one_shot.py predicts a group with them)
    held_terms = pe.term_samples(rows, shares, without=NARAYANAN)
    assert NARAYANAN not in held_terms and sum(map(len, held_terms.values())) == sum(map(len, held.values()))
    assert pe.shrinkage_of(rows, shares, without=NARAYANAN).terms != terms
