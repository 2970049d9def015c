"""docs/json.md against what the commands print with --json: every key each command prints is on the page, and every
key on the page is printed by one of the runs here (a key marked "optional" on the page: named in the source), so a
key added or removed without the page fails; every output starts with ``format_version``.

The runs are the commands themselves through ``exatrain.cli.main``: estimate (a CPU plan, a 128-GPU plan with a token
budget, a mixture-of-experts plan with expert and context parallelism), search with --explain, scaling, validate and
calibrate over records written here, models, hardware; bench and tune with their measuring replaced by a result built
here (their --json object is still the real ``to_dict`` through the real command).

Broken on purpose and seen to fail here: a key added to StepEstimate.to_dict (undocumented key); a row removed from
the page (undocumented key); a row added to the page that no command prints (stale row); ``show`` without
``versioned`` (no format_version); a section link renamed (unknown section).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from exatrain.jsonio import JSON_FORMAT_VERSION
from exatrain.settings import NAMES
from exatrain.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "json.md"
SETTING_ROW = "<run setting>"  # the plan's row standing for every run setting not at its default (settings.NAMES)


# ---- the page --------------------------------------------------------------------------------------------------
def read_page(text: str) -> dict[str, dict[str, str]]:
    """{section anchor: {key: type}} from the page's tables: a section is a heading ``## ... {#anchor}`` or a heading
    whose first code span names it (``## `estimate --json` ``: anchor "estimate"); a row is ``| `key` | type | ...``;
    a line "The keys of [x](#x), and:" gives the section x's rows too."""
    sections: dict[str, dict[str, str]] = {}
    includes: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"The keys of \[[^]]*\]\(#([\w-]+)\)", line)
        if m and current is not None:
            includes[current] = m.group(1)
        if line.startswith("#"):
            m = re.search(r"\{#([\w-]+)\}", line) or re.search(r"`([\w-]+)", line)
            current = m.group(1) if m else None
            if current is not None:
                sections.setdefault(current, {})
            continue
        m = re.match(r"\|\s*`([^`]+)`\s*\|\s*([^|]*)\|(.*)", line)
        if m and current is not None:  # the type, and "optional" where the meaning says so
            sections[current][m.group(1)] = m.group(2).strip() + (" optional" if "*optional*" in m.group(3) else "")
    for section, base in includes.items():
        sections[section] = {**sections.get(base, {}), **sections[section]}
    return sections


def target(kind: str) -> str | None:
    """The section a row's type points to (``object: [name](#name)``, ``list of [name](#name)``), else None."""
    m = re.search(r"\(#([\w-]+)\)", kind)
    return m.group(1) if m else None


def check(
    value: Any,
    section: str,
    page: dict[str, dict[str, str]],
    where: str,
    seen: set[tuple[str, str]],
    problems: list[str],
) -> None:
    """Walk ``value`` (an object the page's ``section`` describes): each key on the page, sub-objects in the
    section their row points to; a row of type ``map`` (keys that are data) is not walked into."""
    if section not in page:
        problems.append(f"{where}: the page has no section #{section}")
        return
    rows = page[section]
    if not isinstance(value, dict):
        problems.append(f"{where}: expected an object for #{section}, got {type(value).__name__}")
        return
    for key, sub in value.items():
        row = key if key in rows else SETTING_ROW if key in NAMES and SETTING_ROW in rows else None
        if row is None:
            problems.append(f"{where}.{key}: not on docs/json.md (section #{section})")
            continue
        seen.add((section, row))
        to = target(rows[row])
        if to is None or sub is None:
            continue
        if rows[row].startswith("map of"):  # each value is one (or a list of them)
            items = [
                (f".{k}" + (f"[{i}]" if isinstance(v, list) else ""), x)
                for k, v in sub.items()
                for i, x in enumerate(v if isinstance(v, list) else [v])
            ]
        else:
            items = [(f"[{i}]", x) for i, x in enumerate(sub)] if isinstance(sub, list) else [("", sub)]
        for suffix, item in items:
            if item is not None:
                check(item, to, page, f"{where}.{key}{suffix}", seen, problems)


# ---- the runs --------------------------------------------------------------------------------------------------
def _records(tmp: Path) -> Path:
    """Three RunRecords of gpt-tiny layouts on the CPU, each with its prediction and a measured step time 20-40%
    slower (the calibration has something to fit)."""
    from exatrain.api import make_plan
    from exatrain.catalog import get_cluster
    from exatrain.plan import Measured, RunRecord
    from exatrain.planner.estimate import estimate_plan
    from exatrain.records import append_run_record

    cluster, path = get_cluster("local-cpu"), tmp / "runs.jsonl"
    for i, (tp, dp) in enumerate(((1, 2), (2, 1), (1, 4))):
        plan = make_plan(model="gpt-tiny", cluster="local-cpu", gpus=tp * dp, tp=tp, global_batch=8, dtype="float32")
        est = estimate_plan(plan, cluster)
        t = est.time_s.step * (1.2 + 0.1 * i)
        append_run_record(
            path,
            RunRecord(
                plan=plan.with_estimate(est),
                device="cpu",
                measured=Measured(steps=5, step_time_s=t, tokens_per_s=plan.tokens_per_step / t, peak_memory_bytes=3e8),
            ),
        )
    return path


def _fake_bench(**_: Any):
    from exatrain.bench.machine import BenchResult
    from exatrain.catalog.hardware import LinkTier
    from exatrain.planner.cost.coefficients import Calibration, default_params

    tier = LinkTier(name="local", span=0, bytes_per_s=1e9, latency_s=2e-5)
    return BenchResult(
        calibration=Calibration(devices={"cpu": default_params("cpu")}, cluster_tiers={"local-cpu": (tier,)}),
        device="cpu",
        dtype="float32",
        ranks=2,
        threads_per_rank=1,
        seconds=1.0,
    )


def _fake_tune():
    from exatrain.api import make_plan
    from exatrain.tuning.study import TrialView, TuneResult

    plan = make_plan(model="gpt-tiny", cluster="local-cpu", gpus=2, global_batch=8, dtype="float32")
    trials = (
        TrialView(
            number=0,
            plan=plan,
            status="ok",
            predicted_tokens_per_s=900.0,
            measured_tokens_per_s=800.0,
            source="seed",
            duration_s=12.0,
        ),
        TrialView(
            number=1,
            plan=plan.replace(dims=plan.dims.__class__(tp=2, pp=1, dp=1)),
            status="failed",
            predicted_tokens_per_s=700.0,
            measured_tokens_per_s=None,
            error="rank 1 died",
            source="sampler",
        ),
    )
    return TuneResult(
        study_name="gpt-tiny_2xlocal-cpu",
        trials=trials,
        best=trials[0],
        stopped="trials reached",
        ran=2,
        finished=2,
        candidates=4,
        storage="sqlite:///tune.db",
        runs_file="tune.runs.jsonl",
        trials_dir="tune.trials",
        best_file="tune.best.json",
    )


RUNS: tuple[tuple[str, str, tuple[str, ...]], ...] = (  # (name, the page's section of its object, argv)
    ("models", "models", ("models", "--json")),
    ("hardware", "hardware", ("hardware", "--json")),
    (
        "estimate cpu",
        "estimate",
        ("estimate", "--model", "gpt-small", "--cluster", "local-cpu", "--gpus", "2", "--json"),
    ),
    (
        "estimate 175b",
        "estimate",
        (
            "estimate",
            "--model",
            "gpt-175b",
            "--cluster",
            "frontier",
            "--gpus",
            "128",
            "--tp",
            "4",
            "--pp",
            "16",
            "--global-batch",
            "640",
            "--recompute",
            "full",
            "--tokens",
            "300B",
            "--json",
        ),
    ),
    (
        "estimate moe",
        "estimate",
        (
            "estimate",
            "--model",
            "moe-tiny",
            "--cluster",
            "dgx-h100",
            "--gpus",
            "16",
            "--ep",
            "2",
            "--cp",
            "2",
            "--global-batch",
            "16",
            "--fp8",
            "current",
            "--json",
        ),
    ),
    (
        "estimate offload",
        "estimate",
        (
            "estimate",
            "--model",
            "llama3-8b",
            "--cluster",
            "dgx-h100",
            "--gpus",
            "8",
            "--zero",
            "1",
            "--global-batch",
            "16",
            "--runtime",
            "megatron-deepspeed",
            "--offload",
            "optimizer",
            "--json",
        ),
    ),
    (
        "search",
        "search",
        (
            "search",
            "--model",
            "gpt-tiny",
            "--cluster",
            "local-cpu",
            "--gpus",
            "4",
            "--global-batch",
            "8",
            "--top",
            "3",
            "--explain",
            "--json",
        ),
    ),
    (
        "scaling",
        "scaling",
        ("scaling", "--model", "gpt-small", "--cluster", "local-cpu", "--gpus", "2,4", "--global-batch", "8", "--json"),
    ),
)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, tuple[str, Any]]:
    """{run name: (section, the parsed --json output)} of every run (module-scoped: one pass for all the checks)."""
    import exatrain.bench.machine as machine
    import exatrain.cli.tune_cmds as tune_cmds

    tmp = tmp_path_factory.mktemp("json")
    runs = _records(tmp)
    argvs = [
        *RUNS,
        ("validate", "validate", ("validate", str(runs), "--json")),
        ("calibrate", "calibrate", ("calibrate", str(runs), "--out", str(tmp / "cal.json"), "--json")),
        ("bench", "bench", ("bench", "--out", str(tmp / "bench.json"), "--json")),
        ("tune", "tune", ("tune", "--model", "gpt-tiny", "--gpus", "2", "--global-batch", "8", "--json")),
    ]
    out: dict[str, tuple[str, Any]] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(machine, "measure", _fake_bench)
        mp.setattr(tune_cmds, "call", lambda fn, args, **kw: _fake_tune())  # the parser still reads api.tune
        for name, section, argv in argvs:
            code, text, err = _run(*argv)
            assert code == 0, (name, err)
            out[name] = (section, json.loads(text))
    return out


def _run(*argv: str) -> tuple[int, str, str]:
    """One command in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


# ---- the checks ------------------------------------------------------------------------------------------------
def test_every_json_output_starts_with_its_format_version(outputs) -> None:
    for name, (_, d) in outputs.items():
        assert isinstance(d, dict) and next(iter(d)) == "format_version", name
        assert d["format_version"] == JSON_FORMAT_VERSION, name


def test_every_key_printed_is_on_the_page_and_every_row_is_printed(outputs) -> None:
    page = read_page(PAGE.read_text(encoding="utf-8"))
    seen: set[tuple[str, str]] = set()
    problems: list[str] = []
    for name, (section, d) in outputs.items():
        check(d, section, page, name, seen, problems)
    assert not problems, "\n".join(problems)
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "src" / "exatrain").rglob("*.py"))
    reachable = _reachable(page, {section for section, _ in outputs.values()})
    stale = []
    inherited = {
        (s, k)
        for s, base in re.findall(
            r"\{#([\w-]+)\}\s+The keys of \[[^]]*\]\(#([\w-]+)\)", PAGE.read_text(encoding="utf-8")
        )
        for k in page.get(base, {})
    }
    for section in sorted(reachable):
        for key, kind in page[section].items():
            if (section, key) in seen or (section, key) in inherited:  # an inherited row: checked in its own section
                continue
            if "optional" in kind and (key == SETTING_ROW or f'"{key}"' in source or f"{key}:" in source):
                continue  # printed only in cases not run here; the source still names it
            stale.append(f"#{section} `{key}`")
    assert not stale, "rows on docs/json.md that no command printed here: " + ", ".join(stale)


def _reachable(page: dict[str, dict[str, str]], roots: set[str]) -> set[str]:
    """The sections the commands' sections lead to through their rows' links."""
    todo, out = list(roots), set()
    while todo:
        s = todo.pop()
        if s in out or s not in page:
            continue
        out.add(s)
        todo += [t for kind in page[s].values() if (t := target(kind))]
    return out


def test_the_page_reader_and_walker_catch_a_missing_and_an_unknown_key() -> None:
    page = read_page(
        "## `demo --json`\n| key | type |\n|---|---|\n| `a` | number |\n| `b` | object: [x](#x) |\n"
        "## The x object {#x}\n| `c` | string |\n"
    )
    seen: set[tuple[str, str]] = set()
    problems: list[str] = []
    check({"a": 1, "b": {"c": "s", "d": 2}, "e": 3}, "demo", page, "demo", seen, problems)
    assert problems == ["demo.b.d: not on docs/json.md (section #x)", "demo.e: not on docs/json.md (section #demo)"]
    assert seen == {("demo", "a"), ("demo", "b"), ("x", "c")}
