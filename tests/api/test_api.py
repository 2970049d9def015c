"""exatrain.api: the calls the CLI makes, by typed request or flat keyword; the same answers as the commands; plan
defaults and dp derivation; plans read from any file that holds one; `import exatrain` stays torch-free.

Broken on purpose and seen to fail here: ``requests.routed`` leaving a keyword no request has unsaid (the typed
requests test); the cluster group's --gpus left out of ClusterQuery (the flag groups test)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import exatrain
from exatrain import api
from exatrain.catalog import get_cluster, get_model
from exatrain.cli import main
from exatrain.errors import OutOfMemoryPredicted, PlanError, UserError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.planner.results import estimate_json

STUDY_175B = dict(
    model="gpt-175b",
    cluster="frontier",
    gpus=128,
    tp=4,
    pp=16,
    micro_batch=1,
    global_batch=640,
    zero=1,
    recompute="full",
)


def _cli_json(capsys, *argv: str) -> dict:
    """The command's --json object without its top-level format_version (the API's objects carry none)."""
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d.pop("format_version") == 1
    return d


def test_import_is_lazy_and_torch_free() -> None:
    code = (
        "import sys, exatrain; assert 'exatrain.api' not in sys.modules; "
        "exatrain.estimate; exatrain.search; exatrain.make_plan; import exatrain.api; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_top_level_names_are_the_api() -> None:
    assert exatrain.estimate is api.estimate and exatrain.search is api.search and exatrain.scaling is api.scaling
    assert exatrain.make_plan is api.make_plan and exatrain.compare is api.compare
    assert callable(exatrain.train) and callable(exatrain.tune)  # exatrain.train: a module that forwards to api.train
    with pytest.raises(UserError, match="tune needs --gpus"):
        exatrain.tune(model="gpt-tiny")
    with pytest.raises(AttributeError):
        exatrain.no_such_call  # noqa: B018


def test_estimate_is_what_the_cli_prints(capsys) -> None:
    plan = exatrain.estimate(**STUDY_175B)
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in STUDY_175B.items()]
    assert estimate_json(plan) == _cli_json(capsys, "estimate", *argv)
    assert (plan.dp, plan.num_microbatches, plan.estimate.fits) == (2, 320, True)


def test_search_and_scaling_are_what_the_cli_prints(capsys) -> None:
    result = exatrain.search(model="gpt-22b", cluster="dgx-a100", gpus=64, global_batch=256, top=3, tp=4)
    d = _cli_json(
        capsys,
        "search",
        "--model",
        "gpt-22b",
        "--cluster",
        "dgx-a100",
        "--gpus",
        "64",
        "--global-batch",
        "256",
        "--top",
        "3",
        "--tp",
        "4",
    )
    assert [estimate_json(p) for p in result.ranked] == d["ranked"] and {p.tp for p in result.ranked} == {4}
    sc = exatrain.scaling(model="gpt-175b", gpus=[128, 256], global_batch=640, tp=4, pp=16, mode="weak")
    d = _cli_json(
        capsys,
        "scaling",
        "--model",
        "gpt-175b",
        "--gpus",
        "128,256",
        "--global-batch",
        "640",
        "--tp",
        "4",
        "--pp",
        "16",
    )
    assert sc.to_dict() == d
    assert [p.global_batch for p in sc.points] == [640, 1280] and sc.points[0].efficiency == 1.0
    p0, p1 = sc.points
    assert p1.efficiency == pytest.approx((p1.plan.estimate.tokens_per_s / 256) / (p0.plan.estimate.tokens_per_s / 128))
    assert {(m.mode, m.efficiency) for m in sc.measured} == {("weak", 1.0), ("strong", 0.89)}  # catalog data


def test_make_plan_defaults_and_dp_derivation() -> None:
    m = get_model("gpt-tiny")
    p = exatrain.make_plan(m, "local-cpu", gpus=8, tp=2, pp=2)
    assert (p.tp, p.pp, p.dp, p.micro_batch, p.global_batch, p.schedule, p.interleave) == (2, 2, 2, 1, 16, "1f1b", 1)
    assert (p.zero_stage, p.recompute, p.sequence_parallel, p.dtype, p.flash_attention) == (
        0,
        "none",
        False,
        "bfloat16",
        True,
    )
    assert exatrain.make_plan(m, gpus=8, pp=2, schedule="interleaved").interleave == 2
    assert exatrain.make_plan(m, gpus=4).global_batch == 4  # micro-batch x dp without a pipeline
    base = Plan(model=m, dims=ParallelDims(2, 1, 2), shape=TrainShape(2, 8), zero_stage=1)
    kept = exatrain.make_plan(m, base=base, zero=0)
    assert (kept.tp, kept.dp, kept.global_batch, kept.zero_stage) == (2, 2, 8, 0)  # the base's, except what is given
    assert exatrain.make_plan(m, base=base, gpus=8).global_batch == 8  # dp 4 now: micro-batch x dp
    with pytest.raises(PlanError, match="not divisible by tp\\*pp"):
        exatrain.make_plan(m, gpus=6, tp=4)
    with pytest.raises(PlanError, match="drop --dp"):
        exatrain.make_plan(m, gpus=8, dp=2)


def test_models_by_name_spec_file_or_shape(tmp_path) -> None:
    assert api.resolve_model("gpt-1t", layers=64).name == "gpt-1t*"
    assert api.resolve_model(layers=2, hidden=64, heads=4, seq_len=32, vocab=128).name == "custom"
    spec = get_model("llama-tiny")
    assert api.resolve_model(spec) is spec and api.resolve_cluster(get_cluster("dgx-h100")).name == "dgx-h100"
    with pytest.raises(UserError, match="either --model or --model-file"):
        api.resolve_model("gpt-tiny", tmp_path / "m.toml")
    with pytest.raises(UserError, match="no such file"):
        api.resolve_model(model_file=tmp_path / "m.toml")


def test_load_plan_takes_the_first_ranked_plan_of_a_search(tmp_path) -> None:
    result = exatrain.search(model="gpt-tiny", cluster="local-cpu", gpus=4, global_batch=8, dtype="float32", top=2)
    path = tmp_path / "search.json"
    from exatrain.planner.results import search_json

    path.write_text(json.dumps(search_json(result)))
    heard: list[str] = []
    plan = exatrain.load_plan(path, warn=heard.append)
    assert plan == result.ranked[0] and len(heard) == 1 and "first ranked plan (of 2)" in heard[0]
    (tmp_path / "empty.json").write_text(json.dumps({"ranked": []}))
    with pytest.raises(UserError, match="no ranked plan"):
        exatrain.load_plan(tmp_path / "empty.json")


def test_cpu_memory_refusal_is_typed_and_uses_the_accounting() -> None:
    from exatrain.api.training import check_cpu_memory, state_bytes
    from exatrain.accounting.memory import state_bytes_per_param
    from exatrain.accounting.params import total_params

    big = exatrain.make_plan(get_model("gpt-175b"), "local-cpu", gpus=1, dtype="float32")
    with pytest.raises(OutOfMemoryPredicted, match="GiB of model states"):
        check_cpu_memory(big)
    assert isinstance(OutOfMemoryPredicted("x"), PlanError)
    # One rank, ZeRO-0, float32: every parameter's fp32 weight, gradient and two Adam moments.
    per = state_bytes_per_param("float32", 0, 1)
    assert state_bytes(big) == total_params(big.model) * per.total == total_params(big.model) * 16
    sharded = exatrain.make_plan(get_model("gpt-tiny"), "local-cpu", gpus=4, zero=3, dtype="float32")
    assert state_bytes(sharded) == pytest.approx(total_params(sharded.model) * 16, rel=1e-9)  # shards add up


def test_preflight_makes_a_predicted_oom_an_oom_trial_without_a_run(tmp_path) -> None:
    from exatrain.tuning.runner import SubprocessRunner

    plan = exatrain.make_plan(get_model("gpt-tiny"), "local-cpu", gpus=1, dtype="float32")

    def refuse(kind):
        def check(_plan):
            raise kind("refused for a reason")

        return check

    for kind, status in ((OutOfMemoryPredicted, "oom"), (PlanError, "rejected")):
        runner = SubprocessRunner(preflight=refuse(kind), python="/nonexistent/python")
        out = runner.run(plan, tmp_path / status, should_stop=lambda *_: False, on_start=lambda pid: None)
        assert out.status == status and "refused for a reason" in out.error
        assert not (tmp_path / status / "command.txt").exists()  # no process was started


def test_the_cli_passes_its_flags_by_the_api_names() -> None:
    """Every flag group of a command that maps onto a request (``cli.common.request_group``) holds flags named as
    that request's fields (all of them, for the groups every planner command shares, train's and tune's); the run
    settings group holds settings; every other flag is a keyword argument of its API call (or output-only)."""
    import dataclasses
    import inspect

    from exatrain.api import requests
    from exatrain.cli import build_parser
    from exatrain.cli.common import REQUESTS
    from exatrain.settings import NAMES

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    output_only = {"help", "json", "explain", "progress", "verify", REQUESTS}  # prepare --verify: verify_dataset
    whole = {requests.ModelQuery, requests.Layout, requests.Budget, requests.TrainRun, requests.TrainStore}
    whole |= {requests.TuneOptions, requests.JobOptions, requests.SlurmJob, requests.RecordedRun}
    seen = set()
    for command, fn in (
        ("estimate", api.estimate),
        ("search", api.search),
        ("scaling", api.scaling),
        ("train", api.train),
        ("tune", api.tune),
        ("bench", api.bench),
        ("launch", api.launch),
        ("demo", api.demo),
        ("record", api.record),
        ("prepare", api.prepare),
    ):
        groups = sub[command].get_default(REQUESTS) or {}
        in_groups = set()
        for key, (cls, group) in groups.items():
            assert key in inspect.signature(fn).parameters, (command, key)
            dests = {a.dest for a in group._group_actions}
            in_groups |= dests
            if cls is None:
                assert dests <= set(NAMES), (command, sorted(dests - set(NAMES)))
                continue
            seen.add(cls)
            flags = {f.name for f in dataclasses.fields(cls) if f.name not in ("warn", "progress")}
            assert dests <= flags, (command, cls.__name__, sorted(dests - flags))
            if cls in whole and (command, cls) != ("tune", requests.Layout):  # tune: no ep, cp
                assert dests == flags, (command, cls.__name__, sorted(flags - dests))
        names = set(inspect.signature(fn).parameters)
        flags = {a.dest for a in sub[command]._actions} - output_only - in_groups
        assert flags <= names, (command, sorted(flags - names))
    assert whole <= seen


def test_typed_requests_and_flat_keywords_are_one_call() -> None:
    """The flat call routes each keyword into its request: the same plan as the typed call; a keyword that no
    request has, or an option the call does not take, is a TypeError naming it."""
    from exatrain.api.requests import ClusterQuery, Engine, Layout

    flat = exatrain.estimate("llama3-70b", "dgx-h100", gpus=64, tp=8, pp=2, runtime="megatron-core", fp8="current")
    typed = exatrain.estimate(
        "llama3-70b",
        ClusterQuery(cluster="dgx-h100", gpus=64),
        layout=Layout(tp=8, pp=2),
        engine=Engine(runtime="megatron-core"),
        settings=api.RunSettings(fp8="current"),
    )
    assert estimate_json(flat) == estimate_json(typed)
    assert (typed.tp, typed.pp, typed.dp, typed.runtime, typed.fp8) == (8, 2, 4, "megatron-core", "current")
    with pytest.raises(TypeError, match="unexpected keyword argument 'tpp'.*ModelQuery, ClusterQuery, Layout"):
        exatrain.estimate("llama3-70b", "dgx-h100", gpus=64, tpp=8)
    with pytest.raises(TypeError, match="unexpected keyword argument 'top'"):
        exatrain.estimate("llama3-70b", "dgx-h100", gpus=64, top=3)
    with pytest.raises(TypeError, match="unknown run setting 'fp9'"):
        exatrain.estimate("llama3-70b", "dgx-h100", gpus=64, settings={"fp9": "current"})
    with pytest.raises(TypeError, match="train.. got an unexpected keyword argument 'cross_entropy'"):
        exatrain.train(model="gpt-tiny", cross_entropy="fused")
    with pytest.raises(UserError, match="--gpus must be a positive integer of at most"):
        exatrain.search("gpt-small", "local-cpu", gpus=10**10, global_batch=16)


def test_a_launch_gives_the_requests_its_estimate_reads(tmp_path) -> None:
    """``launch_request`` is what ``estimate --from`` reads, as typed requests: estimating them is estimating the
    file."""
    from exatrain.engine_configs import export

    plan = exatrain.make_plan(get_model("gpt-1.3b"), "dgx-a100", gpus=8, tp=2, global_batch=64)
    script = tmp_path / "pretrain.sh"
    script.write_text(export(plan.replace(runtime="megatron-core"), "megatron").text, encoding="utf-8")
    r = api.launch_request(script, warn=lambda line: None)
    assert (r.cluster.gpus, r.layout.tp, r.engine.runtime) == (8, 2, "megatron-core")
    typed = exatrain.estimate(r.model, "dgx-a100", layout=r.layout, engine=r.engine, settings=r.settings, gpus=8)
    with pytest.warns(api.ExatrainWarning, match="leaves to Megatron-LM's defaults"):
        from_file = exatrain.estimate(cluster="dgx-a100", from_file=script)
    assert estimate_json(typed) == estimate_json(from_file)


def test_checkpoint_dir_needs_room_for_one_checkpoint(tmp_path, monkeypatch) -> None:
    """One checkpoint is fp32 weights and two AdamW moments per parameter (the accounting's bytes);
    a --checkpoint-dir on a filesystem with less free space is refused before any work."""
    import shutil

    from exatrain.api import training
    from exatrain.accounting.params import total_params

    plan = exatrain.make_plan(get_model("gpt-small"), "local-cpu", gpus=1)
    assert training.checkpoint_bytes(plan) == 12 * total_params(plan.model)
    free = shutil.disk_usage(tmp_path).free
    monkeypatch.setattr(training, "checkpoint_bytes", lambda p: 2 * free)
    with pytest.raises(UserError, match="one checkpoint needs about"):
        exatrain.train(model="gpt-tiny", checkpoint_dir=tmp_path / "ckpt", steps=1)
    assert not (tmp_path / "ckpt").exists()
