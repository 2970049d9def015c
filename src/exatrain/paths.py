"""Checks on the paths a user names, made before any work starts.

A command that would train for minutes and then fail to write its output is checked here first:
every function raises ``UserError`` (one line, exit status 2) naming the flag and what is wrong,
and creates nothing. Torch-free, so the planner's commands and the trainer's launcher share it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from exatrain.errors import UserError


def _label(path: Path, flag: str | None) -> str:
    return f"{flag} {path}" if flag else str(path)


def _shown(path: Path) -> str:
    """A path in a message as the user's own path spells it (relative stays relative): "." is the current
    directory."""
    return "the current directory" if str(path) == "." else str(path)


def _nearest_existing(path: Path) -> Path:
    """The path itself or its closest existing ancestor (what a later mkdir -p would start from)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output_file(path: str | Path, flag: str | None = None) -> Path:
    """``path`` can be written as a file: not a directory, its parent a directory (or creatable) and
    writable. Returns the path, absolute. Creates nothing."""
    p = Path(path).expanduser()
    label = _label(p, flag)
    if str(path).strip() == "":
        raise UserError(f"{flag or 'path'}: empty path")
    if p.is_dir():
        raise UserError(f"{label}: is a directory; give a file name")
    if p.exists() and not p.is_file():
        raise UserError(f"{label}: exists and is not a regular file")
    if p.exists() and not os.access(p, os.W_OK):
        raise UserError(f"{label}: not writable")
    base = _nearest_existing(p.parent)  # as typed: messages name the user's own path
    if not base.is_dir():
        raise UserError(f"{label}: {_shown(base)} is a file, not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise UserError(f"{label}: cannot write in {_shown(base)}")
    return p.absolute()


def check_output_dir(path: str | Path, flag: str | None = None, need_bytes: int = 0) -> Path:
    """``path`` can hold files: a directory or creatable as one, writable, and (when ``need_bytes``)
    on a filesystem with at least that much free space. Creates nothing."""
    p = Path(path).expanduser()
    label = _label(p, flag)
    if str(path).strip() == "":
        raise UserError(f"{flag or 'path'}: empty path")
    if p.exists() and not p.is_dir():
        raise UserError(f"{label}: is a file, not a directory")
    base = _nearest_existing(p)  # as typed: messages name the user's own path
    if not base.is_dir():
        raise UserError(f"{label}: {_shown(base)} is a file, not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise UserError(f"{label}: not writable")
    if need_bytes > 0:
        free = shutil.disk_usage(base).free
        if free < need_bytes:
            raise UserError(
                f"{label}: {free / 2**20:,.0f} MiB free, one checkpoint needs about {need_bytes / 2**20:,.0f} MiB"
            )
    return p.absolute()


def check_input_file(path: str | Path, flag: str | None = None) -> Path:
    """``path`` is an existing, readable regular file. Returns it as given (``~`` expanded), so that a message
    about its contents names it as the user typed it."""
    p = Path(path).expanduser()
    label = _label(p, flag)
    if p.is_dir():
        raise UserError(f"{label}: is a directory; give a file")
    if not p.is_file():
        raise UserError(f"{label}: no such file")
    if not os.access(p, os.R_OK):
        raise UserError(f"{label}: not readable")
    return p


def check_input_dir(path: str | Path, flag: str | None = None) -> Path:
    """``path`` is an existing, readable directory. Returns it as given (``~`` expanded)."""
    p = Path(path).expanduser()
    label = _label(p, flag)
    if p.exists() and not p.is_dir():
        raise UserError(f"{label}: is a file, not a directory")
    if not p.is_dir():
        raise UserError(f"{label}: no such directory")
    if not os.access(p, os.R_OK | os.X_OK):
        raise UserError(f"{label}: not readable")
    return p
