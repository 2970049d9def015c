"""The trainer's batches: windows of a prepared dataset's token stream, chosen by global sample index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from exatrain.data import corpus
from exatrain.data.prepare import default_dataset, prepare, stdlib_documents, stdlib_root
from exatrain.data import tokenizer as tk
from exatrain.trainer.sampler import SampleOrder, TokenShards, local_batch, permute


@pytest.fixture(scope="module")
def builtin() -> Path:
    return default_dataset()


def test_the_stdlib_corpus_is_sorted_without_third_party_packages() -> None:
    docs = stdlib_documents()
    names = [d.name for d in docs]
    assert names == sorted(names) and len(names) > 100
    assert "os.py" in names and "json/__init__.py" in names
    assert not any(n.startswith(("site-packages/", "dist-packages/")) for n in names)
    assert all(d.path == stdlib_root() / d.name for d in docs[:50])


def test_a_sample_is_a_window_of_the_documents_joined_by_separators(builtin: Path) -> None:
    src = TokenShards(builtin, shuffle=False)
    docs = corpus.documents()
    stream = b"\0".join(d.encode() for d in docs[:3]) + b"\0"  # the byte tokenizer's separator is id 0
    seq = 64
    for i in range(3):
        assert bytes(src.sample(i, seq).tolist()) == stream[i * seq : i * seq + seq + 1]
    assert src.vocab_size == 256 and src.meta.separator_id == 0 and src.meta.documents == len(docs)
    assert src.meta.tokens == sum(len(d.encode()) + 1 for d in docs)


def test_windows_cross_shard_boundaries(tmp_path: Path) -> None:
    texts = [tmp_path / f"d{i}.txt" for i in range(5)]
    for i, t in enumerate(texts):
        t.write_text(f"document {i} " * (10 + i))
    from exatrain.data.prepare import find_documents

    prepare(
        find_documents([str(tmp_path / "*.txt")]),
        tmp_path / "data",
        tokenizer_json=tk.byte_tokenizer_json(),
        separator=tk.byte_separator(),
        shard_tokens=50,
        quiet=True,
    )
    src = TokenShards(tmp_path / "data", shuffle=False)
    assert len(src.meta.shards) > 3
    stream = b"".join(t.read_bytes() + b"\0" for t in sorted(texts))
    seq = 16
    for i in range(src.num_samples(seq)):
        assert bytes(src.sample(i, seq).tolist()) == stream[i * seq : i * seq + seq + 1]


def test_order_is_a_seeded_permutation_per_epoch(builtin: Path) -> None:
    a, b, c = TokenShards(builtin, seed=0), TokenShards(builtin, seed=0), TokenShards(builtin, seed=1)
    assert torch.equal(a.sample(5, 64), b.sample(5, 64))
    assert not torch.equal(a.sample(5, 64), c.sample(5, 64))
    for n in (1, 2, 3, 10, 1000, 4097):
        for epoch in (0, 1):
            assert sorted(permute(np.arange(n), n, 7, epoch).tolist()) == list(range(n))
    n = 1000
    assert not np.array_equal(permute(np.arange(n), n, 7, 0), permute(np.arange(n), n, 7, 1))  # reshuffled


def test_dp_ranks_split_the_single_process_batch(builtin: Path) -> None:
    src, seq, gb = TokenShards(builtin, seed=0), 32, 8
    x1, y1 = local_batch(src, SampleOrder(gb, 1), 3, 0, seq)
    parts = [local_batch(src, SampleOrder(gb, 4), 3, r, seq) for r in range(4)]
    assert torch.equal(torch.cat([x for x, _ in parts]), x1) and torch.equal(torch.cat([y for _, y in parts]), y1)
    assert x1.shape == (gb, seq) and x1.dtype == torch.int64
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next tokens
    x2, _ = local_batch(src, SampleOrder(gb, 1), 4, 0, seq)
    assert not torch.equal(x1, x2)
    assert list(SampleOrder(8, 2).indices(3, 1)) == [28, 29, 30, 31]


def test_a_resume_onto_another_dp_reads_every_remaining_sample_once() -> None:
    first = SampleOrder(global_batch=12, dp=2)
    read = [i for step in range(4) for r in range(2) for i in first.indices(step, r)]
    second = SampleOrder(global_batch=12, dp=3, start_step=4, start_sample=first.consumed(4))
    read += [i for step in range(4, 9) for r in range(3) for i in second.indices(step, r)]
    assert sorted(read) == list(range(9 * 12)) and len(set(read)) == len(read)
