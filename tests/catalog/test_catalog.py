"""Catalog: presets load, user files load, and malformed files fail with one clear message."""

from __future__ import annotations

import pytest

from exatrain.catalog import (
    cluster_catalog,
    device_catalog,
    get_cluster,
    get_device,
    get_model,
    load_cluster_file,
    load_model_file,
    match_device,
    model_presets,
)
from exatrain.errors import UserError


def test_required_presets_exist() -> None:
    names = set(model_presets())
    for n in (
        "gpt-1.4b",
        "gpt-22b",
        "gpt-175b",
        "gpt-1t",
        "gpt3-125m",
        "gpt3-175b",
        "megatron-1.7b",
        "megatron-1t",
        "llama3-8b",
        "llama3-70b",
        "llama3-405b",
        "gpt-tiny",
    ):
        assert n in names
    assert {"frontier", "dgx-a100", "dgx-h100", "dgx-h200"} <= set(cluster_catalog())


def test_family_defaults() -> None:
    g, llama = get_model("gpt-175b"), get_model("llama3-70b")
    assert (g.ffn_hidden, g.kv_heads, g.tied_embeddings) == (4 * 12288, 96, True)
    assert (llama.ffn_hidden, llama.kv_heads, llama.tied_embeddings) == (28672, 8, False)


def test_frontier_link_tiers() -> None:
    f = get_cluster("frontier")
    assert f.tier_for(2).name == "gcd-pair"
    assert f.tier_for(8).name == "infinity-fabric"
    assert f.tier_for(9).name == "slingshot"
    assert f.tier_for(2).bytes_per_s > f.tier_for(8).bytes_per_s > f.tier_for(16).bytes_per_s


def test_unknown_preset_suggests() -> None:
    with pytest.raises(UserError, match="unknown model preset 'gpt-175'.*gpt-175b"):
        get_model("gpt-175")


def test_user_model_and_cluster_files(tmp_path) -> None:
    mf = tmp_path / "mine.toml"
    mf.write_text(
        'arch = "llama"\nlayers = 2\nhidden = 32\nheads = 4\nkv_heads = 2\nffn_hidden = 64\nseq_len = 16\nvocab = 100\n'
    )
    m = load_model_file(mf)
    assert m.name == "mine" and m.kv_heads == 2
    cf = tmp_path / "lab.json"
    cf.write_text(
        '{"name": "lab", "device": "h100-sxm", "gpus_per_node": 4, "tier": ['
        '{"name": "nvl", "span": 4, "bytes_per_s": 1e11, "latency_s": 3e-6},'
        '{"name": "eth", "span": 0, "bytes_per_s": 1e10, "latency_s": 2e-5}]}'
    )
    c = load_cluster_file(cf)
    assert c.gpus_per_node == 4 and c.tier_for(8).name == "eth"


@pytest.mark.parametrize(
    "text, message",
    [
        ("layers = [", "not valid TOML"),
        ('arch = "gpt"\nlayers = 2\nhidden = 30\nheads = 4\nseq_len = 8\nvocab = 10\n', "not divisible by heads"),
        ('arch = "gpt"\nlayers = -2\nhidden = 32\nheads = 4\nseq_len = 8\nvocab = 10\n', "layers must be a positive"),
        ('arch = "gpt"\nlayers = 2\n', "missing model field"),
        (
            'arch = "gpt"\nlayers = 2\nhidden = 32\nheads = 4\nseq_len = 8\nvocab = 10\ncolour = 1\n',
            "unknown model field",
        ),
    ],
)
def test_malformed_model_files(tmp_path, text, message) -> None:
    f = tmp_path / "m.toml"
    f.write_text(text)
    with pytest.raises(UserError, match=message):
        load_model_file(f)


def test_malformed_cluster_file(tmp_path) -> None:
    f = tmp_path / "c.toml"
    f.write_text(
        'device = "h100-sxm"\ngpus_per_node = 8\n[[tier]]\nname = "x"\nspan = 8\nbytes_per_s = 1e11\nlatency_s = 1e-6\n'
    )
    with pytest.raises(UserError, match="last tier must be the network"):
        load_cluster_file(f)
    f.write_text('device = "tpu"\ngpus_per_node = 8\n')
    with pytest.raises(UserError, match="unknown device 'tpu'"):
        load_cluster_file(f)


# ---- mixture of experts, long context, fp8-capable hardware ------------------------------------------
def test_moe_and_long_context_presets() -> None:
    names = set(model_presets())
    assert {"mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "moe-tiny"} <= names
    for size in ("8b", "70b", "405b"):
        short, long = get_model(f"llama3.1-{size}-8k"), get_model(f"llama3.1-{size}-128k")
        assert (short.seq_len, long.seq_len) == (8192, 131072)
        assert short.replace(seq_len=131072, name=long.name, description=long.description) == long
        assert short.replace(name=f"llama3-{size}", description="") == get_model(f"llama3-{size}")
    mix, qwen, ds = get_model("mixtral-8x7b"), get_model("qwen3-30b-a3b"), get_model("deepseek-v3")
    assert (mix.experts, mix.top_k, mix.expert_width, mix.moe_layers) == (8, 2, 14336, 32)
    assert (qwen.experts, qwen.top_k, qwen.expert_width, qwen.head_dim, qwen.q_width) == (128, 8, 768, 128, 4096)
    big = get_model("qwen3-235b-a22b")  # Qwen's model card: 235B parameters, 22B activated
    assert (big.experts, big.top_k, big.expert_width, big.head_dim, big.q_width, big.qk_norm) == (
        128,
        8,
        1536,
        128,
        8192,
        True,
    )
    from exatrain.accounting.params import total_params

    assert round(total_params(big) / 1e9) == 235
    assert (ds.experts, ds.top_k, ds.shared_experts, ds.dense_layers, ds.moe_layers) == (256, 8, 1, 3, 58)
    assert ds.mla and (ds.q_lora_rank, ds.kv_lora_rank, ds.rope_head_dim) == (1536, 512, 64)
    assert ds.router == "sigmoid" and ds.router_bias
    tiny = get_model("moe-tiny")
    assert tiny.seq_len <= 64 and tiny.hidden == 64 and tiny.experts == 4 and tiny.top_k == 2


def test_dense_presets_serialise_as_before() -> None:
    """Every dense preset's dict has exactly the fields that existed before MoE/MLA, so plan files
    stay the same; every preset round-trips."""
    old = {
        "name",
        "arch",
        "layers",
        "hidden",
        "heads",
        "seq_len",
        "vocab",
        "kv_heads",
        "ffn_hidden",
        "tied_embeddings",
        "rope_theta",
        "norm_eps",
        "dropout",
        "description",
    }
    for m in model_presets().values():
        d = m.to_dict()
        if not (m.is_moe or m.kv_channels):
            assert set(d) == old, m.name
        assert type(m).from_dict(d) == m


def test_user_moe_model_file(tmp_path) -> None:
    f = tmp_path / "mymoe.toml"
    f.write_text(
        'arch = "llama"\nlayers = 4\nhidden = 64\nheads = 4\nkv_heads = 2\nffn_hidden = 128\n'
        "seq_len = 16\nvocab = 100\nexperts = 8\ntop_k = 2\nexpert_ffn_hidden = 32\nmoe_every = 2\n"
    )
    m = load_model_file(f)
    assert m.is_moe and m.moe_layers == 2 and m.expert_width == 32
    f.write_text(
        'arch = "llama"\nlayers = 4\nhidden = 64\nheads = 4\nffn_hidden = 128\nseq_len = 16\n'
        "vocab = 100\nexperts = 8\ntop_k = 9\n"
    )
    with pytest.raises(UserError, match="top_k 9 exceeds experts 8"):
        load_model_file(f)


@pytest.mark.parametrize(
    "name, bf16, fp8, hbm_gb, hbm_tb_s, link_gb_s",
    [
        ("h100-sxm", 989.4, 1978.9, 85.5, 3.35, 450),
        ("h200-sxm", 989.4, 1978.9, 150.8, 4.8, 450),
        ("b200", 2250.0, 4500.0, 192.3, 7.7, 900),
        ("mi300x", 1307.4, 2614.9, 206.2, 5.3, 448),
        ("mi355x", 2516.6, 5033.2, 309.2, 8.0, 537.6),
    ],
)
def test_devices_have_bf16_and_fp8_peaks(name, bf16, fp8, hbm_gb, hbm_tb_s, link_gb_s) -> None:
    d = get_device(name)
    assert d.peak_flops("bfloat16") == pytest.approx(bf16 * 1e12)
    assert d.peak_flops("float8") == pytest.approx(fp8 * 1e12)
    assert d.hbm_bytes / 1e9 == pytest.approx(hbm_gb, abs=0.05)
    assert d.hbm_bytes_per_s == pytest.approx(hbm_tb_s * 1e12)
    assert d.link_bytes_per_s == pytest.approx(link_gb_s * 1e9)
    assert get_device("a100-80gb").peak_flops("float8") is None


def test_new_clusters_and_their_node_links() -> None:
    for name, device in (("dgx-b200", "b200"), ("mi300x-platform", "mi300x"), ("mi355x-platform", "mi355x")):
        c = get_cluster(name)
        assert c.device.name == device and c.gpus_per_node == 8
    # the tier spanning a node carries what the device's links carry
    for c in cluster_catalog().values():
        if c.device.link_bytes_per_s and c.gpus_per_node == 8 and c.name != "frontier":
            assert c.tier_for(8).bytes_per_s == pytest.approx(c.device.link_bytes_per_s), c.name
    # a full Infinity Fabric mesh: n GPUs of a node reach each other over n - 1 links each
    mi = get_cluster("mi300x-platform")
    assert [mi.tier_for(n).bytes_per_s for n in (2, 4, 8)] == [64e9, 3 * 64e9, 7 * 64e9]
    assert mi.tier_for(16).name == "400g-nic"


def test_lumi_is_frontiers_node() -> None:
    """LUMI-G's node is Frontier's: 4 MI250X (8 GCDs), the GCD pair, Infinity Fabric, 4 Slingshot-11 NICs."""
    lumi, frontier = get_cluster("lumi"), get_cluster("frontier")
    assert lumi.device.name == "mi250x-gcd" and lumi.gpus_per_node == 8
    assert [(t.span, t.bytes_per_s) for t in lumi.tiers] == [(t.span, t.bytes_per_s) for t in frontier.tiers]


def test_match_new_device_names() -> None:
    assert match_device("NVIDIA B200").name == "b200"
    assert match_device("AMD Instinct MI355X").name == "mi355x"
    assert match_device("AMD Instinct MI300X").name == "mi300x"
    assert {"b200", "mi355x"} <= set(device_catalog())
