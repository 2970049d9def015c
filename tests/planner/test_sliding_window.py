"""Sliding-window attention (ModelSpec.sliding_window, full_attention_every): the keys a windowed layer
reads against a count of every query's keys, the FLOPs and attention time it saves and nothing else, the
GPT-OSS presets against their published sizes, validation in one line, the trainer's refusal,
`estimate`/`search` saying so when the runtime planned is that trainer, and the default runtime for a model the
trainer does not build (Megatron-Core, said in the output).

Broken on purpose and seen to fail here: window_keys as the window alone (2w - w^2/s dropped: the
brute-force count); every layer windowed whatever full_attention_every says (the layer pattern and preset
tests); the flash kernel's rate taken from the first GEMM's key length for every share (the time test); the
search's line dropped (the "says so" test); plan.default_runtime returning exatrain whatever the model (the default
runtime test); `train` checking the model only after laying the plan out (the train test); a windowed share's key
length divided by the calls of a context-parallel kernel (the split calls test)."""

from __future__ import annotations

import pytest

from exatrain.accounting.flops import layer_gemms, model_flops_per_token
from exatrain.accounting.params import total_params
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.catalog.models import ModelSpec
from exatrain.errors import UserError
from exatrain.planner.cost import layer as cost_layer
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.cost.compute import device_for, flash_attention_s
from exatrain.planner.estimate import estimate_plan
from tests.helpers.plan_fields import trainer_refuses

H100 = get_cluster("dgx-h100")


def _spec(window: int, every: int = 0, seq: int = 4096, layers: int = 6) -> ModelSpec:
    return ModelSpec(
        name="w",
        arch="llama",
        layers=layers,
        hidden=1024,
        heads=16,
        kv_heads=4,
        ffn_hidden=2816,
        seq_len=seq,
        vocab=32000,
        sliding_window=window,
        full_attention_every=every,
    )


@pytest.mark.parametrize("window, seq", [(1, 64), (7, 64), (128, 4096), (4096, 4096), (5000, 4096)])
def test_window_keys_count_every_querys_keys_as_causal_attention_is_counted(window: int, seq: int) -> None:
    # query i reads min(i + 1, w) keys; causal attention is counted as full (s keys a query: twice its pairs)
    pairs = sum(min(i + 1, window) for i in range(seq))
    full_pairs = seq * (seq + 1) // 2
    m = _spec(window, seq=seq)
    assert m.window_keys == pytest.approx(seq * pairs / full_pairs, rel=2 / seq)  # the +1s aside
    assert m.window_keys <= seq


def test_the_layer_pattern_and_the_mean_layers_keys() -> None:
    m = _spec(128, every=2)
    assert [m.layer_is_windowed(i) for i in range(6)] == [True, False, True, False, True, False]
    assert m.windowed_layers == 3 and m.attention_keys == pytest.approx((3 * 4096 + 3 * m.window_keys) / 6)
    every = _spec(128)
    assert every.windowed_layers == 6 and every.attention_keys == pytest.approx(every.window_keys)
    gemma3 = _spec(1024, every=6, layers=12)
    assert [i for i in range(12) if not gemma3.layer_is_windowed(i)] == [5, 11]
    assert _spec(0).attention_keys == 4096.0 and _spec(8192).attention_keys == 4096.0  # no window / one that covers


def test_flops_drop_by_the_keys_not_read_and_nothing_else() -> None:
    m = get_model("gpt-oss-120b")
    full = m.replace(sliding_window=0, full_attention_every=0)
    saved = 3 * 2 * m.heads * 2 * m.head_dim * m.windowed_layers * (m.seq_len - m.window_keys) / m.layers
    assert model_flops_per_token(full) - model_flops_per_token(m) == pytest.approx(m.layers * saved, rel=1e-12)
    dense = [g for g in layer_gemms(m, 2, 1) if not g.name.startswith("attn_")]
    assert dense == [g for g in layer_gemms(full, 2, 1) if not g.name.startswith("attn_")]
    core = [g for g in layer_gemms(m, 2, 1) if g.name.startswith("attn_")]
    assert sum(g.flops for g in core) == pytest.approx(2 * 2 * 4096 * m.attention_keys * 64 * 64 * 2, rel=1e-12)


def test_attention_time_prices_each_share_at_its_own_key_length() -> None:
    m = get_model("gpt-oss-120b")
    dev = device_for(H100, "bfloat16", default_params("h100-sxm"))
    p = dev.params
    assert p.attn_seq_half > 0  # the Hopper prior's rate falls at short keys: the shares' rates differ
    fwd, bwd = flash_attention_s([g for g in layer_gemms(m, 1, 1) if g.name.startswith("attn_")], dev)
    want = 0.0
    for keys, layers in ((4096.0, m.layers - m.windowed_layers), (m.window_keys, m.windowed_layers)):
        flops = 2 * 2 * 4096 * keys * 64 * 64 * layers / m.layers
        want += flops / (dev.peak_flops * p.attn_eff * keys / (keys + p.attn_seq_half))
    assert fwd == pytest.approx(want + p.attn_call_overhead_s / 3.5, rel=1e-12) and bwd == pytest.approx(2.5 * fwd)
    full = m.replace(sliding_window=0, full_attention_every=0)
    plan = make_plan(
        m, H100, gpus=64, tp=1, pp=4, ep=8, micro_batch=1, global_batch=256, zero=1, runtime="megatron-core"
    )
    windowed, whole = estimate_plan(plan, H100), estimate_plan(plan.replace(model=full), H100)
    assert windowed.time_s.compute < whole.time_s.compute  # the communication is the same bytes (its exposed part
    # may differ: a shorter backward hides less of the gradient reduction)
    assert windowed.memory_bytes.total == whole.memory_bytes.total  # flash attention keeps no s x s scores
    assert cost_layer.extended(m, 1, "")


def test_split_calls_keep_a_windowed_shares_key_length() -> None:
    """Under context parallelism the kernel runs in calls over s/calls keys each; a windowed share's query reads
    its window in whichever call holds it, so its rate stays at its own key length while the full share's falls
    to s/calls."""
    m = get_model("gpt-oss-120b")  # 4,096 tokens; every other layer a 128-token window
    dev = device_for(H100, "bfloat16", default_params("h100-sxm"))
    p = dev.params
    core = [g for g in layer_gemms(m, 1, 1, cp=4) if g.name.startswith("attn_")]
    fwd, _ = flash_attention_s(core, dev, calls=4, seq_len=m.seq_len)
    want = 0.0
    for keys, layers in ((4096.0 / 4, m.layers - m.windowed_layers), (m.window_keys, m.windowed_layers)):
        flops = 2 * 2 * 1024 * (4096.0 if keys == 1024 else m.window_keys) * 64 * 64 * layers / m.layers
        want += flops / (dev.peak_flops * p.attn_eff * keys / (keys + p.attn_seq_half))
    assert m.window_keys < 4096 / 4  # the window is shorter than a call's keys
    assert fwd == pytest.approx(want + 4 * p.attn_call_overhead_s / 3.5, rel=1e-12)


def test_the_gpt_oss_presets_have_their_published_sizes() -> None:
    # openai/gpt-oss model card: 116.8B and 20.9B parameters in all
    assert total_params(get_model("gpt-oss-120b")) / 1e9 == pytest.approx(116.8, abs=0.05)
    assert total_params(get_model("gpt-oss-20b")) / 1e9 == pytest.approx(20.9, abs=0.05)
    m = get_model("gpt-oss-20b")
    assert (m.head_dim, m.sliding_window, m.full_attention_every, m.windowed_layers) == (64, 128, 2, 12)
    assert m.attention_sinks and get_model("gpt-oss-120b").attention_sinks
    back = ModelSpec.from_dict(m.to_dict())
    assert back == m and "sliding_window" not in _spec(0).to_dict() and "attention_sinks" not in _spec(0).to_dict()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"full_attention_every": 2}, "full_attention_every applies to sliding-window models only"),
        ({"sliding_window": -1}, "sliding_window must be a non-negative integer, got -1"),
        ({"attention_sinks": "yes"}, "attention_sinks must be true or false, got 'yes'"),
        ({"sliding_window": 128, "arch": "gpt", "kv_heads": 16}, "sliding_window describe llama-family models"),
    ],
)
def test_bad_fields_are_one_line(fields: dict, message: str) -> None:
    base = dict(
        name="w", arch="llama", layers=6, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816, seq_len=4096, vocab=32000
    )
    with pytest.raises(UserError, match=message) as err:
        ModelSpec(**{**base, **fields})
    assert "\n" not in str(err.value)


def test_the_trainer_refuses_a_windowed_model() -> None:
    tiny = get_model("llama-tiny").replace(sliding_window=8)
    trainer_refuses("does not build kv_channels, qk_norm, latent or sliding-window attention", tiny)


def test_planning_a_model_the_trainer_cannot_build_for_exatrain_says_so(capsys) -> None:
    from tests.helpers.cli import run

    said = (
        "exatrain's own trainer does not build gpt-oss-20b yet (a head width other than hidden/heads, sliding "
        "windows, attention sinks and biases on a llama-family model's linear layers)"
    )
    args = ["--model", "gpt-oss-20b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch", "64"]
    for command in ("estimate", "search"):
        code, out, _ = run(capsys, command, *args, "--runtime", "exatrain")
        assert code == 0 and said in " ".join(out.split()), command
        code, out, _ = run(capsys, command, *args, "--runtime", "megatron-core")
        assert code == 0 and "does not build" not in out, command
    code, out, _ = run(capsys, "estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8")
    assert code == 0 and "does not build" not in out
    assert get_model("qwen3-30b-a3b").unbuilt_by_trainer == ("a head width other than hidden/heads", "QK-norm")


def test_the_default_runtime_is_one_that_builds_the_model(capsys) -> None:
    """No --runtime: exatrain's own trainer where it builds the model, else Megatron-Core, and the output says
    why; a runtime named is kept, and says nothing of the default."""
    import json

    from exatrain import api
    from tests.helpers.cli import run

    said = (
        "runtime megatron-core, the default for gpt-oss-20b: exatrain's own trainer does not build it yet (a "
        "head width other than hidden/heads, sliding windows, attention sinks and biases on a llama-family "
        "model's linear layers); name the engine that will run it with --runtime"
    )
    plan = api.estimate(model="gpt-oss-20b", cluster="dgx-h100", gpus=16, ep=8)
    assert plan.runtime == "megatron-core" and plan.estimate.notes[0] == said
    assert api.estimate(model="llama3-8b", cluster="dgx-h100", gpus=8).runtime == "exatrain"
    named = api.estimate(model="gpt-oss-20b", cluster="dgx-h100", gpus=16, ep=8, runtime="torchtitan")
    assert named.runtime == "torchtitan" and not any("the default for" in n for n in named.estimate.notes)
    args = ["--model", "gpt-oss-20b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch", "64"]
    code, out, _ = run(capsys, "search", *args, "--top", "1")
    assert code == 0 and said in " ".join(out.split()) and "runtime megatron-core" in out
    code, out, _ = run(capsys, "search", *args, "--top", "1", "--json")
    d = json.loads(out)
    assert code == 0 and d["notes"] == [said] and d["ranked"][0]["plan"]["runtime"] == "megatron-core"
    scaled = api.scaling(model="gpt-oss-20b", cluster="dgx-h100", gpus=[16, 32], global_batch=64)
    assert {p.plan.runtime for p in scaled.points} == {"megatron-core"}
    # a runtime's own checks run on the one chosen: exatrain's trainer offers no all-to-all
    code, _, err = run(
        capsys,
        "estimate",
        "--model",
        "llama3.1-8b-128k",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "16",
        "--cp",
        "4",
        "--cp-comm",
        "a2a",
    )
    assert code == 2 and "exatrain does not run context parallelism that way" in err


def test_train_refuses_a_model_it_does_not_build_before_its_layout(tmp_path) -> None:
    """A Megatron-Core plan (ep 16 folded over tp 2 x dp 8, which the trainer's ep-inside-dp would refuse) of a
    model the trainer does not build: `train` says the model, not the layout."""
    from exatrain import api
    from exatrain.errors import PlanError

    path = tmp_path / "qwen3.json"
    api.estimate(model="qwen3-30b-a3b", cluster="dgx-h100", gpus=16, tp=2, ep=16, sequence_parallel=True, out=path)
    with pytest.raises(PlanError, match="qwen3-30b-a3b: the trainer does not build kv_channels, qk_norm"):
        api.train(plan=path, steps=1)
