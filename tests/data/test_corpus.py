"""The built-in corpus (data/corpus.py): the same bytes on every Python, what `train` reads without --data.

Break-on-purpose checks (each seen to fail): SEED changed by one; a word list reordered; ``hash()``
of a word used to pick the next one (varies with PYTHONHASHSEED, caught by the subprocess case).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exatrain.data import corpus
from exatrain.data.prepare import default_dataset
from exatrain.data.dataset import read_meta


def test_the_generated_corpus_is_the_recorded_one() -> None:
    texts = list(corpus.generate())
    assert len(texts) == corpus.DOCUMENTS
    assert corpus.digest(texts) == corpus.SHA256
    assert corpus.documents() == texts


def test_the_corpus_is_the_same_under_any_hash_seed() -> None:
    """A fresh interpreter with another PYTHONHASHSEED (set and dict order of str keys change with it)
    generates the same bytes."""
    code = "from exatrain.data import corpus; print(corpus.digest(list(corpus.generate())))"
    for seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == corpus.SHA256


def test_the_corpus_is_small_ascii_text_of_every_kind() -> None:
    texts = corpus.documents()
    size = sum(len(t) for t in texts)
    assert 500_000 < size < 2_000_000, size
    assert all(t.isascii() and "\0" not in t and t.endswith("\n") for t in texts)
    assert any(t.startswith("def ") for t in texts)  # code
    assert any(t.startswith("name,city,age") for t in texts)  # records
    assert any(" = " in t.splitlines()[0] and t[0].isdigit() for t in texts)  # number tables
    assert any(t.startswith("The ") and "\n\n" in t for t in texts)  # prose
    assert len(set(texts)) == len(texts)


def test_a_changed_generator_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "SEED", corpus.SEED + 1)
    monkeypatch.setattr(corpus.generate, "__defaults__", (corpus.DOCUMENTS, corpus.SEED))
    with pytest.raises(AssertionError, match="not the recorded"):
        corpus.documents()


def test_splitmix64_matches_its_published_sequence() -> None:
    """The first outputs for seed 0 of the reference C implementation (prng.di.unimi.it/splitmix64.c)."""
    r = corpus.SplitMix64(0)
    assert [r.next() for _ in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_the_default_dataset_holds_the_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`train` without --data: the cache holds the corpus's bytes with a NUL after each document, named by
    the corpus's sha256; `prepare --builtin` writes the same shards."""
    from exatrain.cli import main

    monkeypatch.setenv("EXATRAIN_CACHE", str(tmp_path / "cache"))
    path = default_dataset()
    assert path.parent == tmp_path / "cache" and path.name.startswith("builtin-")
    meta = read_meta(path)
    assert meta.sources["sha256"] == corpus.SHA256 and meta.documents == corpus.DOCUMENTS
    stream = b"".join(t.encode() + b"\0" for t in corpus.documents())
    ids = np.concatenate(
        [np.fromfile(path / s.file, dtype=np.dtype(meta.dtype).newbyteorder("<")) for s in meta.shards]
    )
    assert ids.astype(np.uint8).tobytes() == stream and int(ids.max()) < 256
    assert default_dataset() == path  # found, not made again
    assert main(["prepare", "--builtin", "--out", str(tmp_path / "copy"), "--quiet"]) == 0
    again = read_meta(tmp_path / "copy")
    assert [s.sha256 for s in again.shards] == [s.sha256 for s in meta.shards]
