"""A prepared dataset read as untrusted input: every field of dataset.json type-checked, the largest
token id per shard recorded and checked against the model before any rank starts (or read from the
shards for a dataset.json that predates it), a dataset shorter than one sample refused, a shard
whose bytes changed after `prepare` refused before any rank starts (its sha256), and one changed while
a run reads it stopped with one line by the sampler, never in the embedding."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exatrain.catalog import get_model
from exatrain.cli import main
from exatrain.data import dataset
from exatrain.data import tokenizer as tk
from exatrain.data.prepare import Document, prepare
from exatrain.errors import UserError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.trainer.sampler import TokenShards


def gpt_tiny(**fields) -> Plan:
    model = get_model("gpt-tiny")
    if fields:
        model = type(model).from_dict({**model.to_dict(), **fields}, source="test")
    return Plan(model=model, dims=ParallelDims(), shape=TrainShape(2, 4), cluster="local-cpu").validate()


def byte_data(root: Path, text: str, shard_tokens: int = 400) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "a.txt").write_text(text, encoding="utf-8")
    prepare(
        [Document("a.txt", root / "a.txt")],
        root / "data",
        tokenizer_json=tk.byte_tokenizer_json(),
        separator=tk.byte_separator(),
        shard_tokens=shard_tokens,
        quiet=True,
    )
    return root / "data"


def edit_meta(data: Path, change) -> None:  # type: ignore[no-untyped-def]
    raw = json.loads((data / "dataset.json").read_text())
    change(raw)
    (data / "dataset.json").write_text(json.dumps(raw))


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_prepare_records_each_shards_largest_id(tmp_path: Path) -> None:
    data = byte_data(tmp_path, "hello world, " * 100 + "~")
    meta = dataset.read_meta(data)
    stream = [np.asarray(a) for a in dataset.open_shards(data, meta)]
    assert [s.max_id for s in meta.shards] == [int(a.max()) for a in stream] and len(stream) > 1
    assert dataset.shard_max_ids(data, meta) == [s.max_id for s in meta.shards]


def test_a_dataset_json_without_max_ids_still_reads_and_is_checked_from_the_shards(tmp_path: Path) -> None:
    data = byte_data(tmp_path, "abc " * 300)
    edit_meta(data, lambda raw: [s.pop("max_id") for s in raw["shards"]])
    meta = dataset.read_meta(data)
    assert all(s.max_id is None for s in meta.shards)
    assert dataset.shard_max_ids(data, meta) == [int(np.asarray(a).max()) for a in dataset.open_shards(data, meta)]
    dataset.check_dataset_for(gpt_tiny(), data)
    shard = data / meta.shards[1].file  # a same-size shard holding an id beyond the byte tokenizer's 256
    ids = np.fromfile(shard, dtype="<u2")
    ids[3] = 300
    ids.tofile(shard)
    with pytest.raises(UserError) as exc:
        dataset.check_dataset_for(gpt_tiny(), data)
    assert one_line(exc).startswith(f"{shard}: holds token id 300, beyond its tokenizer's 256 ids")
    assert "prepare the data again" in str(exc.value)


def test_a_recorded_max_id_beyond_the_vocabulary_is_refused(tmp_path: Path) -> None:
    data = byte_data(tmp_path, "abc " * 300)

    def beyond(raw: dict) -> None:
        raw["shards"][0]["max_id"] = 256

    edit_meta(data, beyond)
    with pytest.raises(UserError) as exc:
        dataset.read_meta(data)
    assert "shard shard-00000.bin holds token id 256, beyond the tokenizer's 256 ids" in one_line(exc)


def test_a_dataset_shorter_than_one_sample_is_refused_before_any_rank(tmp_path: Path) -> None:
    plan = gpt_tiny()
    window = plan.model.seq_len + 1
    short = byte_data(tmp_path / "short", "x" * (window - 2))  # + the separator: window - 1 tokens
    exact = byte_data(tmp_path / "ok", "x" * (window - 1))  # exactly one window
    with pytest.raises(UserError) as exc:
        dataset.check_dataset_for(plan, short)
    assert one_line(exc) == (
        f"{short}: the dataset holds {window - 1} tokens, fewer than one sample of gpt-tiny "
        f"(seq_len {plan.model.seq_len} + 1 = {window} tokens); prepare more text into it or "
        "train with a shorter --seq-len"
    )
    assert dataset.check_dataset_for(plan, exact).tokens == window
    src = TokenShards(short, shuffle=False)  # the rank's own guard: one line, not a ZeroDivisionError
    with pytest.raises(UserError, match="fewer than one sample"):
        src.sample(0, plan.model.seq_len)
    assert TokenShards(exact, shuffle=False).sample(5, plan.model.seq_len).numel() == window


def test_a_tokenizer_larger_than_the_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("the quick brown fox " * 200)
    prepare(
        [Document("a.txt", tmp_path / "a.txt")],
        tmp_path / "data",
        tokenizer_json=tk.train_bpe([(tmp_path / "a.txt").read_text()], 300),
        quiet=True,
    )
    vocab = dataset.read_meta(tmp_path / "data").vocab_size  # the merges the text supports, at most 300
    assert 256 < vocab <= 300
    with pytest.raises(UserError) as exc:
        dataset.check_dataset_for(gpt_tiny(), tmp_path / "data")
    assert one_line(exc).startswith(
        f"gpt-tiny has vocab 256 but the training data ({tmp_path / 'data'}) needs {vocab} token ids"
    ) and f"use --vocab {vocab} or more" in str(exc.value)
    dataset.check_dataset_for(gpt_tiny(vocab=vocab), tmp_path / "data")


def test_a_changed_shard_is_refused_before_the_ranks_and_stops_the_sampler(tmp_path: Path) -> None:
    """A shard overwritten after prepare with the same size: its size and recorded max_id still pass
    the cheap checks, its sha256 does not (check_dataset_for refuses it before any rank starts, naming
    it); a rank that reads it anyway (the shard changed under a running job) stops at the window that
    reads the bad id, with one line naming the shard."""
    data = byte_data(tmp_path, "".join(chr(97 + i % 26) for i in range(1000)), shard_tokens=300)
    meta = dataset.read_meta(data)
    shard = data / meta.shards[1].file
    ids = np.fromfile(shard, dtype="<u2")
    ids[10] = 5000
    ids.tofile(shard)
    with pytest.raises(UserError) as exc:  # sizes and recorded ids agree: only the hash tells
        dataset.check_dataset_for(gpt_tiny(), data)
    assert one_line(exc).startswith(f"{shard}: shard is corrupted (its sha256 differs")
    src = TokenShards(data, shuffle=False)
    seq = 16
    assert src.sample(0, seq).max() < 256
    bad = (300 + 10) // seq  # the window holding stream position 310
    with pytest.raises(UserError) as exc:
        src.sample(bad, seq)
    assert one_line(exc).startswith(f"{shard}: token 10 is id 5000, beyond the tokenizer's 256 ids")
    with pytest.raises(UserError, match="shard is corrupted"):
        dataset.verify(data)


MALFORMED = {
    "shards not a list": (lambda r: r.update(shards={"file": "x"}), "'shards' is dict"),
    "shard entry not an object": (
        lambda r: r["shards"].__setitem__(0, "shard-00000.bin"),
        "shards[0] is not an object",
    ),
    "tokens a string": (lambda r: r["shards"][0].update(tokens="12"), "'shards[0].tokens' is str"),
    "tokens a bool": (lambda r: r["shards"][0].update(tokens=True), "'shards[0].tokens' is bool"),
    "negative tokens": (lambda r: r["shards"][0].update(tokens=-4), "'shards[0].tokens' is negative"),
    "vocab a float": (lambda r: r.update(vocab_size=256.0), "'vocab_size' is float"),
    "tokenizer not an object": (lambda r: r.update(tokenizer="abc"), "'tokenizer' is str"),
    "no sha256": (lambda r: r["tokenizer"].pop("sha256"), "no 'tokenizer.sha256'"),
    "shard name escapes": (lambda r: r["shards"][0].update(file="../a.txt"), "not a plain file name"),
    "shard name absolute": (lambda r: r["shards"][0].update(file="/etc/passwd"), "not a plain file name"),
    "shard listed twice": (lambda r: r["shards"].append(dict(r["shards"][0])), "listed twice"),
    "separator beyond vocab": (lambda r: r.update(separator_id=999), "separator id 999 is beyond"),
    "vocab too large for dtype": (lambda r: r.update(vocab_size=70000), "does not fit token dtype uint16"),
    "sources not an object": (lambda r: r.update(sources=[1, 2]), "'sources' is not an object"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_dataset_json_is_one_line_and_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data = byte_data(tmp_path, "abc " * 200)
    change, message = MALFORMED[case]
    edit_meta(data, change)
    before = sorted(p.name for p in data.iterdir())
    assert main(["prepare", "--verify", str(data)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in data.iterdir()) == before


def test_deeply_nested_dataset_json_is_one_line(tmp_path: Path) -> None:
    data = byte_data(tmp_path, "abc " * 200)
    (data / "dataset.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="not valid JSON .nested too deeply"):
        dataset.read_meta(data)


def test_an_empty_shard_listed_in_dataset_json_is_read_as_empty(tmp_path: Path) -> None:
    data = byte_data(tmp_path, "abc " * 200)
    (data / "shard-empty.bin").write_bytes(b"")

    def add(raw: dict) -> None:
        raw["shards"].insert(1, {"file": "shard-empty.bin", "tokens": 0, "sha256": "0" * 64})

    edit_meta(data, add)
    src = TokenShards(data, shuffle=False)
    seq = 64
    assert [int(x) for x in src.sample(6, seq)] == [
        int(x)
        for x in np.concatenate([np.asarray(a) for a in dataset.open_shards(data, dataset.read_meta(data))])[
            6 * seq : 7 * seq + 1
        ]
    ]


@pytest.mark.parametrize("damage", ["short", "id beyond the vocabulary"])
def test_a_rank_given_such_data_stops_with_one_line(damage: str, tmp_path: Path, one_rank: None) -> None:
    """Inside a rank (one, in this process) the same data ends the run with a UserError line (the
    launcher re-raises it in the parent), not a ZeroDivisionError or an IndexError in the embedding."""
    from exatrain.trainer.config import TrainConfig
    from exatrain.trainer.train import Trainer

    plan = gpt_tiny()
    if damage == "short":
        data, message = byte_data(tmp_path, "x" * 10), "fewer than one sample"
    else:
        data = byte_data(tmp_path, "abc " * 300)
        shard = data / "shard-00000.bin"
        ids = np.fromfile(shard, dtype="<u2")
        ids[:] = 4000  # every window reads it
        ids.tofile(shard)
        message = "shard-00000.bin: token 0 is id 4000, beyond the tokenizer's 256 ids"
    with pytest.raises(UserError) as exc:
        Trainer(TrainConfig(plan=plan, steps=2, quiet=True, data_dir=str(data), data_shuffle=False)).run()
    assert message in one_line(exc)
