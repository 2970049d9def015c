"""Tokenizers, all Hugging Face ``tokenizers``: load a ``tokenizer.json``, train a byte-level BPE, or
the 256-id byte tokenizer the default corpus uses.

Byte-level throughout (GPT-2's scheme, Radford et al. 2019 Sec. 2.2): text is UTF-8 bytes, each byte
is one of 256 base symbols, so no input is ever out of vocabulary. Documents are joined by one
separator token, ``<|endoftext|>`` (GPT-2's), so a window that straddles two documents says where one
ends.

The byte tokenizer maps byte b to id b (a BPE with the 256 byte symbols and no merges). Its 256 ids
leave no room for a special token, so its separator is id 0, the NUL byte (``BYTE_SEPARATOR``, its
byte-level symbol), which text files never contain. Encoding with it is the identity on UTF-8 bytes,
which ``encode_documents`` uses directly (tests check it against ``tokenizers``).

The identity of a tokenizer is the sha256 of its ``tokenizer.json`` text: data, checkpoints and
exports record it, so a resume onto other data or an export with the wrong tokenizer is caught.
"""

from __future__ import annotations

import hashlib
import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from exatrain.errors import UserError

SEPARATOR = "<|endoftext|>"


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_separator() -> str:
    """The byte tokenizer's separator: the byte-level symbol of NUL (id 0)."""
    return bytes_to_unicode()[0]


def byte_tokenizer_json() -> str:
    """The 256-id byte tokenizer (id == byte value) as tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    b2u = bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={b2u[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return json.dumps(json.loads(tok.to_str()), ensure_ascii=False, sort_keys=True)


# The largest vocabulary --train-tokenizer accepts: about 4x the largest in wide use (Gemma's 256,128
# ids, Gemma Team 2024, Table 1). The BPE trainer reserves memory by the requested size before it looks at
# the text, so an absurd request (1e10) aborts inside the native library instead of failing cleanly.
MAX_TRAIN_VOCAB = 1 << 20


def check_train_vocab(vocab_size: int) -> None:
    """A vocabulary size ``train_bpe`` can honour: 256 byte symbols + the separator, at most MAX_TRAIN_VOCAB."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 257:
        raise UserError(
            f"--train-tokenizer needs a vocabulary of at least 257 (256 bytes + the separator), got {vocab_size}"
        )
    if vocab_size > MAX_TRAIN_VOCAB:
        raise UserError(
            f"--train-tokenizer {vocab_size:,} is beyond the {MAX_TRAIN_VOCAB:,} ids this trainer "
            f"accepts (vocabularies in use go up to about 256k ids)"
        )


def train_bpe(texts: Iterable[str], vocab_size: int, quiet: bool = True) -> str:
    """A byte-level BPE of ``vocab_size`` ids trained on ``texts`` (``<|endoftext|>`` is id 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    check_train_vocab(vocab_size)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # tokenizers' progress display writes blank lines to stdout: shown only where stdout is a terminal, so that a
    # piped command's stdout holds its result alone
    show = not quiet and sys.stdout.isatty()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SEPARATOR],
        show_progress=show,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok.to_str()


def identity(text: str) -> str:
    """The tokenizer's identity: sha256 of its tokenizer.json text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@lru_cache(maxsize=1)
def byte_tokenizer_identity() -> str:
    return identity(byte_tokenizer_json())


def load(path: str | Path):
    """A ``tokenizers.Tokenizer`` from a tokenizer.json file (one-line UserError when it is not one)."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such tokenizer file")
    try:
        return Tokenizer.from_str(path.read_text(encoding="utf-8"))
    except Exception as exc:  # tokenizers raises its own Exception type for malformed files
        raise UserError(f"{path}: not a Hugging Face tokenizer.json ({str(exc).splitlines()[0][:200]})") from None


def vocab_size(tokenizer) -> int:
    """Ids the tokenizer can produce: one more than its largest id (added tokens included)."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def separator_id(tokenizer, separator: str, source: str) -> int:
    sep = tokenizer.token_to_id(separator)
    if sep is None:
        raise UserError(f"{source} has no token {separator!r} to separate documents; name one with --separator")
    return sep


def encode_documents(tokenizer, texts: list[str], byte_identity: bool) -> Iterator[np.ndarray]:
    """int64 token ids of each text (no separator added)."""
    if byte_identity:  # the byte tokenizer is the identity on UTF-8 bytes (checked against tokenizers in tests)
        for text in texts:
            yield np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
        return
    for enc in tokenizer.encode_batch(texts, add_special_tokens=False):
        yield np.asarray(enc.ids, dtype=np.int64)


__all__ = [
    "MAX_TRAIN_VOCAB",
    "SEPARATOR",
    "byte_separator",
    "byte_tokenizer_identity",
    "byte_tokenizer_json",
    "bytes_to_unicode",
    "check_train_vocab",
    "encode_documents",
    "identity",
    "load",
    "separator_id",
    "train_bpe",
    "vocab_size",
]
