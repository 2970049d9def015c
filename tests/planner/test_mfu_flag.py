"""A prediction above the highest MFU ever published for its device class and precision is flagged, naming that
reference (catalog/data/studies.toml ``[[mfu]]``), in the estimate's JSON and its text.

Broken on purpose and seen to fail here: the flag's comparison reversed (``mfu <= best.mfu`` to ``>=``): the
plain A100 estimate was flagged and the fast one not."""

from __future__ import annotations

import json

import pytest

from exatrain import api
from exatrain.catalog import get_cluster
from exatrain.catalog.studies import best_mfu_for, best_published_mfu
from exatrain.cli import main
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.estimate import estimate_plan, mfu_above_published
from exatrain.report.text import make_console, render_estimate

KW = dict(
    model="llama3-8b",
    cluster="dgx-a100",
    gpus=8,
    tp=1,
    pp=1,
    micro_batch=1,
    global_batch=64,
    zero=1,
    recompute="full",
    runtime="megatron-core",
    overlap="default",
)


def test_every_entry_names_its_run_and_source() -> None:
    entries = best_published_mfu()
    assert entries and all(0 < e.mfu < 1 and e.run and e.source and e.devices for e in entries)
    a100 = best_mfu_for("a100-80gb", fp8=False)
    assert a100 is not None and a100.precision == "16-bit"
    assert best_mfu_for("no-such-device", fp8=False) is None


def test_above_the_reference_is_flagged_in_json_and_text(capsys) -> None:
    best = best_mfu_for("a100-80gb", fp8=False)
    assert mfu_above_published("a100-80gb", False, best.mfu - 0.01) is None
    flag = mfu_above_published("a100-80gb", False, best.mfu + 0.01)
    assert flag["mfu"] == best.mfu and best.run in flag["text"] and best.source in flag["text"]
    plan = api.estimate(**KW)
    assert plan.estimate.mfu < best.mfu and plan.estimate.mfu_above_published is None
    # the same plan priced with every GEMM at the data sheet's peak: above any published A100 run
    c = get_cluster("dgx-a100")
    fast = estimate_plan(
        plan, c, default_params("a100-80gb").replace(gemm_eff=1.0, attn_eff=1.0, mem_eff=1.0), overlap="all"
    )
    assert fast.mfu > best.mfu
    d = fast.to_dict()
    assert d["mfu_above_published"]["run"] == best.run
    assert type(fast).from_dict(json.loads(json.dumps(d))).mfu_above_published == d["mfu_above_published"]
    # the text: the flag line appears only where the estimate carries it
    assert main(["estimate", *sum(([f"--{k.replace('_', '-')}", str(v)] for k, v in KW.items()), [])]) == 0
    assert "flag: predicted MFU" not in capsys.readouterr().out
    render_estimate(plan.with_estimate(fast), con=make_console())
    out = " ".join(capsys.readouterr().out.split())
    assert f"flag: predicted MFU {fast.mfu:.1%} is above the highest published" in out and best.run in out


@pytest.mark.parametrize("fp8", [False, True])
def test_fp8_and_16_bit_are_separate_classes(fp8) -> None:
    entry = best_mfu_for("h100-sxm", fp8=fp8)
    assert entry is None or entry.precision == ("fp8" if fp8 else "16-bit")
