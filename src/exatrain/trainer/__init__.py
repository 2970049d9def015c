"""The trainer: runs a Plan with PyTorch's own distributed engine.

model.py (one device) -> parallel/ (pipeline split, TP/SP, activation checkpointing, data
parallelism) -> init.py (deterministic per-parameter weights) -> train.py (the step loop).
Imports plan.py and the catalog, never the planner (tests/test_layering.py keeps that true).
"""
