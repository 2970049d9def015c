"""CPU milliseconds a second that a process at the lowest priority (nice 19) gets while other processes keep every
core busy: what a starved CPU rank's step thread still uses, against the 5 ms a beat (``trainer.health.CPU_MOVED_S``)
at which the watchdog takes a rank as computing rather than blocked.

    python benchmarks/starved_cpu_share.py [--busy N] [--seconds 6]

``--busy``: how many busy processes to start beside it (default: one a core). Prints one figure a second."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        os.nice(19)
        start = last = time.monotonic()
        cpu = time.thread_time()
        samples = []
        while time.monotonic() - start < args.seconds:
            for _ in range(10_000):
                pass
            now = time.monotonic()
            if now - last >= 1.0:
                used = time.thread_time()
                samples.append((used - cpu) * 1e3 / (now - last))
                last, cpu = now, used
    finally:
        for h in hogs:
            h.kill()
    print(
        f"nice 19 beside {args.busy} busy processes on {os.cpu_count()} cores: CPU ms a second "
        + ", ".join(f"{x:.1f}" for x in samples)
    )


if __name__ == "__main__":
    main()
