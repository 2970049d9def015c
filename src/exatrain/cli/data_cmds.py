"""`exatrain prepare` (text -> tokenizer -> token shards) and `exatrain export` (checkpoint -> Hugging Face).

Both check their input before doing any work and turn every problem a user can fix into one line
and exit status 2. Torch is imported only by export, and only when it runs.
"""

from __future__ import annotations

import argparse
import sys

from exatrain.cli.common import nonneg_int, positive_int
from exatrain.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare", help="tokenize a text corpus into token shards for `exatrain train --data`",
        description="Tokenize text files with a Hugging Face tokenizer (a tokenizer.json, or a byte-level BPE "
                    "trained here) into token shards (uint16/uint32 memmaps) plus dataset.json (counts, sha256 "
                    "of each shard, the tokenizer's identity). Each file is one document, followed by the "
                    "separator token.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--input", action="append", metavar="GLOB", help="text files ('corpus/**/*.txt'; repeatable)")
    src.add_argument("--stdlib", action="store_true",
                     help="the default corpus: this Python's standard library source, byte tokenizer")
    src.add_argument("--verify", metavar="DIR", help="recompute every shard's sha256 of a prepared dataset")
    tok = p.add_mutually_exclusive_group()
    tok.add_argument("--tokenizer", metavar="PATH", help="a Hugging Face tokenizer.json")
    tok.add_argument("--train-tokenizer", type=positive_int, metavar="VOCAB",
                     help="train a byte-level BPE of VOCAB ids on the corpus")
    p.add_argument("--separator", default=None, metavar="TOKEN",
                   help="document separator token (default <|endoftext|>)")
    p.add_argument("--shard-tokens", type=positive_int, default=None, metavar="N",
                   help="tokens per shard (default 100,000,000)")
    p.add_argument("--out", metavar="DIR", help="the dataset directory to create (must not hold one)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_prepare)

    e = sub.add_parser(
        "export", help="export a checkpoint as a Hugging Face model (safetensors + config.json)",
        description="Export a checkpoint of any layout to a directory transformers loads: GPT2LMHeadModel for "
                    "the gpt family, LlamaForCausalLM for llama; float32 weights, the tokenizer alongside.")
    e.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="a checkpoint directory, or a --checkpoint-dir (its newest complete checkpoint)")
    e.add_argument("--step", type=nonneg_int, default=None, help="the checkpoint of this step (in a --checkpoint-dir)")
    e.add_argument("--format", choices=("hf",), default="hf", help="hf: Hugging Face transformers (default)")
    e.add_argument("--out", required=True, metavar="DIR", help="the directory to write (new or empty)")
    e.set_defaults(func=cmd_export)


def cmd_prepare(args: argparse.Namespace) -> int:
    from exatrain.data import dataset, prepare
    from exatrain.data import tokenizer as tk

    if args.verify:
        meta = dataset.verify(args.verify)
        print(f"{args.verify}: {len(meta.shards)} shard(s), {meta.tokens:,} tokens, every sha256 matches")
        return 0
    if not args.out:
        raise UserError("--out DIR is required (where the dataset goes)")
    kw = dict(quiet=args.quiet)
    if args.shard_tokens:
        kw["shard_tokens"] = args.shard_tokens
    if args.stdlib:
        if args.tokenizer or args.train_tokenizer or args.separator:
            raise UserError("--stdlib uses the byte tokenizer; drop --tokenizer/--train-tokenizer/--separator")
        meta = prepare.prepare_stdlib(args.out, **kw)
    else:
        if not args.input:
            raise UserError("give --input GLOB (repeatable) or --stdlib")
        if not args.tokenizer and not args.train_tokenizer:
            raise UserError("give --tokenizer tokenizer.json or --train-tokenizer VOCAB")
        docs = prepare.find_documents(args.input)
        tokenizer_json = None
        if args.tokenizer:
            tk.load(args.tokenizer)  # a readable tokenizer, or one line
            from pathlib import Path

            tokenizer_json = Path(args.tokenizer).read_text(encoding="utf-8")
        meta = prepare.prepare(docs, args.out, tokenizer_json=tokenizer_json, train_vocab=args.train_tokenizer,
                               separator=args.separator or tk.SEPARATOR,
                               sources={"inputs": list(args.input)}, **kw)
    if not args.quiet:
        print(f"{args.out}: {meta.documents:,} documents, {meta.tokens:,} tokens in {len(meta.shards)} shard(s) "
              f"of {meta.dtype}; vocabulary {meta.vocab_size:,}, separator id {meta.separator_id}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from exatrain.trainer.hf_export import export_hf

    source = export_hf(args.checkpoint, args.out, step=args.step)
    sys.stdout.write(f"{args.out}: Hugging Face model from {source}\n")
    return 0


__all__ = ["register"]
