"""The byte-level stdlib token stream: deterministic, complete, split by global sample index."""

from __future__ import annotations

import torch

from exatrain.trainer.data import SampleOrder, StdlibBytes, local_batch, stdlib_root, stdlib_sources


def test_sources_are_the_sorted_stdlib_without_third_party_packages() -> None:
    files = stdlib_sources()
    paths = [p for p, _ in files]
    assert paths == sorted(paths) and len(paths) > 100
    assert "os.py" in paths and "json/__init__.py" in paths
    assert not any(p.startswith(("site-packages/", "dist-packages/")) for p in paths)
    assert all(size == (stdlib_root() / p).stat().st_size for p, size in files[:50])


def test_a_sample_is_a_window_of_the_concatenated_files() -> None:
    src = StdlibBytes(shuffle=False)
    seq = 64
    text = b"".join((stdlib_root() / p).read_bytes() for p in src.paths[:3])
    for i in range(3):
        assert bytes(src.sample(i, seq).tolist()) == text[i * seq:i * seq + seq + 1]
    # a window that straddles two files is read across the boundary
    i = src.starts[1] // seq
    both = b"".join((stdlib_root() / p).read_bytes() for p in src.paths[:2])[i * seq:i * seq + seq + 1]
    assert src.starts[1] < (i + 1) * seq + 1 and bytes(src.sample(i, seq).tolist()) == both


def test_order_is_seeded_and_the_same_in_every_process() -> None:
    a, b, c = StdlibBytes(seed=0), StdlibBytes(seed=0), StdlibBytes(seed=1)
    assert torch.equal(a.sample(5, 64), b.sample(5, 64))
    assert not torch.equal(a.sample(5, 64), c.sample(5, 64))
    n = a.num_samples(64)
    assert torch.equal(a.sample(n + 7, 64), a.sample(7, 64))  # wraps around


def test_dp_ranks_split_the_single_process_batch() -> None:
    src, seq, gb = StdlibBytes(seed=0), 32, 8
    x1, y1 = local_batch(src, SampleOrder(gb, 1), 3, 0, seq)
    parts = [local_batch(src, SampleOrder(gb, 4), 3, r, seq) for r in range(4)]
    assert torch.equal(torch.cat([x for x, _ in parts]), x1) and torch.equal(torch.cat([y for _, y in parts]), y1)
    assert x1.shape == (gb, seq) and x1.dtype == torch.int64
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next bytes
    x2, _ = local_batch(src, SampleOrder(gb, 1), 4, 0, seq)
    assert not torch.equal(x1, x2)
    assert list(SampleOrder(8, 2).indices(3, 1)) == [28, 29, 30, 31]
