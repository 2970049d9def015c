"""exatrain.paths: every check refuses with one UserError line and creates nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exatrain.errors import UserError
from exatrain.paths import check_input_dir, check_input_file, check_output_dir, check_output_file


def _snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_output_file_accepts_new_file_in_new_subdir(tmp_path: Path) -> None:
    before = _snapshot(tmp_path)
    assert check_output_file(tmp_path / "a" / "b.json") == (tmp_path / "a" / "b.json").absolute()
    assert _snapshot(tmp_path) == before  # nothing created


@pytest.mark.parametrize("case", ["dir", "parent_is_file", "empty"])
def test_output_file_refusals(tmp_path: Path, case: str) -> None:
    (tmp_path / "f").write_text("x")
    target = {"dir": tmp_path, "parent_is_file": tmp_path / "f" / "out.json", "empty": ""}[case]
    with pytest.raises(UserError) as exc:
        check_output_file(target, "--out")
    assert "\n" not in str(exc.value) and "--out" in str(exc.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere; the read-only check cannot fail as root")
def test_output_dir_read_only(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(UserError, match="not writable"):
            check_output_dir(ro / "ckpt", "--checkpoint-dir")
    finally:
        ro.chmod(0o700)


def test_output_dir_refuses_file_and_too_little_space(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        check_output_dir(tmp_path / "f", "--checkpoint-dir")
    with pytest.raises(UserError, match="MiB free"):
        check_output_dir(tmp_path / "ckpt", "--checkpoint-dir", need_bytes=1 << 62)
    assert not (tmp_path / "ckpt").exists()


def test_inputs(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert check_input_file(tmp_path / "f") == (tmp_path / "f").absolute()
    with pytest.raises(UserError, match="is a directory"):
        check_input_file(tmp_path, "--plan")
    with pytest.raises(UserError, match="no such file"):
        check_input_file(tmp_path / "missing", "--plan")
    with pytest.raises(UserError, match="is a file"):
        check_input_dir(tmp_path / "f", "--data")
    with pytest.raises(UserError, match="no such directory"):
        check_input_dir(tmp_path / "missing", "--data")
