"""benchmarks/anchor_train_error.py: every train record of the H200 anchor is planned as one GPU, one
micro-batch, with the run's own shape; the batch scales the prediction; a missing or broken file is one line.
(Broken on purpose: with every run planned at batch 8, the B-16 ratio check failed.)"""

from __future__ import annotations

import json

import pytest

from tests.helpers import benchmarks


@pytest.fixture(scope="module")
def ate():
    return benchmarks.load("anchor_train_error")


def test_each_anchor_run_is_priced_with_its_own_shape(ate, tmp_path, capsys) -> None:
    rows = ate.load()
    assert [r["label"] for r in rows].count("nanogpt_compile") == 2 and len(rows) == 5
    by = {(r["label"], r["B"]): ate.predict(r) for r in rows}
    # one prediction for the eager and the compiled loop (no such setting), twice the work at B 16
    assert by[("nanogpt_eager", 8)] == by[("nanogpt_compile", 8)]
    assert 1.8 < by[("nanogpt_compile", 16)] / by[("nanogpt_compile", 8)] < 2.0
    assert by[("nanogpt_compile_2.7B", 8)] > by[("nanogpt_compile", 8)]
    out = tmp_path / "rows.json"
    assert ate.main(["--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert len(got) == 5 and all(r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1) for r in got)
    assert "median |error|" in capsys.readouterr().out


def test_a_broken_anchor_file_is_one_line(ate, tmp_path, monkeypatch, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "train"\n', encoding="utf-8")
    monkeypatch.setattr(ate, "DATA", bad)
    monkeypatch.setattr(ate.load, "__defaults__", (bad,))
    assert ate.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not JSON" in err[0]
