"""The atomic JSON writer (jsonio.write_json_atomic) and reader (jsonio.read_json): a reader sees the old
file or the whole new one; the temporary file is unique, lies in the target's own directory and is
gone after a failure; a directory target is refused with one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from exatrain.cli import main
from exatrain.errors import UserError
from exatrain.jsonio import read_json, write_json_atomic


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_a_directory_target_is_refused_and_nothing_is_written_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "outdir"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    before = tree(tmp_path)
    with pytest.raises(UserError, match="outdir: is a directory; give a file name"):
        write_json_atomic(target, {"a": 1})
    assert tree(tmp_path) == before


def test_estimate_out_naming_a_directory_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    target = tmp_path / "tmp"  # `--out /tmp` once wrote /.tmp.tmp at the filesystem root
    target.mkdir()
    assert main(["estimate", "--model", "gpt-tiny", "--cluster", "local-cpu", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is a directory" in err, err
    assert tree(tmp_path) == {"tmp"}


def test_the_temporary_file_is_unique_and_in_the_targets_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, str]] = []
    real = os.replace

    def spy(src, dst):  # type: ignore[no-untyped-def]
        seen.append((str(src), str(dst)))
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    target = tmp_path / "sub" / "plan.json"
    write_json_atomic(target, {"n": 1})
    write_json_atomic(target, {"n": 2})
    assert json.loads(target.read_text()) == {"n": 2}
    (first, dst1), (second, dst2) = seen
    assert dst1 == dst2 == str(target)
    assert Path(first).parent == Path(second).parent == target.parent
    assert first != second and Path(first).name.startswith(".plan.json.")
    assert tree(tmp_path) == {"sub", "sub/plan.json"}


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "plan.json"
    write_json_atomic(target, {"old": True})

    def refuse(src, dst):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(UserError, match="plan.json: cannot write .No space left on device"):
        write_json_atomic(target, {"old": False})
    monkeypatch.undo()

    def interrupted(fd):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(target, {"old": False}, durable=True)
    assert json.loads(target.read_text()) == {"old": True}
    assert tree(tmp_path) == {"plan.json"}


def test_a_value_json_cannot_hold_fails_before_any_file_exists(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_json_atomic(tmp_path / "x" / "plan.json", {"bad": object()})
    assert tree(tmp_path) == set()


def test_permissions_follow_the_umask_or_the_replaced_file(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "new.json", [1])
        assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o644
        (tmp_path / "old.json").write_text("[]")
        (tmp_path / "old.json").chmod(0o600)
        write_json_atomic(tmp_path / "old.json", [2])
        assert (tmp_path / "old.json").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(umask)


def test_read_json_refuses_a_directory_and_deep_nesting_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is a directory; give a JSON file"):
        read_json(tmp_path)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="deep.json: not valid JSON"):
        read_json(deep)
    assert read_json(_written(tmp_path / "ok.json", {"a": [1, 2]})) == {"a": [1, 2]}


def _written(path: Path, obj: object) -> Path:
    write_json_atomic(path, obj)
    return path
