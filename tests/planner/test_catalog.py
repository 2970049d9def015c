"""Catalog: presets load, user files load, and malformed files fail with one clear message."""

from __future__ import annotations

import pytest

from exatrain.catalog import (cluster_catalog, get_cluster, get_model, load_cluster_file,
                              load_model_file, model_presets)
from exatrain.errors import UserError


def test_required_presets_exist() -> None:
    names = set(model_presets())
    for n in ("gpt-1.4b", "gpt-22b", "gpt-175b", "gpt-1t", "gpt3-125m", "gpt3-175b", "megatron-1.7b",
              "megatron-1t", "llama3-8b", "llama3-70b", "llama3-405b", "gpt-tiny"):
        assert n in names
    assert {"frontier", "dgx-a100", "dgx-h100", "dgx-h200"} <= set(cluster_catalog())


def test_family_defaults() -> None:
    g, l = get_model("gpt-175b"), get_model("llama3-70b")
    assert (g.ffn_hidden, g.kv_heads, g.tied_embeddings) == (4 * 12288, 96, True)
    assert (l.ffn_hidden, l.kv_heads, l.tied_embeddings) == (28672, 8, False)


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
    mf.write_text('arch = "llama"\nlayers = 2\nhidden = 32\nheads = 4\nkv_heads = 2\n'
                  'ffn_hidden = 64\nseq_len = 16\nvocab = 100\n')
    m = load_model_file(mf)
    assert m.name == "mine" and m.kv_heads == 2
    cf = tmp_path / "lab.json"
    cf.write_text('{"name": "lab", "device": "h100-sxm", "gpus_per_node": 4, "tier": ['
                  '{"name": "nvl", "span": 4, "bytes_per_s": 1e11, "latency_s": 3e-6},'
                  '{"name": "eth", "span": 0, "bytes_per_s": 1e10, "latency_s": 2e-5}]}')
    c = load_cluster_file(cf)
    assert c.gpus_per_node == 4 and c.tier_for(8).name == "eth"


@pytest.mark.parametrize("text, message", [
    ("layers = [", "not valid TOML"),
    ('arch = "gpt"\nlayers = 2\nhidden = 30\nheads = 4\nseq_len = 8\nvocab = 10\n', "not divisible by heads"),
    ('arch = "gpt"\nlayers = -2\nhidden = 32\nheads = 4\nseq_len = 8\nvocab = 10\n', "layers must be a positive"),
    ('arch = "gpt"\nlayers = 2\n', "missing model field"),
    ('arch = "gpt"\nlayers = 2\nhidden = 32\nheads = 4\nseq_len = 8\nvocab = 10\ncolour = 1\n', "unknown model field"),
])
def test_malformed_model_files(tmp_path, text, message) -> None:
    f = tmp_path / "m.toml"
    f.write_text(text)
    with pytest.raises(UserError, match=message):
        load_model_file(f)


def test_malformed_cluster_file(tmp_path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('device = "h100-sxm"\ngpus_per_node = 8\n[[tier]]\nname = "x"\nspan = 8\n'
                 'bytes_per_s = 1e11\nlatency_s = 1e-6\n')
    with pytest.raises(UserError, match="last tier must be the network"):
        load_cluster_file(f)
    f.write_text('device = "tpu"\ngpus_per_node = 8\n')
    with pytest.raises(UserError, match="unknown device 'tpu'"):
        load_cluster_file(f)
