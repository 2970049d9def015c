"""The trainer: runs a Plan with PyTorch's own distributed engine.

model.py (one device; MoE layers in moe.py) -> parallel/ (pipeline split, TP/SP, expert
parallelism, activation checkpointing, data parallelism) -> init.py (deterministic per-parameter weights)
-> sampler.py (batches by global sample index from a prepared dataset) -> train.py (the step loop)
-> checkpoint/ (layout-free DCP checkpoints, resume) -> hf_export.py (Hugging Face, MoE
models in Mixtral's format). Imports plan.py, the catalog and exatrain.data,
never the planner (tests/test_layering.py keeps that true).
"""
