"""A rank killed with SIGKILL mid-run, then `--resume auto`: the run ends exactly as an uninterrupted one.

Three `exatrain train` commands (gpt-tiny, dp 2, two spawned ranks, asynchronous saves every 4
steps, keeping the last 2): an uninterrupted reference; a run one of whose ranks is killed once a
checkpoint is published and two more steps are done; the same command with `--resume auto`. From the
checkpoint it found on, the resumed run's losses and samples equal the reference's, bit for bit.
Waits poll for progress (a file under the test's folder changing) and fail only after a long stall,
never on a deadline (tests/helpers/progress_wait.py).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers.progress_wait import finish, run, start, wait_for

pytestmark = pytest.mark.slow
STEPS, EVERY = 16, 4  # the kill lands after step 6, ten steps before the end


def command(metrics: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "exatrain",
        "train",
        "--model",
        "gpt-tiny",
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "2",
        "--micro-batch",
        "2",
        "--global-batch",
        "4",
        "--steps",
        str(STEPS),
        "--lr",
        "3e-3",
        "--quiet",
        "--record-samples",
        "--metrics-file",
        str(metrics),
        *extra,
    ]


def steps_of(metrics: Path) -> list[dict]:
    if not metrics.is_file():
        return []
    lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return [x for x in lines if x["kind"] == "step"]


def rank_pids(parent: int) -> list[int]:
    """The spawned rank processes under ``parent`` (Linux /proc)."""
    found, todo = [], [parent]
    while todo:
        pid = todo.pop()
        for task in Path(f"/proc/{pid}/task").glob("*"):
            children = (task / "children").read_text().split() if (task / "children").exists() else []
            for child in map(int, children):
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
                if b"spawn_main" in cmdline:
                    found.append(child)
                todo.append(child)
    return sorted(found)


def run_ok(cmd: list[str], cwd: Path, name: str) -> str:
    """Run to the end (unless it stalls); its stderr."""
    rc, _, err = run(cmd, cwd, name, watch=[cwd], cwd=cwd)
    assert rc == 0, err[-3000:]
    return err


def test_sigkill_then_resume_auto_ends_like_an_uninterrupted_run(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    saving = ["--checkpoint-dir", str(ckpt), "--save-every", str(EVERY), "--keep-last", "2", "--async-save"]

    crashed = tmp_path / "crashed.jsonl"
    proc, out, err = start(command(crashed, *saving), tmp_path / "logs", "crashed", cwd=tmp_path)
    try:
        wait_for(
            lambda: (
                proc.poll() is not None
                or ((ckpt / f"step-{EVERY:08d}" / "manifest.json").is_file() and len(steps_of(crashed)) >= EVERY + 2)
            ),
            watch=[tmp_path],
            poll_s=0.01,
            what="the run to be killed",
        )
        assert proc.poll() is None, f"the run ended before it could be killed:\n{err.read_text()[-3000:]}"
        ranks = rank_pids(proc.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[-1], signal.SIGKILL)
    finally:
        finish([proc], [tmp_path], [out, err])
    killed_at = len(steps_of(crashed))
    assert proc.returncode == 4 and killed_at < STEPS, (proc.returncode, killed_at, err.read_text()[-3000:])

    resumed = tmp_path / "resumed.jsonl"
    resumed_err = run_ok(command(resumed, *saving, "--resume", "auto"), tmp_path, "resumed")
    reference = tmp_path / "reference.jsonl"
    run_ok(command(reference), tmp_path, "reference")

    ref, res = steps_of(reference), steps_of(resumed)
    first = res[0]["step"]
    assert (first - 1) % EVERY == 0 and EVERY < first <= killed_at + 1, (first, killed_at)
    assert [s["step"] for s in res] == list(range(first, STEPS + 1))
    assert [s["loss"] for s in res] == [s["loss"] for s in ref[first - 1 :]]
    assert [s["samples"] for s in res] == [s["samples"] for s in ref[first - 1 :]]
    assert [s["loss"] for s in steps_of(crashed)[: first - 1]] == [s["loss"] for s in ref[: first - 1]]
    published = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-"))
    assert published == [f"step-{STEPS - EVERY:08d}", f"step-{STEPS:08d}"]  # --keep-last 2
    assert "Traceback" not in resumed_err
