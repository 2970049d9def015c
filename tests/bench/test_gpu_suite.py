"""benchmarks/gpu_suite.py without a GPU: import safety, arguments, plans, the commands it would run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from exatrain.catalog import get_cluster
from exatrain.accounting.trainer_memory import trainer_memory_by_stage
from exatrain.planner.estimate import estimate_plan

from tests.helpers.benchmarks import load

gpu_suite = load("gpu_suite")
ROOT = Path(__file__).resolve().parents[2]


def test_import_does_not_load_torch() -> None:
    code = (
        "import sys; from tests.helpers.benchmarks import load; gpu_suite = load('gpu_suite'); "
        "gpu_suite.plans(); gpu_suite.commands(gpu_suite.parse_args(['--dry-run'])); "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_arguments_and_output_folder(monkeypatch, tmp_path) -> None:
    a = gpu_suite.parse_args([])
    assert a.steps == 8 and a.budget_s < 480 and a.cluster == "dgx-h200" and not a.dry_run
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_suite.out_dir(a) == tmp_path
    assert gpu_suite.out_dir(gpu_suite.parse_args(["--out", "x"])) == Path("x")
    with pytest.raises(SystemExit) as exc:
        gpu_suite.parse_args(["--steps", "2"])
    assert exc.value.code == 2


def test_plans_are_single_gpu_and_fit_an_h200() -> None:
    h200 = get_cluster("dgx-h200")
    plans = gpu_suite.plans()
    assert len(plans) >= 3 and len({p.model.name for _, p in plans}) >= 3
    assert any(p.model.arch == "llama" for _, p in plans) and any(p.recompute == "full" for _, p in plans)
    for run, plan in plans:
        assert plan.gpus == 1 and plan.cluster == "dgx-h200" and plan.dtype == "bfloat16"
        assert estimate_plan(plan, h200).fits, run.name
        # The trainer's own footprint (larger than the planner's reference) must fit too.
        assert max(m.total for m in trainer_memory_by_stage(plan, on_cpu=False)) < 0.95 * h200.device.hbm_bytes


def test_commands_bench_then_estimate_and_train_each_plan(tmp_path, capsys) -> None:
    cmds = gpu_suite.commands(gpu_suite.parse_args(["--out", str(tmp_path)]))
    assert cmds[0][-4:] == ["--device", "cuda", "--out", str(tmp_path / "calib.json")]
    assert len(cmds) == 1 + 2 * len(gpu_suite.RUNS)
    for est, train in zip(cmds[1::2], cmds[2::2]):
        assert "estimate" in est and "--trace" in est and "--calibration" in est
        assert "train" in train and "--device" in train and train[train.index("--device") + 1] == "cuda"
        assert est[est.index("--out") + 1] == train[train.index("--plan") + 1]
    no_bench = gpu_suite.commands(gpu_suite.parse_args(["--no-bench", "--out", str(tmp_path)]))
    assert all("bench" not in c and "--calibration" not in c for c in no_bench)
    assert gpu_suite.main(["--dry-run", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("\n") == len(cmds) + 1  # and the experts' GEMMs, last
    last = gpu_suite.expert_gemm_command(gpu_suite.parse_args(["--out", str(tmp_path)]))
    assert last[1].endswith("expert_gemm_speed.py") and last[-2:] == ["--calibration", str(tmp_path / "calib.json")]
    assert "--calibration" not in gpu_suite.expert_gemm_command(gpu_suite.parse_args(["--no-bench"]))


# ---- benchmarks/gpu_speed.py: the side-by-side single-GPU speed script ------------------------------
def _gpu_speed():
    return load("gpu_speed")


def test_gpu_speed_mfu_formula_and_largest_model() -> None:
    from exatrain.catalog import get_cluster, get_model, model_presets
    from exatrain.plan import ParallelDims, Plan, TrainShape
    from exatrain.planner.estimate import estimate_plan

    gs = _gpu_speed()
    m = get_model("gpt-1.3b")  # 24 layers, h 2048, s 2048, V 50304
    flops = 72 * 8 * 2048 * 24 * 2048**2 * (1 + 2048 / (6 * 2048) + 50304 / (12 * 2048 * 24))
    assert gs.mfu(m, 8, 1.0, 989.4e12) == pytest.approx(flops / 989.4e12, rel=1e-12)
    big = gs.largest_fitting_gpt("dgx-h200")
    c = get_cluster("dgx-h200")

    def fits(model) -> bool:
        plan = Plan(
            model=model,
            dims=ParallelDims(1, 1, 1),
            shape=TrainShape(1, 1),
            recompute="full",
            dtype="bfloat16",
            cluster=c.name,
        ).validate(c)
        return estimate_plan(plan, c).trainer_fits

    assert big is not None and fits(big)
    larger = [
        p for p in model_presets().values() if p.arch == "gpt" and p.layers * p.hidden**2 > big.layers * big.hidden**2
    ]
    assert larger and not any(fits(p) for p in larger)


def test_gpu_speed_smoke_on_cpu(tmp_path, capsys) -> None:
    """The whole script on a CPU with gpt-tiny: the baseline has exatrain's parameter count (else exit
    1), both sides run, and the table and JSON have their rows."""
    gs = _gpu_speed()
    assert gs.main(["--smoke", "--out", str(tmp_path)]) == 0
    d = json.loads((tmp_path / "gpu_speed.json").read_text())
    assert [r["run"] for r in d["rows"]] == ["baseline (eager)", "exatrain eager"]
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] for r in d["rows"])
    assert "vs base" in capsys.readouterr().out
