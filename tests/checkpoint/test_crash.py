"""A rank killed with SIGKILL mid-run, then `--resume auto`: the run ends exactly as an uninterrupted one.

Three `exatrain train` commands (gpt-tiny, dp 2, two spawned ranks, asynchronous saves every 4
steps, keeping the last 2): an uninterrupted reference; a run one of whose ranks is killed once a
checkpoint is published and two more steps are done; the same command with `--resume auto`. From the
checkpoint it found on, the resumed run's losses and samples equal the reference's, bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
STEPS, EVERY = 40, 4
DEADLINE_S = 240


def command(metrics: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "exatrain", "train", "--model", "gpt-tiny", "--tp", "1", "--pp", "1", "--dp", "2",
            "--micro-batch", "2", "--global-batch", "4", "--steps", str(STEPS), "--lr", "3e-3", "--quiet",
            "--record-samples", "--metrics-file", str(metrics), *extra]


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


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE_S, cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_sigkill_then_resume_auto_ends_like_an_uninterrupted_run(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    saving = ["--checkpoint-dir", str(ckpt), "--save-every", str(EVERY), "--keep-last", "2", "--async-save"]

    crashed = tmp_path / "crashed.jsonl"
    proc = subprocess.Popen(command(crashed, *saving), cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not ((ckpt / f"step-{EVERY:08d}" / "manifest.json").is_file() and len(steps_of(crashed)) >= EVERY + 2):
            assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, "no checkpoint published in time"
            time.sleep(0.01)
        ranks = rank_pids(proc.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        proc.wait(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    killed_at = len(steps_of(crashed))
    assert proc.returncode != 0 and killed_at < STEPS, (proc.returncode, killed_at)

    resumed = tmp_path / "resumed.jsonl"
    out = run(command(resumed, *saving, "--resume", "auto"), tmp_path)
    reference = tmp_path / "reference.jsonl"
    run(command(reference), tmp_path)

    ref, res = steps_of(reference), steps_of(resumed)
    first = res[0]["step"]
    assert (first - 1) % EVERY == 0 and EVERY < first <= killed_at + 1, (first, killed_at)
    assert [s["step"] for s in res] == list(range(first, STEPS + 1))
    assert [s["loss"] for s in res] == [s["loss"] for s in ref[first - 1:]]
    assert [s["samples"] for s in res] == [s["samples"] for s in ref[first - 1:]]
    assert [s["loss"] for s in steps_of(crashed)[:first - 1]] == [s["loss"] for s in ref[:first - 1]]
    published = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-"))
    assert published == [f"step-{STEPS - EVERY:08d}", f"step-{STEPS:08d}"]  # --keep-last 2
    assert "Traceback" not in out.stderr
