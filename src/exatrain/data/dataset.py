"""A prepared dataset on disk: token shards and the ``dataset.json`` that describes them.

    data/
      dataset.json        format, dtype, vocab size, separator, tokenizer identity, per-shard counts + sha256
      tokenizer.json      the tokenizer that made the shards (its sha256 is the identity)
      shard-00000.bin     token ids, little-endian uint16 (vocab <= 65,536) or uint32, back to back
      ...

The shards are raw arrays (``numpy.memmap`` reads them without loading), so the stream of tokens is
the concatenation of the shards in order; documents inside it end with the separator id.
Reading checks what is cheap (the metadata, the tokenizer's hash, every shard's size);
``verify`` also recomputes every shard's sha256 (``exatrain prepare --verify``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exatrain.errors import UserError

FORMAT = "exatrain-tokens"
VERSION = 1
META = "dataset.json"
TOKENIZER = "tokenizer.json"


def token_dtype(vocab: int) -> str:
    """The smallest of uint16/uint32 that holds every id below ``vocab``."""
    return "uint16" if vocab <= 2**16 else "uint32"


@dataclass(frozen=True)
class Shard:
    file: str
    tokens: int
    sha256: str


@dataclass(frozen=True)
class DatasetMeta:
    dtype: str
    vocab_size: int
    separator: str
    separator_id: int
    tokenizer_sha256: str
    documents: int
    shards: tuple[Shard, ...]
    sources: dict[str, Any]

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "dtype": self.dtype, "vocab_size": self.vocab_size,
                "separator": self.separator, "separator_id": self.separator_id,
                "tokenizer": {"file": TOKENIZER, "sha256": self.tokenizer_sha256},
                "documents": self.documents, "tokens": self.tokens,
                "shards": [{"file": s.file, "tokens": s.tokens, "sha256": s.sha256} for s in self.shards],
                "sources": self.sources}

    @classmethod
    def from_dict(cls, d: Any, source: str) -> "DatasetMeta":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise UserError(f"{source}: not an exatrain dataset description (format {FORMAT!r})")
        if d.get("version") != VERSION:
            raise UserError(f"{source}: dataset version {d.get('version')!r} is not {VERSION}")
        try:
            meta = cls(dtype=str(d["dtype"]), vocab_size=int(d["vocab_size"]), separator=str(d["separator"]),
                       separator_id=int(d["separator_id"]), tokenizer_sha256=str(d["tokenizer"]["sha256"]),
                       documents=int(d["documents"]),
                       shards=tuple(Shard(str(s["file"]), int(s["tokens"]), str(s["sha256"])) for s in d["shards"]),
                       sources=dict(d.get("sources") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{source}: malformed dataset description ({type(exc).__name__}: {exc})") from None
        if meta.dtype not in ("uint16", "uint32"):
            raise UserError(f"{source}: token dtype {meta.dtype!r} is not uint16 or uint32")
        if any("/" in s.file or s.file.startswith(".") for s in meta.shards):
            raise UserError(f"{source}: shard names must be plain file names")
        return meta


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_meta(data_dir: str | Path) -> DatasetMeta:
    """The dataset's description, after the cheap checks: tokenizer hash and every shard's size."""
    root = Path(data_dir)
    if not root.is_dir():
        raise UserError(f"{root}: no such data directory (make one with `exatrain prepare --out {root}`)")
    path = root / META
    if not path.is_file():
        raise UserError(f"{root}: no {META} here; is this a directory made by `exatrain prepare`?")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({str(exc).splitlines()[0]})") from None
    meta = DatasetMeta.from_dict(raw, str(path))
    tok = root / TOKENIZER
    if not tok.is_file():
        raise UserError(f"{root}: {TOKENIZER} is missing")
    if hashlib.sha256(tok.read_bytes()).hexdigest() != meta.tokenizer_sha256:
        raise UserError(f"{tok}: its sha256 is not the one {META} records (the tokenizer changed since the "
                        "shards were made)")
    if not meta.shards or meta.tokens < 2:
        raise UserError(f"{root}: the dataset holds no tokens")
    itemsize = np.dtype(meta.dtype).itemsize
    for s in meta.shards:
        f = root / s.file
        if not f.is_file():
            raise UserError(f"{f}: shard missing")
        if f.stat().st_size != s.tokens * itemsize:
            raise UserError(f"{f}: shard is {f.stat().st_size} bytes but {META} says {s.tokens} tokens "
                            f"({s.tokens * itemsize} bytes): truncated or overwritten")
    return meta


def verify(data_dir: str | Path) -> DatasetMeta:
    """read_meta, then every shard's sha256 against the recorded one."""
    meta = read_meta(data_dir)
    for s in meta.shards:
        if sha256_file(Path(data_dir) / s.file) != s.sha256:
            raise UserError(f"{Path(data_dir) / s.file}: shard is corrupted (sha256 differs from {META})")
    return meta


def open_shards(data_dir: str | Path, meta: DatasetMeta) -> list[np.ndarray]:
    """Read-only memory maps of the shards, in order."""
    return [np.memmap(Path(data_dir) / s.file, dtype=np.dtype(meta.dtype).newbyteorder("<"), mode="r",
                      shape=(s.tokens,)) for s in meta.shards]


__all__ = ["DatasetMeta", "META", "Shard", "TOKENIZER", "open_shards", "read_meta", "sha256_file", "token_dtype",
           "verify"]
