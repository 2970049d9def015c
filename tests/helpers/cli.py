"""Running `exatrain` commands in-process, through ``exatrain.cli.main`` (the code path of the shell)."""

from __future__ import annotations

import contextlib
import io

import pytest

from exatrain.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """One command: (exit status, stdout, stderr), read through pytest's ``capsys``."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """One command that must be refused as bad input: exit status 2, one line on stderr, no traceback; that line."""
    code, _, err = run(capsys, *argv)
    assert code == 2, (code, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def refused_by_planner(capsys: pytest.CaptureFixture[str], message: str, *argv: str) -> None:
    """``estimate ARGV`` and ``search ARGV`` are each refused as bad input, their line holding ``message``."""
    for command in ("estimate", "search"):
        line = refused(capsys, command, *argv)
        assert message in line, (command, line)


def refusals(capsys: pytest.CaptureFixture[str], args: tuple[str, ...], cases) -> None:
    """Each ``(command, extra argv, text)`` of ``cases``, run with ``args`` after ``extra``, is refused as bad input in
    one line that holds ``text``."""
    for command, extra, text in cases:
        line = refused(capsys, command, *args, *extra)
        assert text in line, (command, extra, line)


def saved_plan(capsys: pytest.CaptureFixture[str], path, *argv: str) -> dict:
    """``exatrain estimate ARGV --out PATH``, which must succeed: the plan file it wrote, as JSON."""
    import json

    code, _, err = run(capsys, "estimate", *argv, "--out", str(path))
    assert code == 0, err
    return json.loads(path.read_text())


def run_cli(*argv: str) -> str:
    """stdout of one command, which must succeed (usable in session fixtures, where capsys is not)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(list(argv))
    assert rc == 0, f"exatrain {' '.join(argv)} -> {rc}"
    return buf.getvalue()
