"""Training batches from a prepared dataset (``exatrain prepare``; see ``exatrain.data``).

The token stream is the dataset's shards back to back. One sample is a window of ``seq_len + 1``
tokens (inputs and next-token targets); windows stride by ``seq_len``. Sampling is by *global sample
index*: index i belongs to epoch ``i // windows`` and reads window ``perm_epoch(i % windows)``, where
``perm_epoch`` is a seeded pseudo-random permutation of the windows, a fresh one each epoch (a keyed
Feistel network with cycle walking: any index is mapped in O(1) memory, however many windows).

Step t of a run that started at step t0 with s0 samples already consumed reads global samples
``[s0 + (t - t0) * global_batch, ... + global_batch)``; data-parallel rank r takes the r-th contiguous
share of those, its micro-batches consecutive slices of that share. So what a step reads depends only
on the count of samples consumed before it: a resume, even onto another dp (or another global
batch), reads every remaining sample exactly once. That count is the sampler state a checkpoint keeps.

Without ``--data`` the trainer reads the built-in corpus (``data/corpus.py``, byte tokenizer),
prepared once into a cache by the same code as ``exatrain prepare --builtin``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from exatrain.data.dataset import DatasetMeta, check_vocab, open_shards, read_meta
from exatrain.errors import UserError

_MASK64 = np.uint64(2**64 - 1)


class TokenSource(Protocol):
    """Token windows by global sample index."""

    vocab_size: int

    def num_samples(self, seq_len: int) -> int: ...

    def sample(self, index: int, seq_len: int) -> torch.Tensor:
        """int64 tokens [seq_len + 1] of global sample ``index`` (later epochs wrap around the data)."""
        ...


@dataclass(frozen=True)
class SampleOrder:
    """Which global sample indices data-parallel rank ``dp_rank`` reads at ``step``: a cursor that
    started at ``start_sample`` consumed samples when the run (or its resume) began at ``start_step``."""

    global_batch: int
    dp: int
    start_step: int = 0
    start_sample: int = 0

    def indices(self, step: int, dp_rank: int) -> range:
        share = self.global_batch // self.dp
        start = self.consumed(step) + dp_rank * share
        return range(start, start + share)

    def consumed(self, step: int) -> int:
        """Global samples consumed before ``step``: the sampler state at that point."""
        return self.start_sample + (step - self.start_step) * self.global_batch


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64's finaliser of x + key (Steele et al. 2014), on uint64 arrays."""
    with np.errstate(over="ignore"):
        z = (x + key) & _MASK64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return z ^ (z >> np.uint64(31))


def permute(index: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """A seeded bijection of [0, n) applied to ``index``: a 4-round balanced Feistel network on the
    smallest even-width power of two >= n, cycle-walking values that land outside (Black & Rogaway 2002)."""
    half = max(1, ((max(n - 1, 1)).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    keys = [
        np.uint64((seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03 + r * 0x8CB92BA72F3D8DD7) % 2**64)
        for r in range(4)
    ]
    x = np.asarray(index, dtype=np.uint64).copy()
    todo = np.ones(x.shape, dtype=bool)
    while todo.any():
        v = x[todo]
        left, right = v >> np.uint64(half), v & mask
        for k in keys:
            left, right = right, left ^ (_mix(right, k) & mask)
        v = (left << np.uint64(half)) | right
        x[todo] = v
        todo[todo] = v >= np.uint64(n)
    return x.astype(np.int64)


class TokenShards:
    """A prepared dataset's token stream, read through memory maps (only the windows a rank uses)."""

    def __init__(
        self, data_dir: str | Path, seed: int = 0, shuffle: bool = True, meta: DatasetMeta | None = None
    ) -> None:
        self.root = Path(data_dir)
        self.meta = meta or read_meta(self.root)
        self.vocab_size = self.meta.vocab_size
        self.tokenizer_sha256 = self.meta.tokenizer_sha256
        self.shards = open_shards(self.root, self.meta)
        self.starts = [0]
        for s in self.meta.shards:
            self.starts.append(self.starts[-1] + s.tokens)
        self.total = self.starts[-1]
        self.seed, self.shuffle = seed, shuffle

    def num_samples(self, seq_len: int) -> int:
        return (self.total - 1) // seq_len

    def window_of(self, index: int, seq_len: int) -> int:
        """The window global sample ``index`` reads."""
        n = self.num_samples(seq_len)
        if n == 0:  # data.dataset.check_dataset_for refuses this before the ranks start
            raise UserError(
                f"{self.root}: the dataset holds {self.total} tokens, fewer than one sample "
                f"(seq_len {seq_len} + 1 tokens); prepare more text into it or use a shorter --seq-len"
            )
        epoch, pos = divmod(index, n)
        if not self.shuffle:
            return pos
        return int(permute(np.array([pos]), n, self.seed, epoch)[0])

    def sample(self, index: int, seq_len: int) -> torch.Tensor:
        start = self.window_of(index, seq_len) * seq_len
        return torch.from_numpy(self._read(start, seq_len + 1))

    def _read(self, offset: int, length: int) -> np.ndarray:
        """``length`` tokens of the stream from ``offset``; every id checked against the tokenizer's
        vocabulary (the model's embedding has at least that many rows: check_vocab), so a shard
        corrupted after ``prepare`` stops the run with one line naming it, not in the embedding."""
        out = np.empty(length, dtype=np.int64)
        done = 0
        i = bisect.bisect_right(self.starts, offset) - 1
        while done < length:
            local = offset + done - self.starts[i]
            piece = self.shards[i][local : local + length - done]
            if piece.size and int(piece.max()) >= self.vocab_size:
                at = local + int(np.argmax(piece >= self.vocab_size))
                raise UserError(
                    f"{self.root / self.meta.shards[i].file}: token {at} is id {int(piece[at - local])}, "
                    f"beyond the tokenizer's {self.vocab_size} ids: the shard is corrupted "
                    f"(`exatrain prepare --verify {self.root}`); prepare the data again"
                )
            out[done : done + piece.size] = piece
            done += piece.size
            i += 1
        return out


def local_batch(
    source: TokenSource, order: SampleOrder, step: int, dp_rank: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This dp rank's share of step ``step``: inputs and targets, each int64 [global_batch/dp, s]."""
    rows = torch.stack([source.sample(i, seq_len) for i in order.indices(step, dp_rank)])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


__all__ = ["SampleOrder", "TokenShards", "TokenSource", "check_vocab", "local_batch", "permute"]
