"""Process checks shared by the trainer's tests, the tuner and the benchmarks (torch-free, POSIX)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def pid_alive(pid: Any) -> bool:
    """Whether process ``pid`` runs: a zombie (ended, not yet reaped) does not; one we may not signal does."""
    try:
        pid = int(pid)
        os.kill(pid, 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
