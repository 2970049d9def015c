"""Seconds a run start spends checking a prepared dataset, the first start (every shard hashed) against a later one
(the shards recorded in ``.exatrain-verified.json`` as hashed right, data/dataset.py), and ``prepare --verify``
(every byte read, always).

    python benchmarks/data_start_check.py [--mb 256] [--keep DIR]

Builds a dataset of about ``--mb`` megabytes of uint16 tokens (generated text through the byte tokenizer) in a
temporary directory, then times ``check_dataset_for`` twice and ``verify`` once on it.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from exatrain.catalog import get_model
from exatrain.data import dataset
from exatrain.data import tokenizer as tk
from exatrain.data.prepare import Document, prepare
from exatrain.plan import ParallelDims, Plan, TrainShape


def build(root: Path, mb: int) -> Path:
    """About ``mb`` MB of shards (two bytes a token) from generated words."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    text = root / "corpus.txt"
    with text.open("w", encoding="utf-8") as f:
        written = 0
        while written < mb * 1_000_000 // 2:
            line = " ".join(rng.choice(words) for _ in range(200)) + "\n"
            f.write(line)
            written += len(line)
    prepare(
        [Document("corpus.txt", text)],
        root / "data",
        tokenizer_json=tk.byte_tokenizer_json(),
        separator=tk.byte_separator(),
        quiet=True,
    )
    return root / "data"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="dataset size in MB of shards (default 256)")
    ap.add_argument("--keep", type=Path, help="build the dataset here and keep it (default: a temporary directory)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        data = build(root, args.mb)
        built = time.perf_counter() - t0
        meta = dataset.read_meta(data)
        size = sum((data / s.file).stat().st_size for s in meta.shards)
        plan = Plan(
            model=get_model("gpt-tiny"), dims=ParallelDims(), shape=TrainShape(2, 4), cluster="local-cpu"
        ).validate()
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            dataset.check_dataset_for(plan, data)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dataset.verify(data)
        full = time.perf_counter() - t0
    print(f"dataset: {size / 1e6:,.0f} MB in {len(meta.shards)} shards (built in {built:.0f} s)")
    print(f"run start, first (every shard hashed): {times[0]:.2f} s ({size / times[0] / 1e9:.2f} GB/s)")
    print(f"run start, second (the record read):   {times[1]:.3f} s")
    print(f"prepare --verify (every byte):         {full:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
