"""Hugging Face config.json files read as models: real files (tests/catalog/data/hf/<model>/config.json, the
public checkpoints' own) against each checkpoint's parameter count and its model card, through the catalog, the
CLI and the API; the catalog's presets of the same models; bad files.

Broken on purpose, each failing here: Qwen3's QK-norm dropped (Qwen3-8B and -30B-A3B off by 2*head_dim a
layer: 5 failures); head_dim ignored (hidden/heads instead: Qwen3, GPT-OSS, 8 failures); first_k_dense_replace
ignored (DeepSeek-V3 counts 3 more MoE layers: 3); the q/k/v biases of qwen2 left out of ``unmodelled``
(Qwen2.5-7B 129,024 short: 2); gpt_oss's attention sinks off (5); the default sequence ignoring a shorter limit
(GPT-2 at 4096 counts a 4096-row position table: 3).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exatrain import api
from exatrain.accounting.params import active_params, total_params
from exatrain.catalog import get_model, load_model_file
from exatrain.catalog.hf_config import DEFAULT_SEQ_LEN, read_hf_config
from exatrain.errors import UserError

from tests.helpers.cli import refused, run

HF = Path(__file__).parent / "data" / "hf"

# (folder, the checkpoint's parameters, the model card's total in billions as it prints it). The checkpoint's
# count is its model.safetensors.index.json total_size over the bytes of its dtype (2 for bf16/fp16; DeepSeek-V3's
# 671B main model without its 14B multi-token-prediction layer, README_WEIGHTS.md; GPT-OSS's counted from its
# tensors, the catalog presets' figures; GPT-NeoX-20B: Black et al. 2022, arXiv 2204.06745, Sec. 2).
CHECKPOINTS = [
    ("Llama-2-7b-hf", 6_738_415_616, "7"),  # meta-llama/Llama-2-7b-hf: "7B"
    ("Meta-Llama-3-8B", 8_030_261_248, "8"),  # meta-llama/Meta-Llama-3-8B: "8B"
    ("Llama-3.1-8B", 8_030_261_248, "8.03"),  # meta-llama/Llama-3.1-8B: 8.03B
    ("Llama-3.1-70B", 70_553_706_496, "70.6"),  # meta-llama/Llama-3.1-70B: 70.6B
    ("Mistral-7B-v0.1", 7_241_732_096, "7.24"),  # mistralai/Mistral-7B-v0.1: 7.24B
    ("Mixtral-8x7B-v0.1", 46_702_792_704, "46.70"),  # mistralai/Mixtral-8x7B-v0.1: 46.7B
    ("Qwen2.5-7B", 7_615_616_512, "7.61"),  # Qwen/Qwen2.5-7B: "Number of Parameters: 7.61B"
    ("Qwen2-57B-A14B", 57_408_658_944, "57"),  # Qwen/Qwen2-57B-A14B: 57B total, 14B activated
    ("Qwen3-8B", 8_190_735_360, "8.2"),  # Qwen/Qwen3-8B: "Number of Parameters: 8.2B"
    ("Qwen3-30B-A3B", 30_532_122_624, "30.5"),  # Qwen/Qwen3-30B-A3B: 30.5B in total, 3.3B activated
    ("DeepSeek-V3", 671_026_419_200, "671"),  # deepseek-ai/DeepSeek-V3: 671B total, 37B activated
    ("gpt-oss-120b", 116_829_156_672, "117"),  # openai/gpt-oss-120b: 117B parameters
    ("gpt-oss-20b", 20_914_757_184, "21"),  # openai/gpt-oss-20b: 21B parameters
    ("gpt2", 124_439_808, "0.124"),  # openai-community/gpt2: "124M parameters"
    ("gpt-neox-20b", 20_554_567_680, "20.55"),  # EleutherAI/gpt-neox-20b
]


def _read(folder: str, **kw):
    path = HF / folder / "config.json"
    return read_hf_config(json.loads(path.read_text()), name=folder, source=str(path), **kw)


@pytest.mark.parametrize("folder, checkpoint, card", CHECKPOINTS)
def test_counts_match_the_checkpoint_and_the_model_card(folder: str, checkpoint: int, card: str) -> None:
    """The plan counts the checkpoint's parameters exactly, less what the reader says it does not model; and that
    total is the model card's figure to the card's last digit."""
    read = _read(folder)
    counted = total_params(read.spec)
    assert counted + read.unmodelled_params == checkpoint
    unit = 10 ** -len(card.partition(".")[2])  # the card's last printed digit, in billions
    assert abs(checkpoint / 1e9 - float(card)) < unit
    if not read.unmodelled:
        assert abs(counted / 1e9 - float(card)) < unit  # the plan's own count, too
    else:  # what it leaves out is named, and small: qwen2's biases, GPT-NeoX's rotary positions (0.06%)
        assert abs(read.unmodelled_params) < 1e-3 * checkpoint


@pytest.mark.parametrize(
    "folder, active", [("Mixtral-8x7B-v0.1", 12.9), ("Qwen3-30B-A3B", 3.3), ("Qwen2-57B-A14B", 14)]
)
def test_activated_parameters(folder: str, active: float) -> None:
    """The model cards' activated parameters (Mixtral 12.9B, Qwen3-30B-A3B 3.3B, Qwen2-57B-A14B 14B)."""
    unit = 0.1 if active < 14 else 1  # the card's last printed digit (Qwen's cards truncate: 3.35 prints 3.3)
    assert abs(active_params(_read(folder).spec) / 1e9 - active) < unit


@pytest.mark.parametrize(
    "folder, preset",
    [
        ("Llama-3.1-8B", "llama3.1-8b-8k"),
        ("Llama-3.1-70B", "llama3.1-70b-8k"),
        ("Meta-Llama-3-8B", "llama3-8b"),
        ("Mixtral-8x7B-v0.1", "mixtral-8x7b"),
        ("Qwen3-30B-A3B", "qwen3-30b-a3b"),
        ("DeepSeek-V3", "deepseek-v3"),
        ("gpt-oss-120b", "gpt-oss-120b"),
        ("gpt-oss-20b", "gpt-oss-20b"),
    ],
)
def test_same_model_as_the_catalog_preset(folder: str, preset: str) -> None:
    """A config.json of a catalog model reads as that preset: every field (kv heads, head_dim, QK-norm, experts,
    top-k, shared experts, dense prefix, router, latent attention, sliding windows, sinks, biases, rope, ties)."""
    want = get_model(preset)
    got = _read(folder, seq_len=want.seq_len).spec
    assert got.replace(name=want.name, description=want.description) == want
    assert total_params(got) == total_params(want)


def test_features_read() -> None:
    mistral, oss, ds = _read("Mistral-7B-v0.1").spec, _read("gpt-oss-120b").spec, _read("DeepSeek-V3").spec
    assert (mistral.sliding_window, mistral.full_attention_every, mistral.windowed_layers) == (4096, 0, 32)
    assert (oss.sliding_window, oss.full_attention_every, oss.windowed_layers) == (128, 2, 18)
    assert oss.attention_sinks and oss.linear_bias and oss.head_dim == 64
    assert (
        ds.dense_layers,
        ds.moe_layers,
        ds.router,
        ds.router_bias,
        ds.q_lora_rank,
        ds.kv_lora_rank,
        ds.rope_head_dim,
        ds.head_dim,
    ) == (3, 58, "sigmoid", True, 1536, 512, 64, 128)
    qmoe = _read("Qwen2-57B-A14B").spec
    assert (qmoe.experts, qmoe.top_k, qmoe.shared_experts, qmoe.expert_width) == (64, 8, 8, 2560)
    gpt2, neox = _read("gpt2").spec, _read("gpt-neox-20b").spec
    assert (gpt2.arch, gpt2.tied_embeddings, gpt2.dropout, neox.arch, neox.tied_embeddings) == (
        "gpt",
        True,
        0.1,
        "gpt",
        False,
    )
    assert _read("Qwen3-8B").spec.qk_norm and _read("Qwen3-8B").spec.head_dim == 128


def test_sequence_length_is_the_callers_or_a_stated_default() -> None:
    """max_position_embeddings is the model's limit: the plan takes the given seq_len, else DEFAULT_SEQ_LEN capped at
    the limit, and a note says which."""
    read = _read("Llama-3.1-8B")
    assert read.spec.seq_len == DEFAULT_SEQ_LEN == 4096
    assert any("seq_len 4096" in n and "131072" in n and "--seq-len" in n for n in read.notes)
    assert _read("gpt2").spec.seq_len == 1024 and _read("gpt-neox-20b").spec.seq_len == 2048
    given = _read("Llama-3.1-8B", seq_len=8192)
    assert given.spec.seq_len == 8192 and not any("seq_len" in n for n in given.notes)
    # the gpt family's learned position table grows with the sequence
    assert total_params(_read("gpt2", seq_len=2048).spec) == 124_439_808 + 1024 * 768


def test_exatrain_own_files_still_load(tmp_path) -> None:
    f = tmp_path / "mine.json"
    f.write_text(
        json.dumps(
            {"arch": "llama", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "seq_len": 32, "vocab": 100}
        )
    )
    m = load_model_file(f, seq_len=999)  # seq_len is a config.json's; an exatrain file states its own
    assert (m.name, m.seq_len) == ("mine", 32)


def test_a_config_is_named_after_its_hub_id_or_its_folder(tmp_path) -> None:
    data = json.loads((HF / "Llama-2-7b-hf" / "config.json").read_text())
    assert data["_name_or_path"] == "meta-llama/Llama-2-7b-hf"
    (tmp_path / "scratch").mkdir()
    f = tmp_path / "scratch" / "config.json"
    f.write_text(json.dumps(data))
    assert load_model_file(f).name == "Llama-2-7b-hf"  # the id it was saved from, not the folder it sits in
    del data["_name_or_path"]
    f.write_text(json.dumps(data))
    assert load_model_file(f).name == "scratch"


# ---- through the CLI and the API ---------------------------------------------------------------------
@pytest.mark.parametrize("folder, billions", [("Llama-3.1-8B", "8.03"), ("Mixtral-8x7B-v0.1", "46.70")])
def test_cli_and_api_plan_the_config(capsys, folder: str, billions: str) -> None:
    path = str(HF / folder / "config.json")
    code, out, err = run(capsys, "estimate", "--model-file", path, "--gpus", "8", "--tp", "8", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert f"{d['params'] / 1e9:.2f}" == billions
    assert d["plan"]["model"]["name"] == folder and d["plan"]["model"]["seq_len"] == 4096
    assert len(err.strip().splitlines()) == 1 and "warning" in err and "seq_len 4096" in err  # one line, the choice
    code, out, err = run(
        capsys, "estimate", "--model-file", path, "--gpus", "8", "--tp", "8", "--seq-len", "8192", "--json"
    )
    d = json.loads(out)
    assert code == 0 and d["plan"]["model"]["seq_len"] == 8192 and d["plan"]["model"]["name"] == folder
    assert "seq_len" not in err
    with pytest.warns(api.ExatrainWarning, match="seq_len 4096"):
        plan = api.estimate(model_file=path, gpus=8, tp=8)
    assert f"{plan.estimate.params / 1e9:.2f}" == billions and plan.model == load_model_file(path)


def test_search_takes_a_config(capsys) -> None:
    path = str(HF / "Qwen3-8B" / "config.json")
    code, out, err = run(
        capsys,
        "search",
        "--model-file",
        path,
        "--gpus",
        "16",
        "--global-batch",
        "64",
        "--cluster",
        "dgx-h100",
        "--top",
        "2",
        "--json",
    )
    assert code == 0, err
    assert json.loads(out)["ranked"][0]["plan"]["model"]["qk_norm"] is True


@pytest.mark.parametrize(
    "content, message",
    [
        ({"model_type": "falcon", "hidden_size": 4544}, "model_type 'falcon' is not one exatrain reads"),
        ({"architectures": ["MambaForCausalLM"]}, "architectures ['MambaForCausalLM'] is not one exatrain reads"),
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": 100,
            },
            "a llama config.json needs intermediate_size",
        ),
        (
            {
                "model_type": "mixtral",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": 100,
                "intermediate_size": 128,
            },
            "needs num_local_experts",
        ),
        (
            {
                "model_type": "qwen3",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": 100,
                "intermediate_size": 128,
            },
            "needs head_dim",
        ),
        (
            {
                "model_type": "llama",
                "hidden_size": "64",
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": 100,
                "intermediate_size": 128,
            },
            "hidden must be a positive integer",
        ),
        (
            {
                "model_type": "deepseek_v3",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": 100,
                "intermediate_size": 128,
                "kv_lora_rank": 16,
                "qk_nope_head_dim": 16,
                "v_head_dim": 32,
                "qk_rope_head_dim": 8,
            },
            "qk_nope_head_dim 16 != v_head_dim 32",
        ),
    ],
)
def test_bad_configs_are_one_line(capsys, tmp_path, content, message) -> None:
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(content))
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_model_file(path)
    assert message in refused(capsys, "estimate", "--model-file", str(path))
