"""benchmarks/expert_gemm_speed.py without a GPU: import safety, the expert shapes, the cost model's price of
each way of launching the experts' GEMMs, and the whole script on a CPU (--smoke).

Broken on purpose and seen to fail here: fc1 priced one expert width wide for a gated MLP (the shapes test);
the grouped call priced as E calls (the price test: it then equals the per-expert one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from exatrain.accounting.flops import Gemm
from exatrain.catalog import get_cluster, get_model
from exatrain.planner.cost import compute
from exatrain.planner.cost.coefficients import default_params

from tests.helpers.benchmarks import load

egs = load("expert_gemm_speed")
ROOT = Path(__file__).resolve().parents[2]


def test_import_does_not_load_torch() -> None:
    code = (
        "import sys; from tests.helpers.benchmarks import load; m = load('expert_gemm_speed'); "
        "m.parse_args([]); print(sorted(n for n in sys.modules if n == 'torch' or n.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_the_expert_shapes() -> None:
    oss = get_model("gpt-oss-120b")  # gated, experts 2880 wide, hidden 2880
    assert egs.expert_shapes(oss) == (("fc1", 2 * 2880, 2880), ("fc2", 2880, 2880))
    dsv3 = get_model("deepseek-v3")  # 2048-wide experts, hidden 7168
    assert egs.expert_shapes(dsv3) == (("fc1", 4096, 7168), ("fc2", 7168, 2048))


def test_the_price_of_each_launch() -> None:
    c = get_cluster("dgx-h200")
    p = default_params(c.device.name)
    dev = compute.device_for(c, "bfloat16", p, 1)
    kw = dict(rows=128, n=5760, k=2880, experts=16, dtype="bfloat16")
    loop = egs.predicted_s(c, p, how="per_expert", **kw)
    grouped = egs.predicted_s(c, p, how="grouped", **kw)
    assert loop == pytest.approx(16 * float(compute.gemm_time_s(Gemm("e", 128, 5760, 2880, 1), dev)))
    assert grouped == pytest.approx(float(compute.gemm_time_s(Gemm("e", 128, 5760, 2880, 16), dev)))
    # the per-call time is paid once a call: sixteen launches cost more than one
    assert loop - grouped == pytest.approx(15 * p.gemm_overhead_s, rel=1e-6)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rows", "a,b"], "--rows must be integers"),
        (["--rows", "0"], "--rows must be positive"),
        (["--experts", "0"], "must be positive"),
    ],
)
def test_bad_arguments_exit_2(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        egs.parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_smoke_on_cpu(tmp_path, capsys) -> None:
    assert egs.main(["--smoke", "--out", str(tmp_path), "--repeats", "2"]) == 0
    d = json.loads((tmp_path / "expert_gemm_speed.json").read_text())
    assert d["device"] == "cpu" and d["dtype"] == "float32" and d["cases"]
    for case in d["cases"]:
        assert case["per_expert_s"] > 0 and case["per_expert_predicted_s"] > 0 and case["grouped_predicted_s"] > 0
        assert ("grouped_s" in case) != ("grouped_unavailable" in case)
    assert "pred/meas" in capsys.readouterr().out
