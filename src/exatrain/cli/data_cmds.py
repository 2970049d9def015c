"""`exatrain prepare` (text -> tokenizer -> token shards) and `exatrain export` (checkpoint -> Hugging Face)."""

from __future__ import annotations

import argparse

from exatrain import api
from exatrain.api.requests import TokenizeOptions
from exatrain.cli.common import call, nonneg_int, positive_int, request_group
from exatrain.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare",
        help="tokenize a text corpus into token shards for `exatrain train --data`",
        description="Tokenize text files with a Hugging Face tokenizer (a tokenizer.json, or a byte-level BPE "
        "trained here) into token shards (uint16/uint32 memmaps) plus dataset.json (counts, sha256 "
        "of each shard, the tokenizer's identity). Each file is one document, followed by the "
        "separator token.",
        epilog="examples:\n  exatrain prepare --input 'corpus/**/*.txt' --train-tokenizer 32000 --out data/\n"
        "  exatrain prepare --builtin --out data/\n  exatrain prepare --verify data/",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--input", action="append", metavar="GLOB", help="text files ('corpus/**/*.txt'; repeatable)")
    src.add_argument(
        "--builtin",
        action="store_true",
        help="the built-in corpus `train` uses without --data (about 1 MB of generated text, the same "
        "on every machine), byte tokenizer",
    )
    src.add_argument(
        "--stdlib",
        action="store_true",
        help="this Python's standard library source (differs between Python versions), byte tokenizer",
    )
    src.add_argument("--verify", metavar="DIR", help="recompute every shard's sha256 of a prepared dataset")
    t = request_group(p, "tokenize", TokenizeOptions, "tokenizing")
    tok = t.add_mutually_exclusive_group()
    tok.add_argument("--tokenizer", metavar="PATH", help="a Hugging Face tokenizer.json")
    tok.add_argument(
        "--train-tokenizer",
        type=positive_int,
        metavar="VOCAB",
        help="train a byte-level BPE of VOCAB ids on the corpus",
    )
    t.add_argument("--separator", metavar="TOKEN", help="document separator token (default <|endoftext|>)")
    t.add_argument("--shard-tokens", type=positive_int, metavar="N", help="tokens per shard (default 100,000,000)")
    p.add_argument("--out", metavar="DIR", help="the dataset directory to create (new or empty)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    e = sub.add_parser(
        "export",
        help="export a checkpoint as a Hugging Face model (safetensors + config.json)",
        description="Export a checkpoint of any layout to a directory transformers loads: GPT2LMHeadModel for "
        "the gpt family, LlamaForCausalLM for llama; float32 weights, the tokenizer alongside.",
        epilog="example: exatrain export --checkpoint ckpt/ --format hf --out model/",
    )
    e.add_argument(
        "--checkpoint",
        required=True,
        metavar="PATH",
        help="a checkpoint directory, or a --checkpoint-dir (its newest complete checkpoint)",
    )
    e.add_argument("--step", type=nonneg_int, help="the checkpoint of this step (in a --checkpoint-dir)")
    e.add_argument("--format", choices=("hf",), default="hf", help="hf: Hugging Face transformers (default)")
    e.add_argument("--out", required=True, metavar="DIR", help="the directory to write (new or empty)")


def cmd_prepare(args: argparse.Namespace) -> int:
    if args.verify:
        meta = api.verify_dataset(args.verify)
        print(f"{args.verify}: {len(meta.shards)} shard(s), {meta.tokens:,} tokens, every sha256 matches")
        return 0
    if not args.out:
        raise UserError("--out DIR is required (where the dataset goes)")
    meta = call(api.prepare, args, input=args.input or ())
    if not args.quiet:
        print(
            f"{args.out}: {meta.documents:,} documents, {meta.tokens:,} tokens in {len(meta.shards)} shard(s) "
            f"of {meta.dtype}; vocabulary {meta.vocab_size:,}, separator id {meta.separator_id}"
        )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    source = call(api.export_model, args)
    print(f"{args.out}: Hugging Face model from {source}")
    return 0
