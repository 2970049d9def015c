"""Training data for now: the Python standard library's own source files as a byte-level token stream.

Every Python install has this text, so the trainer runs anywhere with no download. The stream is the
concatenation of the stdlib's ``.py`` files in sorted order of their relative paths; one sample is a
window of ``seq_len + 1`` bytes (inputs and the next-byte targets), windows stride by ``seq_len``,
and a seeded permutation orders them. Sample ``i`` of the whole run is the same on every layout:
step t consumes global samples ``[t * global_batch, (t + 1) * global_batch)``, data-parallel rank r
takes the r-th contiguous share of those, and its micro-batches are consecutive slices of that share.

Two small interfaces keep this replaceable (a later issue brings BPE shards and a resumable
sampler): a ``TokenSource`` gives the tokens of a sample by global index, a ``SampleOrder`` says
which global indices a data-parallel rank reads at a step.
"""

from __future__ import annotations

import bisect
import os
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from exatrain.errors import UserError

BYTE_VOCAB = 256


class TokenSource(Protocol):
    """Token windows by global sample index."""

    vocab_size: int

    def num_samples(self, seq_len: int) -> int: ...

    def sample(self, index: int, seq_len: int) -> torch.Tensor:
        """int64 tokens [seq_len + 1] of sample ``index`` (wrapping around the source)."""
        ...


@dataclass(frozen=True)
class SampleOrder:
    """Which global sample indices data-parallel rank ``dp_rank`` reads at ``step``."""

    global_batch: int
    dp: int

    def indices(self, step: int, dp_rank: int) -> range:
        share = self.global_batch // self.dp
        start = step * self.global_batch + dp_rank * share
        return range(start, start + share)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_sources(root: Path | None = None) -> list[tuple[str, int]]:
    """(relative path, size in bytes) of every stdlib ``.py`` file, sorted by path; installed
    third-party packages (site-packages, dist-packages) are not the standard library."""
    root = root or stdlib_root()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")]
        for f in filenames:
            if f.endswith(".py"):
                path = Path(dirpath, f)
                found.append((path.relative_to(root).as_posix(), path.stat().st_size))
    found.sort()
    if not found:
        raise UserError(f"no Python sources under {root}: the byte-level training data needs the "
                        "standard library's .py files")
    return found


class StdlibBytes:
    """The stdlib sources as one byte stream, read lazily (only the files a sample touches)."""

    vocab_size = BYTE_VOCAB

    def __init__(self, seed: int = 0, root: Path | None = None, shuffle: bool = True) -> None:
        self.root = root or stdlib_root()
        files = stdlib_sources(self.root)
        self.paths = [p for p, _ in files]
        self.starts = [0]
        for _, size in files:
            self.starts.append(self.starts[-1] + size)
        self.total = self.starts[-1]
        self.seed, self.shuffle = seed, shuffle
        self._read_file = lru_cache(maxsize=32)(self._read_file_uncached)

    def num_samples(self, seq_len: int) -> int:
        return (self.total - 1) // seq_len

    def sample(self, index: int, seq_len: int) -> torch.Tensor:
        window = int(self._order(seq_len)[index % self.num_samples(seq_len)])
        data = self._read(window * seq_len, seq_len + 1)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)

    def _order(self, seq_len: int) -> np.ndarray:
        return _permutation(self.num_samples(seq_len), self.seed, self.shuffle)

    def _read(self, offset: int, length: int) -> bytes:
        out = bytearray()
        i = bisect.bisect_right(self.starts, offset) - 1
        while len(out) < length:
            data = self._read_file(i)
            start = offset + len(out) - self.starts[i]
            out += data[start:start + length - len(out)]
            i += 1
        return bytes(out)

    def _read_file_uncached(self, i: int) -> bytes:
        data = (self.root / self.paths[i]).read_bytes()
        expected = self.starts[i + 1] - self.starts[i]
        return data[:expected].ljust(expected, b"\n")  # a file changed since indexing keeps its size


@lru_cache(maxsize=4)
def _permutation(n: int, seed: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng(seed).permutation(n)


def local_batch(source: TokenSource, order: SampleOrder, step: int, dp_rank: int,
                seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This dp rank's share of step ``step``: inputs and targets, each int64 [global_batch/dp, s]."""
    rows = torch.stack([source.sample(i, seq_len) for i in order.indices(step, dp_rank)])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def check_vocab(source: TokenSource, vocab: int, model_name: str) -> None:
    if vocab < source.vocab_size:
        raise UserError(f"{model_name} has vocab {vocab} but the byte-level training data needs at least "
                        f"{source.vocab_size} token ids; use --vocab {source.vocab_size} or more")


__all__ = ["BYTE_VOCAB", "SampleOrder", "StdlibBytes", "TokenSource", "check_vocab", "local_batch",
           "stdlib_sources"]
