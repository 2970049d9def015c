"""The one trace process the trace tests share (tests/bench/test_trace*.py): every case of
tests/helpers/trace_matrix.py traced in full and the fast way, in one subprocess of its own (the trace keeps
a fake process group for its process), started with the session on the idle core (tests/helpers/background.py).

One process for all of them, not one per module: each case is traced once (test_trace_counted.py compares the
same full traces with its counted runs), and torch is imported once. Each module lists ``JOBS`` in its
``BACKGROUND_JOBS``; under one name the job runs once per session, and once per pytest process when a module
runs alone or under xdist (the modules are one work unit: tests/conftest.py ``SHARED_UNITS``).
"""

from __future__ import annotations

import json
import sys

from tests.helpers import background, trace_matrix

MATRIX = "trace.matrix"
JOBS = {
    MATRIX: background.Job([sys.executable, str(trace_matrix.__file__), "--fast", *trace_matrix.ALL], timeout_s=3600),
}


def matrix() -> dict:
    """{case: rows} of every case (trace_matrix.run with ``fast``), waited for or run here."""
    out = background.result(MATRIX, JOBS)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
