"""Measurements that feed the planner: micro-benchmarks of this machine (``exatrain bench``) and a
trace of the trainer's memory without allocating it (``exatrain estimate --trace``).

This package imports torch (lazily, inside functions where a CLI path needs it) and may use the
trainer's modules; the planner never imports it — the CLI wires the two together.
"""
