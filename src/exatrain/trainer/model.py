"""The GPT, written for one device: GPT-2/3 style and Llama style, exactly as the catalog describes,
with mixture-of-experts MLPs (``MoEBlock``, trainer/moe.py) in the layers a MoE spec names.

Nothing here knows about parallelism. The parallel techniques (``trainer/parallel``) work on this
module afterwards: the pipeline split deletes layers and ends, tensor parallelism shards the linear
layers with DTensor, activation checkpointing flips the ``recompute`` switches, data parallelism
wraps the result. Three choices make that possible:

* layers live in a ``ModuleDict`` keyed by their index in the whole model, so a parameter keeps its
  name (``layers.7.attn.wq.weight``) on whatever pipeline stage it lands; initialisation is seeded
  by that name, so the weights do not depend on the layout;
* the query, key and value projections are separate ``Linear`` layers (column-parallel sharding of
  a fused QKV matrix would hand one rank all the queries), and every reshape infers the number of
  heads (``-1``), so a tensor-parallel rank runs the same code on its share of the heads;
* ``embed``, ``norm`` and ``head`` may be ``None`` (a middle pipeline stage holds only layers).

Dropout (``spec.dropout`` > 0, while training) promises layout independence when the caller passes
``dropout_keys``, one int64 key per sequence of the batch (``dropout_keys(seed, global sample
indices)``; the trainer does): each mask is drawn from its own generator, seeded by (the sequence's
key, the layer's index in the whole model, the site, the attention head), at its full size; a rank
keeps the slice it computes (its heads under tensor parallelism, its sequence slice under sequence
parallelism). So a sequence meets the same masks on any tp/pp/dp layout, with or without activation
recomputation, and after a resume (the key depends on the sample, not on a generator's state).
Under context parallelism (parallel/context.py sets ``context``) a rank holds some positions of each
sequence: the learned position table, the rotary angles, the causal mask and the dropout masks are
indexed by those global positions, and attention gathers the whole sequence's keys and values.
The attention core then runs as explicit matmul-softmax-matmul (the s x s probabilities are
materialised: SDPA's fused dropout draws from the global generator). Without keys, dropout draws
from the global generator as ``F.dropout`` does.

Build on the meta device (``with torch.device("meta"): Transformer(spec)``) and materialise with
``exatrain.trainer.init``: no full model is ever allocated.

Shapes: b = micro-batch, s = sequence, h = hidden, V = vocab, n = heads, k = kv heads, d = head dim.
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from exatrain.catalog.models import ModelSpec
from exatrain.trainer.moe import MoE


def make_norm(spec: ModelSpec) -> nn.Module:
    """LayerNorm (weight + bias) for gpt, RMSNorm (weight only) for llama."""
    if spec.arch == "llama":
        return nn.RMSNorm(spec.hidden, eps=spec.norm_eps)
    return nn.LayerNorm(spec.hidden, eps=spec.norm_eps)


def to_compute_dtype(x: torch.Tensor) -> torch.Tensor:
    """x in autocast's 16-bit dtype when autocast is on (else unchanged). Used for the residual
    stream (the embedding's output: fp32 tables would make every residual addition fp32, as
    Megatron-LM's bf16 stream is not) and for a norm's output once before the projections it feeds
    (autocast casts per op, so q, k and v would each keep their own 16-bit copy of it)."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
        if x.dtype != dtype:
            return x.to(dtype)
    return x


ATTN_PROBS, ATTN_OUT, MLP_OUT = 0, 1, 2  # dropout sites of a layer: attention probabilities, residual branches


def dropout_keys(seed: int, samples: Iterable[int]) -> torch.Tensor:
    """int64 [len(samples)]: the dropout key of each global sample index, 63 bits of
    sha256(seed, sample) (stable across processes and layouts)."""
    return torch.tensor([_digest(f"dropout:{seed}:{int(i)}") for i in samples], dtype=torch.int64)


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & ((1 << 63) - 1)


def keep_mask(
    key: int, layer: int, site: int, index: int, shape: tuple[int, ...], p: float, device: torch.device
) -> torch.Tensor:
    """bool ``shape``: True where dropout keeps an entry (probability 1 - p); drawn from a generator
    seeded by (sequence key, layer, site, index), at the full size of the masked tensor."""
    gen = torch.Generator(device=device)
    gen.manual_seed(_digest(f"{key}:{layer}:{site}:{index}"))
    return torch.rand(shape, generator=gen, device=device) >= p


def rope_table(spec: ModelSpec, device: torch.device | str | None = None) -> torch.Tensor:
    """cos and sin of the rotary angles, [s, d/2, 2] (Su et al. 2021, RoFormer, Eq. 34)."""
    d = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
    angles = torch.outer(torch.arange(spec.seq_len, dtype=torch.float32, device=device), inv_freq)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rope(x: torch.Tensor, table: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate pairs of channels of x [b, s, n, d] by the angles of table [S, d/2, 2] at ``positions``
    (int64 [s]; None: 0 .. s-1)."""
    s = x.shape[1]
    if positions is not None:
        table = table.index_select(0, positions)
    pairs = x.float().unflatten(-1, (-1, 2))  # [b, s, n, d/2, 2]
    cos = table[:s, None, :, 0]  # [s, 1, d/2]
    sin = table[:s, None, :, 1]
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads and SDPA."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, kv, bias = spec.hidden, spec.kv_hidden, spec.has_bias
        self.head_dim = spec.head_dim
        self.kv_repeat = spec.heads // spec.kv_heads  # query heads per key/value head
        self.rotary = spec.arch == "llama"
        self.wq = nn.Linear(h, h, bias=bias)
        self.wk = nn.Linear(h, kv, bias=bias)
        self.wv = nn.Linear(h, kv, bias=bias)
        self.wo = nn.Linear(h, h, bias=bias)
        self.dropout = spec.dropout  # on the attention probabilities, while training
        self.recompute = False  # selective recomputation of the attention core (Korthikanti et al. 2022)
        self.math_kernel = False  # True: SDPA's math kernel, which stores the s x s scores
        self.index = 0  # the layer's index in the whole model (a dropout mask key)
        self.shard_rank = 0  # which share of the heads this rank holds under tp (parallel/tensor.py)
        self.context = None  # this rank's share of the sequence under cp (parallel/context.py ContextShard)

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor | None, dropout_keys: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, s, _ = x.shape  # x: [b, s, h]
        q = self.wq(x).view(b, s, -1, self.head_dim)  # [b, s, n, d]
        k = self.wk(x).view(b, s, -1, self.head_dim)  # [b, s, k, d]
        v = self.wv(x).view(b, s, -1, self.head_dim)  # [b, s, k, d]
        if self.rotary:
            assert rope is not None
            positions = None if self.context is None else self.context.positions
            q, k = apply_rope(q, rope, positions), apply_rope(k, rope, positions)
        if self.context is not None:  # the whole sequence's keys and values: [b, S, k, d]
            k, v = self.context.gather(k), self.context.gather(v)
        if self.recompute and torch.is_grad_enabled():
            y = checkpoint(self._core, q, k, v, dropout_keys, use_reentrant=False)
        else:
            y = self._core(q, k, v, dropout_keys)
        return self.wo(y.flatten(2))  # [b, s, h]

    def _core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_keys: torch.Tensor | None = None
    ) -> torch.Tensor:
        """softmax(q k^T / sqrt(d)) v, causal: q [b, s, n, d], k and v [b, S, k, d] (S = s, or the
        whole sequence under cp, masked by global positions) -> [b, s, n, d]."""
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, n|k, s, d]
        if self.kv_repeat > 1:
            k = k.repeat_interleave(self.kv_repeat, dim=1)  # [b, n, s, d]
            v = v.repeat_interleave(self.kv_repeat, dim=1)
        p = self.dropout if self.training else 0.0
        if p and dropout_keys is not None:
            return self._keyed_dropout_core(q, k, v, dropout_keys, p).transpose(1, 2)
        mask = None if self.context is None else self.context.causal_mask()  # [s, S]: True = attend
        kw = dict(dropout_p=p, is_causal=mask is None, attn_mask=mask)
        if self.math_kernel:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.MATH]):
                y = F.scaled_dot_product_attention(q, k, v, **kw)
        else:
            y = F.scaled_dot_product_attention(q, k, v, **kw)
        return y.transpose(1, 2)

    def _keyed_dropout_core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, p: float
    ) -> torch.Tensor:
        """Attention (Vaswani et al. 2017, Eq. 1) with dropout on the probabilities, each head's
        mask keyed by its global head index: [b, n, s, d] -> [b, n, s, d]."""
        b, n, s, d = q.shape
        S = k.shape[2]  # keys: the whole sequence (under cp, gathered)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))  # [b, n, s, S]
        if self.context is None:
            future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
            rows = cols = None
        else:
            future = ~self.context.causal_mask()
            rows, cols = self.context.positions, self.context.all_positions
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        first = self.shard_rank * n  # global index of this rank's first head

        def mask(key: int, j: int) -> torch.Tensor:  # [s, S]: the whole mask's rows and columns held here
            m = keep_mask(key, self.index, ATTN_PROBS, first + j, (S, S), p, q.device)
            return m if rows is None else m.index_select(0, rows).index_select(1, cols)

        keep = torch.stack([torch.stack([mask(key, j) for j in range(n)]) for key in keys.tolist()])  # [b, n, s, S]
        probs = probs.masked_fill(~keep, 0.0) * (1.0 / (1.0 - p))
        return torch.matmul(probs.to(v.dtype), v)


class MLP(nn.Module):
    """GELU MLP (gpt: fc1, fc2) or SwiGLU (llama: w1 gate, w3 up, w2 down; Shazeer 2020)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn_hidden
        self.gated = spec.gated_mlp
        if self.gated:
            self.w1 = nn.Linear(h, f, bias=False)
            self.w3 = nn.Linear(h, f, bias=False)
            self.w2 = nn.Linear(f, h, bias=False)
        else:
            self.fc1 = nn.Linear(h, f, bias=True)
            self.fc2 = nn.Linear(f, h, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, s, h] -> [b, s, h]
        if self.gated:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))  # inner [b, s, f]
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, spec: ModelSpec, index: int = 0) -> None:
        super().__init__()
        self.attn_norm = make_norm(spec)
        self.attn = Attention(spec)
        self.mlp_norm = make_norm(spec)
        self.mlp = self.make_mlp(spec)
        self.dropout = spec.dropout  # on both residual branches (GPT-2, Megatron-LM)
        self.recompute = False  # full recomputation: keep only the layer input (Chen et al. 2016)
        self.index = self.attn.index = index  # position in the whole model: a dropout mask key
        # Under sequence parallelism this rank holds sequence slice shard_rank of shard_count
        # (parallel/tensor.py sets these; the dropout masks are sliced alike).
        self.shard_rank, self.shard_count, self.sequence_sharded = 0, 1, False
        self.context = None  # this rank's share of the sequence under cp (parallel/context.py)

    def make_mlp(self, spec: ModelSpec) -> nn.Module:
        return MLP(spec)

    def set_shard(self, rank: int, count: int, sequence: bool) -> None:
        """This rank holds heads share ``rank`` of ``count`` (tensor parallelism) and, when
        ``sequence``, the same share of the sequence between the attention and the MLP."""
        self.shard_rank = self.attn.shard_rank = rank
        self.shard_count, self.sequence_sharded = count, sequence

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor | None, dropout_keys: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, rope, dropout_keys, use_reentrant=False)
        return self._forward(x, rope, dropout_keys)

    def _forward(self, x: torch.Tensor, rope: torch.Tensor | None, keys: torch.Tensor | None = None) -> torch.Tensor:
        y = self.attn(to_compute_dtype(self.attn_norm(x)), rope, dropout_keys=keys)
        x = x + self._drop(y, keys, ATTN_OUT)  # [b, s, h]
        return x + self._drop(self.mlp(to_compute_dtype(self.mlp_norm(x))), keys, MLP_OUT)

    def _drop(self, x: torch.Tensor, keys: torch.Tensor | None, site: int) -> torch.Tensor:
        """Residual-branch dropout of x [b, s, h] (s: this rank's slice under sequence parallelism)."""
        if not self.dropout or not self.training:
            return x
        if keys is None:
            return F.dropout(x, self.dropout, True)
        b, s, h = x.shape
        rows = s * self.shard_count if self.sequence_sharded else s  # the whole sequence (this cp rank's)
        first = self.shard_rank * s if self.sequence_sharded else 0
        if self.context is None:

            def mine(m: torch.Tensor) -> torch.Tensor:
                return m[first : first + s]
        else:  # the rows at this rank's global positions
            held = self.context.positions[first : first + s]
            rows = len(self.context.all_positions)

            def mine(m: torch.Tensor) -> torch.Tensor:
                return m.index_select(0, held)

        keep = torch.stack(
            [mine(keep_mask(key, self.index, site, 0, (rows, h), self.dropout, x.device)) for key in keys.tolist()]
        )  # [b, s, h]
        return x.masked_fill(~keep, 0.0) * (1.0 / (1.0 - self.dropout))


class MoEBlock(Block):
    """A layer whose MLP is a mixture of experts (trainer/moe.py); the rest as Block."""

    def make_mlp(self, spec: ModelSpec) -> nn.Module:
        return MoE(spec)


def make_block(spec: ModelSpec, index: int) -> Block:
    """Layer ``index``: a MoEBlock where the spec puts a MoE layer (its dense-first layers and the
    layers between MoE layers keep the dense MLP), a Block otherwise."""
    return MoEBlock(spec, index) if spec.layer_is_moe(index) else Block(spec, index)


class Embeddings(nn.Module):
    """Token embedding, plus the learned position table of the gpt family."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.tok = nn.Embedding(spec.vocab, spec.hidden)
        self.pos = nn.Embedding(spec.seq_len, spec.hidden) if spec.learned_positions else None
        self.context = None  # this rank's share of the sequence under cp (parallel/context.py)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [b, s] -> [b, s, h]
        x = self.tok(tokens)
        if self.pos is not None:
            positions = (
                torch.arange(tokens.shape[1], device=tokens.device) if self.context is None else self.context.positions
            )
            x = x + self.pos(positions)  # + [s, h]
        return to_compute_dtype(x)


class Transformer(nn.Module):
    """The whole model, or (after the pipeline split) a contiguous run of its layers.

    forward: token ids [b, s] -> logits [b, s, V] for the whole model; a first stage maps ids to
    hidden states [b, s, h], a middle stage hidden states to hidden states, a last stage hidden
    states to logits.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed: Embeddings | None = Embeddings(spec)
        self.layers = nn.ModuleDict({str(i): make_block(spec, i) for i in range(spec.layers)})
        self.norm: nn.Module | None = make_norm(spec)
        self.head: nn.Linear | None = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tied_embeddings:
            self.head.weight = self.embed.tok.weight  # one parameter, counted once
        # Rotary angles: derived, not trained; rebuilt by reset_buffers after materialisation.
        self.register_buffer("rope", rope_table(spec) if spec.arch == "llama" else None, persistent=False)
        self.context = None  # this rank's share of the sequence under cp (parallel/context.py)

    def reset_buffers(self) -> None:
        if self.rope is not None:
            self.rope = rope_table(self.spec, device=self.rope.device)

    def forward(self, x: torch.Tensor, dropout_keys: torch.Tensor | None = None) -> torch.Tensor:
        """``dropout_keys``: int64 [b], one per sequence (see the module docstring); None draws
        dropout masks from the global generator."""
        if self.embed is not None:
            x = self.embed(x)  # [b, s] -> [b, s, h]
        for layer in self.layers.values():
            x = layer(x, self.rope, dropout_keys)  # [b, s, h]
        if self.head is not None:
            x = self.head(self.norm(x))  # [b, s, V]
        return x


NORMS = ("attn_norm", "mlp_norm", "norm")  # module names of the normalisation layers


def init_std(name: str, spec: ModelSpec) -> float | None:
    """Standard deviation of a weight's normal init, or None for norms and biases.

    GPT-2's scheme (Radford et al. 2019, Sec. 2.3): N(0, 0.02), with the projections that write
    into the residual stream scaled by 1/sqrt(2 * layers) (in a MoE layer: every expert's down
    projection, routed and shared, as Megatron-Core's output_layer_init_method). The router's
    balancing bias starts at 0 (DeepSeek-V3)."""
    parts = name.split(".")
    if parts[-1] == "bias" or (len(parts) > 1 and parts[-2] in NORMS):
        return None
    if name.endswith(("attn.wo.weight", "mlp.fc2.weight", "mlp.w2.weight", "mlp.experts.w2", "mlp.shared.w2.weight")):
        return 0.02 / math.sqrt(2 * spec.layers)
    return 0.02


def init_fill(name: str) -> float:
    """Constant for parameters without a random init: norm weights 1, biases 0."""
    return 0.0 if name.endswith(".bias") else 1.0


def canonical_name(name: str, spec: ModelSpec) -> str:
    """The name a parameter has in the whole single-device model. A tied head's own copy on the last
    pipeline stage is the token embedding; wrappers' prefixes are dropped."""
    for prefix in ("module.", "_orig_mod.", "_checkpoint_wrapped_module."):
        name = name.replace(prefix, "")
    name = name.replace("parametrizations.", "").replace(".original", "")
    if spec.tied_embeddings and name == "head.weight":
        return "embed.tok.weight"
    return name


__all__ = [
    "ATTN_OUT",
    "ATTN_PROBS",
    "Attention",
    "Block",
    "Embeddings",
    "MLP",
    "MLP_OUT",
    "MoEBlock",
    "Transformer",
    "apply_rope",
    "canonical_name",
    "dropout_keys",
    "init_fill",
    "init_std",
    "keep_mask",
    "make_block",
    "make_norm",
    "rope_table",
]
