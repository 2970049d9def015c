"""benchmarks/grad_norm_speed.py runs as its docstring says and prints its three figures (no speed is asserted: that is
the benchmark's to print).

Broken on purpose and seen to fail here: the script without its one-rank process group (the norm's all-reduce
refuses to run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "grad_norm_speed.py"


def test_it_times_the_norm_on_a_tiny_model() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "gpt-tiny", "--repeat", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "gpt-tiny: 0.2 M parameters on cpu" in out.stdout
    assert re.search(r"fp32 copy: [\d.]+ ms \([\d.]+ GB/s\)", out.stdout)
    assert re.search(r"gradient norm: [\d.]+ ms = [\d.]+ bytes a parameter", out.stdout)
