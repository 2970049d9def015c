"""Tuning: Bayesian optimisation of the layout over short real training runs, seeded by the cost model.

* ``study``   the Optuna study, the tuning loop and its typed result (``TuneResult``);
* ``sampler`` the candidates and the cost-model-prior sampler that picks the next layout;
* ``runner``  one trial as a real training run in a subprocess.

Torch-free: the tuner starts the trainer as a process, never imports it. ``exatrain.tune(...)``
(``exatrain.api.tune``) wires search, study and runner together.
"""
