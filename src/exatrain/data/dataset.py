"""A prepared dataset on disk: token shards and the ``dataset.json`` that describes them.

    data/
      dataset.json        format, dtype, vocab size, separator, tokenizer identity, per shard: tokens,
                          sha256 and largest token id
      tokenizer.json      the tokenizer that made the shards (its sha256 is the identity)
      shard-00000.bin     token ids, little-endian uint16 (vocab <= 65,536) or uint32, back to back
      ...

The shards are raw arrays (``numpy.memmap`` reads them without loading), so the stream of tokens is
the concatenation of the shards in order; documents inside it end with the separator id.
Every field of dataset.json is type-checked on reading (it may be hand-edited or crafted). Reading
checks what is cheap (the metadata, the tokenizer's hash, every shard's size); ``check_dataset_for``
(before a run's ranks start) adds what a model needs (ids inside its vocabulary, one sample window)
and, as ``verify`` (``exatrain prepare --verify``) does, every shard's sha256: a shard whose bytes
changed since ``prepare`` is refused in one line naming it, before anything trains on it (one pass
over the data, about 0.7 GB/s on one CPU core). A shard that hashed right is recorded in the directory's
``.exatrain-verified.json`` with its size and modification time, and a later run start reads it again only
where either changed (``check_shards``): a restart of a run on a large dataset does not hash it again.
``prepare --verify`` always reads every byte (a shard rewritten with its size and time kept, or rotted on
disk, is only found so). Where the directory is read-only nothing is recorded and every start hashes.
The trainer checks each window it reads too (trainer/sampler.py), so a shard changed while a run reads it
stops with one line, not in the embedding.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exatrain.errors import UserError
from exatrain.jsonio import read_json

DATASET_FORMAT = "exatrain-tokens"
VERSION = 1
META = "dataset.json"
TOKENIZER = "tokenizer.json"
VERIFIED = ".exatrain-verified.json"  # the shards that hashed right, with their size and modification time


def token_dtype(vocab: int) -> str:
    """The smallest of uint16/uint32 that holds every id below ``vocab``."""
    return "uint16" if vocab <= 2**16 else "uint32"


@dataclass(frozen=True)
class Shard:
    file: str
    tokens: int
    sha256: str
    max_id: int | None = None  # the largest token id in the shard (None: a dataset.json from before it was kept)


def _field(d: dict, key: str, kind: type, source: str, where: str = "") -> Any:
    """``d[key]`` if it is a ``kind`` (an int is never a bool), else one UserError line naming it."""
    label = f"{where}{key}"
    if key not in d:
        raise UserError(f"{source}: malformed dataset description (no {label!r})")
    value = d[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise UserError(
            f"{source}: malformed dataset description ({label!r} is {type(value).__name__} "
            f"{str(value)[:40]!r}, not {kind.__name__})"
        )
    if kind is int and value < 0:
        raise UserError(f"{source}: malformed dataset description ({label!r} is negative)")
    return value


def plain_name(name: str) -> bool:
    """A file name that stays inside its directory: no separator, no NUL, not hidden, not . or .."""
    return bool(name) and not name.startswith(".") and not any(c in name for c in "/\\\0")


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
        return {
            "format": DATASET_FORMAT,
            "version": VERSION,
            "dtype": self.dtype,
            "vocab_size": self.vocab_size,
            "separator": self.separator,
            "separator_id": self.separator_id,
            "tokenizer": {"file": TOKENIZER, "sha256": self.tokenizer_sha256},
            "documents": self.documents,
            "tokens": self.tokens,
            "shards": [
                {
                    "file": s.file,
                    "tokens": s.tokens,
                    "sha256": s.sha256,
                    **({} if s.max_id is None else {"max_id": s.max_id}),
                }
                for s in self.shards
            ],
            "sources": self.sources,
        }

    @classmethod
    def from_dict(cls, d: Any, source: str) -> "DatasetMeta":
        """Every field type-checked (a hand-edited or crafted dataset.json is one UserError line)."""
        if not isinstance(d, dict) or d.get("format") != DATASET_FORMAT:
            raise UserError(f"{source}: not an exatrain dataset description (format {DATASET_FORMAT!r})")
        if d.get("version") != VERSION:
            raise UserError(f"{source}: dataset version {d.get('version')!r} is not {VERSION}")
        tokenizer = _field(d, "tokenizer", dict, source)
        shards = []
        for i, s in enumerate(_field(d, "shards", list, source)):
            if not isinstance(s, dict):
                raise UserError(f"{source}: malformed dataset description (shards[{i}] is not an object)")
            at = f"shards[{i}]."
            max_id = _field(s, "max_id", int, source, at) if "max_id" in s else None
            shards.append(
                Shard(
                    _field(s, "file", str, source, at),
                    _field(s, "tokens", int, source, at),
                    _field(s, "sha256", str, source, at),
                    max_id,
                )
            )
        sources = d.get("sources") or {}
        if not isinstance(sources, dict):
            raise UserError(f"{source}: malformed dataset description ('sources' is not an object)")
        meta = cls(
            dtype=_field(d, "dtype", str, source),
            vocab_size=_field(d, "vocab_size", int, source),
            separator=_field(d, "separator", str, source),
            separator_id=_field(d, "separator_id", int, source),
            tokenizer_sha256=_field(tokenizer, "sha256", str, source, "tokenizer."),
            documents=_field(d, "documents", int, source),
            shards=tuple(shards),
            sources=dict(sources),
        )
        if meta.dtype not in ("uint16", "uint32"):
            raise UserError(f"{source}: token dtype {meta.dtype!r} is not uint16 or uint32")
        if not 0 < meta.vocab_size <= 2 ** (8 * np.dtype(meta.dtype).itemsize):
            raise UserError(f"{source}: vocab_size {meta.vocab_size} does not fit token dtype {meta.dtype}")
        if meta.separator_id >= meta.vocab_size:
            raise UserError(
                f"{source}: separator id {meta.separator_id} is beyond the vocabulary ({meta.vocab_size} ids)"
            )
        bad = next((s.file for s in meta.shards if not plain_name(s.file)), None)
        if bad is not None:
            raise UserError(f"{source}: shard name {bad!r} is not a plain file name in the dataset directory")
        if len({s.file for s in meta.shards}) != len(meta.shards):
            raise UserError(f"{source}: a shard is listed twice")
        for s in meta.shards:
            if s.max_id is not None and s.max_id >= meta.vocab_size:
                raise UserError(
                    f"{source}: shard {s.file} holds token id {s.max_id}, beyond the tokenizer's "
                    f"{meta.vocab_size} ids; prepare the data again"
                )
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
    raw = read_json(path)
    meta = DatasetMeta.from_dict(raw, str(path))
    tok = root / TOKENIZER
    if not tok.is_file():
        raise UserError(f"{root}: {TOKENIZER} is missing")
    _check_sha256(
        tok,
        meta.tokenizer_sha256,
        "cannot read",
        f"its sha256 is not the one {META} records (the tokenizer changed since the shards were made)",
    )
    if not meta.shards or meta.tokens < 2:
        raise UserError(f"{root}: the dataset holds no tokens")
    itemsize = np.dtype(meta.dtype).itemsize
    for s in meta.shards:
        f = root / s.file
        if not f.is_file():
            raise UserError(f"{f}: shard missing")
        if f.stat().st_size != s.tokens * itemsize:
            raise UserError(
                f"{f}: shard is {f.stat().st_size} bytes but {META} says {s.tokens} tokens "
                f"({s.tokens * itemsize} bytes): truncated or overwritten"
            )
    return meta


def shard_max_ids(data_dir: str | Path, meta: DatasetMeta) -> list[int]:
    """The largest token id of every shard: as ``prepare`` recorded it, or, for a dataset.json from
    before it was recorded, read from the shard (one numpy pass over its memory map)."""
    out = []
    for s, arr in zip(meta.shards, open_shards(data_dir, meta)):
        out.append(s.max_id if s.max_id is not None else (int(arr.max()) if arr.size else 0))
    return out


def check_vocab(vocab_size: int, vocab: int, model_name: str, where: str = "the training data") -> None:
    """Every token id the data's tokenizer can produce must have an embedding row."""
    if vocab < vocab_size:
        raise UserError(
            f"{model_name} has vocab {vocab} but {where} needs {vocab_size} token ids "
            f"(its tokenizer's vocabulary); use --vocab {vocab_size} or more"
        )


def check_dataset_for(plan: Any, data_dir: str | Path, where: str | None = None) -> DatasetMeta:
    """Can ``plan``'s model train on the dataset in ``data_dir``? Run before any rank starts.

    The cheap checks of read_meta, then: the tokenizer's vocabulary fits the model's embedding; the
    stream holds at least one sample window, seq_len + 1 tokens (inputs and next-token targets);
    every shard's largest token id (shard_max_ids) is inside the tokenizer's vocabulary (else the
    shard is corrupted or crafted), hence inside the model's; every shard's sha256 is the one dataset.json
    records (``check_shards``). Each failure is one UserError line naming the file and the fix. Returns
    the description."""
    root = Path(data_dir)
    meta = read_meta(root)
    model = plan.model
    check_vocab(meta.vocab_size, model.vocab, model.name, where=where or f"the training data ({root})")
    window = model.seq_len + 1
    if meta.tokens < window:
        raise UserError(
            f"{root}: the dataset holds {meta.tokens} tokens, fewer than one sample of {model.name} "
            f"(seq_len {model.seq_len} + 1 = {window} tokens); prepare more text into it or "
            f"train with a shorter --seq-len"
        )
    for s, top in zip(meta.shards, shard_max_ids(root, meta)):
        if top >= meta.vocab_size:
            raise UserError(
                f"{root / s.file}: holds token id {top}, beyond its tokenizer's {meta.vocab_size} "
                f"ids: the shard is corrupted or not made by {TOKENIZER}; prepare the data again"
            )
    check_shards(root, meta)
    return meta


def check_shards(data_dir: str | Path, meta: DatasetMeta, *, recheck: bool = False) -> None:
    """Every shard's sha256 against the one dataset.json records: a one-line UserError naming the first
    shard whose bytes changed since ``prepare``. A shard whose size, modification time and recorded sha256 are
    those ``VERIFIED`` holds for it hashed right before and is not read again, unless ``recheck``; the shards that
    hash right are recorded there (where the directory is writable; module doc)."""
    root = Path(data_dir)
    known = {} if recheck else _read_verified(root)
    checked: dict[str, dict[str, Any]] = {}
    for s in meta.shards:
        path = root / s.file
        try:
            st = path.stat()
        except OSError as exc:
            raise UserError(f"{path}: cannot read the shard ({exc.strerror or exc})") from None
        entry = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": s.sha256}
        if known.get(s.file) != entry:
            _check_sha256(
                path,
                s.sha256,
                "cannot read the shard",
                f"shard is corrupted (its sha256 differs from the one {META} records: its bytes changed "
                "since `exatrain prepare`); prepare the data again",
            )
        checked[s.file] = entry
    if checked != known:
        _write_verified(root, checked)


def _read_verified(root: Path) -> dict[str, dict[str, Any]]:
    """What ``VERIFIED`` records ({} where it is missing, unreadable or not the expected shape: then every shard
    is hashed)."""
    try:
        raw = json.loads((root / VERIFIED).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {}
    shards = raw.get("shards") if isinstance(raw, dict) and raw.get("version") == 1 else None
    if not isinstance(shards, dict):
        return {}
    return {k: v for k, v in shards.items() if isinstance(k, str) and isinstance(v, dict)}


def _write_verified(root: Path, shards: dict[str, dict[str, Any]]) -> None:
    """Record ``shards`` in ``VERIFIED`` (written whole, then renamed into place); a directory that cannot be
    written records nothing (every start then hashes)."""
    tmp = root / f"{VERIFIED}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps({"version": 1, "shards": shards}, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, root / VERIFIED)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


def _check_sha256(path: Path, expected: str, unreadable: str, differs: str) -> None:
    """``path``'s sha256 against the recorded one: a one-line UserError, ``unreadable`` or ``differs``, naming it."""
    try:
        digest = sha256_file(path)
    except OSError as exc:
        raise UserError(f"{path}: {unreadable} ({exc.strerror or exc})") from None
    if digest != expected:
        raise UserError(f"{path}: {differs}")


def verify(data_dir: str | Path) -> DatasetMeta:
    """read_meta, then every shard's sha256 against the recorded one, every byte read whatever ``VERIFIED``
    records (check_shards with ``recheck``)."""
    meta = read_meta(data_dir)
    check_shards(data_dir, meta, recheck=True)
    return meta


def open_shards(data_dir: str | Path, meta: DatasetMeta) -> list[np.ndarray]:
    """Read-only memory maps of the shards, in order (an empty shard is an empty array: mmap refuses
    empty files)."""
    dtype = np.dtype(meta.dtype).newbyteorder("<")
    out = []
    for s in meta.shards:
        path = Path(data_dir) / s.file
        if s.tokens == 0:
            out.append(np.zeros(0, dtype=dtype))
            continue
        try:
            out.append(np.memmap(path, dtype=dtype, mode="r", shape=(s.tokens,)))
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: cannot map the shard ({getattr(exc, 'strerror', None) or exc})") from None
    return out


__all__ = [
    "DatasetMeta",
    "META",
    "Shard",
    "TOKENIZER",
    "VERIFIED",
    "check_dataset_for",
    "check_shards",
    "check_vocab",
    "open_shards",
    "plain_name",
    "read_meta",
    "sha256_file",
    "shard_max_ids",
    "token_dtype",
    "verify",
]
