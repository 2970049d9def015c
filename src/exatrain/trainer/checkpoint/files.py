"""Checkpoint directories on disk: names, the manifest, verification, and which one to resume.

    ckpt/
      step-00000200/                 one published checkpoint
        manifest.json                written last: the trainer state and sha256 + size of every file below
        trainer.json                 step, sampler cursor, plan, tokenizer identity, seed, skipped steps
        metadata.json                every tensor: global size, dtype, its chunks and where each is stored
        __0.safetensors ...          the chunks each rank wrote (see storage.py)
        tokenizer.json               the data's tokenizer (for export)
      .tmp-step-00000400/            a save in progress (or one a crash interrupted): never read

A checkpoint is written into a ``.tmp-`` directory, verified, given its manifest and only then renamed
to ``step-NNNNNNNN``; so a directory under that name with a manifest whose files all match is
complete. Nothing here imports torch, and nothing here or in storage.py unpickles anything.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from exatrain.data.dataset import sha256_file
from exatrain.errors import UserError

FORMAT = "exatrain-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
TRAINER = "trainer.json"
METADATA = "metadata.json"
TOKENIZER = "tokenizer.json"
_STEP = re.compile(r"^step-(\d{8,})$")


class CheckpointError(UserError):
    """A checkpoint that cannot be used: incomplete, corrupted, or for another model."""


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def tmp_dir_name(step: int) -> str:
    return f".tmp-{step_dir_name(step)}"


@dataclass(frozen=True)
class Manifest:
    path: Path
    step: int
    trainer: dict[str, Any]  # trainer.json's content
    files: dict[str, dict[str, Any]]  # name -> {"bytes", "sha256"}


def write_manifest(directory: Path, step: int) -> None:
    """Hash every file of ``directory`` (not the manifest itself) into manifest.json, durably."""
    files = {}
    for f in sorted(directory.iterdir()):
        if f.is_file() and f.name != MANIFEST:
            files[f.name] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
    text = json.dumps({"format": FORMAT, "version": VERSION, "step": step, "files": files}, indent=2) + "\n"
    tmp = directory / f".{MANIFEST}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        _fsync(fh.fileno())
    tmp.replace(directory / MANIFEST)


def _fsync(fd: int) -> None:
    import os

    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - filesystems without fsync
        pass


def _read_json(path: Path, what: str, where: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{where}: {what} is unreadable ({str(exc).splitlines()[0][:200]})") from None


def verify(path: str | Path, hashes: bool = True) -> Manifest:
    """The manifest of a complete checkpoint; CheckpointError naming the checkpoint and the problem
    otherwise. ``hashes=False`` checks presence and sizes only."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"{path}: no {MANIFEST}: the checkpoint is incomplete (its save did not finish) "
                              "or is not an exatrain checkpoint")
    raw = _read_json(mpath, MANIFEST, path)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or not isinstance(raw.get("files"), dict):
        raise CheckpointError(f"{path}: {MANIFEST} is not an exatrain checkpoint manifest")
    if raw.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {raw.get('version')!r} is not {VERSION}")
    files = raw["files"]
    for required in (TRAINER, METADATA):
        if required not in files:
            raise CheckpointError(f"{path}: {MANIFEST} lists no {required}")
    for name, info in files.items():
        f = path / name
        if "/" in name or name.startswith(".."):
            raise CheckpointError(f"{path}: {MANIFEST} names a file outside the checkpoint ({name!r})")
        if not f.is_file():
            raise CheckpointError(f"{path}: {name} is missing")
        size = f.stat().st_size
        if size != info.get("bytes"):
            raise CheckpointError(f"{path}: {name} is truncated or overwritten ({size} bytes, manifest says "
                                  f"{info.get('bytes')})")
        if hashes and sha256_file(f) != info.get("sha256"):
            raise CheckpointError(f"{path}: {name} is corrupted (its sha256 differs from the manifest)")
    trainer = _read_json(path / TRAINER, TRAINER, path)
    if not isinstance(trainer, dict) or trainer.get("step") != raw.get("step"):
        raise CheckpointError(f"{path}: {TRAINER} does not match the manifest")
    return Manifest(path=path, step=int(raw["step"]), trainer=trainer, files=files)


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every published-looking checkpoint under ``root``, newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _STEP.match(d.name)
        if m and d.is_dir():
            found.append((int(m.group(1)), d))
    return sorted(found, reverse=True)


def is_checkpoint_root(path: Path) -> bool:
    return path.is_dir() and not (path / MANIFEST).exists() and bool(list_checkpoints(path))


def newest_complete(root: str | Path, hashes: bool = True,
                    warn: Callable[[str], None] | None = None) -> Manifest | None:
    """The newest checkpoint under ``root`` that verifies; each one that does not is reported through
    ``warn`` (one line) and skipped. None when there is none."""
    warn = warn or (lambda line: sys.stderr.write(line + "\n"))
    for _, path in list_checkpoints(root):
        try:
            return verify(path, hashes=hashes)
        except CheckpointError as exc:
            warn(f"warning: skipping checkpoint {exc}")
    return None


def resolve(resume: str | None, checkpoint_dir: str | None, hashes: bool = True,
            warn: Callable[[str], None] | None = None) -> Manifest | None:
    """What ``--resume`` names: None (start fresh), ``auto`` (the newest complete checkpoint in
    ``checkpoint_dir``, or nothing), or a path (that checkpoint; a checkpoint root means its newest)."""
    if resume is None:
        return None
    if resume == "auto":
        if checkpoint_dir is None:
            raise UserError("--resume auto needs --checkpoint-dir (where to look for checkpoints)")
        return newest_complete(checkpoint_dir, hashes=hashes, warn=warn)
    path = Path(resume)
    if is_checkpoint_root(path):
        found = newest_complete(path, hashes=hashes, warn=warn)
        if found is None:
            raise CheckpointError(f"{path}: no complete checkpoint here")
        return found
    return verify(path, hashes=hashes)


def select(path: str | Path, step: int | None = None) -> Manifest:
    """For export: a checkpoint directory, or under a checkpoint root the one of ``step`` (default: the
    newest complete one)."""
    path = Path(path)
    if is_checkpoint_root(path):
        if step is not None:
            return verify(path / step_dir_name(step))
        found = newest_complete(path)
        if found is None:
            raise CheckpointError(f"{path}: no complete checkpoint here")
        return found
    manifest = verify(path)
    if step is not None and manifest.step != step:
        raise CheckpointError(f"{path} is the checkpoint of step {manifest.step}, not {step}")
    return manifest


__all__ = ["CheckpointError", "METADATA", "MANIFEST", "Manifest", "TOKENIZER", "TRAINER", "list_checkpoints",
           "newest_complete", "resolve", "select", "step_dir_name", "tmp_dir_name", "verify", "write_manifest"]
