"""`exatrain report`: a whole report whose index.html names only files that exist, inputs in every
form the CLI writes, and bad input refused in one line with exit 2 and nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from tests.helpers.report_helpers import assert_png_drawn, write_json

from exatrain.cli import main

from tests.helpers.cli import run_cli
from tests.report.conftest import GPT_22B


class _Refs(HTMLParser):
    """Every src= and href= of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.refs += [v for k, v in attrs if k in ("src", "href") and v is not None]


def _refs(index: Path) -> list[str]:
    p = _Refs()
    p.feed(index.read_text(encoding="utf-8"))
    return p.refs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, est_22b, search_json, scaling_weak_175b) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    run_cli("estimate", *GPT_22B, "--out", str(d / "plan.json"))
    from exatrain.plan import Measured, RunRecord
    from exatrain.report.inputs import plan_from_json

    rec = RunRecord(
        plan=plan_from_json(est_22b, "t"),
        measured=Measured(steps=5, step_time_s=3.0, tokens_per_s=1.0),
        device="NVIDIA H200",
    ).to_dict()
    steps = [{"kind": "step", "step": i, "loss": 10.0 / i} for i in range(1, 6)]
    (d / "runs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [*steps, rec]))
    return {
        "plan": d / "plan.json",
        "estimate": write_json(d / "estimate.json", est_22b),
        "search": write_json(d / "search.json", search_json),
        "scaling": write_json(d / "scaling.json", scaling_weak_175b),
        "runs": d / "runs.jsonl",
    }


@pytest.fixture(scope="module")
def report(inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("r") / "nested" / "report"
    run_cli(
        "report",
        "--plan",
        str(inputs["plan"]),
        "--search",
        str(inputs["search"]),
        "--scaling",
        str(inputs["scaling"]),
        "--runs",
        str(inputs["runs"]),
        "--out",
        str(out),
    )
    return out


def test_index_references_only_pictures_that_exist(report: Path) -> None:
    refs = _refs(report / "index.html")
    assert refs, "the page shows pictures"
    for ref in refs:
        assert "://" not in ref and not ref.startswith("/"), f"{ref} is not a relative path"
        assert (report / ref).is_file(), f"index.html names missing {ref}"
    pngs = sorted(p.name for p in report.glob("*.png"))
    assert sorted(refs) == pngs  # and every picture written is shown
    assert sorted(p.name for p in report.iterdir()) == sorted(pngs + ["index.html"])  # no staging left
    assert {
        "plan-memory.png",
        "plan-step-time.png",
        "plan-timeline.png",
        "search-landscape.png",
        "search-step-time.png",
        "search-best-memory.png",
        "scaling-scaling.png",
        "scaling-step-time.png",
        "runs-predicted-vs-measured.png",
        "runs-loss.png",
    } == set(pngs)
    for p in pngs:
        assert_png_drawn(report / p)


def test_index_shows_captions_and_key_numbers(report: Path, est_22b: dict) -> None:
    page = (report / "index.html").read_text(encoding="utf-8")
    assert page.count("<figcaption>") == 10
    worst = max(s["total"] for s in est_22b["memory_by_stage"]) / 1024**3
    assert f"{worst:,.1f} GiB" in page  # the worst stage's memory, as the caption states it
    assert "Frontier" in page and "Dash et al." in page


def test_plan_file_and_estimate_json_are_the_same_input(inputs) -> None:
    """`estimate --out` and `estimate --json` give the same plan with the same estimate, so every
    picture drawn from one is drawn from the other."""
    from exatrain.report.inputs import read_plan

    a, b = read_plan(inputs["plan"]).plan, read_plan(inputs["estimate"]).plan
    assert a.estimate is not None and a.estimate.time_s is not None
    assert a == b and a.estimate == b.estimate


def test_a_plan_without_estimate_is_estimated_for_the_given_cluster(inputs, tmp_path: Path) -> None:
    d = json.loads(inputs["plan"].read_text())
    d.pop("estimate")
    d["cluster"] = ""
    bare = write_json(tmp_path / "bare.json", d)
    rc, err = _run("report", "--plan", str(bare), "--out", str(tmp_path / "no"))  # as a user sees it
    assert rc == 2 and err.count("\n") == 1 and "--cluster" in err and "Traceback" not in err
    assert not (tmp_path / "no").exists()
    run_cli("report", "--plan", str(bare), "--cluster", "frontier", "--out", str(tmp_path / "yes"))
    assert (tmp_path / "yes" / "plan-timeline.png").is_file()


# ---- bad input -----------------------------------------------------------------------------------
def _run(*argv: str) -> tuple[int, str]:
    """Exit status and stderr of `exatrain` in a subprocess (exactly what a user sees)."""
    p = subprocess.run([sys.executable, "-m", "exatrain.cli", *argv], capture_output=True, text=True)
    assert not p.stdout.strip(), p.stdout
    return p.returncode, p.stderr


def _run_here(capsys, *argv: str) -> tuple[int, str]:
    """The same through ``exatrain.cli.main`` in this process (no interpreter start per case)."""
    capsys.readouterr()
    rc = main(list(argv))
    got = capsys.readouterr()
    assert not got.out.strip(), got.out
    return rc, got.err


def _bad_inputs(tmp: Path, inputs: dict[str, Path]) -> dict[str, tuple[list[str], str]]:
    (tmp / "notjson.json").write_text("{ this is not json")
    (tmp / "array.json").write_text("[1, 2, 3]")
    (tmp / "binary.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    (tmp / "half.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    return {
        "missing file": (["--plan", str(tmp / "nope.json")], "no such file"),
        "not json": (["--plan", str(tmp / "notjson.json")], "not valid JSON"),
        "json array": (["--plan", str(tmp / "array.json")], "not exatrain JSON for --plan"),
        "search given as plan": (["--plan", str(inputs["search"])], "pass it with --search"),
        "plan given as search": (["--search", str(inputs["plan"])], "pass it with --plan"),
        "scaling given as runs": (["--runs", str(inputs["scaling"])], "pass it with --scaling"),
        "estimate given as scaling": (["--scaling", str(inputs["estimate"])], "pass it with --plan"),
        "binary runs": (["--runs", str(tmp / "binary.jsonl")], "not a text file"),
        "truncated runs line": (["--runs", str(tmp / "half.jsonl")], ":2: not a JSON line"),
        "no input": ([], "give at least one of --plan"),
        "good then bad": (["--plan", str(inputs["plan"]), "--search", str(tmp / "nope.json")], "no such file"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing file",
        "not json",
        "json array",
        "search given as plan",
        "plan given as search",
        "scaling given as runs",
        "estimate given as scaling",
        "binary runs",
        "truncated runs line",
        "no input",
        "good then bad",
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case: str, inputs, tmp_path: Path, capsys) -> None:
    argv, expected = _bad_inputs(tmp_path, inputs)[case]
    out = tmp_path / "out"
    rc, err = _run_here(capsys, "report", *argv, "--out", str(out))
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("exatrain report: error: "), err
    assert expected in err
    assert not out.exists()


def test_unwritable_out_is_one_line_exit_2(inputs, tmp_path: Path, capsys) -> None:
    (tmp_path / "afile").write_text("keep me")
    for out in (tmp_path / "afile", tmp_path / "afile" / "report"):
        rc, err = _run_here(capsys, "report", "--plan", str(inputs["plan"]), "--out", str(out))
        assert rc == 2 and err.count("\n") == 1 and err.startswith("exatrain report: error: "), err
    assert (tmp_path / "afile").read_text() == "keep me"


def test_bad_input_leaves_an_existing_out_folder_as_it_was(inputs, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    assert main(["report", "--plan", str(inputs["plan"]), "--runs", str(inputs["scaling"]), "--out", str(out)]) == 2
    assert [p.name for p in out.iterdir()] == ["old.txt"]


def test_a_failure_while_drawing_removes_what_it_wrote(inputs, tmp_path: Path, monkeypatch) -> None:
    """Nothing half-written even when drawing itself fails (a bug, not bad input): the folder this
    call created is gone again and the error is not swallowed."""
    import exatrain.report.runs as runs_mod

    def boom(*a, **k):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(runs_mod, "loss_curves", boom)
    out = tmp_path / "new" / "report"
    with pytest.raises(RuntimeError, match="drawing failed"):
        main(["report", "--plan", str(inputs["plan"]), "--runs", str(inputs["runs"]), "--out", str(out)])
    assert not (tmp_path / "new").exists()


# ---- --calibration -----------------------------------------------------------------------------
def _calibration(path: Path, device: str, gemm_eff: float, tiers: dict | None = None) -> Path:
    """A calibration file as `exatrain bench` / `exatrain calibrate` write it."""
    from exatrain.catalog.hardware import LinkTier
    from exatrain.planner.cost.coefficients import Calibration, default_params, save_calibration

    cal = Calibration(
        devices={device: default_params(device).replace(gemm_eff=gemm_eff, source="measured")},
        cluster_tiers={k: tuple(LinkTier(**t) for t in v) for k, v in (tiers or {}).items()},
    )
    save_calibration(path, cal)
    return path


def test_report_with_a_calibration_file_draws_the_timeline_with_its_parameters(inputs, tmp_path: Path) -> None:
    """`report --calibration FILE` (the file `estimate --calibration` takes) replaces the cost model's
    priors for the timeline: the plan's stored estimate was made with the priors, so the timeline
    re-simulated with a slower GEMM says the cost model now gives another step time."""
    from exatrain.catalog import get_cluster

    device = get_cluster("frontier").device.name
    cal = _calibration(tmp_path / "cal.json", device, gemm_eff=0.3)
    out = tmp_path / "report"
    printed = run_cli("report", "--plan", str(inputs["plan"]), "--calibration", str(cal), "--out", str(out))
    assert f"uses the calibration file's parameters for {device}" in printed
    assert_png_drawn(out / "plan-timeline.png")
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "the cost model now gives" in page  # the timeline is not the stored (prior) estimate

    # The same report without the file draws the stored estimate: no such note.
    run_cli("report", "--plan", str(inputs["plan"]), "--out", str(tmp_path / "plain"))
    assert "the cost model now gives" not in (tmp_path / "plain" / "index.html").read_text(encoding="utf-8")


def test_calibration_parameters_and_measured_links_reach_the_timeline(inputs, tmp_path: Path) -> None:
    """What the CLI reads (``load_calibration``) is what the timeline is drawn with: the device's
    parameters, and the cluster's link tiers where the file measured them."""
    from exatrain.catalog import get_cluster
    from exatrain.planner.cost.coefficients import load_calibration
    from exatrain.report.build import ReportInputs, prepare_plan
    from exatrain.report.inputs import read_plan

    frontier = get_cluster("frontier")
    tiers = {
        "frontier": [
            {"name": "measured-node", "span": 8, "bytes_per_s": 5e10, "latency_s": 1e-5},
            {"name": "measured-net", "span": 0, "bytes_per_s": 1e10, "latency_s": 2e-5},
        ]
    }
    cal = load_calibration(_calibration(tmp_path / "cal.json", frontier.device.name, 0.4, tiers))
    prepared = prepare_plan(read_plan(inputs["plan"]), ReportInputs(calibration=cal))
    assert prepared.params == cal.params_for(frontier.device.name) and prepared.params.gemm_eff == 0.4
    assert [t.name for t in prepared.cluster.tiers] == ["measured-node", "measured-net"]
    # A file for another device leaves the priors in place and says so.
    other = load_calibration(_calibration(tmp_path / "cpu.json", "cpu", 0.9))
    prepared = prepare_plan(read_plan(inputs["plan"]), ReportInputs(calibration=other))
    assert prepared.params.source != "measured" and prepared.cluster.tiers == frontier.tiers
    assert any("no parameters for" in n for n in prepared.notes)


def test_a_bad_calibration_file_is_one_line_exit_2_and_writes_nothing(inputs, tmp_path: Path) -> None:
    bad = write_json(tmp_path / "bad.json", {"kind": "something else"})
    for path in (bad, tmp_path / "missing.json"):
        out = tmp_path / "out"
        rc, err = _run("report", "--plan", str(inputs["plan"]), "--calibration", str(path), "--out", str(out))
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert not out.exists()
