"""Fixtures shared by tests in several packages."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A one-rank gloo process group in this process, for tests that drive a Trainer directly."""
    import torch.distributed as dist

    store: Path = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
