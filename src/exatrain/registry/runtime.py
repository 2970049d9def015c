"""The engine a plan gets when none is named, and the lines a plan for exatrain's own trainer gets about a model
it does not build."""

from __future__ import annotations

from typing import Any

from exatrain.registry.vocab import RUNTIMES, listed


def trainer_cannot_build(model: Any) -> str:
    """The line a plan for exatrain's own trainer (``--runtime exatrain``) gets when its model has what the trainer
    does not build yet (``ModelSpec.unbuilt_by_trainer``); "" when the trainer builds it."""
    missing = model.unbuilt_by_trainer
    if not missing:
        return ""
    return (
        f"exatrain's own trainer does not build {model.name} yet ({listed(missing)}): these figures are "
        f"for a run it cannot make; plan the engine that will run it (--runtime "
        f"{', '.join(r for r in RUNTIMES if r != 'exatrain')})"
    )


def default_runtime(model: Any) -> str:
    """The engine a plan is predicted for when none is named: exatrain's own trainer (the one `train` and `tune`
    run) where it builds the model, else Megatron-Core, which builds every architecture the catalog describes
    (latent attention, QK-norm, a head width of its own, sliding windows)."""
    return "megatron-core" if model.unbuilt_by_trainer else "exatrain"


def default_runtime_note(model: Any) -> str:
    """The line a plan gets whose runtime was chosen for it (``default_runtime``) as another than exatrain's own
    trainer; "" where the default is the trainer."""
    missing = model.unbuilt_by_trainer
    if not missing:
        return ""
    return (
        f"runtime megatron-core, the default for {model.name}: exatrain's own trainer does not build it yet "
        f"({listed(missing)}); name the engine that will run it with --runtime"
    )
