"""The single-device model: exact parameter counts, shapes, deterministic layout-free init, the split."""

from __future__ import annotations

import pytest
import torch

from exatrain.catalog import get_model
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.accounting.params import stage_params, total_params
from exatrain.trainer.init import materialize, param_seed
from exatrain.trainer.model import Transformer, apply_rope, canonical_name, rope_table
from exatrain.trainer.parallel.pipeline import split_stages


def meta_model(name: str) -> Transformer:
    with torch.device("meta"):
        return Transformer(get_model(name))


@pytest.mark.parametrize(
    "name", ["gpt-tiny", "llama-tiny", "gpt-small", "gpt3-1.3b", "gpt-175b", "megatron-1t", "llama3-8b", "llama3-70b"]
)
def test_parameter_count_equals_the_planners(name: str) -> None:
    model = meta_model(name)
    assert sum(p.numel() for p in model.parameters()) == total_params(get_model(name))


def test_tied_head_is_the_embedding_and_llama_is_untied() -> None:
    gpt, llama = meta_model("gpt-tiny"), meta_model("llama-tiny")
    assert gpt.head.weight is gpt.embed.tok.weight
    assert llama.head.weight is not llama.embed.tok.weight
    assert llama.embed.pos is None and gpt.embed.pos is not None


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_forward_shapes_and_initial_loss(name: str) -> None:
    spec = get_model(name)
    with torch.device("meta"):
        model = Transformer(spec)
    materialize(model, spec, seed=0, device=torch.device("cpu"))
    tokens = torch.randint(0, spec.vocab, (2, spec.seq_len))
    logits = model(tokens)
    assert logits.shape == (2, spec.seq_len, spec.vocab)
    targets = torch.randint(0, spec.vocab, (2, spec.seq_len))
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    # small init: close to a uniform guess over the vocabulary
    assert abs(loss.item() - torch.log(torch.tensor(float(spec.vocab))).item()) < 0.2


def test_materialize_keeps_the_tie_and_is_deterministic() -> None:
    spec = get_model("gpt-tiny")
    a, b = meta_model("gpt-tiny"), meta_model("gpt-tiny")
    materialize(a, spec, seed=3, device=torch.device("cpu"))
    materialize(b, spec, seed=3, device=torch.device("cpu"))
    assert a.head.weight is a.embed.tok.weight
    assert sum(p.numel() for p in a.parameters()) == total_params(spec)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    c = meta_model("gpt-tiny")
    materialize(c, spec, seed=4, device=torch.device("cpu"))
    assert not torch.equal(c.layers["0"].attn.wq.weight, a.layers["0"].attn.wq.weight)


def test_init_values_do_not_depend_on_the_pipeline_split() -> None:
    """Each stage, built alone, holds exactly the whole model's values under the same names; the
    last stage's own copy of a tied embedding equals the first stage's embedding."""
    spec = get_model("gpt-tiny")
    whole = meta_model("gpt-tiny")
    materialize(whole, spec, seed=0, device=torch.device("cpu"))
    ref = dict(whole.named_parameters())
    plan = Plan(
        model=spec, dims=ParallelDims(pp=2), shape=TrainShape(1, 4), schedule="interleaved", interleave=2
    ).validate()
    seen = set()
    for pp_rank in range(2):
        for index, stage in split_stages(meta_model("gpt-tiny"), plan, pp_rank):
            materialize(stage, spec, seed=0, device=torch.device("cpu"))
            for name, p in stage.named_parameters():
                assert torch.equal(p, ref[canonical_name(name, spec)]), name
                seen.add(canonical_name(name, spec))
            if index == plan.virtual_stages - 1:
                assert stage.embed is None and torch.equal(stage.head.weight, ref["embed.tok.weight"])
    assert seen == set(ref)


def test_interleaved_split_uses_looped_placement_and_uneven_layers() -> None:
    spec = get_model("gpt-tiny")  # 4 layers
    looped = Plan(
        model=spec, dims=ParallelDims(pp=2), shape=TrainShape(1, 4), schedule="interleaved", interleave=2
    ).validate()
    stages = split_stages(meta_model("gpt-tiny"), looped, 0)
    assert [(i, list(m.layers)) for i, m in stages] == [(0, ["0"]), (2, ["2"])]
    assert stages[0][1].embed is not None and stages[1][1].head is None
    uneven = Plan(model=spec, dims=ParallelDims(pp=2), shape=TrainShape(1, 4), stage_layers=(1, 3)).validate()
    ((i0, first),) = split_stages(meta_model("gpt-tiny"), uneven, 0)
    ((i1, last),) = split_stages(meta_model("gpt-tiny"), uneven, 1)
    assert (list(first.layers), list(last.layers)) == (["0"], ["1", "2", "3"])
    assert first.head is None and last.embed is None and last.head is not None


@pytest.mark.parametrize("name, pp", [("gpt-175b", 16), ("llama3-8b", 4), ("gpt-tiny", 2)])
def test_stage_parameters_equal_the_planners_stage_counts(name: str, pp: int) -> None:
    """A stage is built on meta without the rest of the model, and holds what the planner counts
    (with a tied head over pp > 1, the last stage's own embedding copy included)."""
    spec = get_model(name)
    plan = Plan(model=spec, dims=ParallelDims(pp=pp), shape=TrainShape(1, 4 * pp)).validate()
    whole = meta_model(name)  # split_stages copies what a stage keeps and leaves the whole model as it was
    counts = tuple(sum(p.numel() for _, m in split_stages(whole, plan, r) for p in m.parameters()) for r in range(pp))
    assert sum(p.numel() for p in whole.parameters()) == total_params(spec)
    assert counts == stage_params(plan)


def test_rope_is_a_rotation_and_canonical_names() -> None:
    spec = get_model("llama-tiny")
    x = torch.randn(2, spec.seq_len, 4, spec.head_dim)
    y = apply_rope(x, rope_table(spec))
    assert torch.allclose(x.norm(dim=-1), y.norm(dim=-1), atol=1e-5)
    assert torch.equal(y[:, 0], x[:, 0])  # position 0 is not rotated
    assert canonical_name("module.layers.3.attn.wq.parametrizations.weight.original", spec) == "layers.3.attn.wq.weight"
    assert canonical_name("head.weight", get_model("gpt-tiny")) == "embed.tok.weight"
    assert canonical_name("head.weight", spec) == "head.weight"
    assert param_seed(0, "a") != param_seed(0, "b") and param_seed(0, "a") == param_seed(0, "a")
