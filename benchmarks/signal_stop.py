"""How long a training run takes to stop on a signal, for each way a signal reaches it.

    python benchmarks/signal_stop.py [--repeat N] [PATH ...]

Each run is `exatrain train` with gpt-tiny on two CPU ranks (dp 2, OMP_NUM_THREADS=1, a checkpoint
directory, no save of its own before its last step), signalled once it has completed 3 steps. PATHs
(default: all): ``launcher:SIGTERM``, ``launcher:SIGINT``, ``launcher:SIGHUP``, ``group:SIGTERM``,
``group:SIGINT``, ``launcher:SIGKILL`` (the ranks must notice on their own), and ``rank:SIGTERM``
(``python -m exatrain.train`` as torchrun starts it, RANK/WORLD_SIZE per process; SIGTERM to rank 1).
Printed per run: seconds from the signal to every rank process gone, and to the command's exit (the
launcher's, or the last rank's), its exit status, the steps in the metrics file, the checkpoint
saved, and the RunRecord's status. The command's exit includes the launcher's diagnosis, which
imports torch there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from exatrain.procs import pid_alive

PATHS = (
    "launcher:SIGTERM",
    "launcher:SIGINT",
    "launcher:SIGHUP",
    "group:SIGTERM",
    "group:SIGINT",
    "launcher:SIGKILL",
    "rank:SIGTERM",
)
ARGS = ["--model", "gpt-tiny", "--dp", "2", "--micro-batch", "2", "--global-batch", "4", "--steps", "20000", "--quiet"]


def _steps(metrics: Path) -> int:
    if not metrics.is_file():
        return 0
    return sum(1 for line in metrics.read_text().splitlines() if '"kind": "step"' in line)


def _rank_pids(run_dir: Path) -> list[int]:
    return [int(json.loads((run_dir / f"heartbeat-{r}.json").read_text())["pid"]) for r in range(2)]


def run(path: str) -> dict:
    target, name = path.split(":")
    sig = getattr(signal, name)
    d = Path(tempfile.mkdtemp(prefix="exatrain-signal-"))
    metrics, ckpt = d / "m.jsonl", d / "ckpt"
    args = [*ARGS, "--metrics-file", str(metrics), "--checkpoint-dir", str(ckpt), "--save-every", "200000"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["OMP_NUM_THREADS"] = "1"
    procs = []
    if target == "rank":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for r in range(2):
            rank_env = {
                **env,
                "RANK": str(r),
                "WORLD_SIZE": "2",
                "LOCAL_RANK": str(r),
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "exatrain.train", *args],
                    env=rank_env,
                    stdout=subprocess.DEVNULL,
                    stderr=open(d / f"err{r}", "w"),
                    start_new_session=True,
                )
            )
    else:
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "exatrain", "train", *args],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(d / "err0", "w"),
                start_new_session=True,
            )
        )
    try:
        while _steps(metrics) < 3:
            if any(p.poll() is not None for p in procs):
                raise SystemExit(f"{path}: the run ended before it was signalled: {(d / 'err0').read_text()[-500:]}")
            time.sleep(0.05)
        ranks = _rank_pids(ckpt / "ranks")
        t0 = time.monotonic()
        if target == "group":
            os.killpg(procs[0].pid, sig)
        elif target == "rank":
            os.kill(ranks[1], sig)
        else:
            os.kill(procs[0].pid, sig)
        gone = exited = None
        while gone is None or exited is None:
            now = time.monotonic() - t0
            if gone is None and not any(pid_alive(p) for p in ranks):
                gone = now
            if exited is None and all(p.poll() is not None for p in procs):
                exited = now
            if now > 600:
                break
            time.sleep(0.02)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for pid in locals().get("ranks", []):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    records = [json.loads(x) for x in metrics.read_text().splitlines() if '"run_record"' in x]
    saved = sorted(p.name for p in ckpt.glob("step-*"))
    return {
        "path": path,
        "ranks_gone_s": gone,
        "exit_s": exited,
        "exit": [p.returncode for p in procs],
        "steps": _steps(metrics),
        "checkpoint": saved[-1] if saved else None,
        "record": records[-1]["status"] if records else None,
    }


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", default=list(PATHS), help=f"of {', '.join(PATHS)}")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    for path in a.paths:
        if path not in PATHS:
            ap.error(f"unknown path {path!r}")
    print(f"{'path':18s} {'ranks gone':>10s} {'exit':>7s}  status      steps  checkpoint      record")
    for _ in range(a.repeat):
        for path in a.paths:
            r = run(path)
            print(
                f"{r['path']:18s} {_secs(r['ranks_gone_s']):>10s} {_secs(r['exit_s']):>7s}  {r['exit']!s:10s}  "
                f"{r['steps']:5d}  {r['checkpoint']!s:14s}  {r['record']}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
