"""A run start does not hash a large dataset again: the shards that hashed right are recorded in the data
directory's ``.exatrain-verified.json`` with their size and modification time, and only a shard whose size or
time changed is read again; ``prepare --verify`` reads every byte whatever the record says.

Broken on purpose (each fails here): ``check_shards`` ignoring the record (hashing every start) fails
``test_a_second_start_reads_no_shard_again``; a record keyed on the size alone (not the modification time) fails
``test_a_shard_rewritten_is_hashed_again_and_refused``; ``verify`` trusting the record fails
``test_prepare_verify_reads_every_byte_whatever_the_record_says``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from exatrain.cli import main
from exatrain.data import dataset
from exatrain.errors import UserError
from tests.data.test_untrusted_data import byte_data, gpt_tiny


def _counting(monkeypatch) -> list[Path]:  # type: ignore[no-untyped-def]
    """Every shard (or tokenizer) hashed from now on, in order."""
    seen: list[Path] = []
    real = dataset.sha256_file

    def counted(path: Path, chunk: int = 1 << 22) -> str:
        seen.append(Path(path))
        return real(path, chunk)

    monkeypatch.setattr(dataset, "sha256_file", counted)
    return seen


def _shards(data: Path) -> list[Path]:
    return [data / s.file for s in dataset.read_meta(data).shards]


def test_a_second_start_reads_no_shard_again(tmp_path: Path, monkeypatch) -> None:
    data = byte_data(tmp_path, "abcd " * 400, shard_tokens=300)
    shards = _shards(data)
    assert len(shards) >= 3
    seen = _counting(monkeypatch)
    dataset.check_dataset_for(gpt_tiny(), data)
    assert [p for p in seen if p in shards] == shards  # the first start hashes every shard
    record = json.loads((data / dataset.VERIFIED).read_text())
    assert record["version"] == 1 and set(record["shards"]) == {p.name for p in shards}
    entry = record["shards"][shards[0].name]
    assert entry["bytes"] == shards[0].stat().st_size and entry["mtime_ns"] == shards[0].stat().st_mtime_ns
    seen.clear()
    dataset.check_dataset_for(gpt_tiny(), data)
    assert not [p for p in seen if p in shards]  # the second reads none


def test_a_shard_rewritten_is_hashed_again_and_refused(tmp_path: Path, monkeypatch) -> None:
    data = byte_data(tmp_path, "abcd " * 400, shard_tokens=300)
    dataset.check_dataset_for(gpt_tiny(), data)
    shard = _shards(data)[1]
    raw = bytearray(shard.read_bytes())
    raw[0] ^= 1  # same size, other bytes, a later modification time
    st = shard.stat()
    shard.write_bytes(bytes(raw))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    seen = _counting(monkeypatch)
    with pytest.raises(UserError, match="shard is corrupted") as err:
        dataset.check_dataset_for(gpt_tiny(), data)
    assert shard.name in str(err.value) and "\n" not in str(err.value)
    assert [p for p in seen if p.name.startswith("shard")] == [shard]  # only the changed one is read


def test_prepare_verify_reads_every_byte_whatever_the_record_says(tmp_path: Path, capsys) -> None:
    data = byte_data(tmp_path, "abcd " * 400, shard_tokens=300)
    dataset.check_dataset_for(gpt_tiny(), data)
    shard = _shards(data)[0]
    st = shard.stat()
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 1
    shard.write_bytes(bytes(raw))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and time kept: the record cannot see it
    dataset.check_dataset_for(gpt_tiny(), data)  # the documented limit of a run start's check
    assert main(["prepare", "--verify", str(data)]) == 2
    err = capsys.readouterr().err
    assert "shard is corrupted" in err and shard.name in err and len(err.strip().splitlines()) == 1


def test_a_record_that_is_not_json_or_not_ours_is_ignored(tmp_path: Path, monkeypatch) -> None:
    data = byte_data(tmp_path, "abcd " * 400, shard_tokens=300)
    shards = _shards(data)
    for junk in (
        "not json {",
        json.dumps([1, 2]),
        json.dumps({"version": 2, "shards": {}}),
        json.dumps({"version": 1, "shards": {shards[0].name: "x"}}),
    ):
        (data / dataset.VERIFIED).write_text(junk)
        seen = _counting(monkeypatch)
        dataset.check_shards(data, dataset.read_meta(data))
        assert [p for p in seen if p in shards] == shards, junk
        assert json.loads((data / dataset.VERIFIED).read_text())["version"] == 1  # rewritten whole


def test_a_directory_that_cannot_be_written_records_nothing(tmp_path: Path, monkeypatch) -> None:
    data = byte_data(tmp_path, "abcd " * 400, shard_tokens=300)

    def refuse(src, dst) -> None:  # type: ignore[no-untyped-def]
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(dataset.os, "replace", refuse)
    dataset.check_dataset_for(gpt_tiny(), data)
    assert sorted(p.name for p in data.iterdir() if p.name.startswith(".")) == []  # no record, no temp file
    seen = _counting(monkeypatch)
    dataset.check_dataset_for(gpt_tiny(), data)
    assert len([p for p in seen if p.name.startswith("shard")]) == len(_shards(data))  # every start hashes
