"""RunRecord files: one JSON line per run, appended by the trainer and read back by calibrate, validate, tune and
the reports."""

from __future__ import annotations

import json
from pathlib import Path

from exatrain.errors import UserError
from exatrain.jsonio import iter_json_lines
from exatrain.plan import RunRecord


def append_run_record(path: str | Path, record: RunRecord) -> None:
    """Append one record as a JSON line (one write call, so concurrent appenders do not interleave)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record.to_dict()) + "\n")


def amend_last_run_record(path: str | Path, env: dict) -> RunRecord | None:
    """Add ``env``'s keys to the ``env`` of the last RunRecord line of ``path`` (what the launching process learnt
    after the ranks wrote it: the machine's load) and return that record; the file is rewritten aside and renamed
    into place. None (and the file untouched) when it holds no record."""
    import os
    import tempfile

    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for i in range(len(lines) - 1, -1, -1):
        try:
            obj = json.loads(lines[i])
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("kind") == "run_record":
            obj["env"] = {**(obj.get("env") or {}), **env}
            lines[i] = json.dumps(obj) + "\n"
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write("".join(lines))
            os.chmod(tmp, path.stat().st_mode & 0o7777)
            os.replace(tmp, path)
            return RunRecord.from_dict(obj, source=f"{path}:{i + 1}")
    return None


def read_run_records(path: str | Path) -> list[RunRecord]:
    """Every RunRecord line of a JSON-lines file (other kinds of lines, e.g. per-step metrics, are
    skipped). Malformed lines are a UserError naming the line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such runs file")
    records = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None
    for lineno, obj in iter_json_lines(path, text):
        if isinstance(obj, dict) and obj.get("kind") == "run_record":
            records.append(RunRecord.from_dict(obj, source=f"{path}:{lineno}"))
    return records


__all__ = ["amend_last_run_record", "append_run_record", "read_run_records"]
