"""``exatrain prepare``: text files -> a tokenizer -> token shards + ``dataset.json`` (see dataset.py).

The corpus is a sorted list of files (glob patterns, ``**`` recursive), each file one document,
read as UTF-8 (undecodable bytes replaced). Each document's ids are followed by the separator id, and
the stream is cut into shards of at most ``shard_tokens`` tokens. Everything is written into a
temporary directory beside ``out`` and renamed into place at the end, so an interrupted run leaves no
half dataset behind.

The trainer's default data is the built-in corpus (``data/corpus.py``: generated, the same bytes on
every machine) with the 256-id byte tokenizer, prepared once into a cache directory
(``default_dataset``) by this same code. ``prepare --stdlib`` makes a larger dataset of the running
Python's standard library sources, which differ between Python versions.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import sys
import sysconfig
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from exatrain.data import tokenizer as tk
from exatrain.data.dataset import META, TOKENIZER, DatasetMeta, Shard, read_meta, token_dtype
from exatrain.errors import UserError
from exatrain.jsonio import write_json_atomic

DEFAULT_SHARD_TOKENS = 100_000_000


@dataclass(frozen=True)
class Document:
    name: str  # as recorded (relative to the corpus root)
    path: Path | None  # the file it is read from; None for a document given as text
    text: str | None = None

    @property
    def size(self) -> int:
        """Bytes on disk (or of the text's UTF-8), for the progress bar."""
        return self.path.stat().st_size if self.text is None else len(self.text.encode("utf-8"))


def find_documents(patterns: Sequence[str]) -> list[Document]:
    """Every file matching any of the glob patterns, once, sorted by path."""
    found: dict[str, Path] = {}
    for pattern in patterns:
        matches = [p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p)]
        if not matches:
            raise UserError(f"--input {pattern!r} matches no files")
        for m in matches:
            found.setdefault(os.path.normpath(m), Path(m))
    return [Document(name, found[name]) for name in sorted(found)]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_documents(root: Path | None = None) -> list[Document]:
    """Every standard-library ``.py`` file, sorted by relative path; installed third-party packages
    (site-packages, dist-packages) are not the standard library."""
    root = root or stdlib_root()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")]
        for f in filenames:
            if f.endswith(".py"):
                path = Path(dirpath, f)
                found.append(Document(path.relative_to(root).as_posix(), path))
    found.sort(key=lambda d: d.name)
    if not found:
        raise UserError(
            f"no Python sources under {root}: the default training data is the standard library's .py files"
        )
    return found


def read_text(doc: Document) -> str:
    if doc.text is not None:
        return doc.text
    try:
        return doc.path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise UserError(f"{doc.path}: cannot read ({exc.strerror or exc})") from None


class _ShardWriter:
    """Appends token arrays to shard files of at most ``limit`` tokens, hashing as it goes and
    keeping each shard's largest id (dataset.json records it; check_dataset_for reads it)."""

    def __init__(self, root: Path, dtype: str, limit: int) -> None:
        self.root, self.dtype, self.limit = root, np.dtype(dtype).newbyteorder("<"), limit
        self.shards: list[Shard] = []
        self._file = None
        self._count = 0
        self._max = 0
        self._hash = hashlib.sha256()

    def write(self, ids: np.ndarray) -> None:
        while ids.size:
            if self._file is None:
                self._file = open(self.root / f"shard-{len(self.shards):05d}.bin", "wb")
            take = min(ids.size, self.limit - self._count)
            data = ids[:take].astype(self.dtype).tobytes()
            self._file.write(data)
            self._hash.update(data)
            if take:
                self._max = max(self._max, int(ids[:take].max()))
            self._count += take
            ids = ids[take:]
            if self._count == self.limit:
                self._close()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self.shards.append(Shard(Path(self._file.name).name, self._count, self._hash.hexdigest(), self._max))
        self._file, self._count, self._max, self._hash = None, 0, 0, hashlib.sha256()

    def close(self) -> tuple[Shard, ...]:
        if self._count:
            self._close()
        elif self._file is not None:  # opened but empty
            self._file.close()
            os.unlink(self._file.name)
            self._file = None
        return tuple(self.shards)


def check_text(docs: Sequence[Document], probe: int = 8192) -> None:
    """Refuse a binary file among the documents (a NUL byte in its first ``probe`` bytes, which no UTF-8 text
    holds): read as text, its bytes would become replacement characters and train the tokenizer silently."""
    for d in docs:
        if d.path is None:
            continue
        try:
            with open(d.path, "rb") as f:
                head = f.read(probe)
        except OSError as exc:
            raise UserError(f"{d.name}: cannot read ({exc.strerror or exc})") from None
        if b"\0" in head:
            raise UserError(
                f"{d.name} is a binary file, not text (a NUL byte in its first {probe:,} bytes); give "
                "--input text files"
            )


@contextmanager
def _progress(total_bytes: int, quiet: bool, what: str) -> Iterator:
    """A rich progress bar over the corpus bytes (or nothing when quiet)."""
    if quiet:
        yield lambda n: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from rich.console import Console

    # on stderr: the command's stdout carries its result line, which a pipe or a file should get alone
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        transient=False,
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task(what, total=total_bytes)
        yield lambda n: bar.advance(task, n)


def prepare(
    docs: list[Document],
    out: str | Path,
    *,
    tokenizer_json: str | None = None,
    train_vocab: int | None = None,
    separator: str = tk.SEPARATOR,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    quiet: bool = False,
    sources: dict | None = None,
) -> DatasetMeta:
    """Tokenize ``docs`` with ``tokenizer_json`` (or a BPE of ``train_vocab`` ids trained on them) into ``out``."""
    out = Path(out)
    if (out / META).exists():
        raise UserError(f"{out} already holds a dataset; choose another --out or remove it first")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists and is not an empty directory")
    if not docs:
        raise UserError("the corpus has no documents")
    if shard_tokens <= 0:
        raise UserError(f"--shard-tokens must be positive, got {shard_tokens}")
    check_text(docs)
    if tokenizer_json is None and train_vocab is not None:
        tk.check_train_vocab(train_vocab)
    total_bytes = sum(d.size for d in docs)
    if tokenizer_json is None:
        if train_vocab is None:
            raise UserError("give --tokenizer tokenizer.json or --train-tokenizer VOCAB")
        if not quiet:
            print(f"training a byte-level BPE of {train_vocab} ids on {len(docs)} files", file=sys.stderr)
        tokenizer_json = tk.train_bpe((read_text(d) for d in docs), train_vocab, quiet=quiet)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    sep = tk.separator_id(tokenizer, separator, "the tokenizer")
    vocab = tk.vocab_size(tokenizer)
    byte_identity = tk.identity(tokenizer_json) == tk.byte_tokenizer_identity()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / TOKENIZER).write_text(tokenizer_json, encoding="utf-8")
        writer = _ShardWriter(tmp, token_dtype(vocab), shard_tokens)
        sep_arr = np.array([sep], dtype=np.int64)
        with _progress(total_bytes, quiet, f"tokenizing {len(docs)} files") as advance:
            batch = 64
            for i in range(0, len(docs), batch):
                chunk = docs[i : i + batch]
                texts = [read_text(d) for d in chunk]
                for ids in tk.encode_documents(tokenizer, texts, byte_identity):
                    writer.write(ids)
                    writer.write(sep_arr)
                advance(sum(d.size for d in chunk))
        meta = DatasetMeta(
            dtype=token_dtype(vocab),
            vocab_size=vocab,
            separator=separator,
            separator_id=sep,
            tokenizer_sha256=tk.identity(tokenizer_json),
            documents=len(docs),
            shards=writer.close(),
            sources={"files": len(docs), **(sources or {})},
        )
        write_json_atomic(tmp / META, meta.to_dict())
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp made it private
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def prepare_stdlib(
    out: str | Path, *, shard_tokens: int = DEFAULT_SHARD_TOKENS, quiet: bool = False, root: Path | None = None
) -> DatasetMeta:
    """The default corpus: the standard library's .py files with the byte tokenizer."""
    root = root or stdlib_root()
    return prepare(
        stdlib_documents(root),
        out,
        tokenizer_json=tk.byte_tokenizer_json(),
        separator=tk.byte_separator(),
        shard_tokens=shard_tokens,
        quiet=quiet,
        sources={"corpus": "python-stdlib", "python": sys.version.split()[0]},
    )


def cache_root() -> Path:
    """Where prepared default data is kept: $EXATRAIN_CACHE, else $XDG_CACHE_HOME/exatrain, else ~/.cache/exatrain."""
    if os.environ.get("EXATRAIN_CACHE"):
        return Path(os.environ["EXATRAIN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "exatrain"


def builtin_documents() -> list[Document]:
    """The built-in corpus (data/corpus.py) as documents, named doc-00000 ..."""
    from exatrain.data import corpus

    return [Document(f"doc-{i:05d}", None, text) for i, text in enumerate(corpus.documents())]


def prepare_builtin(out: str | Path, *, shard_tokens: int = DEFAULT_SHARD_TOKENS, quiet: bool = False) -> DatasetMeta:
    """The built-in corpus with the byte tokenizer: the data ``exatrain train`` uses without --data."""
    from exatrain.data import corpus

    return prepare(
        builtin_documents(),
        out,
        tokenizer_json=tk.byte_tokenizer_json(),
        separator=tk.byte_separator(),
        shard_tokens=shard_tokens,
        quiet=quiet,
        sources={"corpus": "exatrain-builtin", "sha256": corpus.SHA256},
    )


def default_dataset(quiet: bool = True) -> Path:
    """The prepared built-in corpus in the cache, made on first use. Its name holds the corpus's
    recorded sha256 and the tokenizer's, so a changed corpus gets a directory of its own. Concurrent
    callers (every rank of a run) serialise on a lock file; the first prepares, the rest find it ready."""
    from exatrain.data import corpus

    key = hashlib.sha256((corpus.SHA256 + tk.byte_tokenizer_identity()).encode()).hexdigest()[:16]
    target = cache_root() / f"builtin-{key}"
    if (target / META).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".builtin-{key}.lock"):
        if not (target / META).is_file():
            prepare_builtin(target, quiet=quiet)
    read_meta(target)
    return target


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


__all__ = [
    "DEFAULT_SHARD_TOKENS",
    "Document",
    "builtin_documents",
    "cache_root",
    "default_dataset",
    "find_documents",
    "prepare",
    "prepare_builtin",
    "prepare_stdlib",
    "stdlib_documents",
    "stdlib_root",
]
