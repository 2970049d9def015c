"""`exatrain prepare`: tokenizers, shards and their description, verification, bad input.

Broken on purpose and seen to fail here: the progress bar on rich's default console (stdout) and the tokenizer
trainer's progress shown when stdout is a pipe (test_a_piped_prepare_writes_its_summary_alone_on_stdout); the
binary-file check skipped (``check_text`` not called: the "a binary input" case trains a tokenizer).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from exatrain.cli import main
from exatrain.data import dataset
from exatrain.data import tokenizer as tk
from exatrain.data.prepare import stdlib_documents

TEXTS = {
    "a/one.txt": "The quick brown fox jumps over the lazy dog. " * 20,
    "a/two.txt": "Pack my box with five dozen liquor jugs! Ünïcödé ✓ " * 15,
    "b/deep/three.txt": "def f(x):\n    return x * 2\n" * 30,
}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    for name, text in TEXTS.items():
        (tmp_path / "corpus" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "corpus" / name).write_text(text, encoding="utf-8")
    return tmp_path / "corpus"


def test_byte_tokenizer_is_the_identity_on_utf8_bytes() -> None:
    tok = Tokenizer.from_str(tk.byte_tokenizer_json())
    texts = [d.path.read_text(encoding="utf-8") for d in stdlib_documents()[:20]] + ["Ünïcödé ✓ \t\r\n", "\x00x"]
    fast = list(tk.encode_documents(tok, texts, byte_identity=True))
    slow = list(tk.encode_documents(tok, texts, byte_identity=False))
    assert all(np.array_equal(a, b) for a, b in zip(fast, slow))
    assert tk.vocab_size(tok) == 256 and tok.token_to_id(tk.byte_separator()) == 0
    assert tok.decode(list(b"caf\xc3\xa9")) == "café"


def test_prepare_trains_a_bpe_and_writes_checked_shards(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "data"
    assert (
        main(
            [
                "prepare",
                "--input",
                str(corpus / "**" / "*.txt"),
                "--train-tokenizer",
                "300",
                "--shard-tokens",
                "500",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == ""  # --quiet: no bar, no summary
    meta = dataset.verify(out)
    raw = json.loads((out / "dataset.json").read_text())
    assert raw["documents"] == 3 and raw["dtype"] == "uint16" and raw["vocab_size"] == 300
    assert raw["tokenizer"]["sha256"] == hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest()
    assert len(meta.shards) > 1 and all(s.tokens <= 500 for s in meta.shards)
    assert raw["tokens"] == sum(s["tokens"] for s in raw["shards"])
    for s in raw["shards"]:
        assert hashlib.sha256((out / s["file"]).read_bytes()).hexdigest() == s["sha256"]
        assert s["max_id"] == int(np.fromfile(out / s["file"], dtype="<u2").max())
    stream = np.concatenate(dataset.open_shards(out, meta))
    tok = tk.load(out / "tokenizer.json")
    sep = tok.token_to_id(tk.SEPARATOR)
    assert meta.separator_id == sep and stream[-1] == sep and (stream == sep).sum() == 3
    ends = np.flatnonzero(stream == sep)
    docs = [stream[: ends[0]]] + [stream[a + 1 : b] for a, b in zip(ends, ends[1:])]
    assert [tok.decode(d.tolist()) for d in docs] == [TEXTS[k] for k in sorted(TEXTS)]  # sorted by path


def test_a_piped_prepare_writes_its_summary_alone_on_stdout(corpus: Path, tmp_path: Path) -> None:
    """Without --quiet, the tokenizer's training and the tokenizing bar go to stderr (or nowhere): stdout, a pipe
    here, holds the one summary line."""
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "exatrain",
            "prepare",
            "--input",
            str(corpus / "**" / "*.txt"),
            "--train-tokenizer",
            "300",
            "--out",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [out.stdout.strip()]
    assert out.stdout.startswith(f"{tmp_path / 'data'}: 3 documents")
    assert "tokenizing 3 files" in out.stderr


def test_prepare_with_a_given_tokenizer_and_the_stdlib(corpus: Path, tmp_path: Path) -> None:
    (tmp_path / "tok.json").write_text(tk.train_bpe(TEXTS.values(), 280), encoding="utf-8")
    assert (
        main(
            [
                "prepare",
                "--input",
                str(corpus / "a" / "*.txt"),
                "--tokenizer",
                str(tmp_path / "tok.json"),
                "--out",
                str(tmp_path / "given"),
                "--quiet",
            ]
        )
        == 0
    )
    meta = dataset.read_meta(tmp_path / "given")
    assert meta.documents == 2 and meta.tokenizer_sha256 == tk.identity((tmp_path / "tok.json").read_text())
    assert main(["prepare", "--stdlib", "--out", str(tmp_path / "std"), "--quiet"]) == 0
    std = dataset.read_meta(tmp_path / "std")
    assert std.vocab_size == 256 and std.documents == len(stdlib_documents())
    assert std.tokenizer_sha256 == tk.byte_tokenizer_identity()


def test_token_dtype_follows_the_vocabulary() -> None:
    assert dataset.token_dtype(256) == "uint16" and dataset.token_dtype(65536) == "uint16"
    assert dataset.token_dtype(65537) == "uint32" and dataset.token_dtype(128256) == "uint32"


def test_a_corrupted_or_truncated_shard_is_named(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "data"
    assert (
        main(
            [
                "prepare",
                "--input",
                str(corpus / "**" / "*.txt"),
                "--train-tokenizer",
                "260",
                "--shard-tokens",
                "400",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    shard = out / "shard-00001.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    dataset.read_meta(out)  # sizes still agree: only the checksum can tell
    assert main(["prepare", "--verify", str(out)]) == 2
    err = capsys.readouterr().err
    assert "shard-00001.bin: shard is corrupted" in err and len(err.strip().splitlines()) == 1
    shard.write_bytes(bytes(data[:-2]))
    with pytest.raises(Exception, match="shard-00001.bin: shard is .* truncated"):
        dataset.read_meta(out)


BAD = {
    "no input matches": (["--input", "NOPE/*.txt", "--train-tokenizer", "300"], "matches no files"),
    "no tokenizer": (["--input", "CORPUS/**/*.txt"], "--tokenizer tokenizer.json or --train-tokenizer"),
    "tokenizer is not json": (
        ["--input", "CORPUS/**/*.txt", "--tokenizer", "CORPUS/a/one.txt"],
        "not a Hugging Face tokenizer.json",
    ),
    "vocab below the bytes": (["--input", "CORPUS/**/*.txt", "--train-tokenizer", "100"], "at least 257"),
    "vocab beyond any real one": (
        ["--input", "CORPUS/**/*.txt", "--train-tokenizer", "100000000"],
        "--train-tokenizer 100,000,000 is beyond the 1,048,576 ids",
    ),
    "out holds a dataset": (["--stdlib", "--out", "EXISTING"], "already holds a dataset"),
    "a binary input": (["--input", "BINARY", "--train-tokenizer", "300"], "is a binary file, not text"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_exit_2(
    case: str, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "dataset.json").write_text("{}")
    argv, message = BAD[case]
    binary = tmp_path / "model.bin"  # what a wrong glob picks up: bytes with NULs, not text
    binary.write_bytes(bytes(range(256)) * 8)
    argv = [
        a.replace("CORPUS", str(corpus))
        .replace("NOPE", str(tmp_path / "nope"))
        .replace("EXISTING", str(existing))
        .replace("BINARY", str(binary))
        for a in argv
    ]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    assert main(["prepare", *argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))
