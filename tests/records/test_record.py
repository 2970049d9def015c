"""`exatrain record` and `exatrain calibrate` on runs made with other engines: the engines' logs read back (excerpts
of real logs, tests/records/logs/, each naming where it was published), a record appended or created, a calibration
fitted from one run and from several, and `estimate --calibration` using it.

Broken on purpose and seen to fail here: the first logged line kept in the median (Megatron-LM's and NeMo's medians
move); torchtitan's tps read as the whole job's (the step time 16x too short); DeepSpeed's MaxMemAllocated read as MB;
a torchtitan log accepted with a Megatron launch (no refusal); record writing the runs file before reading the log
(a refused log leaves a file behind); calibrate grouping by device only (the torchtitan run's scale applied to the
Megatron plan); step_scale not applied in planner.evaluate (the calibrated estimate equals the prior's); the held-out
band fitted on every run including the one it predicts (its ratios all 1); the one-run band left with its centre;
the one-run band's centre taken out whole where the calibration took only its shrinkage weight of the miss; the
report dropping the fit's terms; the one-run fit falling back to step_scale though the shipped file has term spreads.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from exatrain.engine_configs.read_logs import read_log, steady_step_s
from exatrain.planner.cost import shrinkage
from exatrain.planner.cost.coefficients import load_calibration
from exatrain.records import read_run_records

from tests.helpers.cli import refused, run
from tests.launch.test_launch_from import MEGATRON_LM, TORCHTITAN

LOGS = Path(__file__).resolve().parent / "logs"
GIB, MIB = 2.0**30, 2.0**20


def _read(name: str, runtime: str = ""):
    return read_log((LOGS / name).read_bytes(), source=name, runtime=runtime)


# ---- the log readers, on real excerpts --------------------------------------------------------------------------
def test_megatron_lm_log_step_time_and_memory() -> None:
    r = _read("megatron_lm_756.log", "megatron-core")
    assert r.fmt == "megatron" and r.steps == (2, 3, 4) and r.unit == "s"
    assert r.peak_bytes == pytest.approx(54250.98583984375 * MIB) and r.memory_kind == "max allocated"
    # the first logged line (iteration 2) is warm-up: the median of iterations 3 and 4
    step, n = steady_step_s(r, 2, tokens_per_step=1, global_batch=1, gpus=1)
    assert n == 2 and step == pytest.approx((5410.6 + 5364.1) / 2 / 1000)
    r = _read("megatron_llm_11.log", "megatron-deepspeed")  # the same lines from a Megatron-DeepSpeed launch
    step, n = steady_step_s(r, 2, tokens_per_step=1, global_batch=1, gpus=1)
    assert n == 4 and step == pytest.approx(statistics.median([87871.6, 89474.8, 89075.2, 89692.9]) / 1000)
    assert r.peak_bytes is None and r.memory_kind == ""


def test_nemo_log_step_time_and_memory() -> None:
    r = _read("nemo_14850.log", "megatron-core")
    assert r.fmt == "nemo" and r.steps == (8, 9, 10, 11) and r.engine == "NeMo / Megatron-Bridge"
    step, n = steady_step_s(r, 2, tokens_per_step=1, global_batch=1, gpus=1)
    assert n == 3 and step == pytest.approx(26.93)  # median of 27.88, 26.63, 26.93
    assert r.peak_bytes == 53930270720


def test_torchtitan_log_throughput_to_step_time() -> None:
    r = _read("torchtitan_1287.log", "torchtitan")
    assert r.fmt == "torchtitan" and r.steps == (200, 210, 220, 230, 240, 250) and r.unit == "tokens/s/device"
    assert r.values[0] == 5856 and r.peak_bytes == pytest.approx(49.66 * GIB)
    # tokens a second a device: a step of 16 x 8192 tokens on 16 GPUs at the median 5,864 (steps 210-250)
    step, n = steady_step_s(r, 2, tokens_per_step=16 * 8192, global_batch=16, gpus=16)
    assert n == 5 and step == pytest.approx(16 * 8192 / (5864 * 16))


def test_deepspeed_log_samples_to_step_time() -> None:
    r = _read("deepspeed_1825.log", "megatron-deepspeed")
    assert r.fmt == "deepspeed" and r.steps == (40, 50) and r.unit == "samples/s"
    assert r.peak_bytes == pytest.approx(9.02 * GIB)
    step, n = steady_step_s(r, 2, tokens_per_step=1, global_batch=64, gpus=8)
    assert n == 1 and step == pytest.approx(64 / 83.73838805358588)


@pytest.mark.parametrize(
    "data, runtime, message",
    [
        (b"", "", "the log is empty"),
        (b"  \n\n", "", "the log is empty"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00 elapsed time per iteration (ms): 5.0", "", "not a text log (binary data)"),
        (b"hello\nworld\n", "", "no step times in it"),
        (
            (LOGS / "torchtitan_1287.log").read_bytes(),
            "megatron-core",
            "a torchtitan log, but the launch runs megatron-core",
        ),
        ((LOGS / "nemo_14850.log").read_bytes(), "torchtitan", "a NeMo / Megatron-Bridge log, but the launch runs"),
    ],
)
def test_unreadable_or_foreign_logs(data, runtime, message) -> None:
    from exatrain.errors import UserError

    with pytest.raises(UserError, match="x.log: ") as exc:
        read_log(data, source="x.log", runtime=runtime)
    assert message in str(exc.value)


def test_a_log_all_warm_up_is_refused() -> None:
    from exatrain.errors import UserError

    r = _read("megatron_lm_756.log")
    with pytest.raises(UserError, match="none after the warm-up"):
        steady_step_s(r, 4, tokens_per_step=1, global_batch=1, gpus=1, source="m.log")


# ---- record ------------------------------------------------------------------------------------------------------
def _launch(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A runs file made by `record`: a Megatron-LM launch with its log, a torchtitan job with its log (both on
    dgx-h100), created by the first and appended to by the second."""
    tmp = tmp_path_factory.mktemp("record")
    out = tmp / "runs.jsonl"
    import contextlib
    import io

    from exatrain.cli import main

    for argv in (
        [
            "--from",
            _launch(tmp, "train_llama.sh", MEGATRON_LM),
            "--log",
            str(LOGS / "megatron_lm_756.log"),
            "--vocab",
            "128256",
        ],
        [
            "--from",
            _launch(tmp, "llama3_8b.toml", TORCHTITAN),
            "--log",
            str(LOGS / "torchtitan_1287.log"),
            "--gpus",
            "16",
        ],
    ):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert main(["record", *argv, "--cluster", "dgx-h100", "--out", str(out)]) == 0
    return out


def test_record_from_launch_and_log(runs) -> None:
    megatron, titan = read_run_records(runs)
    assert megatron.plan.runtime == "megatron-core" and (megatron.plan.tp, megatron.plan.pp) == (2, 2)
    assert megatron.measured.step_time_s == pytest.approx((5410.6 + 5364.1) / 2 / 1000)
    assert megatron.measured.peak_memory_bytes == pytest.approx(54250.98583984375 * MIB)
    assert megatron.env["overlap"] == "dp_grad_reduce,dp_param_gather,pp_p2p"  # what the launch switches on
    assert megatron.predicted is not None and megatron.predicted.time_s.step > 0
    assert megatron.device == "h100-sxm" and megatron.plan.cluster == "dgx-h100"
    # torchtitan: 16 sequences of 8192 tokens a step on 16 GPUs at 5,864 tokens a second a GPU
    assert titan.plan.runtime == "torchtitan" and titan.plan.global_batch == 16
    assert titan.measured.step_time_s == pytest.approx(16 * 8192 / (5864 * 16))
    assert titan.measured.tokens_per_s == pytest.approx(5864 * 16)


def test_record_plan_creates_then_appends(capsys, tmp_path) -> None:
    plan = tmp_path / "plan.json"
    assert (
        run(
            capsys,
            "estimate",
            "--model",
            "gpt-small",
            "--cluster",
            "dgx-a100",
            "--gpus",
            "8",
            "--tp",
            "2",
            "--global-batch",
            "32",
            "--runtime",
            "megatron-core",
            "--out",
            str(plan),
        )[0]
        == 0
    )
    out = tmp_path / "deep" / "runs.jsonl"
    code, text, err = run(capsys, "record", "--plan", str(plan), "--step-time", "0.25", "--out", str(out))
    assert code == 0, err
    assert "measured 0.250 s a step" in text and f"created {out}" in text
    code, text, err = run(
        capsys,
        "record",
        "--plan",
        str(plan),
        "--step-time",
        "0.3",
        "--peak-memory-gib",
        "20",
        "--out",
        str(out),
        "--json",
    )
    assert code == 0, err
    assert json.loads(text)["created"] is False
    first, second = read_run_records(out)
    assert (first.measured.step_time_s, second.measured.step_time_s) == (0.25, 0.3)
    assert first.measured.peak_memory_bytes is None and second.measured.peak_memory_bytes == 20 * GIB
    assert first.predicted == second.predicted and first.predicted.time_s.step > 0  # the plan's own prediction
    assert first.env["cluster"] == "dgx-a100" and first.env["recorded_by"] == "exatrain record"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--log", "{logs}/megatron_lm_756.log"], "--from and --log go together"),
        (["--plan", "{tmp}/plan.json"], "--plan and --step-time go together"),
        ([], "give --plan PLAN --step-time SECONDS, or --from LAUNCH --log LOG"),
        (
            ["--from", "{tmp}/m.sh", "--log", "{logs}/torchtitan_1287.log", "--vocab", "128256"],
            "torchtitan_1287.log: a torchtitan log, but the launch runs megatron-core",
        ),
        (["--from", "{tmp}/m.sh", "--log", "{tmp}/empty.log", "--vocab", "128256"], "empty.log: the log is empty"),
        (["--from", "{tmp}/m.sh", "--log", "{tmp}/binary.log", "--vocab", "128256"], "binary.log: not a text log"),
        (["--from", "{tmp}/m.sh", "--log", "{tmp}/missing.log", "--vocab", "128256"], "missing.log"),
        (
            ["--from", "{tmp}/m.sh", "--log", "{logs}/megatron_lm_756.log", "--vocab", "128256", "--warmup", "9"],
            "none after the warm-up",
        ),
    ],
)
def test_record_bad_input_is_one_line_and_writes_nothing(argv, message, capsys, tmp_path) -> None:
    (tmp_path / "m.sh").write_text(MEGATRON_LM)
    (tmp_path / "empty.log").write_text("")
    (tmp_path / "binary.log").write_bytes(bytes(range(256)) * 4)
    out = tmp_path / "runs.jsonl"
    args = [a.format(tmp=tmp_path, logs=LOGS) for a in argv]
    assert message in refused(capsys, "record", *args, "--cluster", "dgx-h100", "--out", str(out))
    assert not out.exists()


def test_record_refuses_to_append_to_what_is_not_a_runs_file(capsys, tmp_path) -> None:
    out = tmp_path / "notes.txt"
    out.write_text("my notes\n")
    assert "not a JSON line" in refused(
        capsys,
        "record",
        "--from",
        _launch(tmp_path, "m.sh", MEGATRON_LM),
        "--log",
        str(LOGS / "megatron_lm_756.log"),
        "--vocab",
        "128256",
        "--cluster",
        "dgx-h100",
        "--out",
        str(out),
    )
    assert out.read_text() == "my notes\n"


# ---- calibrate from other engines' runs, and estimate with it ---------------------------------------------------
def test_one_run_fits_one_factor_per_cluster_and_engine(runs, capsys, tmp_path) -> None:
    from exatrain.catalog import get_cluster
    from exatrain.planner.plan_cost import step_time

    cal = tmp_path / "calib.json"
    code, text, err = run(capsys, "calibrate", str(runs), "--out", str(cal), "--json")
    assert code == 0, err
    fits = json.loads(text)["fits"]
    assert set(fits) == {"dgx-h100/megatron-core", "dgx-h100/torchtitan"}
    megatron, titan = read_run_records(runs)
    c = load_calibration(cal)
    prior = shrinkage.current().terms
    for rec in (megatron, titan):
        rep = fits[f"dgx-h100/{rec.plan.runtime}"]
        assert rep["runs"] == 1 and rep["band"] is None
        p = c.params_for("h100-sxm", "dgx-h100", rec.plan.runtime)
        # one term moved: the one whose shipped spread times the run's share of it (priced with the overlaps the
        # record names) is the largest (planner/cost/shrinkage.py), its fields alone; the rest the prior
        g = rep_shares(rec)
        term = shrinkage.TERM_NAMES[int((prior.variances() * g**2).argmax())]
        assert rep["terms"] == [term] and set(rep["factors"]) == set(shrinkage.fields_of(term, rep_params()))
        moved = {k for k, v in p.to_dict().items() if v != rep_params().to_dict()[k]}
        assert moved - {"source", "calibrated_runs"} == set(rep["factors"])
        assert p.step_scale == 1.0 and p.band_runs == 0
        # the share of the run's log miss it took is below the whole
        assert 0 < rep["taken"] < 1
        calibrated = step_time(rec.plan, get_cluster("dgx-h100"), p, rec.env["overlap"])[0].step
        assert calibrated == pytest.approx(
            rep_prediction(rec) * (rec.measured.step_time_s / rep_prediction(rec)) ** rep["taken"], rel=1e-9
        )
    assert c.params_for("h100-sxm") is None  # no device-wide entry: another engine is not calibrated by these

    # estimate with the calibration: the recorded layout lands its shrinkage weight of the way to its measured step
    code, out, err = run(
        capsys,
        "estimate",
        "--from",
        _launch(tmp_path, "m.sh", MEGATRON_LM),
        "--vocab",
        "128256",
        "--cluster",
        "dgx-h100",
        "--calibration",
        str(cal),
        "--json",
    )
    assert code == 0, err
    est = json.loads(out)
    prediction = rep_prediction(megatron)
    taken = fits["dgx-h100/megatron-core"]["taken"]
    expected = prediction * (megatron.measured.step_time_s / prediction) ** taken
    assert est["time_s"]["step"] == pytest.approx(expected, rel=1e-6)
    # one run measures no band: the published-run one holds, its centre (the sources' median bias) taken out
    assert est["band"]["basis"] == "out of sample"
    assert "centred on the prediction calibrated on 1 run" in est["band"]["text"]
    from exatrain.planner.band import load_bands

    centre = math.exp(load_bands()["center"] * shrinkage.taken(1))  # the share of the bias the calibration took
    prior = json.loads(
        run(
            capsys,
            "estimate",
            "--from",
            _launch(tmp_path, "m.sh", MEGATRON_LM),
            "--vocab",
            "128256",
            "--cluster",
            "dgx-h100",
            "--json",
        )[1]
    )
    scale = est["time_s"]["step"] / prior["time_s"]["step"]
    assert est["step_range_s"] == pytest.approx([x * scale / centre for x in prior["step_range_s"]], rel=1e-9)
    # another cluster, or a runtime the file has no fit for, is refused rather than priced with a wrong factor
    line = refused(
        capsys,
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "16",
        "--global-batch",
        "16",
        "--runtime",
        "megatron-deepspeed",
        "--calibration",
        str(cal),
    )
    assert "nor for dgx-h100/megatron-deepspeed (fitted: dgx-h100/megatron-core, dgx-h100/torchtitan)" in line
    for command in ("search", "scaling"):
        gpus = ["--gpus", "16"] if command == "search" else ["--gpus", "16,32"]
        code, out, err = run(
            capsys,
            command,
            "--model",
            "llama3-8b",
            "--cluster",
            "dgx-h100",
            *gpus,
            "--global-batch",
            "16",
            "--runtime",
            "torchtitan",
            "--calibration",
            str(cal),
            "--json",
        )
        assert code == 0, (command, err)


def rep_params():
    from exatrain.planner.cost.coefficients import default_params

    return default_params("h100-sxm")


def rep_shares(rec):
    """The record's share of its step each term of the cost model makes, as calibrate prices it."""
    import numpy as np

    from exatrain.catalog import get_cluster
    from exatrain.planner.plan_cost import step_time

    def predict(q):
        return np.array([step_time(rec.plan, get_cluster("dgx-h100"), q, rec.env["overlap"])[0].step])

    return shrinkage.shares(predict, rep_params())[0]


def rep_prediction(rec) -> float:
    """The record's step time as calibrate prices it: its plan on its cluster with the prior, its overlaps."""
    from exatrain.catalog import get_cluster
    from exatrain.planner.cost.coefficients import default_params
    from exatrain.planner.plan_cost import step_time

    return step_time(rec.plan, get_cluster("dgx-h100"), default_params("h100-sxm"), rec.env["overlap"])[0].step


def test_several_runs_fit_more_factors_and_measure_their_band(capsys, tmp_path) -> None:
    """Five runs of one layout family on dgx-a100, 'measured' 20% slower than the prior with a few percent of
    scatter: gemm_eff and step_overhead_s are fitted, and the band is the held-out ratios' p10-p90."""
    from exatrain.catalog import get_cluster
    from exatrain.planner.cost.coefficients import default_params
    from exatrain.planner.plan_cost import step_time

    a100, prior = get_cluster("dgx-a100"), default_params("a100-80gb")
    plans, out = [], tmp_path / "runs.jsonl"
    for i, (gpus, tp) in enumerate(((8, 1), (8, 2), (16, 2), (32, 4), (64, 8))):
        plan = tmp_path / f"p{i}.json"
        assert (
            run(
                capsys,
                "estimate",
                "--model",
                "gpt-1.3b",
                "--cluster",
                "dgx-a100",
                "--gpus",
                str(gpus),
                "--tp",
                str(tp),
                "--global-batch",
                "64",
                "--runtime",
                "megatron-core",
                "--out",
                str(plan),
            )[0]
            == 0
        )
        plans.append(plan)
    scatter = (1.0, 1.03, 0.97, 1.02, 0.99)
    from exatrain.api import load_plan

    for plan, s in zip(plans, scatter):
        t = 1.2 * s * step_time(load_plan(plan), a100, prior, "all")[0].step
        assert (
            run(
                capsys, "record", "--plan", str(plan), "--step-time", f"{t:.6f}", "--overlap", "all", "--out", str(out)
            )[0]
            == 0
        )
    cal = tmp_path / "calib.json"
    code, text, err = run(capsys, "calibrate", str(out), "--out", str(cal), "--json")
    assert code == 0, err
    rep = json.loads(text)["fits"]["dgx-a100/megatron-core"]
    assert rep["runs"] == 5 and set(rep["factors"]) == {"gemm_eff", "step_overhead_s"}
    assert rep["after"]["median"] < 0.03 < rep["before"]["median"]
    band = rep["band"]
    assert band["held_out_runs"] == 5 and band["ratio_low"] < 1.0 < band["ratio_high"] < 1.1
    p = load_calibration(cal).params_for("a100-80gb", "dgx-a100", "megatron-core")
    assert (p.band_low, p.band_high, p.band_runs) == (band["ratio_low"], band["ratio_high"], 5)
    # held out, the runs land farther from their predictions than the fit itself leaves them
    import numpy as np

    inside = [r.measured.step_time_s / step_time(r.plan, a100, p, "all")[0].step for r in read_run_records(out)]
    assert band["ratio_low"] < np.percentile(inside, 10) and band["ratio_high"] > np.percentile(inside, 90)
    code, out_text, err = run(
        capsys,
        "estimate",
        "--model",
        "gpt-1.3b",
        "--cluster",
        "dgx-a100",
        "--gpus",
        "16",
        "--tp",
        "2",
        "--global-batch",
        "64",
        "--runtime",
        "megatron-core",
        "--overlap",
        "all",
        "--calibration",
        str(cal),
        "--json",
    )
    assert code == 0, err
    est = json.loads(out_text)
    assert est["band"]["basis"] == "calibrated" and est["band"]["n"] == 5
    assert est["step_range_s"] == pytest.approx(
        [est["time_s"]["step"] * band["ratio_low"], est["time_s"]["step"] * band["ratio_high"]]
    )


def test_a_record_without_stated_overlaps_is_priced_again_at_the_engines_defaults() -> None:
    """`record` stores None where the run states no overlaps (estimate's own default): calibrate and validate price
    it again at the engine's defaults, not at the string "None" (refused) or at every overlap on; a record that
    names none at all (exatrain's own training runs) keeps every overlap on."""
    from exatrain.api.recording import _estimate_default_overlap
    from exatrain.planner.compare import recorded_overlap

    assert _estimate_default_overlap() is None
    assert recorded_overlap({"overlap": None}) is None
    assert recorded_overlap({"overlap": "tp,dp_grad_reduce"}) == "tp,dp_grad_reduce"
    assert recorded_overlap({}) == "all"
