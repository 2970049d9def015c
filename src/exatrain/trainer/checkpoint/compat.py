"""Does a checkpoint fit a model? Compared tensor by tensor, before any rank starts."""

from __future__ import annotations

import torch

from exatrain.catalog.models import ModelSpec
from exatrain.trainer.checkpoint.files import CheckpointError, Manifest
from exatrain.trainer.checkpoint.storage import read_metadata_json
from exatrain.trainer.model import Transformer, canonical_name


def expected_shapes(spec: ModelSpec) -> dict[str, list[int]]:
    """Every parameter of the whole model by canonical name, and its shape (built on the meta device)."""
    with torch.device("meta"):
        model = Transformer(spec)
    return {canonical_name(n, spec): list(p.shape) for n, p in model.named_parameters()}


def check_model(manifest: Manifest, spec: ModelSpec) -> None:
    """CheckpointError (one line) unless the checkpoint holds exactly this model's parameters."""
    table = read_metadata_json(manifest.path)
    stored = {k.removeprefix("model."): v["size"] for k, v in table.items() if k.startswith("model.")}
    want = expected_shapes(spec)
    saved_for = (manifest.trainer.get("plan") or {}).get("model", {}).get("name", "?")
    for name, shape in want.items():
        if name not in stored:
            raise CheckpointError(f"{manifest.path} was saved for another model ({saved_for}): it has no {name}, "
                                  f"which {spec.name} needs")
        if list(stored[name]) != shape:
            raise CheckpointError(f"{manifest.path} was saved for another model ({saved_for}): {name} is "
                                  f"{list(stored[name])} there but {shape} in {spec.name}")
    extra = sorted(set(stored) - set(want))
    if extra:
        raise CheckpointError(f"{manifest.path} was saved for another model ({saved_for}): it has {extra[0]}, "
                              f"which {spec.name} lacks")


__all__ = ["check_model", "expected_shapes"]
