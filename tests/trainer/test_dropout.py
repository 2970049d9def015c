"""Dropout masks keyed by sample (trainer/model.py), in one process: what makes them layout-independent.

The multi-rank consequences (every layout trains like one process with dropout on, and a resume
continues the same masks) are in test_parity.py and tests/checkpoint/test_reshard.py; here, the
properties those rest on: a mask depends on its key and nothing else (not the global generator, not
a recomputation), and a rank's slice of a mask (its sequence slice, its heads) is the slice of the
whole mask.
"""

from __future__ import annotations

import pytest
import torch

from exatrain.catalog import get_model
from exatrain.trainer.init import materialize
from exatrain.trainer.model import ATTN_OUT, Block, Transformer, dropout_keys, keep_mask

P = 0.1


def model(name: str = "gpt-tiny", dropout: float = P) -> Transformer:
    spec = get_model(name).replace(dropout=dropout)
    with torch.device("meta"):
        m = Transformer(spec)
    materialize(m, spec, seed=0, device=torch.device("cpu"))
    return m.train()


def tokens(spec_name: str = "gpt-tiny") -> torch.Tensor:
    spec = get_model(spec_name)
    return torch.randint(0, spec.vocab, (2, spec.seq_len), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_a_mask_depends_on_its_key_only(name: str) -> None:
    m, x = model(name), tokens(name)
    keys = dropout_keys(0, [8, 9])
    torch.manual_seed(1)
    first = m(x, dropout_keys=keys)
    torch.manual_seed(2)  # the global generator plays no part
    assert torch.equal(m(x, dropout_keys=keys), first)
    assert not torch.allclose(m(x, dropout_keys=dropout_keys(0, [10, 11])), first)  # other samples
    assert not torch.allclose(m(x, dropout_keys=dropout_keys(1, [8, 9])), first)  # another seed
    # a sequence's masks do not depend on its batch neighbours
    alone = m(x[1:], dropout_keys=keys[1:])
    assert torch.allclose(alone, first[1:], rtol=1e-6, atol=1e-6)


def test_evaluation_and_zero_dropout_draw_nothing() -> None:
    x, keys = tokens(), dropout_keys(0, [0, 1])
    plain = model(dropout=0.0)(x, dropout_keys=keys)
    assert torch.equal(model().eval()(x, dropout_keys=keys), plain)
    assert not torch.allclose(model()(x, dropout_keys=keys), plain)


def test_keep_rate_is_one_minus_p() -> None:
    keep = keep_mask(12345, 3, ATTN_OUT, 0, (256, 256), P, torch.device("cpu"))
    assert abs(keep.float().mean().item() - (1 - P)) < 0.005  # 65,536 draws: 4 standard deviations


def test_a_sequence_slice_of_a_residual_mask_is_the_slice_of_the_whole() -> None:
    """Sequence parallelism: rank r of 2 drops exactly the entries the whole mask drops in its rows."""
    spec = get_model("gpt-tiny").replace(dropout=P)
    block = Block(spec, index=2).train()
    x, keys = torch.randn(2, spec.seq_len, spec.hidden), dropout_keys(0, [3, 4])
    whole = block._drop(x, keys, ATTN_OUT)
    half = spec.seq_len // 2
    for rank in range(2):
        block.set_shard(rank, 2, sequence=True)
        rows = slice(rank * half, (rank + 1) * half)
        assert torch.equal(block._drop(x[:, rows], keys, ATTN_OUT), whole[:, rows])


def test_a_rank_of_heads_gets_those_heads_masks() -> None:
    """Tensor parallelism: rank 1 of 2 holds heads 2-3 and drops what the whole model drops there."""
    spec = get_model("llama-tiny").replace(dropout=P)
    attn = Block(spec, index=1).train().attn
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, spec.heads, spec.seq_len, spec.head_dim, generator=gen) for _ in range(3))
    keys = dropout_keys(0, [5, 6])
    whole = attn._keyed_dropout_core(q, k, v, keys, P)
    attn.shard_rank = 1
    part = attn._keyed_dropout_core(q[:, 2:], k[:, 2:], v[:, 2:], keys, P)
    assert torch.allclose(part, whole[:, 2:], rtol=1e-6, atol=1e-7)
    attn.shard_rank = 0  # rank 0's masks are the first heads' masks, not the second's
    assert not torch.allclose(attn._keyed_dropout_core(q[:, 2:], k[:, 2:], v[:, 2:], keys, P), whole[:, 2:])


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_recomputation_replays_the_same_masks(recompute: str) -> None:
    x, keys = tokens(), dropout_keys(0, [0, 1])
    grads = []
    for on in (False, True):
        m = model()
        for block in m.layers.values():
            block.recompute = on and recompute == "full"
            block.attn.recompute = on and recompute == "selective"
        m(x, dropout_keys=keys).float().square().mean().backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
    for name, g in grads[0].items():
        assert torch.allclose(grads[1][name], g, rtol=1e-5, atol=1e-8), name
