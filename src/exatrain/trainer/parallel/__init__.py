"""Parallelism for the single-device model, one ``apply_*`` per technique.

The order is fixed (torchtitan's, for the same reasons): pipeline split -> tensor/sequence
parallelism -> expert parallelism -> activation checkpointing -> (compile) -> FSDP / DDP. See ``build.py``.
"""
