"""JSON files read and written safely: one clear line for a file that is missing or not JSON, and a write that a
reader sees whole or not at all. Every layer's files (plans, calibrations, checkpoints' manifests, run records) go
through these."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from exatrain.errors import UserError

# The version of the objects `--json` prints (docs/json.md lists their keys): raised when a key is renamed or
# removed or changes meaning, so a script can refuse output it does not know; a key added keeps it.
JSON_FORMAT_VERSION = 1


def versioned(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` (a command's --json object) with ``format_version`` as its first key."""
    return {"format_version": JSON_FORMAT_VERSION, **obj}


def iter_json_lines(path: Path, text: str, hint: str = ""):
    """(line number, parsed object) of every non-blank line of a JSON-lines text; a line that is
    not JSON is a UserError naming it (``hint`` is added to the message)."""
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except ValueError:
            raise UserError(f"{path}:{lineno}: not a JSON line{hint}") from None


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``; one UserError line when it is missing, a directory, unreadable or
    not JSON (nesting too deep for the parser included). Callers type-check what it holds."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a directory; give a JSON file")
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({str(exc).splitlines()[0][:200]})") from None
    except RecursionError:
        raise UserError(f"{path}: not valid JSON (nested too deeply)") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None


def write_json_atomic(path: str | Path, obj: Any, *, durable: bool = False, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON to ``path`` so that a reader sees the old file or the whole new one.

    The text goes to a temporary file of a unique name in the target's own directory (the same
    filesystem, so the final ``os.replace`` is atomic; POSIX rename(2)), which is removed again if
    anything fails. A directory target is refused (UserError), as is a value JSON cannot hold
    (before any file exists). ``durable`` fsyncs the file and its directory before returning.
    The new file gets the old one's permissions, or the umask's."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a directory; give a file name")
    text = json.dumps(obj, indent=indent) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise UserError(f"{path}: cannot write there ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from None
        raise
    if durable:
        _fsync_dir(path.parent)


def _mode_for(path: Path) -> int:
    """Permission bits for a new ``path``: the existing file's, else 0666 less the umask (mkstemp
    creates its files private)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened or synced)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["JSON_FORMAT_VERSION", "iter_json_lines", "read_json", "versioned", "write_json_atomic"]
