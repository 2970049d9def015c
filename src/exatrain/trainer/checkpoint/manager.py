"""Saving and loading during a run: atomic publication, keep-last-k, asynchronous saves.

A save: rank 0 clears a stale ``.tmp-step-N`` (a crash's leftover; at a run's first save every
``.tmp-``/``.old-`` leftover, each reported, a link unlinked rather than followed) and every rank
writes its chunks into it with ``torch.distributed.checkpoint`` (storage.py's writer). Rank 0 then
writes trainer.json and the tokenizer, checks that every chunk metadata.json names is in its file
with its dtype and shape (the safetensors headers), hashes every file into manifest.json and renames
the directory to ``step-N``; then it deletes all but the newest ``keep_last`` checkpoints (never
through a link). A crash at any point leaves either the previous checkpoints or the
new one complete, never a half one under a published name.

With ``async_save`` DCP copies the state to CPU memory (its default stager) and writes it from a
background thread while training goes on; the next save, and the end of the run, wait for it.
Checkpoint collectives run on their own gloo group so they never interleave with training's.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from exatrain.jsonio import write_json_atomic
from exatrain.trainer.checkpoint import files
from exatrain.trainer.checkpoint.files import CheckpointError, Manifest
from exatrain.trainer.checkpoint.state import restore_rng, state_dict
from exatrain.trainer.checkpoint.storage import SafetensorsReader, SafetensorsWriter, read_metadata_json


def check_chunks(path: Path) -> None:
    """Every chunk metadata.json names is in its safetensors file, with its dtype, shape and byte
    range (read from the files' headers: storage.read_metadata_json)."""
    read_metadata_json(path)


def publish(tmp: Path, final: Path, trainer: dict[str, Any], tokenizer: Path | None, keep_last: int) -> None:
    """Rank 0, after every rank wrote its chunks: verify, write the manifest, rename, prune."""
    write_json_atomic(tmp / files.TRAINER, trainer)
    if tokenizer is not None and tokenizer.is_file():
        shutil.copyfile(tokenizer, tmp / files.TOKENIZER)
    check_chunks(tmp)
    files.write_manifest(tmp, trainer["step"])
    files.verify(tmp)  # read back what the manifest says, before the name makes it visible
    if final.exists() or final.is_symlink():  # the same step saved again (a run resumed before it): replace it
        old = final.with_name(f".old-{final.name}")
        files.remove_path(old)
        final.rename(old)
        tmp.rename(final)
        files.remove_path(old)
    else:
        tmp.rename(final)
    if keep_last > 0:  # the newest K by step; never the one just written (a run resumed from an older step)
        for _, path in files.list_checkpoints(final.parent)[keep_last:]:
            if path != final and not path.is_symlink():  # a linked checkpoint is the user's, not ours to prune
                files.remove_path(path)


class Checkpointer:
    """One rank's side of checkpointing for a run (built by every rank: it creates a process group)."""

    def __init__(
        self,
        root: str | None,
        *,
        rank: int,
        device: torch.device,
        keep_last: int = 0,
        async_save: bool = False,
        tokenizer: Path | None = None,
    ) -> None:
        self.root = Path(root) if root else None
        self.rank, self.device = rank, device
        self.keep_last, self.async_save, self.tokenizer = keep_last, async_save, tokenizer
        self.group = dist.new_group(backend="gloo")  # DCP's plans and barriers; CPU tensors only
        self._pending: Future | None = None
        self._cleared = False
        self._executor = ThreadPoolExecutor(max_workers=1) if async_save else None

    def save(self, step: int, pm, optimizer: torch.optim.Optimizer, trainer: dict[str, Any]) -> None:
        """Save the state after ``step`` optimizer steps (returns early when asynchronous)."""
        assert self.root is not None
        self.wait()
        tmp = self.root / files.tmp_dir_name(step)
        final = self.root / files.step_dir_name(step)
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if not self._cleared:  # unfinished saves an earlier run left (reported; links unlinked, not followed)
                files.clear_leftovers(self.root)
                self._cleared = True
            files.remove_path(tmp)
            if os.environ.get("EXATRAIN_FAIL_SAVE_STEP") == str(step):  # fault injection for the failure tests
                raise FileExistsError(f"{tmp}: a save failure injected by EXATRAIN_FAIL_SAVE_STEP")
            tmp.mkdir()
        dist.barrier(group=self.group)
        state = state_dict(pm, optimizer, self.rank, self.device)
        writer = SafetensorsWriter(tmp)
        if not self.async_save:
            dcp.save(state, storage_writer=writer, process_group=self.group)
            if self.rank == 0:
                publish(tmp, final, trainer, self.tokenizer, self.keep_last)
            dist.barrier(group=self.group)
            return
        written = dcp.async_save(state, storage_writer=writer, process_group=self.group)

        def finish() -> None:
            written.result()
            if self.rank == 0:
                publish(tmp, final, trainer, self.tokenizer, self.keep_last)

        assert self._executor is not None
        self._pending = self._executor.submit(finish)

    def wait(self) -> None:
        """Block until an asynchronous save in flight is published (re-raising its error)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def close(self) -> None:
        self.wait()
        if self._executor is not None:
            self._executor.shutdown()

    def load(self, manifest: Manifest, pm, optimizer: torch.optim.Optimizer, restore_rng_state: bool) -> None:
        """Fill this rank's parameters and optimizer states from ``manifest``'s checkpoint, in place."""
        state = state_dict(pm, optimizer, self.rank, self.device)
        if not restore_rng_state:
            state = {k: v for k, v in state.items() if not k.startswith("rng.")}
        present = manifest.tensors
        missing = sorted(k for k in state if k not in present)
        if missing:
            raise CheckpointError(f"{manifest.path}: holds no {missing[0]} (saved for another model?)")
        dcp.load(state, storage_reader=SafetensorsReader(manifest.path), process_group=self.group)
        if restore_rng_state:
            restore_rng(state, self.rank, self.device)


__all__ = ["Checkpointer", "check_chunks", "publish"]
