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


__all__ = ["append_run_record", "read_run_records"]
