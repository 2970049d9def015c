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


def run_cli(*argv: str) -> str:
    """stdout of one command, which must succeed (usable in session fixtures, where capsys is not)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(list(argv))
    assert rc == 0, f"exatrain {' '.join(argv)} -> {rc}"
    return buf.getvalue()
