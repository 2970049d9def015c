"""Tuning: Bayesian optimisation of the layout over short real training runs, seeded by the cost model.

* ``study``   the Optuna study, the tuning loop and its typed result (``TuneResult``);
* ``sampler`` the candidates and the cost-model-prior sampler that picks the next layout;
* ``runner``  one trial as a real training run in a subprocess.

Torch-free: the tuner starts the trainer as a process, never imports it. Calling this package,
``exatrain.tune(model=..., gpus=..., global_batch=...)``, is calling ``exatrain.api.tune``, which
wires search, study and runner together.
"""

from __future__ import annotations

import sys
import types


class _CallableModule(types.ModuleType):
    """This package, callable: ``exatrain.tune(...)`` runs ``exatrain.api.tune(...)``."""

    def __call__(self, *args, **kwargs):
        from exatrain.api.tuning import tune

        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
