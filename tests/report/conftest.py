"""Fixtures for the report tests: the JSON the CLI really prints, made once per session.

The commands are run in-process through ``exatrain.cli.main`` (the same code path as the shell),
and every picture test compares what it drew with this JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import run_cli

GPT_1T = (
    "--model",
    "gpt-1t",
    "--cluster",
    "frontier",
    "--gpus",
    "3072",
    "--tp",
    "8",
    "--pp",
    "64",
    "--micro-batch",
    "1",
    "--global-batch",
    "1536",
    "--zero",
    "1",
    "--recompute",
    "full",
)
# 22B on 32 GCDs: pp 4 with 8 micro-batches, small enough that every op spans many pixels.
GPT_22B = (
    "--model",
    "gpt-22b",
    "--cluster",
    "frontier",
    "--gpus",
    "32",
    "--tp",
    "2",
    "--pp",
    "4",
    "--micro-batch",
    "1",
    "--global-batch",
    "32",
    "--zero",
    "1",
    "--recompute",
    "selective",
)


def cli_json(*argv: str) -> Any:
    return json.loads(run_cli(*argv))


@pytest.fixture(scope="session")
def jsondir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("json")


@pytest.fixture(scope="session")
def est_1t(jsondir: Path) -> dict:
    """`estimate --json` of the 1T layout on Frontier (and the plan file `--out` writes beside it)."""
    return cli_json("estimate", *GPT_1T, "--json", "--out", str(jsondir / "plan-1t.json"))


@pytest.fixture(scope="session")
def plan_1t_path(est_1t: dict, jsondir: Path) -> Path:
    return jsondir / "plan-1t.json"


@pytest.fixture(scope="session")
def est_22b(jsondir: Path) -> dict:
    return cli_json("estimate", *GPT_22B, "--json")


@pytest.fixture(scope="session")
def est_tiny() -> dict:
    """gpt-tiny (4 layers) on 4 CPU ranks, pp 4: too few layers to interleave."""
    return cli_json(
        "estimate",
        "--model",
        "gpt-tiny",
        "--cluster",
        "local-cpu",
        "--gpus",
        "4",
        "--pp",
        "4",
        "--global-batch",
        "16",
        "--json",
    )


@pytest.fixture(scope="session")
def search_json(jsondir: Path) -> dict:
    d = cli_json(
        "search",
        "--model",
        "gpt-1.3b",
        "--cluster",
        "dgx-a100",
        "--gpus",
        "16",
        "--global-batch",
        "64",
        "--top",
        "30",
        "--json",
    )
    (jsondir / "search.json").write_text(json.dumps(d))
    return d


@pytest.fixture(scope="session")
def scaling_weak_175b(jsondir: Path) -> dict:
    d = cli_json(
        "scaling",
        "--model",
        "gpt-175b",
        "--cluster",
        "frontier",
        "--gpus",
        "128,256,512",
        "--global-batch",
        "640",
        "--tp",
        "4",
        "--pp",
        "16",
        "--json",
    )
    (jsondir / "scaling.json").write_text(json.dumps(d))
    return d


@pytest.fixture(scope="session")
def scaling_strong_22b(jsondir: Path) -> dict:
    d = cli_json(
        "scaling",
        "--model",
        "gpt-22b",
        "--cluster",
        "frontier",
        "--gpus",
        "64,128",
        "--global-batch",
        "256",
        "--mode",
        "strong",
        "--tp",
        "2",
        "--pp",
        "4",
        "--json",
    )
    (jsondir / "scaling-strong.json").write_text(json.dumps(d))
    return d


@pytest.fixture(scope="session")
def est_tiny_pp2() -> dict:
    """gpt-tiny on 2 CPU ranks, pp 2: a few MiB per rank against a 16 GiB device."""
    return cli_json(
        "estimate",
        "--model",
        "gpt-tiny",
        "--cluster",
        "local-cpu",
        "--gpus",
        "2",
        "--pp",
        "2",
        "--global-batch",
        "8",
        "--json",
    )


@pytest.fixture(scope="session")
def search_tiny() -> dict:
    return cli_json(
        "search",
        "--model",
        "gpt-tiny",
        "--cluster",
        "local-cpu",
        "--gpus",
        "4",
        "--global-batch",
        "16",
        "--top",
        "30",
        "--json",
    )


@pytest.fixture(scope="session")
def scaling_strong_tiny() -> dict:
    return cli_json(
        "scaling",
        "--model",
        "gpt-tiny",
        "--cluster",
        "local-cpu",
        "--gpus",
        "1,2,4",
        "--global-batch",
        "16",
        "--mode",
        "strong",
        "--json",
    )
