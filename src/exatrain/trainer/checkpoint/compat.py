"""Does a checkpoint fit a model? Compared tensor by tensor, before any rank starts.

The tensors a checkpoint of model M may hold (state.py names them): ``model.<p>`` for every
parameter p of M with p's shape and dtype; ``optim.<p>.exp_avg`` / ``.exp_avg_sq`` of the same shape
and dtype, and ``optim.<p>.step`` a float32 scalar (AdamW's state, present for all of M's trained parameters
or none); ``rng.rank<r>.cpu`` / ``.cuda``, 1-D uint8 generator states. Anything else, or any other
shape or dtype, is refused with one line naming the tensor.
"""

from __future__ import annotations

import re

import torch

from exatrain.catalog.models import ModelSpec
from exatrain.trainer.checkpoint.files import CheckpointError, Manifest
from exatrain.trainer.model import Transformer, canonical_name

_RNG = re.compile(r"^rng\.rank\d+\.(cpu|cuda)$")
_ADAM = ("exp_avg", "exp_avg_sq")


def expected_params(spec: ModelSpec) -> dict[str, tuple[list[int], str]]:
    """Every parameter of the whole model by canonical name: (shape, dtype name), built on the meta device."""
    with torch.device("meta"):
        model = Transformer(spec)
    return {
        canonical_name(n, spec): (list(p.shape), str(p.dtype).removeprefix("torch."))
        for n, p in model.named_parameters()
    }


def trained_params(spec: ModelSpec) -> set[str]:
    """Canonical names of the parameters the optimizer updates (an MoE router's balancing bias is a
    parameter that is not trained: it has no optimizer state)."""
    with torch.device("meta"):
        model = Transformer(spec)
    return {canonical_name(n, spec) for n, p in model.named_parameters() if p.requires_grad}


def expected_shapes(spec: ModelSpec) -> dict[str, list[int]]:
    """Every parameter of the whole model by canonical name, and its shape."""
    return {name: shape for name, (shape, _) in expected_params(spec).items()}


def check_model(manifest: Manifest, spec: ModelSpec) -> None:
    """CheckpointError (one line) unless the checkpoint holds exactly this model's parameters (and
    optimizer and generator states that go with them)."""
    saved_for = manifest.plan.model.name
    table = manifest.tensors
    want = expected_params(spec)
    stored = {k.removeprefix("model."): v for k, v in table.items() if k.startswith("model.")}
    for name, (shape, _) in want.items():
        if name not in stored:
            raise CheckpointError(
                f"{manifest.path} was saved for another model ({saved_for}): it has no {name}, which {spec.name} needs"
            )
        if stored[name]["size"] != shape:
            raise CheckpointError(
                f"{manifest.path} was saved for another model ({saved_for}): {name} is "
                f"{stored[name]['size']} there but {shape} in {spec.name}"
            )
    extra = sorted(set(stored) - set(want))
    if extra:
        raise CheckpointError(
            f"{manifest.path} was saved for another model ({saved_for}): it has {extra[0]}, which {spec.name} lacks"
        )
    _check_states(manifest, want)


def _check_states(manifest: Manifest, want: dict[str, tuple[list[int], str]]) -> None:
    """Every tensor's name is one a checkpoint of this model may hold, with its shape and dtype."""
    has_optim = False
    for key, t in manifest.tensors.items():
        size, dtype = t["size"], t["dtype"]
        if key.startswith("model."):
            shape, kind = want[key.removeprefix("model.")]
        elif key.startswith("optim."):
            name, _, state = key.removeprefix("optim.").rpartition(".")
            if name not in want or state not in (*_ADAM, "step"):
                raise CheckpointError(
                    f"{manifest.path}: holds tensor {key[:120]!r}, which is not a state of "
                    f"{manifest.plan.model.name}'s optimizer"
                )
            has_optim = True
            shape, kind = ([], "float32") if state == "step" else want[name]
        elif _RNG.match(key):
            if len(size) != 1:
                raise CheckpointError(f"{manifest.path}: generator state {key} is {size}, not one-dimensional")
            shape, kind = size, "uint8"
        else:
            raise CheckpointError(f"{manifest.path}: holds tensor {key[:120]!r}, which no exatrain checkpoint has")
        if size != shape or dtype != kind:
            raise CheckpointError(f"{manifest.path}: {key} is {dtype} {size}, not {kind} {shape}")
    if has_optim:
        trained = trained_params(manifest.plan.model)
        missing = [
            f"optim.{n}.{s}"
            for n in want
            if n in trained
            for s in (*_ADAM, "step")
            if f"optim.{n}.{s}" not in manifest.tensors
        ]
        if missing:
            raise CheckpointError(f"{manifest.path}: holds optimizer states but not {missing[0]}")


def check_consistent(manifest: Manifest) -> None:
    """The checkpoint's tensors against the model of its own plan: a crafted or damaged table (an
    unknown tensor, another shape or dtype) makes the checkpoint unusable, so a search for the
    newest usable checkpoint passes over it (files.newest_complete)."""
    check_model(manifest, manifest.plan.model)


__all__ = ["check_consistent", "check_model", "expected_params", "expected_shapes", "trained_params"]
